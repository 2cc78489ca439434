"""The `skynet` helpers observation(), service_cost() and reward(): inside and outside a metric call."""

from __future__ import annotations

import dataclasses

import dspy
import pytest

import skynet_dspy
from skynet_dspy import Observation
from skynet_dspy.devserver import dspy_reply


def test_the_helpers_import_from_skynet():
    import skynet
    from skynet import llm, observation, reward, service_cost

    assert skynet is skynet_dspy.helpers
    assert all(callable(helper) for helper in (llm, observation, reward, service_cost))


@pytest.mark.parametrize("helper", ["observation", "service_cost"])
def test_outside_a_metric_call_is_a_clear_error(helper):
    import skynet

    with pytest.raises(RuntimeError) as caught:
        getattr(skynet, helper)()
    message = str(caught.value)
    assert f"skynet.{helper}() was called outside a metric call" in message
    assert "call it from inside score()" in message


def run_with(observation: Observation | None, reason: str | None = None) -> dict:
    """Score once with the given measured run; return what the helpers gave the metric."""
    from skynet import observation as observed
    from skynet import service_cost

    got = {}

    def score(input, output):
        got["observation"] = observed()
        got["service_cost"] = service_cost()
        return 1.0, {"feedback": "ok"}

    result = skynet_dspy.load_metric(score, measure=False).run({"q": 1}, "a", None, observation, reason)
    assert result.failure is None, result.feedback
    return got


def test_inside_a_metric_call_the_helpers_give_the_run_being_scored():
    measured = Observation(
        run_ms=812.5, cost_usd=0.00042, model_calls=2, prompt_tokens=900, completion_tokens=120
    )
    got = run_with(measured)
    assert got["observation"] == measured
    assert got["service_cost"] == 0.00042
    assert got["observation"].total_tokens == 1020


def test_the_observation_is_read_only():
    got = run_with(Observation(run_ms=1.0, cost_usd=0.0, model_calls=0, prompt_tokens=0, completion_tokens=0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        got["observation"].cost_usd = 0.5  # type: ignore[misc]


def test_an_unknown_price_gives_service_cost_none_with_the_reason():
    got = run_with(Observation(run_ms=10.0, cost_usd=None, model_calls=1, prompt_tokens=5, completion_tokens=5,
                               cost_unknown_reason="no price known for model openai/my-private-model"))
    assert got["service_cost"] is None
    assert got["observation"].cost_unknown_reason == "no price known for model openai/my-private-model"
    assert got["observation"].run_ms == 10.0


def test_an_unmeasured_run_gives_none_figures_and_says_why():
    got = run_with(None, "no measured run of the program returned this prediction")
    observation = got["observation"]
    assert not observation.measured
    assert (observation.run_ms, observation.cost_usd, observation.model_calls, observation.total_tokens) == (
        None, None, None, None,
    )
    assert observation.unmeasured_reason == "no measured run of the program returned this prediction"
    assert got["service_cost"] is None


def test_the_helpers_under_dspy_evaluate_see_the_programs_run(server, lm):
    from skynet import observation, service_cost

    server.responder = lambda request: {"content": dspy_reply(answer="4"), "prompt_tokens": 70,
                                        "completion_tokens": 3}
    got = []

    def score(input, output, expected):
        got.append((observation(), service_cost()))
        return float(output == expected["answer"]), {"feedback": "checked"}

    devset = [dspy.Example(question="2 + 2?", answer="4").with_inputs("question")]
    with dspy.context(lm=lm):
        dspy.Evaluate(devset=devset, metric=skynet_dspy.load_metric(score))(dspy.Predict("question -> answer"))

    [(seen, cost)] = got
    assert (seen.model_calls, seen.prompt_tokens, seen.completion_tokens) == (1, 70, 3)
    assert seen.run_ms > 0
    assert cost == seen.cost_usd and cost > 0
