"""`make bench` at a tiny size, so the benchmarks cannot rot: every row, with its baseline and sane figures.

No timing thresholds here (machines are shared and noisy): the figures are checked for shape and
for the counts that must hold whatever the speed — every call really scored in both isolations, no
duplicate judge request, every example judged once per thread count, the memory loop run to the
end, each Predict variant in its own process with measurement installed only for the reward() metric.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math

import pytest

from benchmarks import run as bench

# Benchmark 11 runs on a local Ray: with the other Ray tests, one at a time. The quick run takes about two minutes of
# one core, so it runs with the slow tests (CI runs both), keeping `make test` near five minutes.
# On a loaded machine the quick run can take several minutes: a generous bound for a hang, not a speed.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow, pytest.mark.timeout(900)]

ISOLATIONS = ("process", "thread")


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[dict, str]:
    """One --quick run of `python -m benchmarks.run`: its JSON document and its printed table."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("bench") / "bench.json"
    printed = io.StringIO()
    # the bench quiets these loggers (run._quiet): put their levels back, or later tests in this worker see no log
    loggers = [logging.getLogger(name) for name in ("dspy", "gepa", "LiteLLM", "litellm", "httpx", "skynet_dspy")]
    levels = [found.level for found in loggers]
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            assert bench.main(["--quick", "--out", str(out), "--profile", "500"]) == 0
    finally:
        for found, level in zip(loggers, levels, strict=True):
            found.setLevel(level)
    return json.loads(out.read_text(encoding="utf-8")), printed.getvalue()


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _timing(part: dict) -> None:
    assert _finite_positive(part["median_us"])
    assert part["p99_us"] >= part["p90_us"] >= part["median_us"]


def test_the_table_has_every_row_and_the_machine(quick):
    doc, printed = quick
    assert set(bench.NAMES.values()) <= doc.keys()
    assert set(doc["timings_s"]) == set(bench.NAMES.values())
    for row in ('| 1a. Per-call overhead, `metric(gold, pred)`, isolation="process"',
                '| 1b. Per-call overhead, `metric(gold, pred)`, isolation="thread"', "| 2. Judge requests per",
                "| 3. `dspy.Evaluate`", "| 4. Memory", "| 5. `dspy.Predict` on `DummyLM`",
                "| 6. Per-call overhead of the isolation", "| 7. CPU-bound metric", "| 8a. Judge cache on disk",
                "| 8b. Judge cache in Redis", "| 9a. Worker pool", "| 9b. Worker pool", "| 9c. Worker pool",
                "| 9d. Worker pool", "| 12a. Per-call overhead, `metric.score(...)` from another thread, "
                "sandbox=True", "| 12b. Worker start", "| 11a. Per-call overhead, `metric.score(...)` with isolation",
                "| 11b. CPU-bound metric, `dspy.Evaluate", "| 11c. The driver's CPU per call",
                "| 11d. Starting a local Ray", "| 12c. sandbox=True, a ", "| 12d. sandbox=True, a ", "| 10. ", "| 13. ",
                "| 14. A rubric metric asking 8 judge questions"):
        assert printed.count(row) == 1, row
    has_pebble = importlib.util.find_spec("pebble") is not None
    assert ("| 6b. Reference: pebble" in printed) == has_pebble
    assert printed.count("bare `score()`") == 4 and printed.count("hand-written LiteLLM metric") == 2
    rows = bench.rows(doc)
    assert len(rows) == 25 + has_pebble and all(len(row) == 5 and all(row) for row in rows)
    assert all(f"| {' | '.join(row)} |" in printed for row in rows)
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["python"].count(".") == 2
    assert machine["dspy"] != "not installed" and machine["litellm"] != "not installed"
    assert f"Python {machine['python']}" in printed and f"dspy {machine['dspy']}" in printed
    assert len(machine["load_average_at_start"]) == 3 and len(machine["load_average_at_end"]) == 3


def test_overhead_row_times_every_call_in_both_isolations_against_the_bare_score(quick):
    doc, _ = quick
    overhead = doc["overhead"]
    calls, warmup = overhead["calls"], overhead["warmup"]
    assert calls == bench.QUICK.calls and warmup == min(1000, calls) and overhead["timeout_s"] == 60
    assert overhead["isolations"] == list(ISOLATIONS)
    for isolation in ISOLATIONS:
        # Each timed call on fresh predictions ran score (both threads), and each repeat was a memo hit.
        assert overhead["score_calls"][isolation] == 2 * (calls + warmup)
        assert overhead["memo_hits"][isolation] == 2 * (calls + warmup)
        assert overhead["failures"][isolation] == 0
    assert overhead["target_us"] == {"process": 200.0, "thread": 50.0}
    _timing(overhead["thread_handoff_floor"])
    for where in ("main_thread", "worker_thread"):
        _timing(overhead[where]["bare"])
        bare = overhead[where]["bare"]
        for isolation in ISOLATIONS:
            part = overhead[where][isolation]
            assert part["mismatches"] == 0
            for name in ("adapter", "memo_hit"):
                _timing(part[name])
            assert part["overhead_median_us"] == pytest.approx(part["adapter"]["median_us"] - bare["median_us"])
            assert part["overhead_p90_us"] == pytest.approx(part["adapter"]["p90_us"] - bare["p90_us"])
            assert part["ratio_median"] == pytest.approx(part["adapter"]["median_us"] / bare["median_us"])
            assert part["target_us"] == overhead["target_us"][isolation]
            assert part["target_met"] == (part["overhead_median_us"] <= part["target_us"])
            if part["target_met"]:
                assert "profile" not in part
            else:
                profile = part["profile"]
                assert profile["isolation"] == isolation and profile["worker_thread"] == (where == "worker_thread")
                assert profile["by_module"] and "µs per adapter call" in profile["by_module_text"]
        assert overhead["target_met"] == {
            isolation: overhead["main_thread"][isolation]["target_met"] and
            overhead["worker_thread"][isolation]["target_met"] for isolation in ISOLATIONS
        }


def test_predict_row_runs_each_variant_in_its_own_process(quick):
    doc, printed = quick
    predict = doc["predict"]
    sizes = bench.QUICK
    assert (predict["calls"], predict["rounds"], predict["warmup"]) == (
        sizes.predict_calls, sizes.predict_rounds, sizes.predict_warmup)
    for variant in ("native", "plain", "measuring", "noop_callback"):
        part = predict[variant]
        assert part["variant"] == variant and part["calls"] == sizes.predict_calls
        assert part["answers_ok"] == sizes.predict_calls  # every Predict call answered from DummyLM
        _timing(part)
        assert len(part["rounds_median_us"]) == sizes.predict_rounds
        assert part["median_us"] == pytest.approx(min(part["rounds_median_us"]), abs=0.06)
    # The baselines never import the package; the variants with a metric load it and can score with it.
    assert predict["native"]["skynet_dspy_imported"] is False and predict["native"]["dspy_callbacks"] == 0
    assert predict["noop_callback"]["skynet_dspy_imported"] is False
    assert predict["noop_callback"]["dspy_callbacks"] == 1
    for variant in ("plain", "measuring"):
        assert predict[variant]["skynet_dspy_imported"] is True and predict[variant]["metric_ok"] is True
    # Only the reward() metric installs measurement (around dspy.Module's call, never a DSPy callback).
    assert predict["plain"]["measuring"] is False and predict["plain"]["module_calls_wrapped"] is False
    assert predict["measuring"]["measuring"] is True and predict["measuring"]["module_calls_wrapped"] is True
    assert predict["plain"]["dspy_callbacks"] == 0 and predict["measuring"]["dspy_callbacks"] == 0
    native = predict["native"]["median_us"]
    for variant in ("plain", "measuring", "noop_callback"):
        assert predict["ratio"][variant] == pytest.approx(predict[variant]["median_us"] / native)
    assert predict["target_ratio"] == {"plain": 1.05, "measuring": 1.3}
    for variant in ("plain", "measuring"):
        met = predict["target_met"][variant]
        assert met == (predict["ratio"][variant] <= predict["target_ratio"][variant])
        assert f"{predict['ratio'][variant]:.2f}×" in printed


def test_isolation_row_times_both_isolations_and_pebble_in_one_loop(quick):
    doc, printed = quick
    isolation = doc["isolation"]
    calls, warmup = isolation["calls"], isolation["warmup"]
    assert calls == bench.QUICK.isolation_calls and warmup == min(500, calls)
    _timing(isolation["bare"])
    has_pebble = importlib.util.find_spec("pebble") is not None
    assert (isolation["pebble"] is not None) == has_pebble == (isolation["pebble_version"] is not None)
    for name in ("process", "thread", "pebble"):
        part = isolation[name]
        if part is None:
            continue
        _timing(part)
        assert part["mismatches"] == 0
        assert part["overhead_median_us"] == pytest.approx(part["median_us"] - isolation["bare"]["median_us"])
        assert part["overhead_p90_us"] == pytest.approx(part["p90_us"] - isolation["bare"]["p90_us"])
        if name != "pebble":
            assert part["score_calls"] == calls + warmup and part["failures"] == 0
    assert isolation["target_us"] == 200.0
    assert isolation["target_met"] == (isolation["process"]["overhead_median_us"] <= 200.0)
    if has_pebble:
        assert f"pebble {isolation['pebble_version']} `ProcessPool`" in printed


def test_cpu_bound_row_scores_every_example_in_processes_and_threads(quick):
    doc, _ = quick
    cpu = doc["cpu_bound"]
    examples, repeats, threads = cpu["examples"], cpu["repeats"], cpu["threads"]
    assert (examples, repeats, threads) == (bench.QUICK.cpu_examples, bench.QUICK.cpu_repeats, 4)
    assert _finite_positive(cpu["bare_ms_per_call"]) and cpu["usable_cores"] >= 1
    assert 1 <= cpu["process_workers"] <= threads  # the pool grew to at most the concurrency DSPy used
    for name in ISOLATIONS:
        part = cpu[name]
        assert part["score"] == 100.0 and part["failures"] == 0
        # the warm-up run (2 examples per thread), then every timed run: each example scored once
        assert part["score_calls"] == 2 * threads + examples * repeats
        assert _finite_positive(part["examples_per_s"]) and len(part["repeats_s"]) == repeats
        assert part["seconds"] == pytest.approx(min(part["repeats_s"]), abs=0.001)
    assert cpu["speedup"] == pytest.approx(cpu["process"]["examples_per_s"] / cpu["thread"]["examples_per_s"])
    assert cpu["target_met"] == (cpu["speedup"] >= cpu["target_speedup"] == 1.8)


def test_judge_row_counts_requests_of_both_gepa_runs(quick):
    doc, _ = quick
    judge = doc["judge_calls"]
    mine, theirs = judge["skynet"], judge["hand_written"]
    assert judge["budget"] == bench.QUICK.gepa_budget
    # Same budget and seed, same scripted world: the two runs score the same (example, output) pairs.
    assert mine["metric_calls"] == theirs["metric_calls"] > 0
    assert mine["distinct_pairs"] == theirs["distinct_pairs"] > 0
    # The hand-written metric pays on every call; the adapter once per distinct pair.
    assert theirs["judge_requests"] == theirs["metric_calls"]
    assert mine["judge_requests"] == mine["distinct_pairs"] and mine["duplicate_judge_requests"] == 0
    assert judge["saved_judge_requests"] == theirs["judge_requests"] - mine["judge_requests"]
    # Every saved request is accounted for: GEPA's repeat call hit the memo, or another candidate's
    # identical output hit the judge cache.
    assert mine["score_calls"] + mine["adapter_memo_hits"] == mine["metric_calls"]
    assert mine["adapter_memo_hits"] + mine["judge_cache_hits"] == judge["saved_judge_requests"]
    assert mine["best_val_score"] == theirs["best_val_score"] and mine["candidates"] == theirs["candidates"]
    assert judge["target_met"] is True
    assert mine["isolation"] == "process"  # the default


def test_judge_cache_rows_pay_each_distinct_request_once_across_runs_and_processes(quick):
    doc, printed = quick
    disk, redis = doc["judge_cache"]["disk"], doc["judge_cache"]["redis"]
    first, second = disk["first"], disk["second"]
    assert disk["budget"] == bench.QUICK.gepa_budget
    # the first run pays each distinct judge request once; the identical second run pays nothing
    assert first["server_judge_requests"] == first["distinct_judge_requests"] == first["judge_requests"] > 0
    assert second["server_judge_requests"] == second["judge_requests"] == 0 and second["dollars"] == 0.0
    assert second["judge_cache_hits"] == first["judge_requests"] + first["judge_cache_hits"]
    assert first["dollars"] > 0 and disk["same_result"] is True and disk["target_met"] is True
    # two processes at once on one Redis cache: each distinct request reached the judge once, in all
    if "skipped" in redis:  # redis-server not installed here (.ci/run installs it)
        assert "apt-get install -y redis-server" in redis["skipped"] and "| 8b." in printed
        return
    assert len(redis["processes"]) == 2 and all(p["judge_errors"] == 0 for p in redis["processes"])
    assert redis["server_judge_requests"] == redis["distinct_judge_requests"] == redis["paid_requests"]
    assert redis["distinct_judge_requests"] == first["distinct_judge_requests"]  # the same run as 8a's
    assert redis["dollars"] == pytest.approx(first["dollars"]) and redis["target_met"] is True


def test_thread_row_judges_every_example_at_every_thread_count(quick):
    doc, _ = quick
    threads = doc["threads"]
    for name in ("skynet", "hand_written"):
        runs = threads[name]
        assert [r["threads"] for r in runs] == list(bench.QUICK.threads)
        for entry in runs:
            assert entry["judge_requests"] == threads["examples"]  # distinct requests: no cache hides the judge
            assert entry["score"] == 100.0
            assert _finite_positive(entry["examples_per_s"])
        assert runs[0]["speedup"] == pytest.approx(1.0)
    assert threads["skynet_speedup_at_8"] == pytest.approx(threads["skynet"][3]["speedup"])
    assert threads["isolation"] == "process" and threads["failures"] == 0


def test_memory_row_reads_rss_through_the_whole_loop(quick):
    doc, _ = quick
    memory = doc["memory"]
    calls = bench.QUICK.memory_calls
    assert memory["calls"] == calls and memory["score_calls"] == calls and memory["failures"] == 0
    assert memory["isolation"] == "process"
    for loop in ("baseline", "adapter"):
        readings = memory[loop]["readings"]
        assert [r["calls"] for r in readings] == [0, calls // 10, calls // 2, calls]
        assert all(_finite_positive(r["rss_mb"]) and r["peak_mb"] >= r["rss_mb"] for r in readings)
        assert all(_finite_positive(r["workers_rss_mb"]) for r in readings)  # the worker process was alive
    adapter = memory["adapter"]["readings"]
    assert memory["workers_growth_mb"] == pytest.approx(adapter[-1]["workers_rss_mb"] - adapter[1]["workers_rss_mb"])
    assert memory["target_met"] == (memory["second_half_growth_mb"] < memory["flat_mb"])


def test_the_worker_pool_row_compares_both_start_modes_with_8_workers_each(quick):
    doc, _ = quick
    pool = doc["worker_pool"]
    assert pool["template"]["start_mode"] == "template" and pool["fresh"]["start_mode"] == "fresh"
    for mode in ("template", "fresh"):
        part = pool[mode]
        assert part["memory"]["workers"] == 8  # the pool grew to 8 workers in both modes
        assert all(_finite_positive(part[key]) for key in ("import_s", "ready_s", "overhead_us"))
        assert part["replace_ms"] >= 0
        assert part["memory"]["pool_pss"] == part["memory"]["helpers_pss"] + part["memory"]["workers_pss"]
    # the workers share the template's pages: together they hold less than fresh workers each importing it
    assert pool["template"]["memory"]["workers_pss"] < pool["fresh"]["memory"]["workers_pss"]


def test_ray_rows_time_ray_and_processes_side_by_side(quick):
    found = quick[0]["ray_cluster"]
    for name in ("ray", "process", "bare"):
        _timing(found["per_call"][name])
    assert found["failures"] == {"process": 0, "ray": 0}
    for name in ("ray", "process"):
        driver = found["driver"][name]
        assert driver["calls"] > 0 and _finite_positive(driver["driver_cpu_ms_per_call"])
        assert _finite_positive(driver["sustainable_calls_per_s"]) and _finite_positive(driver["calls_per_s"])
        assert _finite_positive(found["cpu_bound"][name]["examples_per_s"])
    assert found["ray_workers_after_runs"] >= 1
    for name in ("ray_init", "package", "load_metric", "close"):  # 11d: starting a local Ray, both ways
        assert _finite_positive(found["start"][name])
    where = found["where"]  # 11c: where the driver's CPU goes
    assert _finite_positive(where["python_ms_per_call"]) and where["ray_threads_ms_per_call"] >= 0
    assert where["top"] and all(0 < entry["share"] <= 1 for entry in where["top"])


def test_bad_sizes_are_refused_with_a_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--only", "99"])
    assert exit_info.value.code == 2
    assert "--only takes benchmark numbers 1-14" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--threads", "0,2"])
    assert "threads must be at least 1" in capsys.readouterr().err


def test_sandbox_rows_time_every_call_and_start_both_ways(quick):
    doc, _ = quick
    found = doc["sandbox"]
    assert found["calls"] == bench.QUICK.sandbox_calls and found["starts"] == bench.QUICK.sandbox_starts
    _timing(found["bare"])
    for way in ("plain", "sandbox"):
        _timing(found[way])
        assert found[way]["failures"] == 0
        assert found[way]["start_max_ms"] >= found[way]["start_median_ms"] > 0
    assert found["first_sandboxed_load_s"] > 0
    pool = found["pool"]  # 12c/d: 8 sandboxed workers, forked in the sandbox and fresh
    for mode in ("template", "fresh"):
        assert pool[mode]["start_mode"] == mode and pool[mode]["memory"]["workers"] == 8
        assert pool[mode]["memory"]["pool_pss"] > 0 and pool[mode]["ready_s"] > 0 and pool[mode]["import_s"] > 0


def test_judge_limits_row_sends_without_429_under_the_limit(quick):
    doc, _ = quick
    found = doc["judge_limits"]
    limited, unlimited = found["limited"], found["unlimited"]
    assert limited["rate_limited"] == 0 and limited["failed"] == 0 and limited["sent"] == limited["requests"]
    assert unlimited["rate_limited"] > 0 and unlimited["sent"] == unlimited["requests"] + unlimited["rate_limited"]


def test_sporadic_429s_row_answers_every_request_each_way(quick):
    doc, _ = quick
    found = doc["judge_429"]
    for way in ("judge", "never_pause", "pause_every_429", "dspy_lm"):
        assert found[way]["answered"] == found["requests"], way
        assert found[way]["rate_limited"] >= 1 and _finite_positive(found[way]["seconds"]), way


def test_the_async_metric_row_times_the_three_metrics_each_call_asking_the_judge_anew(quick):
    doc, _ = quick
    found = doc["async_metric"]
    calls, examples = bench.QUICK.async_calls, bench.QUICK.async_examples
    assert (found["questions"], found["calls"], found["examples"]) == (8, calls, examples)
    asked = {"one_request": 1, "sync": 8, "async": 8}
    for tag, questions in asked.items():  # the cache is off: every call (warm-up, timed, Evaluate) asked anew
        part = found[tag]
        assert part["judge_requests"] == questions * (1 + calls + examples)
        assert _finite_positive(part["median_ms"]) and _finite_positive(part["evaluate_s"])
    assert found["async_vs_one_request"] == found["async"]["median_ms"] / found["one_request"]["median_ms"]
