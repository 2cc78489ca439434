"""Benchmark 9: what sandbox=True (each worker inside bubblewrap) costs, side by side with the plain worker.

12a. **Per-call overhead**: `metric.score(input, output, expected)` on the exact-match metric, from another thread,
    with sandbox=False and sandbox=True, timed back to back in a rotating order against the bare `score()`.
12b. **Worker start**: `load_metric(...)` (one new worker process started and the metric loaded in it), a fresh
    metric each time, both ways in turn; the first sandboxed load_metric in a process (its imports, bwrap's
    first start) is timed apart.
12c/d. **The sandboxed pool** of a metric holding a model (benchmark 9's metric, `model_mb` MiB written at
    import), grown to 8 workers by 8 calls held until all 8 are ready: its memory (PSS of every process in the
    sandbox: bubblewrap, the template, the workers) against one worker's RSS, and the time from load_metric's
    return until the 8 are ready, beside one import. Workers forked from a template inside the sandbox (the
    design) side by side with fresh interpreters in sandboxes of their own (the design before: each imports
    the metric), each in a process of its own.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from array import array
from pathlib import Path
from time import perf_counter, perf_counter_ns
from typing import Any

import skynet_dspy
from benchmarks.common import METRICS, bare_score, on_another_thread
from benchmarks.timing import summarize_ns

EXACT = METRICS / "exact_match.py"
WAYS = ("plain", "sandbox")
POOL_MODES = ("template", "fresh")  # workers forked inside the sandbox, or each a sandboxed fresh interpreter
POOL_WORKERS = 8
POOL_GOALS = {"memory_ratio": 1.5, "ready_over_import_s": 0.5}


def run(calls: int, starts: int, warmup: int = 200) -> dict[str, Any]:
    """Time `calls` calls and `starts` worker starts each way; {"skipped": why} without bubblewrap."""
    if shutil.which("bwrap") is None:
        return {"skipped": "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"}
    mark = perf_counter()
    skynet_dspy.load_metric(EXACT, sandbox=True).close()  # the first in this process: timed apart
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


def pool(megabytes: int) -> dict[str, Any]:
    """12c/d: the sandboxed pool of a metric holding `megabytes` MiB, both start modes, each in a process of its own."""
    from benchmarks.worker_pool import METRIC

    if shutil.which("bwrap") is None:
        return {"skipped": "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"}
    found: dict[str, Any] = {"megabytes": megabytes, "workers": POOL_WORKERS, "goals": POOL_GOALS}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model_metric.py"
        path.write_text(textwrap.dedent(METRIC.format(mb=megabytes)), encoding="utf-8")
        for mode in POOL_MODES:
            done = subprocess.run([sys.executable, "-m", "benchmarks.sandbox", mode, str(path)], capture_output=True,
                                  text=True, timeout=900, cwd=Path(__file__).parent.parent)
            if done.returncode != 0:
                raise RuntimeError(f"benchmark 12c ({mode}) failed: {done.stderr[-2000:]}")
            found[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _pool_child(mode: str, path: str) -> dict[str, Any]:
    os.environ["SKYNET_DSPY_WORKER_START"] = mode
    from benchmarks.worker_pool import _pss, _rss
    from skynet_dspy._core.isolation import tree

    skynet_dspy.load_metric(path, sandbox=True, timeout=120).close()  # the first in this process, not timed
    started = time.perf_counter()
    metric = skynet_dspy.load_metric(path, sandbox=True, timeout=120, workers=POOL_WORKERS)
    import_s = time.perf_counter() - started  # a sandbox started and one import of the metric in it
    executor = metric.scorer.executor
    release = Path(path).with_suffix(f".{mode}.release")
    threads = [threading.Thread(target=metric.score, args=({"hold": str(release)}, "x")) for _ in range(POOL_WORKERS)]
    grown = time.perf_counter()
    for thread in threads:
        thread.start()
    while len(executor.worker_pids) < POOL_WORKERS and time.perf_counter() - grown < 600:
        time.sleep(0.002)
    ready_s = time.perf_counter() - grown
    time.sleep(0.5)  # the workers are idle in their held calls: nothing is being written
    workers = executor.worker_pids
    # every process of the sandboxes: bwrap's own, the template (or a fresh worker's interpreter), the workers
    sandboxes = {helper.proc.pid for helper in executor._helpers}
    inside = {pid for box in sandboxes for pid in [box, *tree.descendants(box)]}
    memory = {"pool_pss": sum(map(_pss, inside)), "processes": len(inside), "workers": len(workers),
              "one_worker_rss": max(_rss(worker.pid) for worker in executor._workers)}
    memory["ratio"] = memory["pool_pss"] / memory["one_worker_rss"]
    release.touch()
    for thread in threads:
        thread.join()
    metric.close()
    return {"start_mode": executor.start_mode, "import_s": import_s, "ready_s": ready_s, "memory": memory}


def pool_rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The table rows 12c/d: forked inside the sandbox (the design) vs a fresh interpreter per sandboxed worker."""
    if "skipped" in found:
        return [("12c. The sandboxed pool", found["skipped"], "n/a", "n/a", "not run")]
    forked, fresh = found["template"], found["fresh"]
    mib = 2**20

    def memory(part: dict[str, Any]) -> str:
        m = part["memory"]
        return (f"{m['pool_pss'] / mib:,.0f} MiB PSS in the sandbox ({m['workers']} workers, {m['processes']} "
                f"processes), one worker's RSS {m['one_worker_rss'] / mib:,.0f} MiB: {m['ratio']:.2f}× one worker")

    def ready(part: dict[str, Any]) -> str:
        return f"{part['ready_s']:.2f} s after load_metric (one import in a new sandbox: {part['import_s']:.2f} s)"

    title = f"12{{}}. sandbox=True, a {found['megabytes']} MiB model at import, {POOL_WORKERS} workers: "
    ratio, ready_s = forked["memory"]["ratio"], forked["ready_s"]
    return [
        (title.format("c") + "the pool's memory", "forked in the sandbox: " + memory(forked),
         "a fresh sandboxed interpreter each: " + memory(fresh),
         f"{fresh['memory']['pool_pss'] / max(forked['memory']['pool_pss'], 1):.1f}× less",
         f"≤ {POOL_GOALS['memory_ratio']}× one worker: {'met' if ratio <= POOL_GOALS['memory_ratio'] else 'missed'}"),
        (title.format("d") + f"until {POOL_WORKERS} workers are ready", ready(forked), ready(fresh),
         f"{forked['ready_s'] - fresh['ready_s']:+.2f} s",
         f"≤ import + {POOL_GOALS['ready_over_import_s']} s: "
         f"{'met' if ready_s <= POOL_GOALS['ready_over_import_s'] else 'missed'}"),
    ]


if __name__ == "__main__":
    print(json.dumps(_pool_child(sys.argv[1], sys.argv[2])))
