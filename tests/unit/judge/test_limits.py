"""judge_max_concurrency= / judge_rpm=, a 429's pause for every caller, the circuit breaker of an unreachable
endpoint, and text the provider cannot take: against the loopback server, through the public API."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy._judge import Judge, retry
from skynet_dspy.devserver import DevServer
from skynet_dspy.errors import LLMCallError

KEY = "limits-test-key-24680"

JUDGE_METRIC = """
from skynet import llm

def score(input, output, expected=None):
    return (1.0, {"feedback": llm("Grade.", input=str(output))})
"""

# a metric that starts threads of its own, each asking the judge (as a heavy metric does)
THREADED_METRIC = """
import contextvars, threading
from skynet import llm

def score(input, output, expected=None):
    answers = []
    def ask(n):
        answers.append(llm("Grade.", input=f"{output} part {n}"))
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask, n)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (1.0, {"feedback": " ".join(sorted(answers))})
"""


def model(server) -> dict:
    return {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_16_threads_within_max_concurrency_get_no_429(tmp_path, isolation):
    path = write_metric(tmp_path, THREADED_METRIC)
    with DevServer(lambda request: "PASS", delay=0.03, max_concurrent=4) as server, skynet_dspy.load_metric(
        path, metric_lm=model(server), isolation=isolation, judge_max_concurrency=4, judge_cache=False,
        workers=4,
    ) as metric, ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda n: metric.score({"q": n}, f"answer {n}"), range(32)))
        assert server.rate_limited == 0 and server.most_in_progress <= 4
        assert len(server.requests) == 32 * 4
    assert all(result.ok for result in results), [r.detail for r in results if not r.ok][:3]


def test_without_the_limit_the_same_load_is_rate_limited():
    with DevServer(lambda request: "PASS", delay=0.03, max_concurrent=4) as server:
        judge = Judge(metric_lm=model(server), cache=False, max_retries=0)
        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(lambda n: _try(judge, f"x{n}"), range(64)))
        assert server.rate_limited > 0 and "RateLimitError" in " ".join(outcomes)
        limited = Judge(metric_lm=model(server), cache=False, max_retries=0, max_concurrency=4)
        server.rate_limited = 0
        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(lambda n: _try(limited, f"y{n}"), range(64)))
        assert server.rate_limited == 0 and set(outcomes) == {"PASS"}


def _try(judge: Judge, text: str) -> str:
    try:
        return judge.complete("Grade.", text)
    except LLMCallError as exc:
        return str(exc)


def test_rpm_spreads_requests_evenly_after_a_small_burst(server):
    judge = Judge(metric_lm=model(server), cache=False, rpm=120)  # one every 0.5 s, a burst of 6
    started = time.time()  # the clock of the server's Request.at
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda n: judge.complete("Grade.", f"x{n}"), range(12)))
    times = sorted(request.at - started for request in server.requests)
    assert len(times) == 12
    assert times[5] < 2.5  # the burst (a limiter spacing it would make it at least 2.5 s)
    # then one every 60/R s, never a minute's quota at once: the j-th after the burst is released j x 0.5 s after
    # the start at the earliest (lower bounds only: a busy machine delivers requests later, never earlier)
    assert all(times[5 + j] >= 0.5 * j - 0.05 for j in range(1, 7)), times


def test_a_lone_429_is_retried_alone_after_its_retry_after(server):
    """A sporadic 429 costs only its own request the wait: another metric's request to the endpoint goes on (when
    429s cluster, the endpoint pauses: test_contention.py)."""
    server.fail_next(status=429, retry_after=1.0)
    judge = Judge(metric_lm=model(server), cache=False, max_retries=2)
    first = threading.Thread(target=judge.complete, args=("Grade.", "first"))
    first.start()
    deadline = time.monotonic() + 5
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the first got its 429 by now
    other = Judge(metric_lm=model(server), cache=False)  # another judge (another metric) on the same endpoint
    assert other.complete("Grade.", "second") == "ok"
    first.join(10)
    limited_at = server.requests[0].at
    assert [request.user for request in server.requests] == ["first", "second", "first"]
    assert server.requests[2].at - limited_at >= 0.9


def test_x_ratelimit_reset_headers_give_the_wait():
    class Limited(Exception):
        status_code = 429

        def __init__(self, headers):
            super().__init__("rate limited")
            self.litellm_response_headers = headers

    assert retry.retry_after(Limited({"x-ratelimit-reset-requests": "1.5s", "x-ratelimit-reset-tokens": "6m0s",
                                      "x-ratelimit-remaining-requests": "0"})) == 1.5
    assert retry.retry_after(Limited({"x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "0",
                                      "x-ratelimit-reset-requests": "20ms"})) == retry.MAX_RETRY_DELAY  # 6 min
    assert retry.retry_after(Limited({"x-ratelimit-reset-requests": "250ms"})) == 0.25
    assert retry.retry_after(Limited({"x-ratelimit-reset-requests": "soon"})) is None


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_endpoint_fails_at_once_and_opens_its_breaker():
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    judge = Judge(metric_lm={"model": "openai/gpt-4o-mini", "api_base": base, "api_key": KEY}, cache=False)
    messages = [_try(judge, f"x{n}") for n in range(6)]
    assert "cannot be reached" in messages[0] and "Connection" in messages[0]  # not retried
    assert all("could not be reached a moment ago" in message and base in message for message in messages[1:])
    assert judge.usage.requests == 1 and judge.usage.retries == 0 and judge.usage.failed == 6


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("where", ["instructions", "input"])
def test_a_lone_surrogate_is_the_metrics_value_error_and_nothing_is_sent(server, tmp_path, isolation, where):
    call = 'llm("Grade \\ud83d.", input="x")' if where == "instructions" else 'llm("Grade.", input="half \\ud83d")'
    path = write_metric(tmp_path, f"from skynet import llm\n\ndef score(input, output, expected=None):\n"
                                  f"    return (1.0, {{'feedback': {call}}})\n")
    with skynet_dspy.load_metric(path, metric_lm=model(server), isolation=isolation) as metric:
        started = time.monotonic()
        result = metric.score({"q": 1}, "out")
        elapsed = time.monotonic() - started
    assert result.failure == "exception" and "ValueError" in result.detail
    assert f"llm() {where} holds text that cannot be sent" in result.detail
    assert not server.requests and elapsed < 5


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
@pytest.mark.parametrize("option", ["judge_max_concurrency", "judge_rpm"])
def test_a_bad_limit_is_refused_naming_the_option(metrics_dir, option, bad):
    with pytest.raises(ValueError, match=rf"{option} must be a whole number of requests, at least 1"):
        skynet_dspy.load_metric(metrics_dir / "judge.py", **{option: bad})


def test_gepa_passes_the_limits_to_its_metric(tmp_path):
    path = write_metric(tmp_path, THREADED_METRIC)
    with DevServer(lambda request: "PASS", delay=0.03, max_concurrent=1) as server:
        optimizer = skynet_dspy.gepa(path, reflection_lm=model(server), judge_max_concurrency=1, judge_rpm=6000,
                                     judge_cache=False, max_metric_calls=10)
        with optimizer.skynet_metric as metric, ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda n: metric.score({"q": n}, f"answer {n}"), range(4)))
        assert server.rate_limited == 0 and len(server.requests) == 16
    assert all(result.ok for result in results)


def test_the_cli_takes_the_limits(tmp_path, capsys, monkeypatch):
    from skynet_dspy._cli import main

    path = write_metric(tmp_path, THREADED_METRIC)
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"input": {"q": 1}, "output": "a", "expected": {"x": 1}}\n', encoding="utf-8")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with DevServer(lambda request: "PASS", delay=0.03, max_concurrent=1) as server:
        main(["check", str(path), "--data", str(cases), "--metric-lm", "openai/gpt-4o-mini", "--api-base",
              server.url, "--judge-max-concurrency", "1", "--judge-rpm", "6000"])
        assert server.requests and server.rate_limited == 0
    assert main(["check", str(path), "--data", str(cases), "--judge-rpm", "0"]) == 2
    assert "'0' is not a number of requests, 1 or more" in capsys.readouterr().err


def test_a_dropped_connection_is_retried_as_usual_not_as_unreachable(server):
    server.fail_next(close_connection=True, times=3)
    judge = Judge(metric_lm=model(server), cache=False, retry_base_delay=0.01)
    assert judge.complete("Grade.", "x") == "ok" and len(server.requests) == 4
