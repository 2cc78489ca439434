"""Benchmarks 6 and 7: what running `score` in a worker process costs per call, and what it buys a CPU-bound metric.

6. **Per-call overhead of each isolation**, on the isolation layer alone: `metric.score(input,
   output, expected)` on plain values (no DSPy translation, no memo) with isolation="process" and
   with isolation="thread", against the bare `score()` on the same values. Timed from another
   thread, where dspy.Evaluate(num_threads > 1) and GEPA call the metric. Each iteration times all of
   them back to back, in a rotating order. When `pebble` is importable, the same loop also times a
   round trip of a trivial function through a pebble `ProcessPool` (one worker, a 60 s timeout per
   task, as the metric's): the reference skynet_dspy/_core/isolation/process.py was measured against
   (a well-kept pool whose own round trip is about the whole overhead budget here).
7. **Throughput of a CPU-bound metric** (benchmarks/metrics/cpu_bound.py: about 20 ms of pure-Python
   work per call) under dspy.Evaluate(num_threads=4), with isolation="process" vs "thread": in
   threads the calls take turns holding the GIL; in worker processes they use every core.
"""

from __future__ import annotations

import gc
import os
from array import array
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import skynet_dspy
from benchmarks.common import METRICS, bare_score, echo_devset, on_another_thread, summarize_ns, timed_evaluate

TARGET_PROCESS_US = 200.0  # issue 32: median overhead per call with isolation="process", quiet 2 cores
TARGET_CPU_SPEEDUP = 1.8  # issue 13: CPU-bound throughput, processes over threads, on 2 cores
EXACT = METRICS / "exact_match.py"
CPU_BOUND = METRICS / "cpu_bound.py"
EVALUATE_THREADS = 4


def trivial(input: Any, output: Any, expected: Any) -> tuple[float, dict[str, str]]:
    """What the pebble reference sends to its worker: a function that does nothing but answer."""
    return 1.0, {"feedback": "Correct."}


def _pebble_pool() -> Any:
    """A started pebble ProcessPool with one worker, or None when pebble is not installed."""
    try:
        from pebble import ProcessPool
    except ImportError:
        return None
    pool = ProcessPool(max_workers=1)
    pool.schedule(trivial, args=({}, "", {}), timeout=60).result()  # the worker is up
    return pool


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def overhead(calls: int, warmup: int = 500) -> dict[str, Any]:
    """Time `calls` calls of each isolation (and of pebble, if installed) against the bare score, on another thread."""
    metrics = {name: skynet_dspy.load_metric(EXACT, isolation=name) for name in ("process", "thread")}
    pool = _pebble_pool()
    try:
        score = bare_score(EXACT)
        values = [({"ticket": f"Ticket {k}"}, label, {"label": "bug"}) for k, label in
                  enumerate(("bug", "billing", "bug", "how-to"))]
        timed: dict[str, Callable[[Any, Any, Any], Any]] = {
            "bare": score,
            "process": metrics["process"].score,
            "thread": metrics["thread"].score,
        }
        if pool is not None:
            timed["pebble"] = lambda i, o, e: pool.schedule(trivial, args=(i, o, e), timeout=60).result()
        looped = on_another_thread(lambda: _loop(timed, values, calls, warmup))
        stats = {name: metric.stats for name, metric in metrics.items()}
    finally:
        for metric in metrics.values():
            metric.close()
        if pool is not None:
            pool.stop()
            pool.join()
    samples, mismatches = looped
    out: dict[str, Any] = {"calls": calls, "warmup": warmup, "pebble_version": _version("pebble")}
    bare = out["bare"] = summarize_ns(samples["bare"])
    for name in ("process", "thread", "pebble"):
        if name not in samples:
            out[name] = None
            continue
        figures = summarize_ns(samples[name])
        out[name] = {
            **figures,
            "overhead_median_us": figures["median_us"] - bare["median_us"],
            "overhead_p90_us": figures["p90_us"] - bare["p90_us"],
            "mismatches": mismatches.get(name, 0),
        }
        if name in stats:
            out[name]["score_calls"] = stats[name]["calls"]
            out[name]["failures"] = sum(v for k, v in stats[name].items() if k not in ("calls", "memo_hits"))
    out["target_us"] = TARGET_PROCESS_US
    out["target_met"] = out["process"]["overhead_median_us"] <= TARGET_PROCESS_US
    return out


def _loop(timed: dict[str, Callable[[Any, Any, Any], Any]], values: list[tuple[Any, Any, Any]], calls: int,
          warmup: int) -> tuple[dict[str, array], dict[str, int]]:
    names = list(timed)
    samples = {name: array("q") for name in names}
    mismatches = dict.fromkeys(names, 0)
    gc.collect()
    for i in range(warmup + calls):
        input_values, output, expected = values[i % len(values)]
        want = None
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = perf_counter_ns()
            got = timed[name](input_values, output, expected)
            elapsed = perf_counter_ns() - t0
            if i >= warmup:
                samples[name].append(elapsed)
            if name in ("process", "thread"):
                want = want or timed["bare"](input_values, output, expected)
                if got.score != want[0] or got.feedback != want[1]["feedback"]:
                    mismatches[name] += 1
    return samples, mismatches


# -- 7. a CPU-bound metric under dspy.Evaluate(num_threads=4) ----------------------------------------


def cpu_bound(examples: int = 200, repeats: int = 2, threads: int = EVALUATE_THREADS) -> dict[str, Any]:
    """dspy.Evaluate(num_threads=threads) on the CPU-bound metric, in worker processes and in threads.

    Each isolation first runs a warm-up Evaluate at the same thread count (so the process pool has grown
    to its size); then the timed runs alternate which isolation goes first, and the fastest of `repeats`
    counts (the others are kept under "repeats_s").
    """
    score = bare_score(CPU_BOUND)
    single = array("q")
    for k in range(5):
        t0 = perf_counter_ns()
        score({"question": f"calibration {k}"}, "", {"answer": ""})
        single.append(perf_counter_ns() - t0)
    metrics = {name: skynet_dspy.load_metric(CPU_BOUND, isolation=name) for name in ("process", "thread")}
    try:
        for name, metric in metrics.items():
            timed_evaluate(metric, echo_devset(f"{name} warm-up", 2 * threads), threads)
        tries: dict[str, list[dict[str, Any]]] = {name: [] for name in metrics}
        for attempt in range(repeats):
            for name in list(metrics)[:: 1 if attempt % 2 == 0 else -1]:
                tries[name].append(timed_evaluate(metrics[name], echo_devset(f"{name} {attempt}", examples), threads))
        stats = {name: metric.stats for name, metric in metrics.items()}
        workers = len(getattr(metrics["process"].scorer.executor, "worker_pids", []))
    finally:
        for metric in metrics.values():
            metric.close()
    out: dict[str, Any] = {
        "examples": examples,
        "threads": threads,
        "repeats": repeats,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "bare_ms_per_call": summarize_ns(single)["median_us"] / 1000,
        "process_workers": workers,
    }
    for name, done in tries.items():
        best = dict(min(done, key=lambda entry: entry["seconds"]))
        best["repeats_s"] = [round(entry["seconds"], 3) for entry in done]
        best["score_calls"] = stats[name]["calls"]
        best["failures"] = sum(v for k, v in stats[name].items() if k not in ("calls", "memo_hits"))
        out[name] = best
    out["speedup"] = out["process"]["examples_per_s"] / out["thread"]["examples_per_s"]
    out["target_speedup"] = TARGET_CPU_SPEEDUP
    out["target_met"] = out["speedup"] >= TARGET_CPU_SPEEDUP
    return out
