"""A misbehaving model server under llm() (issue 9): 429 with Retry-After, 500, 503, a connection
closed mid-response, invalid JSON, an empty completion and a 60-second stall. Each gives a retried
success or, once the bounded retries are used up, the failure score with feedback naming the cause;
and a GEPA run whose judge keeps misbehaving goes on to completion.

The judge is the seed page's judge.py, served by its own loopback server so that faults hit only
llm() calls, never the program's or the reflection model's.
"""

from __future__ import annotations

import json
import re

import dspy
import pytest

import skynet_dspy
from skynet_dspy._judge import Judge as Models
from skynet_dspy.devserver import DevServer, dspy_reply

REQUEST_TIMEOUT = 1.0  # seconds per judge request: what cuts the 60-second stall
MAX_RETRIES = 2
JUDGE_INSTRUCTIONS = "Answer PASS or FAIL, then give one sentence of reasons."



@pytest.fixture
def judge_server():
    """A loopback server for the judge alone; it passes every answer."""
    with DevServer(model_name="gpt-4o-mini") as running:
        running.responder = lambda request: "PASS: the answer is right."
        yield running


JUDGE_SETTINGS = {"timeout": REQUEST_TIMEOUT, "max_retries": MAX_RETRIES, "retry_base_delay": 0.01}


def _judge_lm(judge_server: DevServer) -> dspy.LM:
    return dspy.LM("openai/gpt-4o-mini", api_base=judge_server.url, api_key="local-test-key", cache=False)


def _models_for(judge_server: DevServer, **options) -> Models:
    return Models(metric_lm=_judge_lm(judge_server), cache=False, **(JUDGE_SETTINGS | options))


def _load_judge_metric(
    judge_server: DevServer, metrics_dir, metric_timeout: float, **judge_settings
) -> skynet_dspy.Metric:
    """judge.py loaded (in its worker process) with llm() going to judge_server, uncached, with the judge's
    request timeout and retries set as _models_for sets them on a Judge of its own."""
    metric = skynet_dspy.load_metric(
        metrics_dir / "judge.py", metric_lm=_judge_lm(judge_server), judge_cache=False, timeout=metric_timeout
    )
    for name, value in (JUDGE_SETTINGS | judge_settings).items():
        setattr(metric.judge, name, value)
    reference = _models_for(judge_server, **judge_settings)
    assert (metric.judge.timeout, metric.judge.max_retries, metric.judge.retry_base_delay) == (
        reference.timeout, reference.max_retries, reference.retry_base_delay
    )
    assert metric.judge.cache is None and metric.models is metric.judge
    return metric


@pytest.fixture
def judge_metric(judge_server, metrics_dir):
    """The seed judge metric, its llm() calls going to judge_server with short timeouts and fast retries."""
    metric = _load_judge_metric(judge_server, metrics_dir, metric_timeout=30)
    metric.score({"question": "warm up"}, "4", None)  # LiteLLM's first call builds its client: keep it out of the test
    judge_server.clear()
    return metric


def _judge(metric: skynet_dspy.Metric, answer: str = "4") -> skynet_dspy.Score:
    gold = dspy.Example(question="What is 2+2?", answer="4").with_inputs("question")
    return metric(gold, dspy.Prediction(answer=answer))


# fault settings for DevServer.fail_next, and words (any one, case-insensitive) the failure detail must hold
FAULTS = {
    "429_retry_after": ({"status": 429, "retry_after": 0.3}, ["429", "rate limit", "ratelimit"]),
    "500": ({"status": 500}, ["500", "internal server error", "internalservererror"]),
    "503": ({"status": 503}, ["503", "service unavailable", "serviceunavailable"]),
    "closed_connection": ({"close_connection": True}, ["connection", "disconnect", "incomplete", "closed"]),
    "invalid_json": ({"invalid_json": True}, ["json", "decode", "parse", "expecting"]),
    "empty_completion": ({"empty_completion": True}, ["empty"]),
    "stall_60s": ({"stall": 60}, ["timed out", "timeout"]),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_fault_is_retried_to_success(judge_metric, judge_server, fault):
    settings, _ = FAULTS[fault]
    judge_server.fail_next(**settings)
    before = judge_metric.judge_usage

    score = _judge(judge_metric)

    assert score.result.failure is None, f"{fault}: {score.feedback}"
    assert float(score) == 1.0 and score.feedback == "PASS: the answer is right."
    requests = judge_server.requests
    assert len(requests) == 2, f"{fault}: one failed attempt, one retry"
    assert requests[0].body["messages"] == requests[1].body["messages"], "the retry is the same request"
    usage = judge_metric.judge_usage
    assert (usage.requests - before.requests, usage.retries - before.retries) == (2, 1), "one failed, one retried"
    if fault == "429_retry_after":
        assert requests[1].at - requests[0].at >= 0.25, "the retry waited for the server's Retry-After"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_that_persists_gives_the_failure_score_naming_the_cause(judge_metric, judge_server, fault, caplog):
    settings, words = FAULTS[fault]
    judge_server.fail_next(**(settings | {"times": 50}))

    score = _judge(judge_metric)

    assert score.result.failure == "judge_unreachable"  # not a setup error: the judge kept failing
    assert float(score) == 0.0 and not score
    # the optimizer reads a neutral sentence; the cause is on the result's detail and in the log
    assert score.feedback == (
        "Not scored: the metric's judge model could not be reached (its requests failed after their retries); "
        "this is not a fault of the output."
    )
    detail = score.result.detail.lower()
    assert any(word in detail for word in words), f"{fault}: the detail {score.result.detail!r} names no cause"
    assert any(word in caplog.text.lower() for word in words), f"{fault}: the log names no cause"
    assert len(judge_server.requests) == MAX_RETRIES + 1, "the retries are bounded"
    assert judge_metric.stats["judge_unreachable"] == 1 and judge_metric.stats["exception"] == 0

    judge_server.clear()  # the server recovers: the next example is judged normally
    after = _judge(judge_metric)
    assert after.result.failure is None and float(after) == 1.0


def test_401_fails_at_once_without_retrying(judge_metric, judge_server):
    judge_server.fail_next(status=401, times=50)
    score = _judge(judge_metric)
    assert score.result.failure == "judge_error" and "401" in score.result.detail
    assert "401" not in score.feedback and "judge model could not answer" in score.feedback
    assert len(judge_server.requests) == 1


def test_the_metric_timeout_cuts_a_stall_when_the_request_timeout_is_long(judge_server, metrics_dir):
    metric = _load_judge_metric(judge_server, metrics_dir, metric_timeout=1.5, timeout=120, max_retries=0)
    metric.score({"question": "warm up"}, "4", None)
    judge_server.fail_next(stall=60)

    score = _judge(metric)

    assert score.result.failure == "timeout"
    assert score.feedback == "Not scored: the metric timed out after 1.5 s on this output."
    after = _judge(metric)  # the stalled call still hangs on its worker; the next one is judged normally
    assert after.result.failure is None and float(after) == 1.0


# -- a GEPA run whose judge misbehaves -----------------------------------------------------

CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo"}
BETTER = "Reply with the capital city's name only."


def _program_and_reflection(request):
    """The reflection model proposes BETTER; the program names the capital only under BETTER."""
    if "new_instruction" in request.text:
        return json.dumps({"new_instruction": BETTER})
    for country, capital in CAPITALS.items():
        if f"capital of {country}" in request.user:
            return dspy_reply(answer=capital if BETTER in request.system else f"Somewhere in {country}.")
    return dspy_reply(answer="I do not know.")


def _judge_capitals(request):
    for country, capital in CAPITALS.items():
        if country in request.user:
            return f"PASS: {capital}." if request.user.endswith(f"Answer: {capital}") else "FAIL: name the capital."
    return "FAIL: unknown question."


def test_gepa_goes_on_to_completion_while_the_judge_misbehaves(server, lm, judge_server, metrics_dir):
    server.responder = _program_and_reflection
    judge_server.responder = _judge_capitals
    metric = _load_judge_metric(judge_server, metrics_dir, metric_timeout=30)
    metric.score({"question": "warm up"}, "4", None)
    judge_server.clear()
    # Every kind of fault, queued: the first judge requests of the run meet them in turn, some back to back
    # (more than the retries absorb, so some examples fail and are scored 0), the rest are answered.
    for settings, _ in FAULTS.values():
        judge_server.fail_next(**settings)
    judge_server.fail_next(status=429, retry_after=0.05, times=3)
    judge_server.fail_next(status=500)
    reflection = dspy.LM("openai/reflector", api_base=server.url, api_key="local-test-key", cache=False)
    trainset = [
        dspy.Example(question=f"What is the capital of {country}?", answer=capital).with_inputs("question")
        for country, capital in CAPITALS.items()
    ]
    optimizer = dspy.GEPA(metric=metric, reflection_lm=reflection, max_metric_calls=12, num_threads=1,
                          reflection_minibatch_size=2, track_stats=False)
    with dspy.context(lm=lm):
        optimized = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset, valset=trainset)
        after = [metric(example, optimized(**example.inputs())) for example in trainset]

    assert isinstance(optimized, dspy.Module)
    stats = metric.stats
    assert stats["calls"] >= 8, "GEPA kept scoring after the faults"
    assert stats["judge_unreachable"] >= 1, "some judge calls failed for good and were scored, not raised"
    judged = [request for request in judge_server.requests if request.system == JUDGE_INSTRUCTIONS]
    assert len(judged) > 11, "every queued fault was met, and the judge answered after them"
    assert [float(score) for score in after] == [1.0] * len(trainset), [score.feedback for score in after]
    assert all(re.match(r"PASS: \w+\.$", score.feedback) for score in after)
