"""The judge under contention (issue 31), through the public API against the loopback server: one metric's limits
never starve another, a 429's pause holds, any Retry-After is a bounded pause, a judge that cannot answer is a
failure of its own kind summarized once, the usage adds up to what the server saw, and a cap holds."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy.devserver import DevServer, Fault
from skynet_dspy.errors import LLMCallError, WorkerError

KEY = "contention-test-key-13579"

JUDGE_METRIC = """
from skynet import llm

def score(input, output, expected=None):
    verdict = llm("Grade.", input=str(output))
    return (1.0 if verdict.startswith("PASS") else 0.0, {"feedback": verdict})
"""

# every call asks the judge 16 times at once (the most one call may have in flight), leaving a file as each asks
FLOOD_METRIC = """
import contextvars, pathlib, threading
from skynet import llm

def score(input, output, expected=None):
    def ask(n):
        (pathlib.Path(input["asked"]) / f"{output} {n}").touch()
        llm("Grade.", input=f"{output} part {n}")
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask, n)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (1.0, {"feedback": "done"})
"""


def model(server) -> dict:
    return {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}


def test_one_metrics_rate_limit_does_not_starve_another_metric(tmp_path):
    """Metric A (judge_rpm=1) has 48 requests waiting for their turn, more than the 32 threads answering llm() in a
    process; metric B's call in the same process is still answered (v0.3: it found every thread taken, timed out)."""
    flood, judged = write_metric(tmp_path, FLOOD_METRIC, "flood.py"), write_metric(tmp_path, JUDGE_METRIC)
    asked = tmp_path / "asked"
    asked.mkdir()
    with DevServer(lambda request: "PASS", model_name="gpt-4o-mini") as server, \
            skynet_dspy.load_metric(flood, metric_lm=model(server), judge_rpm=1, judge_cache=False, workers=3,
                                    timeout=300) as throttled, \
            skynet_dspy.load_metric(judged, metric_lm=model(server), judge_cache=False, timeout=60) as other:
        with ThreadPoolExecutor(3) as callers:  # each call's outcome is collected: none raises unobserved
            calls = [callers.submit(throttled.score, {"asked": str(asked)}, f"flood {n}") for n in range(3)]
            deadline = time.monotonic() + 120
            while len(list(asked.iterdir())) < 48 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # set-up, not a bound: the last of them reach their wait for a turn
            assert len(list(asked.iterdir())) == 48 and len(server.requests) <= 1  # at least 47 wait their turn
            result = other.score({"q": 1}, "an answer")
            assert result.ok and result.feedback == "PASS", result.detail
            assert any(request.user == "an answer" for request in server.requests)
            throttled.close()  # its requests waiting for their turn stop, and so do its calls
            outcomes = [call.exception(timeout=60) for call in calls]  # each ended: scored, or stopped by close()
        assert all(outcome is None or isinstance(outcome, WorkerError) and "was closed" in str(outcome)
                   for outcome in outcomes), outcomes


def test_a_pause_holds_the_requests_waiting_under_judge_rpm(server):
    """Two 429s in a row pause the endpoint: no request waiting for its turn (judge_rpm, judge_max_concurrency) starts
    during the pause. (The first 429, alone, is retried alone after its Retry-After.)"""
    server.fail_next(status=429, retry_after=2, times=2)
    judge = skynet_dspy.configure_llm(model(server), cache=False, rpm=120, max_concurrency=1)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: judge.complete("Grade.", f"x{n}"), range(12)))
    assert answers == ["ok"] * 12
    times = sorted(request.at for request in server.requests)
    second_429 = times[1]
    during = [at - second_429 for at in times if second_429 + 0.5 <= at <= second_429 + 1.5]
    assert during == [], f"requests started {during} s into a 2 s pause"  # judge_rpm alone sends one every 0.5 s
    assert len(server.requests) == 14 and judge.usage.retries == 2


@pytest.mark.parametrize("value", [
    "Fri, 31 Dec 99999999999 23:59:59 GMT",  # a date no datetime can hold: OverflowError in v0.3
    "Wed, 21 Oct 2015 07:28:00 GMT",  # long past: no wait
    "soon", "", "-5", "nan", "inf", "1e400", "0x10",
])
def test_any_retry_after_is_a_bounded_pause_never_an_exception(server, value):
    server.fail_next(status=429, retry_after=value)
    judge = skynet_dspy.configure_llm(model(server), cache=False, retry_base_delay=0.05)
    assert judge.complete("Grade.", "x") == "ok"
    assert len(server.requests) == 2 and judge.usage.retries == 1


def test_a_huge_retry_after_is_bounded_and_a_closed_judge_stops_waiting(server):
    server.fail_next(status=429, retry_after=10**9)
    judge = skynet_dspy.configure_llm(model(server), cache=False)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            judge.complete("Grade.", "x")
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    deadline = time.monotonic() + 30
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    judge.close()
    asking.join(30)
    assert not asking.is_alive() and len(errors) == 1
    assert isinstance(errors[0], LLMCallError) and "was not sent" in str(errors[0])


def test_a_judge_failing_after_its_retries_is_its_own_failure_kind_summarized_once(tmp_path, caplog):
    path = write_metric(tmp_path, JUDGE_METRIC)
    failing = {"answer 3", "answer 7"}

    def fault_for(request):
        return Fault(status=503) if any(text in request.user for text in failing) else None

    with DevServer(lambda request: "PASS", fault_for=fault_for) as server, \
            skynet_dspy.load_metric(path, metric_lm=model(server), judge_cache=False) as metric:
        metric.judge.retry_base_delay = 0.01
        devset = [dspy.Example(question=n, answer=f"answer {n}").with_inputs("question") for n in range(10)]
        with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
            evaluation = dspy.Evaluate(devset=devset, metric=metric, num_threads=4, display_progress=False)(
                lambda question: dspy.Prediction(answer=f"answer {question}"))
        assert metric.stats["judge_unreachable"] == 2 and metric.stats["judge_error"] == 0
        usage = metric.judge_usage
        assert usage.failed == 2 and usage.retries == 2 * metric.judge.max_retries
        assert usage.requests == len(server.requests) == 8 + 2 * (metric.judge.max_retries + 1)
    assert evaluation.score == pytest.approx(80.0)
    frame = skynet_dspy.results_frame(evaluation)
    assert sorted(frame["failure"]) == [""] * 8 + ["judge_unreachable"] * 2
    summaries = [r.getMessage() for r in caplog.records if "could not reach the judge" in r.getMessage()]
    assert len(summaries) == 1 and "2 of 10 calls could not reach the judge" in summaries[0], summaries
    assert "failed 5 time(s) in a row" in summaries[0]
    assert not any("judge_error" in r.getMessage() for r in caplog.records)  # not reported as a setup problem


def test_a_refused_key_stays_a_judge_setup_error(tmp_path):
    path = write_metric(tmp_path, JUDGE_METRIC)
    with DevServer(lambda request: "PASS") as server, \
            skynet_dspy.load_metric(path, metric_lm=model(server), judge_cache=False) as metric:
        server.fail_next(status=401)
        result = metric.score({"q": 1}, "x")
    assert result.failure == "judge_error" and metric.judge_usage.failed == 1


def test_the_usage_adds_up_to_what_the_server_saw(tmp_path):
    path = write_metric(tmp_path, JUDGE_METRIC)
    with DevServer(lambda request: "PASS", rate_limit_every=7, retry_after=0) as server, \
            skynet_dspy.load_metric(path, metric_lm=model(server), workers=4) as metric, \
            ThreadPoolExecutor(8) as pool:
        started = time.monotonic()
        results = list(pool.map(lambda n: metric.score({"q": n}, f"answer {n % 30}"), range(60)))
        elapsed = time.monotonic() - started
        usage = metric.judge_usage
        assert all(result.ok for result in results)
        assert usage.requests == len(server.requests) and usage.retries == server.rate_limited > 0
        assert usage.failed == 0 and usage.requests - usage.retries == 30 == usage.cache_hits  # 30 distinct outputs
        assert 0 < usage.seconds <= elapsed  # wall-clock time of the run, not a sum over threads


def test_a_judge_cap_holds_under_16_threads_when_answers_run_long(server):
    server.responder = lambda request: {"content": "PASS " + "word " * 20_000, "completion_tokens": 20_000}
    cap = 0.05
    judge = skynet_dspy.configure_llm(model(server), cache=False, max_cost_usd=cap)

    def ask(n: int) -> str:
        try:
            return judge.complete("Grade.", f"x{n}")[:4]
        except skynet_dspy.SpendCapReached:
            return "refused"

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(64)))
    spend = judge.spend_cap.snapshot()
    one_request = 4096 * 0.6e-6 + 0.001  # gpt-4o-mini's output price for max_tokens, and the prompt
    assert "PASS" in answers and "refused" in answers
    assert spend.spent_usd <= cap + one_request, spend
    assert all(request.body.get("max_tokens") == 4096 for request in server.requests)
