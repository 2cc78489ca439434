"""The judge cache on real stores: a diskcache folder and a real redis-server, shared by processes.

Each store is hammered by two processes at once (every distinct request reaches the model once, no
error), is held or broken by another process during a run (every call is still answered), and is
refused with its path when it is unusable at load.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import diskcache
import dspy
import pytest

import skynet_dspy
from skynet_dspy._judge import Judge
from skynet_dspy._judge.cache import KEY_PREFIX, DiskStore
from skynet_dspy.devserver import DevServer

KEY = "store-test-key-98765"
HAMMER = Path(__file__).with_name("hammer.py")


def answering(request) -> str:
    return f"answer to {request.user}"


def judge_for(server, cache, **options) -> Judge:
    model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    return Judge(metric_lm=model, cache=cache, max_retries=0, **options)


def hammer_twice(spec: str, server, tmp_path, requests: int = 40) -> list[dict]:
    """Two processes asking the same `requests` (each twice, in their own order, 8 threads each) at once."""
    start = tmp_path / "start"
    processes = [
        subprocess.Popen([sys.executable, str(HAMMER), spec, server.url, str(requests), str(seed), str(start)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in (1, 2)
    ]
    time.sleep(0.5)  # both are importing; the start file lets them go together once they wait for it
    start.touch()
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def questions(server) -> list[str]:
    return [request.user for request in server.requests if request.user.startswith("question")]


# -- two processes, one store -------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_hammering_one_disk_cache_pay_each_request_once(tmp_path):
    with DevServer(answering, model_name="gpt-4o-mini", delay=0.02) as server:
        reports = hammer_twice(str(tmp_path / "cache"), server, tmp_path)
        asked = questions(server)
        warm_ups = sum(request.user == "warm-up" for request in server.requests)
    assert all(report["errors"] == [] and report["right"] == report["asked"] == 80 for report in reports)
    assert sorted(asked) == sorted(f"question {number}" for number in range(40))  # each distinct request once
    assert sum(report["calls"] for report in reports) == 40 + warm_ups  # nothing else was sent


@pytest.mark.slow
def test_two_processes_hammering_one_redis_cache_pay_each_request_once(tmp_path, redis_url):
    with DevServer(answering, model_name="gpt-4o-mini", delay=0.02) as server:
        reports = hammer_twice(redis_url, server, tmp_path)
        asked = questions(server)
        warm_ups = sum(request.user == "warm-up" for request in server.requests)
    assert all(report["errors"] == [] and report["right"] == report["asked"] == 80 for report in reports)
    assert sorted(asked) == sorted(f"question {number}" for number in range(40))
    assert sum(report["calls"] for report in reports) == 40 + warm_ups


# -- what is stored -----------------------------------------------------------------------------


def test_a_redis_entry_holds_the_answer_model_and_settings_never_the_key(server, redis_url, redis_server):
    server.responder = answering
    first = judge_for(server, redis_url)
    assert first.complete("Grade it.", "an answer", temperature=0.0) == "answer to an answer"
    again = judge_for(server, redis_url)  # another process's judge, in effect: nothing in its memory
    assert again.complete("Grade it.", "an answer", temperature=0.0) == "answer to an answer"
    assert (again.usage.requests, again.usage.cache_hits) == (0, 1) and len(server.requests) == 1
    client = redis_server.client()
    keys = [key.decode() for key in client.keys(f"{KEY_PREFIX}*")]
    assert len(keys) == 1  # the answer; the in-flight lock was released
    entry = json.loads(client.get(keys[0]))
    assert entry["text"] == "answer to an answer" and entry["model"] == "openai/gpt-4o-mini"
    assert entry["settings"]["temperature"] == 0.0
    assert KEY not in client.get(keys[0]).decode() and KEY not in keys[0]


def test_an_unreachable_redis_is_a_clear_error_at_load_naming_it(metrics_dir):
    with pytest.raises(ValueError, match=r"the judge cache at redis://:\*\*\*@127\.0\.0\.1:1/0 cannot be reached"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", judge_cache="redis://:hunter2-secret@127.0.0.1:1/0")


def test_redis_stopping_mid_run_means_no_cache_with_one_warning(server, own_redis, caplog):
    server.responder = answering
    judge = judge_for(server, own_redis.url)
    assert judge.complete("Grade it.", "one") == "answer to one"
    own_redis.stop()
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        answers = [judge.complete("Grade it.", text) for text in ("two", "three", "two")]
    assert answers == ["answer to two", "answer to three", "answer to two"]  # memory still answers the repeat
    warnings = [r.getMessage() for r in caplog.records if "judge cache" in r.getMessage()]
    assert len(warnings) == 1 and own_redis.url.rsplit("/", 1)[0] in warnings[0]


# -- a disk store held or broken by another process ----------------------------------------------

HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    import diskcache
    folder, how = sys.argv[1], sys.argv[2]
    if how == "write":  # diskcache's own transaction: writers wait, readers go on (WAL)
        cache = diskcache.Cache(folder)
        with cache.transact():
            cache.set("held", 1)
            print("held", flush=True)
            time.sleep(60)
    else:  # an exclusive lock on the whole database: readers wait too
        db = sqlite3.connect(folder + "/cache.db", isolation_level=None)
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("BEGIN EXCLUSIVE")
        db.execute("UPDATE Settings SET value = value WHERE key = 'count'")
        print("held", flush=True)
        time.sleep(60)
""")

JUDGE_METRIC = textwrap.dedent("""
    from skynet import llm

    def score(input, output, expected=None):
        verdict = llm("Answer PASS or FAIL.", input=f"{input['question']} -> {output}")
        return (1.0 if verdict.startswith("PASS") else 0.0), {"feedback": verdict}
""")


@pytest.mark.slow
@pytest.mark.parametrize(("how", "when"), [("write", "after load"), ("exclusive", "before load")])
def test_a_disk_cache_locked_by_another_process_never_fails_a_call(tmp_path, how, when, caplog):
    """Another process holds the store (its write lock, or the whole database) through an Evaluate(num_threads=8)."""
    folder = tmp_path / "judge-cache"
    DiskStore(folder).close()  # the cache exists, as after an earlier run
    (tmp_path / "judge_metric.py").write_text(JUDGE_METRIC, encoding="utf-8")
    examples = [dspy.Example(question=f"q{n}", answer=f"a{n}").with_inputs("question") for n in range(24)]
    program = dspy.Predict("question -> answer")
    program.forward = lambda question: dspy.Prediction(answer=f"a-{question}")
    holder = None
    with DevServer(lambda request: "PASS. Fine.", model_name="gpt-4o-mini") as server, \
            caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        try:
            if when == "before load":
                holder = hold(folder, how)
            started = time.perf_counter()
            model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
            with skynet_dspy.load_metric(tmp_path / "judge_metric.py", metric_lm=model, judge_cache=folder,
                                         timeout=20) as metric:
                loaded = time.perf_counter() - started
                if when == "after load":
                    holder = hold(folder, how)
                started = time.perf_counter()
                result = dspy.Evaluate(devset=examples, metric=metric, num_threads=8, display_progress=False)(program)
                seconds = time.perf_counter() - started
                stats, usage = metric.stats, metric.judge_usage
            assert holder.poll() is None  # the lock was held through the whole run
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
    assert result.score == 100.0 and stats["calls"] == 24  # every call scored...
    assert sum(stats[kind] for kind in stats if kind not in ("calls", "memo_hits")) == 0  # ...none failed
    assert usage.requests == 24 and usage.retries == usage.failed == 0
    # Neither the load nor the run waited out diskcache's 60 s lock timeout (a bound for that hang, not a speed: the
    # calls' own timeout of 20 s already shows none of them waited for the lock).
    assert loaded < 50 and seconds < 50
    warnings = [r.getMessage() for r in caplog.records if "judge cache" in r.getMessage()]
    assert len(warnings) == 1 and str(folder) in warnings[0]


def hold(folder: Path, how: str) -> subprocess.Popen:
    """Another process holding the disk store's lock, until it is killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), how], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_corrupted_disk_cache_is_a_clear_error_at_load_naming_its_path(tmp_path, metrics_dir):
    folder = tmp_path / "judge-cache"
    DiskStore(folder).close()
    (folder / "cache.db").write_bytes(b"this is not a database " * 200)
    with pytest.raises(ValueError, match=rf"the judge cache at {folder} cannot be used \(DatabaseError"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", judge_cache=folder)


def test_a_disk_cache_corrupted_during_a_run_means_no_cache_with_one_warning(server, tmp_path, caplog):
    server.responder = answering
    folder = tmp_path / "judge-cache"
    judge = judge_for(server, folder)
    assert judge.complete("Grade it.", "one") == "answer to one"
    with open(folder / "cache.db", "r+b") as database:  # the open store's file, overwritten in place
        database.write(b"garbage!" * 4096)
    answers = []
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        # a thread that has not used the store yet (as a new worker's helper thread): it opens the damaged file
        asking = threading.Thread(target=lambda: answers.extend(
            judge.complete("Grade it.", text) for text in ("two", "three")))
        asking.start()
        asking.join()
    assert answers == ["answer to two", "answer to three"] and judge.usage.retries == judge.usage.failed == 0
    warnings = [r.getMessage() for r in caplog.records if "judge cache" in r.getMessage()]
    assert len(warnings) == 1 and str(folder) in warnings[0]


def test_the_disk_cache_is_bounded_by_judge_cache_size(server, tmp_path):
    server.responder = lambda request: "x" * 20_000 + request.user
    folder = tmp_path / "judge-cache"
    judge = judge_for(server, folder, cache_size=200_000)
    for number in range(40):
        judge.complete("Repeat.", f"answer {number}")
    judge.cache.close()
    with diskcache.Cache(str(folder)) as store:
        assert store.volume() < 400_000  # 40 answers of 20 kB would be 800 kB: the oldest were evicted
        assert len(store) < 40


def test_judge_cache_size_is_checked(tmp_path, metrics_dir):
    with pytest.raises(ValueError, match="judge_cache_size must be a whole number of bytes"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", judge_cache=tmp_path, judge_cache_size=-1)
    with pytest.raises(ValueError, match="judge_cache_size= bounds the judge's disk cache"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", judge_cache=True, judge_cache_size=10_000)
