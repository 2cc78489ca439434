"""Benchmark 9: what sandbox=True (each worker inside bubblewrap) costs, side by side with the plain worker.

12a. **Per-call overhead**: `metric.score(input, output, expected)` on the exact-match metric, from another thread,
    with sandbox=False and sandbox=True, timed back to back in a rotating order against the bare `score()`.
12b. **Worker start**: `load_metric(...)` (one new worker process started and the metric loaded in it), a fresh
    metric each time, both ways in turn; the sandbox's one-off trial start (at its first load_metric in a
    process) is timed apart.
"""

from __future__ import annotations

import gc
import shutil
import statistics
from array import array
from time import perf_counter, perf_counter_ns
from typing import Any

import skynet_dspy
from benchmarks.common import METRICS, bare_score, on_another_thread
from benchmarks.timing import summarize_ns

EXACT = METRICS / "exact_match.py"
WAYS = ("plain", "sandbox")


def run(calls: int, starts: int, warmup: int = 200) -> dict[str, Any]:
    """Time `calls` calls and `starts` worker starts each way; {"skipped": why} without bubblewrap."""
    if shutil.which("bwrap") is None:
        return {"skipped": "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"}
    mark = perf_counter()
    skynet_dspy.load_metric(EXACT, sandbox=True).close()  # the trial sandbox runs once per process: timed here
    first_load_s = perf_counter() - mark
    start_s: dict[str, list[float]] = {way: [] for way in WAYS}
    for k in range(starts):
        for way in (WAYS if k % 2 == 0 else WAYS[::-1]):
            mark = perf_counter()
            metric = skynet_dspy.load_metric(EXACT, sandbox=way == "sandbox")
            start_s[way].append(perf_counter() - mark)
            metric.close()
    metrics = {way: skynet_dspy.load_metric(EXACT, sandbox=way == "sandbox") for way in WAYS}
    try:
        timed = {"bare": bare_score(EXACT), **{way: metric.score for way, metric in metrics.items()}}
        samples = on_another_thread(lambda: _loop(timed, calls, warmup))
        failures = {way: sum(v for k, v in metric.stats.items() if k not in ("calls", "memo_hits"))
                    for way, metric in metrics.items()}
    finally:
        for metric in metrics.values():
            metric.close()
    bare = summarize_ns(samples["bare"])
    out: dict[str, Any] = {"calls": calls, "starts": starts, "bare": bare, "first_sandboxed_load_s": first_load_s}
    for way in WAYS:
        figures = summarize_ns(samples[way])
        out[way] = {**figures, "overhead_median_us": figures["median_us"] - bare["median_us"],
                    "failures": failures[way], "start_median_ms": statistics.median(start_s[way]) * 1000,
                    "start_max_ms": max(start_s[way]) * 1000}
    return out


def _loop(timed: dict[str, Any], calls: int, warmup: int) -> dict[str, array]:
    names = list(timed)
    samples = {name: array("q") for name in names}
    gc.collect()
    for i in range(warmup + calls):
        values = ({"ticket": f"Ticket {i % 4}"}, ("bug", "billing")[i % 2], {"label": "bug"})
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = perf_counter_ns()
            timed[name](*values)
            elapsed = perf_counter_ns() - t0
            if i >= warmup:
                samples[name].append(elapsed)
    return samples
