"""Benchmark 9: the worker pool with a metric that allocates a model at import, template vs fresh interpreters.

Each start mode runs in a process of its own (so the figures of one never include the other's pages):
the pool's memory (PSS of the user's process, of the template or warden, and of every worker, from
/proc/<pid>/smaps_rollup) after dspy.Evaluate(num_threads=8) made it grow to 8 workers; the time from
load_metric() until 8 workers are ready; the time to replace a worker killed at its timeout; and the
median per-call overhead of `metric.score` (a score that returns at once).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

MODES = ("template", "fresh")
WORKERS = 8
GOALS = {"memory_ratio": 1.5, "ready_over_import_s": 0.5, "replace_ms": 50.0, "overhead_us": 150.0}

METRIC = """
import os, time
MODEL = bytearray(os.urandom(1)) * ({mb} * 2**20)  # a model loaded at import: {mb} MiB, every page written

def score(input, output, expected=None):
    if input.get("sleep"):
        time.sleep(input["sleep"])
    while input.get("hold") and not os.path.exists(input["hold"]):  # held until the benchmark lets go
        time.sleep(0.005)
    return 1.0, {{"feedback": "ok"}}
"""


def run(megabytes: int, calls: int, hang_timeout: float) -> dict[str, Any]:
    """Both start modes, each in a fresh process: their figures side by side."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model_metric.py"
        path.write_text(textwrap.dedent(METRIC.format(mb=megabytes)), encoding="utf-8")
        found: dict[str, Any] = {"megabytes": megabytes, "workers": WORKERS, "goals": GOALS}
        for mode in MODES:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.worker_pool", mode, str(path), str(calls), str(hang_timeout)],
                capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent.parent,
            )
            if done.returncode != 0:
                raise RuntimeError(f"benchmark 9 ({mode}) failed: {done.stderr[-2000:]}")
            found[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _pss(pid: int) -> int:
    """Proportional set size of `pid` in bytes (shared pages divided among the processes sharing them)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(mode: str, path: str, calls: int, hang_timeout: float) -> dict[str, Any]:
    os.environ["SKYNET_DSPY_WORKER_START"] = mode
    import dspy

    import skynet_dspy

    class Sleeper(dspy.Module):
        def forward(self, sleep: float) -> dspy.Prediction:
            return dspy.Prediction(answer="x")

    started = time.perf_counter()
    metric = skynet_dspy.load_metric(path, timeout=120, workers=WORKERS, to_output=lambda prediction: {})
    import_s = time.perf_counter() - started  # one import of the metric (and its process's start)
    executor = metric.scorer.executor
    # 8 calls held until 8 workers are ready: none can take a worker another call gave back
    release = Path(path).with_suffix(f".{mode}.release")
    held = {"hold": str(release)}
    threads = [threading.Thread(target=metric.score, args=(held, "x")) for _ in range(WORKERS)]
    grown = time.perf_counter()
    for thread in threads:
        thread.start()
    while len(executor.worker_pids) < WORKERS and time.perf_counter() - grown < 300:
        time.sleep(0.002)
    ready_s = time.perf_counter() - grown
    release.touch()
    for thread in threads:
        thread.join()
    devset = [dspy.Example(sleep=0.05).with_inputs("sleep") for _ in range(4 * WORKERS)]
    dspy.Evaluate(devset=devset, metric=metric, num_threads=WORKERS, display_progress=False)(Sleeper())
    user, workers = os.getpid(), executor.worker_pids
    helpers = [helper.pid for helper in executor._helpers if helper.pid not in workers]  # a fresh worker is its own
    memory = {
        "user_pss": _pss(user),
        "helpers_pss": sum(map(_pss, helpers)),
        "workers_pss": sum(map(_pss, workers)),
        "workers": len(workers),
        "one_worker_rss": max(map(_rss, workers)),
    }
    memory["pool_pss"] = memory["helpers_pss"] + memory["workers_pss"]
    memory["ratio"] = memory["pool_pss"] / memory["one_worker_rss"]
    timings = []
    for _ in range(calls):
        mark = time.perf_counter()
        metric.score({}, "x")
        timings.append(time.perf_counter() - mark)
    metric.close()

    hung = skynet_dspy.load_metric(path, timeout=hang_timeout, workers=1)
    hung.score({}, "x")
    normal = statistics.median(_timed(hung) for _ in range(20))
    hung.score({"sleep": hang_timeout * 10}, "x")  # killed at its timeout
    replaced = _timed(hung)  # the next call: a new worker, then the call
    hung.close()
    return {
        "start_mode": executor.start_mode,
        "import_s": import_s,
        "ready_s": ready_s,
        "replace_ms": max(0.0, replaced - normal) * 1000,
        "overhead_us": statistics.median(timings) * 1e6,
        "memory": memory,
    }


def _timed(metric: Any) -> float:
    mark = time.perf_counter()
    metric.score({}, "x")
    return time.perf_counter() - mark


def rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The table rows of benchmark 9: template (skynet-dspy's default) vs fresh interpreters (the baseline)."""
    template, fresh = found["template"], found["fresh"]
    mib = 2**20

    def memory(part: dict[str, Any]) -> str:
        m = part["memory"]
        return (f"pool {m['pool_pss'] / mib:,.0f} MiB PSS ({m['workers']} workers), user's process "
                f"{m['user_pss'] / mib:,.0f} MiB, one worker's RSS {m['one_worker_rss'] / mib:,.0f} MiB: "
                f"{m['ratio']:.2f}× one worker")

    def ready(part: dict[str, Any]) -> str:
        return f"{part['ready_s']:.2f} s (one import: {part['import_s']:.2f} s)"

    title = f"9{{}}. Worker pool, a {found['megabytes']} MiB model at import, dspy.Evaluate(num_threads={WORKERS}): "
    ratio = template["memory"]["ratio"]
    return [
        (title.format("a") + "the pool's memory above the user's process", memory(template), memory(fresh),
         f"{fresh['memory']['pool_pss'] / max(template['memory']['pool_pss'], 1):.1f}× less",
         f"≤ {GOALS['memory_ratio']}× one worker: {'met' if ratio <= GOALS['memory_ratio'] else 'missed'}"),
        (title.format("b") + f"until {WORKERS} workers are ready", ready(template), ready(fresh),
         f"{template['ready_s'] - fresh['ready_s']:+.2f} s",
         f"≤ import + {GOALS['ready_over_import_s']} s: "
         f"{'met' if template['ready_s'] <= GOALS['ready_over_import_s'] else 'missed'}"),
        (title.format("c") + "a worker killed at its timeout, replaced", f"{template['replace_ms']:.0f} ms",
         f"{fresh['replace_ms']:.0f} ms", f"{template['replace_ms'] - fresh['replace_ms']:+.0f} ms",
         f"≤ {GOALS['replace_ms']:g} ms: {'met' if template['replace_ms'] <= GOALS['replace_ms'] else 'missed'}"),
        (title.format("d") + "per-call overhead, median", f"{template['overhead_us']:.0f} µs",
         f"{fresh['overhead_us']:.0f} µs", f"{template['overhead_us'] - fresh['overhead_us']:+.0f} µs",
         f"≤ {GOALS['overhead_us']:g} µs: "
         f"{'met' if template['overhead_us'] <= GOALS['overhead_us'] else 'missed'}"),
    ]


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
