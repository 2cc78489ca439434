"""The default workers against buggy metrics the template could trip on: descriptors and fork hooks left by the
import, a template stopped or killed, output floods, exit codes; and the user's process stays debuggable."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure
from skynet_dspy._core.isolation.process import START_VARIABLE


@pytest.fixture(autouse=True)
def template_mode(monkeypatch):
    monkeypatch.delenv(START_VARIABLE, raising=False)


def _score_at_once(metric, calls: int = 8, threads: int = 4) -> list[skynet_dspy.Result]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: metric.score({"i": i}, "x"), range(calls)))


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


OPENED_AT_IMPORT = """
import os, socket, time
KIND = {kind!r}
if KIND == "socket":
    _kept, _other = socket.socketpair()  # a client's connection to a scoring service, say
    FD = _kept.fileno()
elif KIND == "pipe":
    FD, _write = os.pipe()
else:
    FD = os.eventfd(0)

def score(input, output, expected=None):
    time.sleep(0.3)  # calls overlap: several workers serve them
    with open(f"/proc/self/fdinfo/{{FD}}") as info:  # an eventfd's id is here, a socket's or pipe's inode too
        seen = [os.readlink(f"/proc/self/fd/{{FD}}")] + info.read().rpartition("eventfd-id:")[2].split()[:1]
    return 1.0, {{"feedback": "ok", "pid": os.getpid(), "fd": " ".join(seen)}}
"""


@pytest.mark.parametrize("kind", ["socket", "pipe", "eventfd"])
def test_a_descriptor_opened_at_import_is_never_shared_between_workers(tmp_path, kind, caplog):
    path = write_metric(tmp_path, OPENED_AT_IMPORT.format(kind=kind))
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        with skynet_dspy.load_metric(path, timeout=20) as metric:
            results = _score_at_once(metric)
    assert [result.failure for result in results] == [None] * 8
    descriptor_of = {result.extra["pid"]: result.extra["fd"] for result in results}
    assert len(descriptor_of) > 1, "the calls overlapped, so more than one worker served them"
    assert len(set(descriptor_of.values())) == len(descriptor_of), descriptor_of  # one of its own per worker
    warnings = [record.getMessage() for record in caplog.records if "descriptor" in record.getMessage()]
    assert len(warnings) == 1, warnings  # said once


FORK_HOOKS = """
import os, time
os.register_at_fork(before=lambda: time.sleep(3600), after_in_parent=lambda: time.sleep(3600))
os.register_at_fork(after_in_child=lambda: 1 / 0)
_child_ran = []
os.register_at_fork(after_in_child=lambda: _child_ran.append(os.getpid()))

def score(input, output, expected=None):
    return 1.0, {"feedback": "ok", "child_hook_ran": _child_ran == [os.getpid()]}
"""


def test_fork_hooks_a_metric_registers_never_hang_or_fail_calls(tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, FORK_HOOKS), timeout=20) as metric:
        results = _score_at_once(metric)
    assert [(result.failure, result.detail) for result in results] == [(None, None)] * 8
    assert all(result.extra["child_hook_ran"] for result in results)  # a child's hook still runs in the worker


HANGING_CHILD_HOOK = """
import os, time
os.register_at_fork(after_in_child=lambda: time.sleep(3600))

def score(input, output, expected=None):
    return 1.0, {"feedback": "ok"}
"""


@pytest.mark.slow
def test_a_hanging_fork_hook_of_the_child_only_delays_a_workers_start(tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, HANGING_CHILD_HOOK), timeout=5) as metric:
        results = [metric.score({}, "x") for _ in range(3)]
    assert [result.failure for result in results] == [None] * 3


SLEEPS = """
import os, time
def score(input, output, expected=None):
    return 1.0, {"feedback": "ok", "pid": os.getpid()}
"""

USER = """
import ctypes, os, sys, threading
import skynet_dspy
metric = skynet_dspy.load_metric(sys.argv[1], timeout=60)
result = metric.score({}, "x")
dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
print(os.getpid(), dumpable, metric.scorer.executor._template.pid, result.extra["pid"], flush=True)
threading.Event().wait()
"""


def _start_user(tmp_path) -> tuple[subprocess.Popen[str], list[int]]:
    """A user's process that loaded a metric and scored once: it, and (its pid, whether it is dumpable, the
    template's pid, the worker's pid)."""
    script = write_metric(tmp_path, USER, "user.py")
    user = subprocess.Popen([sys.executable, str(script), str(write_metric(tmp_path, SLEEPS))], stdout=subprocess.PIPE,
                            text=True)
    return user, [int(word) for word in user.stdout.readline().split()]


def test_the_template_and_its_workers_end_with_the_users_process_even_when_the_template_is_stopped(tmp_path):
    user, (_, _, template, worker) = _start_user(tmp_path)
    try:
        os.kill(template, signal.SIGSTOP)  # or stuck in C code: it cannot act on anything
        user.kill()
        user.wait()
        deadline = time.monotonic() + 60  # generous: a loaded machine; the kernel acts at once
        while (_running(template) or _running(worker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in (template, worker) if _running(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert left == []
    finally:
        user.kill()
        user.wait()


def test_a_call_after_the_template_was_killed_runs_on_a_new_worker(tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, SLEEPS), timeout=20) as metric:
        assert metric.score({}, "x").failure is None
        for _ in range(4):
            template = metric.scorer.executor._template
            os.kill(template.pid, signal.SIGKILL)  # its idle worker dies with it
            result = metric.score({}, "x")
            assert (result.failure, result.detail) == (None, None)
        assert metric.stats.get(Failure.CRASHED, 0) == 0


FLOODS = """
import ctypes, os, subprocess, sys

def score(input, output, expected=None):
    print("MARK-print")
    sys.stderr.write("x" * 5_000_000)
    os.write(1, b"y" * 3_000_000)
    os.write(2, b"z" * 1_000_000)
    ctypes.CDLL(None).printf(b"%s", b"c" * 500_000)
    subprocess.run(["sh", "-c", "head -c 500000 /dev/zero | tr '\\\\0' w"], check=True)
    return 1.0, {"feedback": "ok"}
"""

FLOOD_USER = """
import sys
import skynet_dspy
with skynet_dspy.load_metric(sys.argv[1], timeout=60) as metric:
    results = [metric.score({}, "x") for _ in range(2)]
print("RESULT", [(r.failure, len(r.output or ""), (r.output or "")[:10]) for r in results], file=sys.stderr)
print("TAIL", results[0].output.splitlines()[-1], file=sys.stderr)
"""


def test_a_metric_printing_10_mb_per_call_reaches_the_user_as_a_few_kb_only(tmp_path):
    path = write_metric(tmp_path, FLOODS)
    script = write_metric(tmp_path, FLOOD_USER, "user.py")
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout) + len(done.stderr) < 10_000, (len(done.stdout), len(done.stderr))  # one 4 kB warning
    result_line = next(line for line in done.stderr.decode().splitlines() if line.startswith("RESULT"))
    assert result_line.count("'MARK-print") == 2, result_line  # each call's own output, from its start
    tail = next(line for line in done.stderr.decode().splitlines() if line.startswith("TAIL"))
    assert tail.endswith("[... 9,995,915 more bytes of output not kept]"), tail  # 10,000,011 written, 4,096 kept


def test_what_score_prints_is_in_the_result_the_log_and_the_results_table(tmp_path, caplog):
    path = write_metric(tmp_path, """
        import os
        def score(input, output, expected=None):
            print("hello from score", input["i"])
            os.write(2, b"to stderr " * 1000)
            return 1.0, {"feedback": "ok"}
    """)
    with caplog.at_level(logging.DEBUG, logger="skynet_dspy"):
        with skynet_dspy.load_metric(path, timeout=20) as metric:
            results = [metric.score({"i": i}, "x") for i in range(3)]
    for i, result in enumerate(results):
        assert result.output.startswith(f"hello from score {i}\nto stderr")
        assert "more bytes of output not kept" in result.output and len(result.output) < 5_000
    logged = [record for record in caplog.records if "hello from score" in record.getMessage()]
    assert [record.levelno for record in logged] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    import dspy

    example, prediction = dspy.Example(i=1).with_inputs("i"), dspy.Prediction(answer="x")
    with skynet_dspy.load_metric(path, timeout=20) as metric:
        frame = skynet_dspy.results_frame([(example, prediction, metric(example, prediction))])
    assert frame["printed"][0].startswith("hello from score 1")


@pytest.mark.parametrize("start", ["template", "fresh"])
def test_exit_codes_are_reported_as_they_were(tmp_path, start, monkeypatch):
    monkeypatch.setenv(START_VARIABLE, start)
    path = write_metric(tmp_path, """
        import os, signal
        def score(input, output, expected=None):
            if input["how"] == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGSEGV)
    """)
    with skynet_dspy.load_metric(path, timeout=20) as metric:
        exited, crashed = metric.score({"how": "exit"}, "x"), metric.score({"how": "segv"}, "x")
    assert exited.failure is Failure.CRASHED and "exited with code 3" in exited.detail
    assert crashed.failure is Failure.CRASHED and "killed by SIGSEGV" in crashed.detail


def test_the_users_process_stays_debuggable_while_workers_live(tmp_path):
    user, (pid, dumpable, _, _) = _start_user(tmp_path)
    try:
        assert dumpable == 1  # a same-user profiler may attach (and so may a same-user metric: docs/isolation.md)
        py_spy = Path(sys.executable).with_name("py-spy")  # the dev extra
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "threading.py" in done.stdout and "skynet-spawner" in done.stdout, done.stdout
    finally:
        user.kill()
        user.wait()
