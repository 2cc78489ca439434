"""Benchmark 13: sporadic 429s (one request in twenty) against a judge that answers in 50-300 ms.

The same distinct requests (no cache) from 8 threads, four ways: the skynet-dspy judge (a lone 429 is retried
alone after its Retry-After; the endpoint pauses only when 429s follow each other); the same judge never pausing
others (each 429 retried alone: the baseline); the same judge pausing the whole endpoint on every 429 (v0.3);
and dspy.LM's own retry (LiteLLM's num_retries, which retries at once, ignoring Retry-After), for reference.
Target: the judge's wall time at most 1.3x the baseline's.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from benchmarks.common import KEY, MODEL
from skynet_dspy._judge import Judge, limits
from skynet_dspy.devserver import DevServer

THREADS = 8
EVERY = 20  # one request in EVERY is answered 429
RETRY_AFTER = 1.0  # seconds the 429 asks to wait
TARGET = 1.3


def _answer(request: Any) -> str:
    time.sleep(random.uniform(0.05, 0.3))
    return "PASS"


def _timed(requests: int, ask: Any) -> dict[str, Any]:
    ask(-1)  # LiteLLM's first call (its set-up, a connection) before the clock starts
    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        answered = sum(pool.map(ask, range(requests)))
    return {"seconds": round(time.perf_counter() - started, 3), "answered": answered}


def _judge_run(requests: int, label: str, pausing: str = "adaptive") -> dict[str, Any]:
    """`pausing`: "adaptive" (as shipped), "never" (each 429 retried alone), "always" (every 429 pauses all)."""
    with DevServer(_answer, rate_limit_every=EVERY, retry_after=RETRY_AFTER) as server:
        judge = Judge(metric_lm={"model": MODEL, "api_base": server.url, "api_key": KEY}, cache=False)
        original = limits.EndpointState.rate_limited

        def forced(state: limits.EndpointState, seconds: float) -> None:
            state.throttled = pausing == "always"  # as if the last answer was a 429 (always), or never
            original(state, seconds)

        if pausing != "adaptive":
            limits.EndpointState.rate_limited = forced  # type: ignore[method-assign]
        try:
            found = _timed(requests, lambda n: judge.complete("Grade.", f"{label} {n}") == "PASS")
        finally:
            limits.EndpointState.rate_limited = original  # type: ignore[method-assign]
        return {**found, "rate_limited": server.rate_limited, "sent": len(server.requests)}


def _dspy_run(requests: int) -> dict[str, Any]:
    with DevServer(_answer, rate_limit_every=EVERY, retry_after=RETRY_AFTER) as server:
        lm = dspy.LM(MODEL, api_base=server.url, api_key=KEY, cache=False, num_retries=4)
        found = _timed(requests, lambda n: lm(messages=[{"role": "user", "content": f"dspy {n}"}])[0] == "PASS")
        return {**found, "rate_limited": server.rate_limited, "sent": len(server.requests)}


def run(requests: int) -> dict[str, Any]:
    return {"threads": THREADS, "every": EVERY, "retry_after": RETRY_AFTER, "requests": requests,
            "judge": _judge_run(requests, "adaptive"),
            "never_pause": _judge_run(requests, "alone", "never"),
            "pause_every_429": _judge_run(requests, "pausing", "always"),
            "dspy_lm": _dspy_run(requests)}


def rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The benchmark's row for the table of benchmarks/run.py."""
    mine, base, paused, lm = found["judge"], found["never_pause"], found["pause_every_429"], found["dspy_lm"]

    def text(part: dict[str, Any]) -> str:
        return f"{part['seconds']:.1f} s, {part['rate_limited']} × 429, {part['answered']:,} answered"

    ratio = mine["seconds"] / max(base["seconds"], 1e-9)
    return [(
        f"13. {found['requests']:,} judge requests from {found['threads']} threads, a 50-300 ms judge answering "
        f"429 (Retry-After {found['retry_after']:g} s) to one request in {found['every']}: the judge vs the same "
        "judge never pausing others, beside dspy.LM's own retry",
        f"judge: {text(mine)}",
        f"never pausing others: {text(base)}; pausing on every 429 (v0.3): {text(paused)}; "
        f"dspy.LM(num_retries=4), no wait: {text(lm)}",
        f"{ratio:.2f}× the baseline (v0.3: {paused['seconds'] / max(base['seconds'], 1e-9):.2f}×; "
        f"dspy.LM: {lm['seconds'] / max(base['seconds'], 1e-9):.2f}×)",
        f"≤ {TARGET}×: {'met' if ratio <= TARGET else '**missed**'}",
    )]


if __name__ == "__main__":
    import json

    print(json.dumps(run(80), indent=2))
