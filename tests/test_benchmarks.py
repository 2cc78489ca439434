"""`make bench` at a tiny size, so the benchmarks cannot rot: all four rows, with their baselines and sane figures.

No timing thresholds here (machines are shared and noisy): the figures are checked for shape and
for the counts that must hold whatever the speed — every call really scored, no duplicate judge
request, every example judged once per thread count, the memory loop run to the end.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import run as bench  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[dict, str]:
    """One --quick run of `python -m benchmarks.run`: its JSON document and its printed table."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("bench") / "bench.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        assert bench.main(["--quick", "--out", str(out), "--profile", "500"]) == 0
    return json.loads(out.read_text(encoding="utf-8")), printed.getvalue()


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_the_table_has_all_four_rows_and_the_machine(quick):
    doc, printed = quick
    assert set(bench.NAMES.values()) <= doc.keys()
    for number in ("| 1. Per-call overhead", "| 2. Judge requests per", "| 3. `dspy.Evaluate`", "| 4. Memory"):
        assert number in printed
    assert printed.count("bare `score()`") == 2 and printed.count("hand-written LiteLLM metric") == 2
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["python"].count(".") == 2
    assert machine["dspy"] != "not installed" and machine["litellm"] != "not installed"
    assert f"Python {machine['python']}" in printed and f"dspy {machine['dspy']}" in printed


def test_overhead_row_times_every_call_against_the_bare_score(quick):
    doc, _ = quick
    overhead = doc["overhead"]
    calls, warmup = overhead["calls"], min(1000, overhead["calls"])
    assert calls == bench.QUICK.calls and overhead["timeout_s"] == 60
    # Each timed call on fresh predictions ran score (both threads), and each repeat was a memo hit.
    assert overhead["score_calls"] == 2 * (calls + warmup)
    assert overhead["memo_hits"] == 2 * (calls + warmup)
    for where in ("main_thread", "worker_thread"):
        part = overhead[where]
        assert part["mismatches"] == 0
        for name in ("bare", "adapter", "memo_hit"):
            assert _finite_positive(part[name]["median_us"])
            assert part[name]["p99_us"] >= part[name]["median_us"]
        assert part["overhead_median_us"] == pytest.approx(part["adapter"]["median_us"] - part["bare"]["median_us"])
        assert part["ratio_median"] == pytest.approx(part["adapter"]["median_us"] / part["bare"]["median_us"])
        assert part["target_met"] == (part["overhead_median_us"] < overhead["target_us"])
        if not part["target_met"]:
            assert part["profile"]["by_module"] and "µs per adapter call" in part["profile"]["by_module_text"]


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


def test_memory_row_reads_rss_through_the_whole_loop(quick):
    doc, _ = quick
    memory = doc["memory"]
    calls = bench.QUICK.memory_calls
    assert memory["calls"] == calls and memory["score_calls"] == calls
    for loop in ("baseline", "adapter"):
        readings = memory[loop]["readings"]
        assert [r["calls"] for r in readings] == [0, calls // 10, calls // 2, calls]
        assert all(_finite_positive(r["rss_mb"]) and r["peak_mb"] >= r["rss_mb"] for r in readings)
    assert memory["target_met"] == (memory["second_half_growth_mb"] < memory["flat_mb"])


def test_bad_sizes_are_refused_with_a_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--only", "5"])
    assert exit_info.value.code == 2
    assert "--only takes benchmark numbers 1-4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--threads", "0,2"])
    assert "threads must be at least 1" in capsys.readouterr().err
