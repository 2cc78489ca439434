"""The worker pool's promises: import once (template), start without failing calls, recycle, a clean import path."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure
from skynet_dspy._core.isolation.handle import private_memory
from skynet_dspy._core.isolation.process import START_VARIABLE
from skynet_dspy._core.isolation.template import THREAD_CAPS

ENV_METRIC = """
import os, sys
def score(input, output, expected=None):
    return 1.0, {"feedback": "ok", "pid": os.getpid(), "env": {k: v for k, v in os.environ.items()
                 if k.endswith("_THREADS")}, "path": sys.path, "modules": sorted(sys.modules)}
"""


@pytest.fixture(params=["template", "fresh"])
def start_mode(request, monkeypatch) -> str:
    monkeypatch.setenv(START_VARIABLE, request.param)
    return request.param


def _pids(metric) -> list[int]:
    return metric.scorer.executor.worker_pids


def test_the_default_start_mode_is_the_template_and_workers_are_its_children(tmp_path, monkeypatch):
    monkeypatch.delenv(START_VARIABLE, raising=False)
    with skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC), timeout=10) as metric:
        executor = metric.scorer.executor
        assert executor.start_mode == "template"
        pid = metric.score({}, "x").extra["pid"]
        template = executor._template.pid
        parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        assert parent == template != os.getpid()


def test_native_thread_pools_are_capped_unless_the_user_set_them(tmp_path, monkeypatch, start_mode):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    for name in THREAD_CAPS:
        if name != "OPENBLAS_NUM_THREADS":
            monkeypatch.delenv(name, raising=False)
    with skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC), timeout=10) as metric:
        env = metric.score({}, "x").extra["env"]
    assert env["OPENBLAS_NUM_THREADS"] == "3"
    assert all(env[name] == "1" for name in THREAD_CAPS if name != "OPENBLAS_NUM_THREADS"), env


def test_a_stdlib_name_in_the_current_directory_is_never_imported_by_a_worker(tmp_path, monkeypatch, start_mode):
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "linecache.py").write_text("raise SystemExit('the linecache.py of the current directory was imported')\n")
    (here / "json.py").write_text("raise SystemExit('the json.py of the current directory was imported')\n")
    (here / "mylib.py").write_text("VALUE = 'from the current directory'\n")
    metric_dir = tmp_path / "metric"
    metric_dir.mkdir()
    write_metric(metric_dir, "VALUE = 'sibling'\n", "helper.py")
    path = write_metric(metric_dir, ENV_METRIC + """
import helper, mylib  # a sibling of the metric, and a module of the folder the user runs from

def score2(input, output, expected=None):
    return 1.0, {"feedback": helper.VALUE + " " + mylib.VALUE}
score = score2
""")
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", ["", *sys.path])  # as in `python train.py` or a notebook: the cwd first
    with skynet_dspy.load_metric(str(path), timeout=10) as metric:
        result = metric.score({}, "x")
    assert result.ok, result.detail
    assert result.feedback == "sibling from the current directory"


def test_a_metric_that_imports_numpy_is_forked_from_the_template_and_shares_its_array(tmp_path, monkeypatch):
    monkeypatch.delenv(START_VARIABLE, raising=False)
    path = write_metric(tmp_path, """
    import os
    import numpy as np
    TABLE = np.ones(200 * 2**20 // 8)  # 200 MiB, written at import

    def score(input, output, expected=None):
        return float(TABLE[:10].sum() / 10), {"feedback": "ok", "pid": os.getpid()}
    """)
    with skynet_dspy.load_metric(str(path), timeout=30, workers=3) as metric:
        assert metric.scorer.executor.start_mode == "template"
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: metric.score({}, "x"), range(12)))
        assert all(result.score == 1.0 for result in results)
        for pid in _pids(metric):
            own = private_memory(pid)
            assert own is not None and own < 100 * 2**20, (pid, own)  # the 200 MiB array is the template's


THREAD_AT_IMPORT = """
import threading
threading.Thread(target=threading.Event().wait, name="model-prefetch", daemon=True).start()

def score(input, output, expected=None):
    return 1.0, {"feedback": "ok"}
"""


def test_a_metric_that_starts_a_thread_at_import_falls_back_to_fresh_workers_and_says_why(tmp_path, monkeypatch,
                                                                                           caplog):
    monkeypatch.delenv(START_VARIABLE, raising=False)
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        with skynet_dspy.load_metric(write_metric(tmp_path, THREAD_AT_IMPORT), timeout=10) as metric:
            assert metric.scorer.executor.start_mode == "fresh"
            assert metric.score({}, "x").score == 1.0
    assert any("model-prefetch" in record.getMessage() for record in caplog.records)


LEAKS = """
import os
_kept = []

def score(input, output, expected=None):
    _kept.append(bytearray(os.urandom(1)) * (input["mb"] * 2**20))  # resident: the pages are written
    return 1.0, {"feedback": "ok", "pid": os.getpid()}
"""


@pytest.mark.slow
def test_a_leaking_metric_keeps_running_with_its_workers_replaced(tmp_path, start_mode):
    path = write_metric(tmp_path, LEAKS)
    with skynet_dspy.load_metric(str(path), timeout=10, workers=1, worker_max_memory=300 * 2**20) as metric:
        results = [metric.score({"mb": 50}, "x") for _ in range(14)]
        # a call that takes its worker past the limit fails as `memory` (or, caught after it, replaces the
        # worker between calls); the run goes on, on new workers
        assert {result.failure for result in results} <= {None, Failure.MEMORY}
        assert sum(result.ok for result in results) >= 10 and results[-1].ok
        assert len({result.extra["pid"] for result in results if result.ok}) >= 2
        assert metric.stats["crashed"] == 0


def test_a_call_past_the_memory_limit_fails_as_memory_and_the_next_call_scores(tmp_path, start_mode):
    path = write_metric(tmp_path, LEAKS + """
import time
_score = score
def score(input, output, expected=None):
    result = _score(input, output, expected)
    time.sleep(input.get("hold", 0))
    return result
""")
    with skynet_dspy.load_metric(str(path), timeout=10, workers=1, worker_max_memory=100 * 2**20) as metric:
        failed = metric.score({"mb": 200, "hold": 5}, "x")
        assert failed.failure is Failure.MEMORY, failed.detail
        assert "memory limit" in failed.feedback and "200" not in failed.feedback
        assert metric.score({"mb": 1}, "x").ok
        assert metric.stats["memory"] == 1


def test_worker_max_calls_replaces_a_worker_after_that_many_calls(tmp_path, start_mode):
    with skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC), timeout=10, workers=1,
                                 worker_max_calls=2) as metric:
        pids = [metric.score({}, "x").extra["pid"] for _ in range(6)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5]


@pytest.mark.parametrize("options, message", [
    ({"worker_max_calls": 0}, "worker_max_calls must be a whole number"),
    ({"worker_max_memory": 1000}, "worker_max_memory must be a whole number"),
    ({"worker_max_calls": 5, "isolation": "thread"}, "isolation='thread' has none"),
])
def test_recycling_options_are_checked(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC), **options)


def test_a_metric_that_can_no_longer_load_fails_calls_as_load_not_crashed(tmp_path, start_mode):
    path = write_metric(tmp_path, ENV_METRIC)
    with skynet_dspy.load_metric(str(path), timeout=5, workers=1) as metric:
        pid = metric.score({}, "x").extra["pid"]
        path.write_text("raise RuntimeError('the model file is gone')\n")
        executor = metric.scorer.executor
        if executor._template is not None:
            executor._template.kill()  # the template must import the metric again, and cannot
        os.kill(pid, 9)
        time.sleep(0.2)
        failed = metric.score({}, "x")
        assert failed.failure is Failure.LOAD, failed.detail
        assert failed.feedback == (
            "Not scored: the metric could not be loaded; this is a setup problem, not a fault of the output."
        )
        assert "the model file is gone" in failed.detail
        assert metric.stats["crashed"] == 0


def _our_helpers() -> list[int]:
    """Live children of this process running a template (or a fresh worker: its own template)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"isolation.template" in cmdline:
            found.append(int(entry))
    return found


def test_a_metric_that_fails_to_load_leaves_no_template_behind(tmp_path, start_mode):
    path = write_metric(tmp_path, "raise RuntimeError('no model here')\n")
    before = _our_helpers()
    with pytest.raises(skynet_dspy.MetricLoadError, match="no model here"):
        skynet_dspy.load_metric(str(path), timeout=10)
    assert _our_helpers() == before
    metric = skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC, "good.py"), timeout=10)
    assert len(_our_helpers()) == len(before) + 1  # one template per pool (a fresh worker is its own)
    metric.close()
    assert _our_helpers() == before


def test_closing_an_inherited_metric_in_a_fork_leaves_the_parents_workers_alone(tmp_path):
    source = "def score(input, output):\n    return 1.0, {'feedback': 'ok'}\n"
    with skynet_dspy.load_metric(write_metric(tmp_path, source)) as metric:
        assert metric.score({}, "x").ok
        workers = metric.scorer.executor.worker_pids
        pid = os.fork()
        if pid == 0:  # a fork of the user's process closes its copy of the metric, then scores with its own
            try:
                metric.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert metric.scorer.executor.worker_pids == workers
        for worker in workers:  # still running: the fork neither stopped nor killed them
            with open(f"/proc/{worker}/stat", "rb") as stat:
                assert stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X", b"T")
        assert metric.score({}, "y").ok  # the parent's pool still serves
