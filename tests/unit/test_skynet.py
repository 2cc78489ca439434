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


@pytest.fixture(params=["process", "thread"])
def isolation(request) -> str:
    return request.param


def _seen_by_the_metric():
    """Inside score: what the helpers give, as plain values (a worker process sends back plain data only)."""
    from skynet import observation, service_cost

    seen = observation()
    try:
        seen.cost_usd = 0.5  # type: ignore[misc]
        frozen = False
    except dataclasses.FrozenInstanceError:
        frozen = True
    return {
        "observation": dataclasses.asdict(seen),
        "type": type(seen).__qualname__,
        "frozen": frozen,
        "total_tokens": seen.total_tokens,
        "measured": seen.measured,
        "service_cost": service_cost(),
    }


def run_with(observation: Observation | None, reason: str | None = None, isolation: str = "process") -> dict:
    """Score once with the given measured run; return what the helpers gave the metric (read back from extra)."""

    def score(input, output):
        return 1.0, {"feedback": "ok", "seen": _seen_by_the_metric()}

    with skynet_dspy.load_metric(score, measure=False, isolation=isolation) as metric:
        result = metric.score({"q": 1}, "a", None, observation=observation, unmeasured_reason=reason)
    assert result.failure is None, result.detail
    got = dict(result.extra["seen"])
    got["observation"] = Observation(**got["observation"])
    return got


def test_inside_a_metric_call_the_helpers_give_the_run_being_scored(isolation):
    measured = Observation(
        run_ms=812.5, cost_usd=0.00042, model_calls=2, prompt_tokens=900, completion_tokens=120
    )
    got = run_with(measured, isolation=isolation)
    assert got["observation"] == measured
    assert got["type"] == "Observation" and got["measured"] is True
    assert got["service_cost"] == 0.00042
    assert got["total_tokens"] == got["observation"].total_tokens == 1020


def test_the_observation_is_read_only(isolation):
    got = run_with(
        Observation(run_ms=1.0, cost_usd=0.0, model_calls=0, prompt_tokens=0, completion_tokens=0),
        isolation=isolation,
    )
    assert got["frozen"] is True  # the metric's own attempt to change it failed
    assert got["observation"].cost_usd == 0.0 and got["service_cost"] == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        got["observation"].cost_usd = 0.5  # type: ignore[misc]


def test_an_unknown_price_gives_service_cost_none_with_the_reason(isolation):
    got = run_with(Observation(run_ms=10.0, cost_usd=None, model_calls=1, prompt_tokens=5, completion_tokens=5,
                               cost_unknown_reason="no price known for model openai/my-private-model"),
                   isolation=isolation)
    assert got["service_cost"] is None
    assert got["observation"].cost_unknown_reason == "no price known for model openai/my-private-model"
    assert got["observation"].run_ms == 10.0


def test_an_unmeasured_run_gives_none_figures_and_says_why(isolation):
    got = run_with(None, "no measured run of the program returned this prediction", isolation=isolation)
    observation = got["observation"]
    assert not observation.measured and got["measured"] is False
    assert (observation.run_ms, observation.cost_usd, observation.model_calls, got["total_tokens"]) == (
        None, None, None, None,
    )
    assert observation.unmeasured_reason == "no measured run of the program returned this prediction"
    assert got["service_cost"] is None


def test_the_helpers_under_dspy_evaluate_see_the_programs_run(server, lm, isolation):
    from skynet import observation, service_cost

    server.responder = lambda request: {"content": dspy_reply(answer="4"), "prompt_tokens": 70,
                                        "completion_tokens": 3}

    def score(input, output, expected):
        seen = {"observation": dataclasses.asdict(observation()), "service_cost": service_cost()}
        return float(output == expected["answer"]), {"feedback": "checked", "seen": seen}

    devset = [dspy.Example(question="2 + 2?", answer="4").with_inputs("question")]
    with skynet_dspy.load_metric(score, isolation=isolation) as metric:
        assert metric.measuring  # the metric's code uses observation(): its runs are measured
        with dspy.context(lm=lm):
            evaluated = dspy.Evaluate(devset=devset, metric=metric)(dspy.Predict("question -> answer"))

    [(_, _, result)] = evaluated.results
    assert result.ok and float(result) == 1.0
    seen = Observation(**result.result.extra["seen"]["observation"])
    cost = result.result.extra["seen"]["service_cost"]
    assert (seen.model_calls, seen.prompt_tokens, seen.completion_tokens) == (1, 70, 3)
    assert seen.run_ms > 0
    assert cost == seen.cost_usd and cost > 0


THREADED_JUDGE = """
import concurrent.futures
from skynet import llm, observation

def score(input, output, expected=None):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda question: llm(question), ["first", "second"]))
        seen = pool.submit(observation).result()
    return 1.0, {"feedback": " | ".join(answers), "measured": seen.measured}
"""


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_llm_and_observation_work_from_threads_the_metric_starts(tmp_path, server, isolation):
    from support import write_metric

    server.responder = lambda request: f"judged {request.user}"
    judge = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": "local"}
    with skynet_dspy.load_metric(write_metric(tmp_path, THREADED_JUDGE), metric_lm=judge, isolation=isolation) as m:
        result = m.score({}, "x")
    assert result.ok, result.detail
    assert result.feedback == "judged first | judged second" and result.extra["measured"] is False


@pytest.mark.parametrize("helper", ["observation()", "llm('Judge.')"])
def test_a_thread_the_metric_starts_is_told_when_its_call_is_ambiguous(tmp_path, helper):
    """With isolation='thread' and two calls at once, a bare thread cannot know its call: a clear error
    (OutsideMetricCall from every helper, never a judge setup problem)."""
    import threading

    from support import write_metric

    path = write_metric(tmp_path, """
        import threading
        from skynet import llm, observation

        both = threading.Barrier(2, timeout=10)  # one process (isolation='thread'): the two calls meet here

        def score(input, output, expected=None):
            found = []
            def look():
                try:
                    HELPER
                    found.append("found")
                except Exception as exc:
                    found.append(type(exc).__name__ + ": " + str(exc))
            both.wait()  # both calls are in progress now
            thread = threading.Thread(target=look)
            thread.start()
            thread.join()
            both.wait()  # and stay so until both have looked
            return 1.0, {"feedback": found[0]}
        """.replace("HELPER", helper))
    with skynet_dspy.load_metric(path, isolation="thread") as metric:
        results = []
        calls = [threading.Thread(target=lambda: results.append(metric.score({}, 1))) for _ in range(2)]
        for call in calls:
            call.start()
        for call in calls:
            call.join()
    assert len(results) == 2
    for result in results:
        assert result.feedback.startswith("OutsideMetricCall: ")
        assert "several metric calls run at once" in result.feedback and "copy_context" in result.feedback
