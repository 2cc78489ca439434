"""Benchmark 10: judge requests against a provider's concurrency limit, with and without judge_max_concurrency.

1,000 judge requests (distinct, no cache) from 16 threads against the loopback server, which answers
429 to any request arriving while 4 are in progress (as a provider's concurrency limit does): once with
no limit, where the judge retries each 429 with backoff (and a 429 pauses the endpoint for every
caller), once with `judge_max_concurrency=4`. Reported: 429s received, requests that failed, wall time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.common import KEY, MODEL
from skynet_dspy._judge import Judge
from skynet_dspy.devserver import DevServer
from skynet_dspy.errors import LLMCallError

THREADS = 16
PROVIDER_LIMIT = 4  # requests the server answers at once; more get 429
DELAY = 0.02  # seconds the server takes per answer


def one(requests: int, max_concurrency: int | None, label: str) -> dict[str, Any]:
    """`requests` judge requests from THREADS threads; the server's 429s, the failures, the wall time."""
    with DevServer(lambda request: "PASS", delay=DELAY, max_concurrent=PROVIDER_LIMIT) as server:
        judge = Judge(metric_lm={"model": MODEL, "api_base": server.url, "api_key": KEY}, cache=False,
                      max_concurrency=max_concurrency)

        def ask(number: int) -> bool:
            try:
                judge.complete("Grade.", f"{label} request {number}")
            except LLMCallError:
                return False
            return True

        started = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            answered = sum(pool.map(ask, range(requests)))
        seconds = time.perf_counter() - started
        return {"requests": requests, "answered": answered, "failed": requests - answered,
                "rate_limited": server.rate_limited, "sent": len(server.requests), "seconds": round(seconds, 3)}


def run(requests: int) -> dict[str, Any]:
    """Both rows: no limit (the baseline), then judge_max_concurrency=PROVIDER_LIMIT."""
    return {"threads": THREADS, "provider_limit": PROVIDER_LIMIT,
            "unlimited": one(requests, None, "unlimited"), "limited": one(requests, PROVIDER_LIMIT, "limited")}


def rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The benchmark's row for the table of benchmarks/run.py."""
    mine, base = found["limited"], found["unlimited"]

    def text(part: dict[str, Any]) -> str:
        return (f"{part['rate_limited']:,} × 429, {part['failed']:,} failed, {part['seconds']:.1f} s "
                f"({part['sent']:,} requests sent)")

    return [(
        f"10. {mine['requests']:,} judge requests from {found['threads']} threads, provider limit "
        f"{found['provider_limit']} concurrent: `judge_max_concurrency={found['provider_limit']}` vs no limit",
        text(mine), text(base), f"{base['seconds'] / max(mine['seconds'], 1e-9):.1f}× faster",
        f"no 429: {'met' if mine['rate_limited'] == 0 else '**missed**'}",
    )]


if __name__ == "__main__":
    import json

    print(json.dumps(run(100), indent=2))
