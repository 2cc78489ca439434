"""Benchmark 4: resident memory over a long run of adapter calls on distinct predictions (the memo is bounded).

Runs in a fresh interpreter (`python -m benchmarks.memory --calls N`, printing JSON) so the
peak RSS is this loop's alone and not the other benchmarks'. In that process, a baseline loop
calls the bare `score` on the same values first, then the adapter loop runs (the default
isolation="process": `score` runs in a worker process); both build a new dspy.Prediction per call.
RSS and peak RSS of this process, and the RSS of the metric's worker processes, are read at 10%,
50% and 100% of each loop.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHECKPOINTS = (0.1, 0.5, 1.0)
# RSS growth allowed over the second half of the adapter loop, by when the memo (4,096 entries) is full:
# an unbounded memo grows by about 1 KB per call there, hundreds of MB over 1,000,000 calls.
FLAT_MB = 4.0


def rss_mb(pid: int | str = "self") -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident memory of this process (or of `pid`), in MB."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "peak_mb": int(fields["VmHWM"].split()[0]) / 1024}
    except (OSError, KeyError, ValueError):
        if pid != "self":
            return {"rss_mb": float("nan"), "peak_mb": float("nan")}
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
        peak_mb = peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
        return {"rss_mb": peak_mb, "peak_mb": peak_mb}


def measure(calls: int) -> dict[str, Any]:
    """Both loops in this process: the bare score first, then the adapter."""
    import dspy

    import skynet_dspy
    from benchmarks.common import bare_score
    from benchmarks.overhead import GOLDS, LABELS, METRIC, _golds

    metric = skynet_dspy.load_metric(METRIC)
    score = bare_score(METRIC)

    def workers_mb() -> float:
        pids = getattr(metric.scorer.executor, "worker_pids", [])
        return sum(rss_mb(pid)["rss_mb"] for pid in pids)
    golds = _golds()
    plain = [(dict(g.inputs()), {"label": g.label}) for g in golds]
    marks = sorted({max(1, round(calls * fraction)) for fraction in CHECKPOINTS})

    def loop(call_one) -> dict[str, Any]:
        readings = [{"calls": 0, **rss_mb(), "workers_rss_mb": workers_mb()}]
        start = time.perf_counter()
        done = 0
        for mark in marks:
            for i in range(done, mark):
                k = i % GOLDS
                call_one(golds[k], plain[k], dspy.Prediction(label=LABELS[(i // GOLDS + k) % 3]))
            done = mark
            readings.append({"calls": mark, **rss_mb(), "workers_rss_mb": workers_mb()})
        return {"seconds": time.perf_counter() - start, "readings": readings}

    baseline = loop(lambda gold, values, pred: score(values[0], pred.label, values[1]))
    adapter = loop(lambda gold, values, pred: metric(gold, pred))
    first, half, last = adapter["readings"][1], adapter["readings"][-2], adapter["readings"][-1]
    stats = metric.stats
    metric.close()
    return {
        "calls": calls,
        "isolation": metric.isolation,
        "baseline": baseline,
        "adapter": adapter,
        "adapter_growth_mb": last["rss_mb"] - first["rss_mb"],
        "adapter_peak_growth_mb": last["peak_mb"] - first["peak_mb"],
        "over_baseline_mb": last["peak_mb"] - baseline["readings"][-1]["peak_mb"],
        "second_half_growth_mb": last["rss_mb"] - half["rss_mb"],
        "workers_growth_mb": last["workers_rss_mb"] - first["workers_rss_mb"],
        "flat_mb": FLAT_MB,
        "target_met": last["rss_mb"] - half["rss_mb"] < FLAT_MB,
        "score_calls": stats.get("calls"),
        "failures": sum(value for key, value in stats.items() if key not in ("calls", "memo_hits")),
    }


def run(calls: int) -> dict[str, Any]:
    """Measure in a fresh interpreter and return its figures."""
    from benchmarks.common import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", "--calls", str(calls)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the memory benchmark failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000, help="adapter calls (and bare calls) to make")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    print(json.dumps(measure(args.calls)))


if __name__ == "__main__":
    main()
