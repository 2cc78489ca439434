"""reward(): the formula of docs/contract.md#reward, spec validation, feedback lines, REWARD_SPEC checked at load."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import skynet_dspy
from skynet_dspy import Observation, RewardSpecError

SPEC = {
    "weights": {"accuracy": 0.7, "speed": 0.2, "cost": 0.1},
    "accuracy": {},
    "speed": {"reference": 2000},
    "cost": {"reference": 0.01},
}


def observed(run_ms: float | None = 2000.0, cost_usd: float | None = 0.01, **more) -> Observation:
    return Observation(run_ms=run_ms, cost_usd=cost_usd, model_calls=1, prompt_tokens=10, completion_tokens=5, **more)


def rewarded(spec, accuracy, feedback="Fine.", observation: Observation | None = None, reason: str | None = None):
    """Run reward() inside a real metric call, with the given measured run; returns the Result."""
    from skynet import reward

    def score(input, output):
        return reward(spec, accuracy, feedback)

    with skynet_dspy.load_metric(score, measure=False) as metric:
        result = metric.score({"q": "?"}, "a", None, observation=observation, unmeasured_reason=reason)
    assert result.failure is None, result.detail
    return result


def test_half_at_each_reference_and_one_at_zero():
    at_reference = rewarded(SPEC, 1.0, observation=observed(2000, 0.01))
    assert at_reference.scores == {"accuracy": 1.0, "speed": 0.5, "cost": 0.5}
    assert at_reference.score == pytest.approx(0.7 * 1.0 + 0.2 * 0.5 + 0.1 * 0.5)

    free_and_instant = rewarded(SPEC, 1.0, observation=observed(0.0, 0.0))
    assert free_and_instant.scores == {"accuracy": 1.0, "speed": 1.0, "cost": 1.0}
    assert free_and_instant.score == pytest.approx(1.0)

    slow = rewarded(SPEC, 1.0, observation=observed(6000, 0.03))
    assert slow.scores["speed"] == pytest.approx(2000 / 8000)
    assert slow.scores["cost"] == pytest.approx(0.01 / 0.04)


@pytest.mark.parametrize(("accuracy", "component"), [(0.3, 0.3), (1.0, 1.0), (0.0, 0.0), (1.7, 1.0), (-0.4, 0.0)])
def test_accuracy_without_reference_is_clamped_to_0_1(accuracy, component):
    assert rewarded(SPEC, accuracy, observation=observed()).scores["accuracy"] == pytest.approx(component)


@pytest.mark.parametrize(("error", "component"), [(0.0, 1.0), (5.0, 0.5), (15.0, 0.25), (45.0, 0.1)])
def test_accuracy_with_reference_is_an_error_lower_is_better(error, component):
    spec = {**SPEC, "accuracy": {"reference": 5}}
    result = rewarded(spec, error, observation=observed())
    assert result.scores["accuracy"] == pytest.approx(component)
    assert f"accuracy {component:.2f} (error {error:g} vs reference 5)" in result.feedback


def test_weights_are_rescaled_to_sum_to_one():
    unscaled = {**SPEC, "weights": {"accuracy": 14, "speed": 4, "cost": 2}}
    observation = observed(1234, 0.004)
    assert rewarded(unscaled, 0.8, observation=observation).score == pytest.approx(
        rewarded(SPEC, 0.8, observation=observation).score
    )
    only_speed = {**SPEC, "weights": {"accuracy": 0, "speed": 3, "cost": 0}}
    assert rewarded(only_speed, 1.0, observation=observed(2000, 0.5)).score == pytest.approx(0.5)


def test_feedback_is_the_given_text_then_one_line_per_component():
    result = rewarded(SPEC, 1.0, "Correct label.", observation=observed(1234, 0.00027))
    assert result.feedback.splitlines() == [
        "Correct label.",
        "accuracy 1.00",
        "speed 0.62 (1234 ms vs reference 2000 ms)",
        f"cost {0.01 / 0.01027:.2f} ($0.00027 vs reference $0.01)",
    ]
    assert rewarded(SPEC, 1.0, "", observation=observed()).feedback.splitlines()[0] == "accuracy 1.00"


def test_an_unknown_price_makes_cost_zero_and_says_why():
    no_price = observed(500, None, cost_unknown_reason="no price known for model openai/my-private-model")
    result = rewarded(SPEC, 1.0, observation=no_price)
    assert result.scores["cost"] == 0.0
    assert result.scores["speed"] == pytest.approx(0.8)
    assert "cost 0.00 (cost not measured: no price known for model openai/my-private-model)" in result.feedback
    assert result.score == pytest.approx(0.7 + 0.2 * 0.8)


def test_an_unmeasured_run_makes_speed_and_cost_zero_and_says_why():
    result = rewarded(SPEC, 1.0, observation=None, reason="the program was not run by DSPy")
    assert result.scores == {"accuracy": 1.0, "speed": 0.0, "cost": 0.0}
    assert "speed 0.00 (speed not measured: the program was not run by DSPy)" in result.feedback
    assert "cost 0.00 (cost not measured: the program was not run by DSPy)" in result.feedback
    assert result.score == pytest.approx(0.7)


def test_reward_returns_a_valid_metric_return_value():
    from skynet import reward

    def score(input, output):
        value = reward(SPEC, 0.5, "Half right.")
        checked = skynet_dspy.validate_return(value)
        assert checked.scores == value[1]["scores"]
        return value

    with skynet_dspy.load_metric(score) as metric:
        result = metric.score({"q": 1}, "a")
    assert result.failure is None, result.detail
    assert set(result.scores) == {"accuracy", "speed", "cost"}


@given(
    accuracy=st.floats(-10, 10, allow_nan=False),
    run_ms=st.floats(0, 1e7, allow_nan=False),
    cost=st.floats(0, 100, allow_nan=False),
    weights=st.tuples(*[st.floats(0, 100, allow_nan=False)] * 3).filter(lambda w: sum(w) > 0),
)
def test_components_and_total_stay_in_0_1(accuracy, run_ms, cost, weights):
    from skynet_dspy._core.reward import compute

    spec = {**SPEC, "weights": dict(zip(("accuracy", "speed", "cost"), weights, strict=True))}
    total, info = compute(spec, accuracy, "", observed(run_ms, cost))
    assert all(0.0 <= value <= 1.0 for value in info["scores"].values())
    assert 0.0 <= total <= 1.0 + 1e-12
    assert info["scores"]["speed"] == pytest.approx(2000 / (2000 + run_ms))


@given(st.floats(0, 1e6, allow_nan=False), st.floats(0, 1e6, allow_nan=False))
def test_slower_never_scores_higher(faster, slower):
    from skynet_dspy._core.reward import compute

    faster, slower = sorted((faster, slower))
    fast_total, _ = compute(SPEC, 1.0, "", observed(faster, 0.0))
    slow_total, _ = compute(SPEC, 1.0, "", observed(slower, 0.0))
    assert slow_total <= fast_total


DELETE = object()


def spec_with(**changes):
    """A copy of SPEC with changes: weights__speed=-1 sets spec["weights"]["speed"]; the value DELETE removes it."""
    spec = {key: dict(value) if isinstance(value, dict) else value for key, value in SPEC.items()}
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = spec
        for parent in parents:
            target = target[parent]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return spec

INVALID = [
    ("not a dict", [("weights", 0.7)], "REWARD_SPEC must be a dict"),
    ("no weights", spec_with(weights=DELETE), "REWARD_SPEC['weights'] is missing"),
    ("weights not a dict", spec_with(weights=[0.7, 0.2, 0.1]), "REWARD_SPEC['weights'] must be a dict"),
    ("missing weight", spec_with(weights__cost=DELETE), "REWARD_SPEC['weights']['cost'] is missing"),
    ("negative weight", spec_with(weights__speed=-0.2), "REWARD_SPEC['weights']['speed'] is negative"),
    ("weight not a number", spec_with(weights__accuracy="0.7"), "REWARD_SPEC['weights']['accuracy'] must be a number"),
    ("NaN weight", spec_with(weights__accuracy=math.nan), "REWARD_SPEC['weights']['accuracy'] must be a number"),
    ("infinite weight", spec_with(weights__cost=math.inf), "REWARD_SPEC['weights']['cost'] must be a number"),
    ("all zero", spec_with(weights={"accuracy": 0, "speed": 0.0, "cost": 0}), "are all 0"),
    ("zero speed reference", spec_with(speed__reference=0), "REWARD_SPEC['speed']['reference'] must be a positive"),
    ("negative cost reference", spec_with(cost__reference=-0.01), "REWARD_SPEC['cost']['reference'] must be a"),
    ("text reference", spec_with(speed__reference="2000"), "REWARD_SPEC['speed']['reference'] must be a positive"),
    ("infinite reference", spec_with(cost__reference=math.inf), "REWARD_SPEC['cost']['reference'] must be a positive"),
    ("zero accuracy reference", spec_with(accuracy__reference=0), "REWARD_SPEC['accuracy']['reference'] must be"),
    ("no speed reference", spec_with(speed={}), "REWARD_SPEC['speed']['reference'] is missing"),
    ("no cost section", spec_with(cost=DELETE), "REWARD_SPEC['cost']['reference'] is missing"),
    ("unknown key", spec_with(latency={"reference": 5}), "unknown key(s) latency"),
    ("unknown weight", spec_with(weights__quality=0.5), "REWARD_SPEC['weights'] has unknown key(s) quality"),
    ("unknown field", spec_with(speed__target=100), "REWARD_SPEC['speed'] has unknown key(s) target"),
    ("section not a dict", spec_with(cost=0.01), "REWARD_SPEC['cost'] must be a dict"),
]


@pytest.mark.parametrize(("spec", "message"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_every_invalid_spec_is_a_clear_error_naming_the_field(spec, message):
    from skynet_dspy._core.reward import validate_spec

    with pytest.raises(RewardSpecError) as caught:
        validate_spec(spec)
    assert message in str(caught.value)


def test_an_invalid_spec_passed_to_reward_fails_the_call_with_its_message():
    from skynet import reward

    def score(input, output):
        return reward(spec_with(weights__speed=-1), 1.0, "x")

    with skynet_dspy.load_metric(score) as metric:
        result = metric.score({"q": 1}, "a")
    assert result.failure == "exception"
    # the optimizer is told what failed; the message is the user's (docs/contract.md#a-failed-call)
    assert result.feedback == "Not scored: the metric raised RewardSpecError while scoring this output."
    assert "RewardSpecError" in result.detail and "['weights']['speed'] is negative" in result.detail


@pytest.mark.parametrize("accuracy", ["0.9", None, math.nan])
def test_accuracy_must_be_a_number(accuracy):
    from skynet_dspy._core.reward import compute

    with pytest.raises(TypeError, match="accuracy must be a number"):
        compute(SPEC, accuracy, "", observed())


def test_feedback_must_be_text():
    from skynet_dspy._core.reward import compute

    with pytest.raises(TypeError, match="feedback must be a str"):
        compute(SPEC, 1.0, None, observed())  # type: ignore[arg-type]


def test_reward_outside_a_metric_call_is_a_clear_error():
    from skynet import reward

    with pytest.raises(RuntimeError, match=r"skynet\.reward\(\) was called outside a metric call"):
        reward(SPEC, 1.0, "x")


METRIC = """
from skynet import reward

REWARD_SPEC = {spec!r}


def score(input, output, expected=None):
    return reward(REWARD_SPEC, 1.0 if output == expected["label"] else 0.0, "checked")
"""


def test_a_bad_reward_spec_in_metric_py_fails_at_load(tmp_path):
    path = tmp_path / "metric.py"
    path.write_text(METRIC.format(spec=spec_with(cost__reference=0)))
    with pytest.raises(RewardSpecError, match=r"REWARD_SPEC\['cost'\]\['reference'\] must be a positive"):
        skynet_dspy.load_metric(path)


def test_the_contract_check_reports_the_reward_spec(tmp_path):
    cases = [{"input": {"text": "hi"}, "output": "ham", "expected": {"label": "ham"}}]
    bad = tmp_path / "bad_metric.py"
    bad.write_text(METRIC.format(spec=spec_with(weights__accuracy=DELETE)))
    report = skynet_dspy.check_contract(bad, cases)
    assert not report.ok
    items = {item.name: item for item in report.items}
    assert items["Metric loads"].passed and items["Metric signature"].passed
    assert not items["Reward spec"].passed
    assert "REWARD_SPEC['weights']['accuracy'] is missing" in items["Reward spec"].message
    assert "Reward spec" in str(report)

    good = tmp_path / "good_metric.py"
    good.write_text(METRIC.format(spec=SPEC))
    report = skynet_dspy.check_contract(good, cases)
    assert report.ok, str(report)
    items = {item.name: item for item in report.items}
    assert items["Reward spec"].passed
