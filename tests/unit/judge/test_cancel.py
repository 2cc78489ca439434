"""A request belongs to its metric call: once the call ends (timed out, its worker killed) or the metric is closed,
none of its llm() requests is sent or retried, and the threads that served them are back in a small fixed pool."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy.devserver import DevServer

KEY = "cancel-test-key-13579"

# asks the judge again and again, swallowing every failure: only cancellation can stop its requests
STUBBORN = """
from skynet import llm

def score(input, output, expected=None):
    for n in range(200):
        try:
            llm("Grade.", input=f"{output} try {n}")
        except Exception:
            pass
    return (1.0, {"feedback": "done"})
"""


def _threads() -> list[str]:
    """This process's threads, but the loopback server's (one per kept-alive connection, the server's own)."""
    return [thread.name for thread in threading.enumerate()
            if "process_request_thread" not in thread.name and thread.name != "skynet-devserver"]


def _settle(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_timed_out_calls_and_close_leave_no_request_and_no_thread_behind(tmp_path, isolation):
    path = write_metric(tmp_path, STUBBORN)
    with DevServer(lambda request: "PASS") as server:
        server.fail_next(status=503, times=10**9)  # every request fails: the judge retries with backoff
        model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
        baseline = len(_threads())
        metric = skynet_dspy.load_metric(path, metric_lm=model, isolation=isolation, timeout=2.0,
                                         judge_cache=False, workers=6)
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda n: metric.score({"q": n}, f"answer {n}"), range(6)))
        assert [result.failure for result in results] == ["timeout"] * 6
        assert len(server.requests) >= 6  # the calls did reach the judge before they timed out
        metric.close()
        time.sleep(0.3)  # a request already on the wire when the call ended may still land
        sent = len(server.requests)
        time.sleep(3.0)  # the judge's backoff is 0.5-1 s, then doubles: a retry would have been sent by now
        assert len(server.requests) == sent, "a request was sent after its call ended and the metric was closed"
        # threads: back to what they were, give or take the small pool that serves workers' llm() requests
        assert _settle(lambda: len(_threads()) <= baseline + 8, 3.0), (baseline, sorted(_threads()))


def test_a_closed_metric_cancels_the_requests_in_its_backoff(tmp_path):
    from skynet_dspy._judge import Judge
    from skynet_dspy.errors import LLMCallError

    with DevServer(lambda request: "PASS") as server:
        server.fail_next(status=503, times=10**9)
        judge = Judge(metric_lm={"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY},
                      cache=False, retry_base_delay=5.0)
        failures: list[str] = []

        def ask() -> None:
            try:
                judge.complete("Grade.", "x")
            except LLMCallError as exc:
                failures.append(str(exc))

        asking = threading.Thread(target=ask)
        asking.start()
        assert _settle(lambda: len(server.requests) == 1, 5.0)
        started = time.monotonic()
        judge.close()
        asking.join(5.0)
        assert not asking.is_alive() and time.monotonic() - started < 2.0  # not after its 2.5-5 s backoff
        assert len(server.requests) == 1
        assert failures and "was not sent" in failures[0]
