"""`make bench`: what skynet-dspy costs per call and to the program, its judge calls, how it scales, its memory.

Fourteen benchmarks, each against its baseline in the same run:

1. per-call overhead: the adapter `metric(gold, pred)` with isolation="process" (the default) and
   with isolation="thread", vs the bare `score(input, output, expected)`;
2. judge requests per dspy.GEPA run on the bundled example: the adapter vs a hand-written LiteLLM metric;
3. dspy.Evaluate throughput with a 50 ms judge at 1-16 threads: the adapter vs the hand-written metric;
4. resident memory over 1,000,000 adapter calls on distinct predictions vs bare score calls;
5. `dspy.Predict` on DummyLM with no metric loaded, a plain metric loaded, a reward() metric loaded
   (each in a fresh process);
6. the isolation layer alone: `metric.score(...)` in a worker process, in a thread, vs the bare
   score; and, when pebble is installed, a pebble ProcessPool round trip for reference;
7. a CPU-bound metric (about 20 ms of pure Python per call) under dspy.Evaluate(num_threads=4):
   worker processes vs threads;
8. the judge cache that outlives the process: two identical dspy.GEPA runs in sequence on one disk
   cache, and two at once in two processes sharing one Redis cache (judge requests and dollars);
9. the worker pool with a 300 MB model loaded at import: workers forked from a template vs fresh
   interpreters (memory, time until 8 workers are ready, replacing a worker, per-call overhead).
10. judge requests from 16 threads against a provider limit of 4 concurrent: judge_max_concurrency=4
    vs none.
11. isolation="ray" on a local Ray vs processes: per-call overhead, a CPU-bound metric's throughput, the
   driver's CPU time per call and the calls/s one driver can sustain (benchmarks/ray_cluster.py).
12. sandbox=True (bubblewrap): per-call overhead and worker start time, with and without the sandbox; the
    sandboxed pool of a 300 MB model (memory, time until 8 workers are ready), forked in the sandbox vs fresh.
13. sporadic 429s (one in twenty) from a 50-300 ms judge: the judge vs dspy.LM's own retry.
14. a rubric metric asking 8 judge questions per output from a 100 ms judge: `async def score` gathering
    `allm()` vs `llm()` one by one (per call, and dspy.Evaluate with 4 threads).

    .venv/bin/python -m benchmarks.run            # full size; writes benchmarks/results/latest.json
    .venv/bin/python -m benchmarks.run --quick    # tiny sizes, seconds; writes nothing unless --out is given

Figures, never assertions: machines are shared and noisy; the table says which targets were met.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

RESULTS = Path(__file__).parent / "results"
LATEST = RESULTS / "latest.json"
NAMES = {1: "overhead", 2: "judge_calls", 3: "threads", 4: "memory", 5: "predict", 6: "isolation", 7: "cpu_bound",
         8: "judge_cache", 9: "worker_pool", 10: "judge_limits", 11: "ray_cluster", 12: "sandbox", 13: "judge_429",
         14: "async_metric"}
ALL = tuple(NAMES)
# The order they run in: the per-call timings first, the long runs last.
ORDER = (1, 6, 12, 5, 7, 9, 4, 2, 8, 10, 13, 14, 3, 11)


@dataclass
class Sizes:
    """How big each benchmark runs."""

    calls: int = 100_000  # 1: adapter calls timed
    gepa_budget: int = 120  # 2: GEPA's max_metric_calls
    gepa_train: int | None = None  # 2: training examples (None: the bundled example's all)
    gepa_val: int | None = None  # 2: validation examples (None: all)
    gepa_threads: int = 4  # 2: GEPA's num_threads
    examples: int = 200  # 3: dspy.Evaluate examples per thread count
    delay: float = 0.05  # 3: seconds the judge takes to answer
    threads: tuple[int, ...] = (1, 2, 4, 8, 16)  # 3
    repeats: int = 2  # 3: runs per point, the fastest counts
    memory_calls: int = 1_000_000  # 4: adapter calls (and bare calls)
    predict_calls: int = 3000  # 5: Predict calls timed per process
    predict_rounds: int = 3  # 5: fresh processes per variant, the least disturbed counts
    predict_warmup: int = 200  # 5: Predict calls before the timed ones
    isolation_calls: int = 20_000  # 6: calls timed per isolation
    cpu_examples: int = 200  # 7: dspy.Evaluate examples per isolation
    cpu_repeats: int = 2  # 7: runs per isolation, the fastest counts
    model_mb: int = 300  # 9: MiB the metric allocates at import
    sandbox_calls: int = 5_000  # 12: calls timed each way
    sandbox_starts: int = 10  # 12: worker starts timed each way
    ray_calls: int = 2000  # 11: calls timed one at a time, and calls from many threads for the driver's CPU
    ray_cpu_examples: int = 100  # 11: dspy.Evaluate examples of the CPU-bound metric per isolation
    ray_starts: int = 3  # 11: fresh processes starting a local Ray, each way
    limit_requests: int = 1000  # 10: judge requests per row
    sporadic_requests: int = 400  # 13: judge requests per row
    async_calls: int = 10  # 14: calls timed per metric
    async_examples: int = 20  # 14: dspy.Evaluate examples per metric


QUICK = Sizes(calls=2_000, gepa_budget=20, gepa_train=6, gepa_val=4, gepa_threads=2, examples=16, delay=0.01,
              repeats=1, memory_calls=20_000, predict_calls=200, predict_rounds=1, predict_warmup=20,
              isolation_calls=500, cpu_examples=8, cpu_repeats=1, model_mb=20, sandbox_calls=200, sandbox_starts=2,
              ray_calls=100, ray_cpu_examples=8, ray_starts=1, limit_requests=40, sporadic_requests=80, async_calls=3,
              async_examples=4)


def _quiet() -> None:
    import dspy  # noqa: F401  (dspy sets its loggers' levels on import; set ours after)

    for name in ("dspy", "gepa", "LiteLLM", "litellm", "httpx", "skynet_dspy"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run(sizes: Sizes, only: tuple[int, ...] = ALL, profile_calls: int = 20_000,
        say: Any = None) -> dict[str, Any]:
    """Run the chosen benchmarks and return every figure (the JSON document)."""
    from benchmarks import machine

    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    _quiet()
    doc: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine.describe(),
        "sizes": asdict(sizes),
    }
    started = time.perf_counter()
    timings: dict[str, float] = {}
    doc["timings_s"] = timings
    total = len(ALL)
    for number in (n for n in ORDER if n in only):
        mark = time.perf_counter()
        doc[NAMES[number]] = _one(number, sizes, profile_calls, lambda text, n=number: say(f"[{n}/{total}] {text}"))
        timings[NAMES[number]] = round(time.perf_counter() - mark, 3)
    doc["seconds"] = time.perf_counter() - started
    try:
        doc["machine"]["load_average_at_end"] = [round(value, 2) for value in os.getloadavg()]
    except OSError:
        pass
    return doc


def _one(number: int, sizes: Sizes, profile_calls: int, say: Any) -> dict[str, Any]:
    if number == 1:
        from benchmarks import overhead

        say(f"per-call overhead: {sizes.calls:,} calls per isolation, on two threads ...")
        found = overhead.run(sizes.calls, warmup=min(1000, sizes.calls))
        for isolation in found["isolations"]:
            for where in ("main_thread", "worker_thread"):
                if not found[where][isolation]["target_met"] and profile_calls:
                    say(f"      isolation={isolation}: target missed on the {where.replace('_', ' ')}; "
                        f"profiling {profile_calls:,} calls ...")
                    found[where][isolation]["profile"] = overhead.profile(
                        profile_calls, worker_thread=where == "worker_thread", isolation=isolation)
        return found
    if number == 2:
        from benchmarks import judge_calls

        say(f"judge requests per GEPA run: budget {sizes.gepa_budget}, twice ...")
        return judge_calls.run(sizes.gepa_budget, sizes.gepa_train, sizes.gepa_val, sizes.gepa_threads)
    if number == 3:
        from benchmarks import threads

        say(f"thread scaling: {sizes.examples} examples at {sizes.delay * 1000:g} ms, threads "
            f"{', '.join(map(str, sizes.threads))}, {sizes.repeats} run(s) each with and without the adapter ...")
        return threads.run(sizes.examples, sizes.delay, sizes.threads, sizes.repeats)
    if number == 4:
        from benchmarks import memory

        say(f"memory: {sizes.memory_calls:,} adapter calls in a fresh process ...")
        return memory.run(sizes.memory_calls)
    if number == 5:
        from benchmarks import predict

        say(f"dspy.Predict on DummyLM: {sizes.predict_calls:,} calls in a fresh process per variant, "
            f"{sizes.predict_rounds} round(s) ...")
        return predict.run(sizes.predict_calls, sizes.predict_rounds, sizes.predict_warmup)
    if number == 6:
        from benchmarks import isolation

        say(f"isolation overhead: {sizes.isolation_calls:,} calls each, process / thread / bare"
            f"{' / pebble' if _has_pebble() else ''} ...")
        return isolation.overhead(sizes.isolation_calls, warmup=min(500, sizes.isolation_calls))
    if number == 7:
        from benchmarks import isolation

        say(f"CPU-bound metric: dspy.Evaluate(num_threads={isolation.EVALUATE_THREADS}), {sizes.cpu_examples} "
            f"examples, processes vs threads, {sizes.cpu_repeats} run(s) each ...")
        return isolation.cpu_bound(sizes.cpu_examples, sizes.cpu_repeats)
    if number == 8:
        from benchmarks import judge_cache

        say(f"judge cache: budget {sizes.gepa_budget}, two GEPA runs on one disk cache, then two processes on one "
            "Redis cache ...")
        return judge_cache.run(sizes.gepa_budget, sizes.gepa_train, sizes.gepa_val, sizes.gepa_threads)
    if number == 9:
        from benchmarks import worker_pool

        say(f"worker pool: a {sizes.model_mb} MiB model at import, template vs fresh interpreters ...")
        return worker_pool.run(sizes.model_mb, min(2000, sizes.isolation_calls), max(1.0, sizes.model_mb / 60))
    if number == 12:
        from benchmarks import sandbox

        say(f"sandbox: {sizes.sandbox_calls:,} calls and {sizes.sandbox_starts} worker starts, with and without ...")
        found = sandbox.run(sizes.sandbox_calls, sizes.sandbox_starts, warmup=min(200, sizes.sandbox_calls))
        say(f"sandbox: a {sizes.model_mb} MiB model at import, {sandbox.POOL_WORKERS} sandboxed workers, forked in "
            "the sandbox vs fresh ...")
        return {**found, "pool": sandbox.pool(sizes.model_mb)}
    if number == 11:
        from benchmarks import ray_cluster

        say(f"isolation=\"ray\" on a local Ray vs processes: {sizes.ray_calls:,} calls, {sizes.ray_cpu_examples} "
            "CPU-bound examples ...")
        return ray_cluster.run(sizes.ray_calls, sizes.ray_cpu_examples, sizes.ray_calls, sizes.ray_starts)
    if number == 10:
        from benchmarks import judge_limits

        say(f"judge limits: {sizes.limit_requests:,} requests from 16 threads, with and without a limit ...")
        return judge_limits.run(sizes.limit_requests)
    if number == 13:
        from benchmarks import judge_429

        say(f"sporadic 429s: {sizes.sporadic_requests:,} requests from 8 threads, the judge vs dspy.LM's retry ...")
        return judge_429.run(sizes.sporadic_requests)
    if number == 14:
        from benchmarks import async_metric

        say(f"async metric: 8 judge questions per output, {sizes.async_calls} calls and {sizes.async_examples} "
            "examples each, sync vs async ...")
        return async_metric.run(sizes.async_calls, sizes.async_examples)
    raise ValueError(f"no benchmark {number}")


def _has_pebble() -> bool:
    import importlib.util

    return importlib.util.find_spec("pebble") is not None


# -- the table ---------------------------------------------------------------------------------


def _met(flag: bool | None) -> str:
    return "met" if flag else "**missed**"


def _us(value: float) -> str:
    return f"{value:,.1f} µs" if abs(value) < 1000 else f"{value / 1000:,.2f} ms"


def rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(benchmark, skynet-dspy, baseline, difference, target) for each benchmark present."""
    out = []
    if "overhead" in doc:
        o = doc["overhead"]
        main, other = o["main_thread"], o["worker_thread"]

        def timing(part: dict[str, Any]) -> str:
            return f"median {_us(part['median_us'])}, p90 {_us(part['p90_us'])}"

        for letter, isolation in zip("ab", o["isolations"], strict=False):
            mine, theirs = main[isolation], other[isolation]
            default = " (the default)" if isolation == "process" else ""
            floor = (f"; a bare thread round trip (the floor of a cross-thread timeout): "
                     f"{timing(o['thread_handoff_floor'])}" if isolation == "thread" else "")
            out.append((
                f"1{letter}. Per-call overhead, `metric(gold, pred)`, isolation=\"{isolation}\"{default}: "
                f"{o['calls']:,} calls per thread, exact match, timeout {o['timeout_s']:g} s",
                f"main thread: {timing(mine['adapter'])}; other thread: {timing(theirs['adapter'])}; "
                f"memo hit: median {_us(mine['memo_hit']['median_us'])} / {_us(theirs['memo_hit']['median_us'])}",
                f"bare `score()`: {timing(main['bare'])} / {timing(other['bare'])}{floor}",
                f"main thread +{_us(mine['overhead_median_us'])} median, +{_us(mine['overhead_p90_us'])} p90; "
                f"other thread +{_us(theirs['overhead_median_us'])} median, +{_us(theirs['overhead_p90_us'])} p90",
                f"≤ {mine['target_us']:g} µs median: main thread {_met(mine['target_met'])}, "
                f"other thread {_met(theirs['target_met'])}",
            ))
    if "judge_calls" in doc:
        j = doc["judge_calls"]
        s, h = j["skynet"], j["hand_written"]
        saved = f"{j['saved_judge_requests']} fewer ({j['saved_judge_requests'] / h['judge_requests']:.0%})" if (
            h["judge_requests"]) else "n/a"
        out.append((
            f"2. Judge requests per `dspy.GEPA` run (bundled example, max_metric_calls={j['budget']}, "
            f"seed {j['seed']})",
            f"{s['judge_requests']} requests for {s['metric_calls']} metric calls; "
            f"{s['distinct_pairs']} distinct (example, output)",
            f"hand-written LiteLLM metric: {h['judge_requests']} requests for {h['metric_calls']} metric calls; "
            f"{h['distinct_pairs']} distinct",
            f"{saved}: {s['adapter_memo_hits']} answered by the adapter's memo (GEPA's repeat call), "
            f"{s['judge_cache_hits']} by the judge cache; {s['duplicate_judge_requests']} duplicates vs "
            f"{h['duplicate_judge_requests']}; both runs: validation {_score(s)} → {_score(s, 'best')}, "
            f"{s['candidates']} candidates" + ("" if _same_run(s, h) else " (the runs differ: see the JSON)"),
            f"one per distinct (example, output): {_met(j['target_met'])}",
        ))
    if "threads" in doc:
        t = doc["threads"]

        def scaling(runs: list[dict[str, Any]]) -> str:
            return " / ".join(f"{r['speedup']:.1f}×" for r in runs)

        counts = "/".join(str(r["threads"]) for r in t["skynet"])
        out.append((
            f"3. `dspy.Evaluate`, {t['examples']} examples, judge answers in {t['delay_s'] * 1000:g} ms "
            f"({counts} threads{', best of ' + str(t['repeats']) if t.get('repeats', 1) > 1 else ''})",
            f"{scaling(t['skynet'])} (1 thread: {t['skynet'][0]['examples_per_s']:.1f} examples/s)",
            f"hand-written LiteLLM metric: {scaling(t['hand_written'])} "
            f"(1 thread: {t['hand_written'][0]['examples_per_s']:.1f}/s)",
            f"{t['skynet_speedup_at_8']:.1f}× at 8 threads vs {_at(t['hand_written'], 8):.1f}×"
            if t["skynet_speedup_at_8"] is not None else "8 threads not run",
            f"≥ {t['target_speedup_at_8']:g}× at 8 threads: {_met(t['target_met'])}",
        ))
    if "memory" in doc:
        m = doc["memory"]
        adapter, bare = m["adapter"]["readings"][1:], m["baseline"]["readings"][1:]
        marks = " → ".join(f"{r['rss_mb']:.1f}" for r in adapter)
        bare_marks = " → ".join(f"{r['rss_mb']:.1f}" for r in bare)
        calls = "/".join(_count(r["calls"]) for r in adapter)
        out.append((
            f"4. Memory, {m['calls']:,} calls on distinct predictions (isolation=\"{m.get('isolation', 'thread')}\")",
            f"RSS {marks} MB at {calls} calls; peak {adapter[-1]['peak_mb']:.1f} MB "
            f"({m['adapter']['seconds']:.0f} s)" + (
                f"; worker process RSS {' → '.join(f'{r[_W]:.1f}' for r in adapter)} MB" if _W in adapter[0] else ""),
            f"bare `score()`: RSS {bare_marks} MB; "
            f"peak {bare[-1]['peak_mb']:.1f} MB",
            f"{m['adapter_growth_mb']:+.1f} MB from {_count(adapter[0]['calls'])} to {_count(adapter[-1]['calls'])} "
            f"calls; peak {m['over_baseline_mb']:+.1f} MB over the baseline",
            f"flat (bounded memo): {_met(m['target_met'])}",
        ))
    if "predict" in doc:
        p = doc["predict"]
        native, ratio = p["native"], p["ratio"]
        best = f", best of {p['rounds']} processes each" if p["rounds"] > 1 else ""
        out.append((
            f"5. `dspy.Predict` on `DummyLM`, per call (median of {p['calls']:,} calls, a fresh process per "
            f"variant{best})",
            f"plain metric loaded: {_us(p['plain']['median_us'])} ({ratio['plain']:.2f}×); "
            f"`reward()` metric loaded: {_us(p['measuring']['median_us'])} ({ratio['measuring']:.2f}×)",
            f"no metric loaded (DSPy alone): {_us(native['median_us'])}; DSPy with one no-op callback: "
            f"{_us(p['noop_callback']['median_us'])} ({ratio['noop_callback']:.2f}×)",
            f"plain {p['plain']['median_us'] - native['median_us']:+,.1f} µs, `reward()` "
            f"{p['measuring']['median_us'] - native['median_us']:+,.1f} µs; DSPy callbacks installed: plain "
            f"{p['plain']['dspy_callbacks']}, `reward()` {p['measuring']['dspy_callbacks']}",
            f"≤ {p['target_ratio']['plain']:g}× native plain: {_met(p['target_met']['plain'])}; "
            f"≤ {p['target_ratio']['measuring']:g}× measuring: {_met(p['target_met']['measuring'])}",
        ))
    if "isolation" in doc:
        i = doc["isolation"]

        def timing6(part: dict[str, Any]) -> str:
            return f"median {_us(part['median_us'])}, p90 {_us(part['p90_us'])}"

        process, thread = i["process"], i["thread"]
        out.append((
            f"6. Per-call overhead of the isolation, `metric.score(input, output, expected)` from another thread "
            f"({i['calls']:,} calls each, exact match)",
            f"process: {timing6(process)}; thread: {timing6(thread)}",
            f"bare `score()`: {timing6(i['bare'])}",
            f"process +{_us(process['overhead_median_us'])} median, +{_us(process['overhead_p90_us'])} p90; "
            f"thread +{_us(thread['overhead_median_us'])} median, +{_us(thread['overhead_p90_us'])} p90",
            f"process ≤ {i['target_us']:g} µs median: {_met(i['target_met'])}",
        ))
        pebble = i.get("pebble")
        if pebble is not None:
            out.append((
                f"6b. Reference: pebble {i.get('pebble_version') or ''} `ProcessPool` round trip of a trivial "
                f"function (1 worker, 60 s task timeout, same loop)".replace("  ", " "),
                f"isolation=\"process\": {timing6(process)}",
                f"pebble: {timing6(pebble)}",
                f"pebble's round trip alone is {pebble['median_us'] / process['median_us']:.2f}× the process "
                f"isolation's whole call ({pebble['median_us'] - process['median_us']:+,.1f} µs median)",
                "reference only",
            ))
    if "cpu_bound" in doc:
        c = doc["cpu_bound"]
        proc, thr = c["process"], c["thread"]
        best = f", best of {c['repeats']}" if c["repeats"] > 1 else ""
        out.append((
            f"7. CPU-bound metric ({c['bare_ms_per_call']:.1f} ms of pure Python per call), `dspy.Evaluate("
            f"num_threads={c['threads']})`, {c['examples']} examples, {c['usable_cores']} cores{best}",
            f"isolation=\"process\": {proc['examples_per_s']:.1f} examples/s ({c['process_workers']} worker "
            f"processes; this process {proc['cpu_ms_per_example']:.1f} ms CPU per example)",
            f"isolation=\"thread\": {thr['examples_per_s']:.1f} examples/s ({thr['cpu_ms_per_example']:.1f} ms "
            "CPU per example)",
            f"processes {c['speedup']:.2f}× threads",
            f"≥ {c['target_speedup']:g}× on 2 cores: {_met(c['target_met'])}",
        ))
    if "judge_cache" in doc:
        out += _judge_cache_rows(doc["judge_cache"])
    if "worker_pool" in doc:
        from benchmarks import worker_pool

        out += worker_pool.rows(doc["worker_pool"])
    if "sandbox" in doc:
        out += _sandbox_rows(doc["sandbox"])
    if "ray_cluster" in doc:
        from benchmarks import ray_cluster

        out += ray_cluster.rows(doc["ray_cluster"])
    if "judge_limits" in doc:
        from benchmarks import judge_limits

        out += judge_limits.rows(doc["judge_limits"])
    if "judge_429" in doc:
        from benchmarks import judge_429

        out += judge_429.rows(doc["judge_429"])
    if "async_metric" in doc:
        from benchmarks import async_metric

        out += async_metric.rows(doc["async_metric"])
    return out


def _sandbox_rows(s: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    from benchmarks import sandbox

    if "skipped" in s:
        return [("12. sandbox=True (bubblewrap)", s["skipped"], "n/a", "n/a", "not run")]
    plain, boxed = s["plain"], s["sandbox"]
    return [(
        f"12a. Per-call overhead, `metric.score(...)` from another thread, sandbox=True vs the plain worker "
        f"({s['calls']:,} calls each)",
        f"sandbox=True: median {_us(boxed['median_us'])}, p90 {_us(boxed['p90_us'])} "
        f"(+{_us(boxed['overhead_median_us'])} over bare)",
        f"plain worker: median {_us(plain['median_us'])}, p90 {_us(plain['p90_us'])} "
        f"(+{_us(plain['overhead_median_us'])} over bare); the bare score, in this process: "
        f"{_us(s['bare']['median_us'])}",
        f"{boxed['median_us'] - plain['median_us']:+,.1f} µs median per call; failures {boxed['failures']} / "
        f"{plain['failures']}",
        "reference only",
    ), (
        f"12b. Worker start, `load_metric(...)` (a new worker, metric loaded), median of {s['starts']}",
        f"sandbox=True: {boxed['start_median_ms']:,.0f} ms (max {boxed['start_max_ms']:,.0f}); the first "
        f"sandboxed load in a process: {s['first_sandboxed_load_s'] * 1000:,.0f} ms",
        f"plain worker: {plain['start_median_ms']:,.0f} ms (max {plain['start_max_ms']:,.0f})",
        f"{boxed['start_median_ms'] - plain['start_median_ms']:+,.0f} ms per worker start",
        "reference only",
    ), *(sandbox.pool_rows(s["pool"]) if "pool" in s else [])]


def _dollars(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:.6f}"


def _judge_cache_rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    d, r = found["disk"], found["redis"]
    first, second = d["first"], d["second"]
    rows = [(
        f"8a. Judge cache on disk (`judge_cache=\"<folder>\"`): two identical `dspy.GEPA` runs in sequence "
        f"(bundled example, max_metric_calls={d['budget']}, seed {d['seed']}, a fresh metric each)",
        f"second run: {second['server_judge_requests']} judge requests, {_dollars(second['dollars'])} "
        f"({second['judge_cache_hits']} answers from the disk cache)",
        f"first run: {first['server_judge_requests']} judge requests, {_dollars(first['dollars'])}",
        f"{first['server_judge_requests'] - second['server_judge_requests']} requests and "
        f"{_dollars((first['dollars'] or 0.0) - (second['dollars'] or 0.0))} saved"
        + ("" if d["same_result"] else " (the runs' results differ: see the JSON)"),
        f"the second run pays nothing: {_met(d['target_met'])}",
    )]
    if "skipped" in r:
        rows.append(("8b. Judge cache in Redis: two processes at once", r["skipped"], "n/a", "n/a", "not run"))
        return rows
    each = "; ".join(f"process {n}: {p['judge_requests']} requests, {_dollars(p['dollars'])}, "
                     f"{p['judge_cache_hits']} cache hits" for n, p in enumerate(r["processes"], 1))
    rows.append((
        f"8b. Judge cache in Redis (`judge_cache=\"redis://...\"`): the same `dspy.GEPA` run in two processes at "
        f"once (max_metric_calls={r['budget']}, seed {r['seed']})",
        f"{r['paid_requests']} judge requests paid in all, {_dollars(r['dollars'])} ({each})",
        f"one run alone: {r['distinct_judge_requests']} distinct judge requests",
        f"{r['server_judge_requests']} requests reached the judge for {r['distinct_judge_requests']} distinct",
        f"each distinct request paid once: {_met(r['target_met'])}",
    ))
    return rows


_W = "workers_rss_mb"


def _score(run: dict[str, Any], which: str = "baseline") -> str:
    value = run.get(f"{which}_val_score")
    return "n/a" if value is None else f"{value:.2f}"


def _same_run(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    keys = ("metric_calls", "distinct_pairs", "candidates", "baseline_val_score", "best_val_score")
    return all(mine.get(key) == theirs.get(key) for key in keys)


def _at(runs: list[dict[str, Any]], threads: int) -> float:
    return next((r["speedup"] for r in runs if r["threads"] == threads), float("nan"))


def _count(calls: int) -> str:
    if calls >= 1_000_000 and calls % 1_000_000 == 0:
        return f"{calls // 1_000_000}M"
    if calls >= 1000 and calls % 1000 == 0:
        return f"{calls // 1000}k"
    return str(calls)


def table(doc: dict[str, Any]) -> str:
    """The markdown table of the benchmarks run, with the machine it ran on."""
    from benchmarks import machine

    head = ("benchmark", "skynet-dspy", "baseline", "difference", "target")
    lines = [
        f"Machine: {machine.caption(doc['machine'])}. Run {doc['when']}"
        + (f", commit {doc['machine']['commit']}" if doc["machine"].get("commit") else "") + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows(doc)]
    if "threads" in doc:
        t = doc["threads"]
        lines += ["", "| threads | skynet-dspy examples/s | speedup | CPU ms/example | hand-written examples/s | "
                      "speedup | CPU ms/example |", "|---|---|---|---|---|---|---|"]
        for mine, theirs in zip(t["skynet"], t["hand_written"], strict=True):
            lines.append(f"| {mine['threads']} | {mine['examples_per_s']:.1f} | {mine['speedup']:.1f}× | "
                         f"{mine['cpu_ms_per_example']:.1f} | {theirs['examples_per_s']:.1f} | "
                         f"{theirs['speedup']:.1f}× | {theirs['cpu_ms_per_example']:.1f} |")
    for isolation in doc.get("overhead", {}).get("isolations", ()):
        for where in ("main_thread", "worker_thread"):
            found = doc["overhead"][where][isolation].get("profile")
            if found:
                lines += ["", "Where the adapter's time goes (cProfile, own time per call, by module):", ""]
                lines += [f"    {line}" for line in found["by_module_text"].splitlines()]
    return "\n".join(lines)


# -- the command line ----------------------------------------------------------------------------


def _threads(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"threads must be whole numbers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"threads must be at least 1, got {text!r}")
    return values


def _only(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--only takes benchmark numbers {ALL[0]}-{ALL[-1]}, comma-separated, got {text!r}") from None
    if not values or not set(values) <= set(ALL):
        raise argparse.ArgumentTypeError(f"--only takes benchmark numbers {ALL[0]}-{ALL[-1]}, got {text!r}")
    return values


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars of DSPy and GEPA would bury the table
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds), e.g. for the test suite")
    parser.add_argument("--only", type=_only, default=ALL, help="benchmarks to run, e.g. 1,4 (default: all)")
    parser.add_argument("--calls", type=_positive(int), help="1: adapter calls timed (default 100,000)")
    parser.add_argument("--gepa-budget", type=_positive(int), help="2: GEPA's max_metric_calls (default 120)")
    parser.add_argument("--examples", type=_positive(int), help="3: examples per thread count (default 200)")
    parser.add_argument("--delay", type=_positive(float), help="3: the judge's answer delay in seconds (0.05)")
    parser.add_argument("--threads", type=_threads, help="3: thread counts (default 1,2,4,8,16)")
    parser.add_argument("--repeats", type=_positive(int), help="3: runs per point, the fastest counts (default 2)")
    parser.add_argument("--memory-calls", type=_positive(int), help="4: adapter calls (default 1,000,000)")
    parser.add_argument("--predict-calls", type=_positive(int), help="5: Predict calls per process (default 3,000)")
    parser.add_argument("--predict-rounds", type=_positive(int), help="5: fresh processes per variant (default 3)")
    parser.add_argument("--isolation-calls", type=_positive(int), help="6: calls per isolation (default 20,000)")
    parser.add_argument("--cpu-examples", type=_positive(int), help="7: examples per isolation (default 200)")
    parser.add_argument("--profile", type=int, default=20_000, metavar="N",
                        help="1: when the overhead target is missed, profile N adapter calls (0: never)")
    parser.add_argument("--out", type=Path, help=f"where to write the JSON (default {LATEST}; --quick: nowhere)")
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else Sizes()
    overrides = {"calls": args.calls, "gepa_budget": args.gepa_budget, "examples": args.examples,
                 "delay": args.delay, "threads": args.threads, "repeats": args.repeats,
                 "memory_calls": args.memory_calls, "predict_calls": args.predict_calls,
                 "predict_rounds": args.predict_rounds, "isolation_calls": args.isolation_calls,
                 "cpu_examples": args.cpu_examples}
    sizes = Sizes(**{**asdict(sizes), **{key: value for key, value in overrides.items() if value is not None}})
    doc = run(sizes, args.only, profile_calls=max(0, args.profile) if not args.quick else min(args.profile, 2000))
    print(table(doc))
    out = args.out if args.out is not None else (None if args.quick else LATEST)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"\nWrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
