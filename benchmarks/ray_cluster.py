"""Benchmark 9: isolation="ray" on a local Ray against isolation="process", side by side in one run.

a. **Per-call overhead**: `metric.score(input, output, expected)` on the exact-match metric, from another thread,
   one call at a time, ray and process alternating; against the bare score.
b. **Throughput of a CPU-bound metric** (benchmarks/metrics/cpu_bound.py, about 20 ms of pure Python per call)
   under dspy.Evaluate(num_threads=4): the node's worker pool does the work in both, so on one machine ray
   costs its own overhead, and pays off only with more machines.
c. **The driver's cost per call**: the user's process's CPU time per call (all its threads: DSPy's, the
   package's and Ray's own) with many calls in flight, and the calls per second one driver core can sustain
   at that cost (1000 / CPU ms per call): the ceiling for a large cluster, on paper. Where it goes: the CPU of
   the calling Python threads against Ray's own (C++) threads (from /proc), and the Python functions that take
   the most of the former (cProfile in each calling thread).
d. **Starting a local Ray**: `ray.init()` alone against the package's start of a local Ray (its helper process,
   then connecting), each in a fresh process from `import ray` on, alternated; and a whole
   `load_metric(isolation="ray")` from nothing (Ray started, the node host up, the metric loaded).

Ray is started by the package (as a user without a cluster would get it) unless this process is connected already.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import skynet_dspy
from benchmarks.common import METRICS, bare_score, echo_devset, on_another_thread, timed_evaluate
from benchmarks.timing import summarize_ns

EXACT = METRICS / "exact_match.py"
CPU_BOUND = METRICS / "cpu_bound.py"
EVALUATE_THREADS = 4
DRIVER_THREADS = 16  # calls in flight when the driver's CPU per call is measured


def run(calls: int = 2000, cpu_examples: int = 100, driver_calls: int = 2000, starts: int = 2) -> dict[str, Any]:
    """Figures a, b, c and d (see the module's docstring)."""
    start = _starts(starts)
    started = time.perf_counter()
    ray_metric = skynet_dspy.load_metric(EXACT, isolation="ray")
    ray_start_s = time.perf_counter() - started
    process_metric = skynet_dspy.load_metric(EXACT)
    try:
        per_call = on_another_thread(lambda: _per_call(
            {"bare": bare_score(EXACT), "process": process_metric.score, "ray": ray_metric.score}, calls))
        driver = {name: _driver_cost(metric, driver_calls) for name, metric in
                  (("process", process_metric), ("ray", ray_metric))}
        where = _where(ray_metric, driver_calls)
        ray_workers = sum(len(host["workers"]) for host in ray_metric.scorer.executor.host_pids())
        cpu = _cpu_bound(cpu_examples)
        failures = {name: sum(v for k, v in metric.stats.items() if k not in ("calls", "memo_hits"))
                    for name, metric in (("process", process_metric), ("ray", ray_metric))}
    finally:
        ray_metric.close()
        process_metric.close()
    bare = per_call["bare"]
    return {
        "calls": calls, "ray_start_s": ray_start_s, "ray_version": _ray_version(),
        "per_call": {name: {**figures, "overhead_median_us": figures["median_us"] - bare["median_us"]}
                     for name, figures in per_call.items()},
        "driver": driver, "driver_threads": DRIVER_THREADS, "cpu_bound": cpu, "failures": failures,
        "ray_workers_after_runs": ray_workers, "start": start, "where": where,
    }


def _per_call(timed: dict[str, Any], calls: int, warmup: int = 100) -> dict[str, dict[str, float]]:
    samples = {name: array("q") for name in timed}
    values = ({"ticket": "Ticket 1"}, "bug", {"label": "bug"})
    names = list(timed)
    for i in range(warmup + calls):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = perf_counter_ns()
            timed[name](*values)
            if i >= warmup:
                samples[name].append(perf_counter_ns() - t0)
    return {name: summarize_ns(found) for name, found in samples.items()}


def _driver_cost(metric: Any, calls: int) -> dict[str, float]:
    """`calls` calls from DRIVER_THREADS threads at once: wall time, and this process's CPU time per call."""
    per_thread = max(1, calls // DRIVER_THREADS)
    values = ({"ticket": "Ticket 2"}, "bug", {"label": "bug"})

    def work() -> None:
        for _ in range(per_thread):
            metric.score(*values)

    threads = [threading.Thread(target=work) for _ in range(DRIVER_THREADS)]
    start, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    done = per_thread * DRIVER_THREADS
    cpu_ms = cpu / done * 1000
    return {"calls": done, "calls_per_s": done / seconds, "driver_cpu_ms_per_call": cpu_ms,
            "sustainable_calls_per_s": 1000 / cpu_ms if cpu_ms > 0 else float("inf")}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads so far: the Python ones (named as the process) and Ray's own
    (named by Ray: its C++ threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/comm") as file:
        process = file.read().strip()
    found = {"python": 0.0, "ray": 0.0}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as file:
                name, rest = file.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        found["python" if name.partition("(")[2] == process else "ray"] += (int(fields[11]) + int(fields[12])) / ticks
    return found


def _where(metric: Any, calls: int) -> dict[str, Any]:
    """Where the driver's CPU goes: Python threads against Ray's, and the costliest Python functions."""
    per_thread = max(1, calls // DRIVER_THREADS)
    values = ({"ticket": "Ticket 3"}, "bug", {"label": "bug"})
    profiles: list[cProfile.Profile] = []

    def work() -> None:
        profile = cProfile.Profile(time.thread_time)  # this thread's CPU, not its waits
        profile.enable()
        for _ in range(per_thread):
            metric.score(*values)
        profile.disable()
        profiles.append(profile)

    before, cpu = _thread_cpu(), time.process_time()
    threads = [threading.Thread(target=work) for _ in range(DRIVER_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after, cpu = _thread_cpu(), time.process_time() - cpu
    done = per_thread * DRIVER_THREADS
    ray_threads = after["ray"] - before["ray"]  # Ray's threads live on; the calling threads have ended
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    total = sum(entry[2] for entry in stats.stats.values()) or 1.0  # type: ignore[attr-defined]
    top = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:8]  # type: ignore[attr-defined]
    return {
        "calls": done,
        "python_ms_per_call": (cpu - ray_threads) / done * 1000,
        "ray_threads_ms_per_call": ray_threads / done * 1000,
        "top": [{"function": f"{Path(file).name}:{line} {name}", "share": entry[2] / total}
                for (file, line, name), entry in top],
    }


_INIT_ALONE = """
import json, sys, time
started = time.perf_counter()
import ray
ray.init(configure_logging=False, log_to_driver=False)
print(json.dumps({"s": time.perf_counter() - started}))
ray.shutdown()
"""
_PACKAGE_START = """
import json, sys, time
from skynet_dspy._core.isolation.ray_session import session
started = time.perf_counter()
ray = session.acquire(None)
seconds = time.perf_counter() - started
print(json.dumps({"s": seconds}))
session.release(ray)
"""
_LOAD = """
import json, sys, time
import skynet_dspy
started = time.perf_counter()
metric = skynet_dspy.load_metric(sys.argv[1], isolation="ray")
loaded = time.perf_counter() - started
started = time.perf_counter()
metric.close()
print(json.dumps({"s": loaded, "close": time.perf_counter() - started}))
"""


def _probe(code: str) -> dict[str, float]:
    """The figures one fresh process prints (its first line); it is ended if it does not exit after them."""
    with subprocess.Popen([sys.executable, "-c", code, str(EXACT)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}) as probe:
        assert probe.stdout is not None
        line = probe.stdout.readline()
        try:
            probe.wait(120)
        except subprocess.TimeoutExpired:
            probe.kill()
    if not line.strip():
        raise RuntimeError(f"starting Ray failed (exit code {probe.returncode})")
    return dict(json.loads(line))


def _starts(rounds: int) -> dict[str, Any]:
    """Seconds to start a local Ray: ray.init() alone and the package's, alternated, each in a fresh process."""
    found: dict[str, list[float]] = {"ray_init": [], "package": [], "load_metric": [], "close": []}
    for _ in range(rounds):
        for name, code in (("ray_init", _INIT_ALONE), ("package", _PACKAGE_START), ("load_metric", _LOAD)):
            figures = _probe(code)
            found[name].append(figures["s"])
            if "close" in figures:
                found["close"].append(figures["close"])
    return {name: sorted(values)[len(values) // 2] for name, values in found.items()} | {"rounds": rounds}


def _cpu_bound(examples: int) -> dict[str, Any]:
    metrics = {name: skynet_dspy.load_metric(CPU_BOUND, isolation=name) for name in ("process", "ray")}
    try:
        for name, metric in metrics.items():
            timed_evaluate(metric, echo_devset(f"{name} warm-up", 2 * EVALUATE_THREADS), EVALUATE_THREADS)
        return {name: timed_evaluate(metric, echo_devset(f"{name} timed", examples), EVALUATE_THREADS)
                for name, metric in metrics.items()} | {"examples": examples, "threads": EVALUATE_THREADS}
    finally:
        for metric in metrics.values():
            metric.close()


def _ray_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None


def _ratio(driver: dict[str, Any], key: str) -> float:
    return driver["ray"][key] / driver["process"][key] if driver["process"][key] else float("nan")


def _us(value: float) -> str:
    return f"{value:,.1f} µs" if abs(value) < 1000 else f"{value / 1000:,.2f} ms"


def rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The table's rows 11a-11d."""
    per_call, driver, cpu = found["per_call"], found["driver"], found["cpu_bound"]
    start, where = found["start"], found["where"]
    top = "; ".join(f"{entry['function']} {entry['share']:.0%}" for entry in where["top"][:4])
    ray, process = per_call["ray"], per_call["process"]
    return [
        (
            f"11a. Per-call overhead, `metric.score(...)` with isolation=\"ray\" (a local Ray {found['ray_version']}, "
            f"started in {found['ray_start_s']:.1f} s) from another thread, {found['calls']:,} calls, one at a time",
            f"ray: median {_us(ray['median_us'])}, p90 {_us(ray['p90_us'])}",
            f"isolation=\"process\": median {_us(process['median_us'])}, p90 {_us(process['p90_us'])}; the "
            f"metric's own function alone: median {_us(per_call['bare']['median_us'])}",
            f"ray +{_us(ray['overhead_median_us'])} median over the function alone, "
            f"{ray['median_us'] / process['median_us']:.1f}× process",
            "figures only",
        ),
        (
            f"11b. CPU-bound metric, `dspy.Evaluate(num_threads={cpu['threads']})`, {cpu['examples']} examples, "
            "one machine",
            f"ray: {cpu['ray']['examples_per_s']:.1f} examples/s (driver {cpu['ray']['cpu_ms_per_example']:.1f} ms "
            "CPU per example)",
            f"isolation=\"process\": {cpu['process']['examples_per_s']:.1f} examples/s "
            f"({cpu['process']['cpu_ms_per_example']:.1f} ms CPU per example)",
            f"ray {cpu['ray']['examples_per_s'] / cpu['process']['examples_per_s']:.2f}× process (on one machine ray "
            "only adds its overhead; it scales with nodes)",
            "figures only",
        ),
        (
            f"11c. The driver's CPU per call, {driver['ray']['calls']:,} calls from {found['driver_threads']} threads "
            "at once (trivial metric)",
            f"ray: {driver['ray']['driver_cpu_ms_per_call']:.2f} ms CPU per call, {driver['ray']['calls_per_s']:.0f} "
            f"calls/s here; one driver core sustains ≈{driver['ray']['sustainable_calls_per_s']:,.0f} calls/s",
            f"isolation=\"process\": {driver['process']['driver_cpu_ms_per_call']:.2f} ms CPU per call, "
            f"{driver['process']['calls_per_s']:.0f} calls/s",
            f"ray costs the driver {_ratio(driver, 'driver_cpu_ms_per_call'):.1f}× process per call; of it, the "
            f"calling Python threads {where['python_ms_per_call']:.2f} ms and Ray's own threads "
            f"{where['ray_threads_ms_per_call']:.2f} ms per call (profiled run); the calling threads' CPU by "
            f"function (own time, the 4 largest): {top}",
            "target ≥2,000 calls/s per driver core",
        ),
        (
            f"11d. Starting a local Ray, each in a fresh process from `import ray` on (median of {start['rounds']})",
            f"the package's local Ray (helper process, then connected): {start['package']:.1f} s; a whole "
            f"`load_metric(isolation=\"ray\")`: {start['load_metric']:.1f} s, its close() {start['close']:.1f} s",
            f"`ray.init()` alone: {start['ray_init']:.1f} s",
            f"{start['package'] / start['ray_init']:.2f}× ray.init() alone",
            "at most 1.5×",
        ),
    ]
