"""Hostile metrics against sandbox=True (docs/sandbox.md): each attack, then a good call.

The default workers contain buggy metrics; a metric written to do harm belongs in the sandbox, and every test
here runs in it. Each is an attack a hostile metric can make on the machinery around it: writing to the
worker's socket (a forged frame header, a forged reply), leaving something behind after a call that returned
normally (an alarm, a timer, a thread still calling llm()), escaping the kill of its worker (setsid, a daemon),
returning values whose handling in the user's process would be slow, signalling the user's process or reading
its environment and memory. For each: the call ends within about its timeout, the next good call scores
normally, no process is left behind, and nothing the metric chose reaches the optimizer. Calls run on a guard
thread, so a hole fails the test instead of hanging the suite. What the sandbox itself keeps out (network,
files, kernel state) is in test_sandbox.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure

TIMEOUT = 1.0
SLACK = 15.0  # seconds past the timeout a call may take on a loaded 2-core machine: a hang, not a speed, is caught


# Finds the call id of the call in progress (the worker's own frame) and writes a frame of our choosing to
# the worker's socket: what any metric can do, since the socket is an inherited descriptor.
FORGER = '''
import os, pickle, signal, struct, sys, threading, time

def _call_id():
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_serve":
            message = frame.f_locals["message"]
            return message["call"] if isinstance(message, dict) else message[1]
        frame = frame.f_back

def _raw(data):
    os.write(int(sys.argv[1]), data)

def _users_process():  # the worker's parent, or the template's parent when the worker was forked from one
    pid = os.getppid()
    while b"skynet_dspy._core.isolation" in open(f"/proc/{pid}/cmdline", "rb").read():
        pid = int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
    return pid

def forge(outcome):
    data = pickle.dumps({"kind": "outcome", "call": _call_id(), "outcome": outcome, "retire": False}, protocol=5)
    _raw(struct.pack("!i", len(data)) + data)
'''


def _example(case: str, label: str = "yes") -> dspy.Example:
    return dspy.Example(case=case, label=label).with_inputs("case")


def _call(metric, case: str, label: str = "yes", bound: float = TIMEOUT + SLACK):
    """metric(example, prediction) on a guard thread; (seconds, Score), or a failure if it does not end."""
    box: dict = {}

    def run() -> None:
        start = time.monotonic()
        try:
            box["score"] = metric(_example(case, label), dspy.Prediction(label="yes"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            box["error"] = exc
        box["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"the call for {case!r} did not end within {bound:g} s"
    assert "error" not in box, f"the call for {case!r} raised into the user's process: {box['error']!r}"
    return box["seconds"], box["score"]


def _assert_good(metric, case: str = "good") -> None:
    _, score = _call(metric, case + uuid.uuid4().hex[:6])
    assert score.result.failure is None, score.result.detail
    assert float(score) == 1.0


def _metric(tmp_path: Path, body: str, **options) -> skynet_dspy.Metric:
    path = write_metric(tmp_path, FORGER + textwrap.dedent(body))
    return skynet_dspy.load_metric(str(path), timeout=TIMEOUT, workers=1, sandbox=True, **options)


def _tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `tag`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if tag.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(tag: str, within: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# -- the socket: a metric writes to the worker's inherited descriptor -------------------------------------


SOCKET = '''
def score(input, output, expected=None):
    case = input["case"]
    if case == "huge_header":  # a frame header announcing 1 GiB that never comes
        _raw(struct.pack("!i", 2**30))
    if case == "half_frame_then_stop":  # half a frame, then the worker stops itself mid-reply
        _raw(struct.pack("!i", 1000) + b"x" * 10)
        os.kill(os.getpid(), signal.SIGSTOP)
    if case == "garbage":
        _raw(b"\\x00\\x00\\x00\\x05hello")
    return 1.0, {"feedback": "ok"}
'''


@pytest.mark.parametrize("case", ["huge_header", "half_frame_then_stop", "garbage"])
def test_bytes_written_to_the_workers_socket_never_stall_the_call(tmp_path, case):
    metric = _metric(tmp_path, SOCKET)
    try:
        seconds, score = _call(metric, case)
        assert score.result.failure in (Failure.CRASHED, Failure.TIMEOUT)
        assert seconds < TIMEOUT + SLACK
        _assert_good(metric)
    finally:
        metric.close()


FORGED = '''
def score(input, output, expected=None):
    case = input["case"]
    if case == "huge_int":
        forge({"result": {"score": 10**400, "feedback": "x"}})
    if case == "nan":
        forge({"result": {"score": float("nan"), "feedback": "x"}})
    if case == "names":
        forge({"result": {"score": 1.0, "feedback": "x", "scores": {f"N{i:04d}" + "n" * 90: 1.0 for i in range(3000)}}})
    if case == "shared_lists":  # 2**40 paths through a few hundred bytes
        value = "s"
        for _ in range(40):
            value = [value, value]
        forge({"result": {"score": 1.0, "feedback": "x", "extra": {"k": value}}})
    if case == "deep":
        value = []
        for _ in range(100_000):
            value = [value]
        forge({"result": {"score": 1.0, "feedback": "x", "extra": {"k": value}}})
    if case == "error_type":
        forge({"failure": "exception", "error_type": "LEAK-" + expected["label"], "detail": "d"})
    if case == "rule":
        forge({"failure": "invalid", "rule": "LEAK-" + expected["label"], "detail": "d"})
    if case == "feedback_flood":
        forge({"result": {"score": 1.0, "feedback": "f" * 5_000_000}})
    if case.startswith("good"):
        return 1.0, {"feedback": "ok"}
    return 1.0, {"feedback": "the real reply"}
'''


@pytest.mark.parametrize(
    "case", ["huge_int", "nan", "names", "shared_lists", "deep", "error_type", "rule", "feedback_flood"]
)
def test_a_forged_reply_is_checked_like_a_return_value(tmp_path, case):
    """A worker is not trusted: what it sends is bounded and checked in the user's process too."""
    metric = _metric(tmp_path, FORGED, feedback_limit=1000)
    try:
        seconds, score = _call(metric, case, label="CANARY42")
        result = score.result
        assert seconds < TIMEOUT + SLACK
        assert math.isfinite(float(score))
        assert "CANARY42" not in result.feedback
        assert len(result.feedback) <= 1000
        assert len(result.scores or {}) <= 32 and all(len(name) <= 64 for name in result.scores or {})
        json.dumps(result.extra, default=repr)  # the extras are small enough to walk
        _assert_good(metric)
    finally:
        metric.close()


FORGE_THEN_HANG = '''
def score(input, output, expected=None):
    if input["case"].startswith("forge"):
        forge({"result": {"score": 1.0, "feedback": "forged"}})
        time.sleep(30)
    return 1.0, {"feedback": "ok"}
'''


def test_a_forged_reply_then_a_hang_costs_at_most_the_next_call_its_timeout(tmp_path):
    """A worker cannot be authenticated against the metric it runs: a forged reply makes it look idle while
    score still runs. The next call it is given times out (it is killed), and the one after scores normally."""
    metric = _metric(tmp_path, FORGE_THEN_HANG)
    try:
        _, forged = _call(metric, "forge")
        assert forged.result.feedback == "forged"  # accepted: it is well-formed and names the call in progress
        seconds, spoiled = _call(metric, "good" + uuid.uuid4().hex[:6])
        assert seconds < TIMEOUT + SLACK
        assert spoiled.result.failure in (None, Failure.TIMEOUT)
        _assert_good(metric)
        assert len(metric.scorer.executor.worker_pids) == 1  # the hung worker was killed, not kept beside a new one
    finally:
        metric.close()


STOPS_ON_THE_NEXT_CALL = '''
import select

def _stop_when_the_next_call_comes():
    select.select([int(sys.argv[1])], [], [])
    os.kill(os.getpid(), signal.SIGSTOP)

def score(input, output, expected=None):
    if input["case"] == "arm":
        threading.Thread(target=_stop_when_the_next_call_comes, daemon=True).start()
    return 1.0, {"feedback": "ok"}
'''


def test_a_worker_stopped_while_a_big_call_is_sent_to_it_does_not_hold_the_sender(tmp_path):
    """A thread the metric left behind stops its worker as the next call arrives: sending that call
    (larger than the socket's buffer) fails after the timeout instead of blocking the caller forever, and
    the call is scored on a new worker (the stopped one never had all of it, so score ran once)."""
    metric = _metric(tmp_path, STOPS_ON_THE_NEXT_CALL)
    try:
        _call(metric, "arm")
        box: dict = {}

        def big() -> None:
            box["result"] = metric.score({"case": "big", "blob": "b" * 16_000_000}, "yes", {"label": "yes"})

        thread = threading.Thread(target=big, daemon=True)
        thread.start()
        thread.join(TIMEOUT + SLACK + 2)
        assert not thread.is_alive(), "sending a call to a stopped worker blocked the caller"
        assert box["result"].failure is None and box["result"].score == 1.0, box["result"].detail
        _assert_good(metric)
    finally:
        metric.close()


SHUTS_ITS_SOCKET = '''
import socket

def score(input, output, expected=None):
    if input["case"] == "shut":
        socket.socket(fileno=os.dup(int(sys.argv[1]))).shutdown(socket.SHUT_RD)
    return 1.0, {"feedback": "ok"}
'''


def test_a_worker_that_shut_its_socket_for_reading_is_replaced_before_the_next_call(tmp_path):
    metric = _metric(tmp_path, SHUTS_ITS_SOCKET)
    try:
        _call(metric, "shut")
        _assert_good(metric)  # the call it can no longer take goes to a new worker
    finally:
        metric.close()


# -- what a call leaves behind after returning normally ---------------------------------------------------


LEFTOVERS = '''
def score(input, output, expected=None):
    case = input["case"]
    if case == "alarm":  # a self-imposed timeout the metric forgot to cancel
        signal.setitimer(signal.ITIMER_REAL, 0.05)
    if case == "timer_exit":
        threading.Timer(0.05, os._exit, (7,)).start()
    if case == "timer_stop":
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    if case == "late_frame":
        threading.Timer(0.05, _raw, (b"\\x00\\x00\\x00\\x03abc",)).start()
    return 1.0, {"feedback": "ok"}
'''


@pytest.mark.parametrize("case", ["alarm", "timer_exit", "timer_stop", "late_frame"])
def test_what_a_returned_call_left_behind_does_not_fail_the_next_good_call(tmp_path, case):
    metric = _metric(tmp_path, LEFTOVERS)
    try:
        _, score = _call(metric, case)
        assert score.result.failure is None
        time.sleep(0.4)  # the leftover fires while the worker is idle
        _assert_good(metric)
        _assert_good(metric)
    finally:
        metric.close()


THREAD_LLM = '''
import skynet

def _spam():
    for number in range(100):
        try:
            skynet.llm(f"question {number}")
        except Exception:
            pass

def score(input, output, expected=None):
    if input["case"].startswith("spawn"):
        for _ in range(4):
            threading.Thread(target=_spam, daemon=True).start()
        time.sleep(0.05)
    return 1.0, {"feedback": "ok"}
'''


def test_llm_calls_from_a_thread_that_outlives_its_call_spoil_no_later_call(tmp_path, server):
    server.responder = lambda request: "an answer"
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    metric = _metric(tmp_path, THREAD_LLM, metric_lm=lm)
    try:
        for _ in range(6):
            _call(metric, "spawn" + uuid.uuid4().hex[:6])
            _assert_good(metric)
    finally:
        metric.close()


REDIRECTS = '''
import skynet

def score(input, output, expected=None):
    if input["case"] == "asked":  # through llm(), which checks its settings in the worker
        skynet.llm("hello", api_base=input["evil"])
    if input["case"] == "forged":  # a hand-written request, past the worker's own check
        forge_llm = {"kind": "llm", "call": _call_id(), "request": 1, "instructions": "hello", "input": None,
                     "settings": {"api_base": input["evil"], "api_key": "x", "timeout": 10**6}}
        data = pickle.dumps(forge_llm, protocol=5)
        _raw(struct.pack("!i", len(data)) + data)
        time.sleep(0.2)  # the user's process answers it meanwhile (and must refuse it)
    return 1.0, {"feedback": "ok"}
'''


@pytest.mark.parametrize("case", ["asked", "forged"])
def test_a_metric_cannot_send_the_users_key_to_an_endpoint_of_its_choosing(tmp_path, server, case):
    """llm() settings say how the model answers; the model, endpoint, key and timeout are the user's."""
    from skynet_dspy.devserver import DevServer

    key = "sk-user-" + uuid.uuid4().hex
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=key, cache=False)
    metric = _metric(tmp_path, REDIRECTS, metric_lm=lm)
    try:
        with DevServer(model_name="gpt-4o-mini") as evil:
            result = metric.score({"case": case, "evil": evil.url}, "yes", {"label": "yes"})
            time.sleep(0.3)
            assert evil.requests == [], "a judge request went to the metric's endpoint"
        assert result.failure is (Failure.EXCEPTION if case == "asked" else None), result.detail
        if case == "asked":
            assert "does not take api_base" in result.detail
    finally:
        metric.close()


FLOODS_LLM = '''
def score(input, output, expected=None):
    if input["case"] == "flood":
        request = {"kind": "llm", "call": _call_id(), "request": 1, "instructions": "x", "input": None,
                   "settings": {}}
        data = pickle.dumps(request, protocol=5)
        _raw((struct.pack("!i", len(data)) + data) * 200_000)  # far more than may be in flight at once
        time.sleep(10**6)
    return 1.0, {"feedback": "ok"}
'''


def test_a_flood_of_llm_requests_ends_the_call_in_about_its_timeout(tmp_path):
    from skynet_dspy.devserver import DevServer

    with DevServer(model_name="gpt-4o-mini", delay=30) as judge:  # the 16 allowed requests hang
        lm = dspy.LM("openai/gpt-4o-mini", api_base=judge.url, api_key="local-test-key", cache=False)
        metric = _metric(tmp_path, FLOODS_LLM, metric_lm=lm)
        try:
            seconds, score = _call(metric, "flood", bound=TIMEOUT + SLACK + TIMEOUT)
            assert score.result.failure in (Failure.CRASHED, Failure.TIMEOUT)
            _assert_good(metric)
        finally:
            metric.close()


DOUBLE_TAMPER = '''
def score(input, output, expected=None):
    if input["case"] == "tamper":
        data = pickle.dumps({"kind": "outcome", "call": 0, "outcome": {}, "retire": False}, protocol=5)
        _raw(struct.pack("!i", len(data)) + data)
        time.sleep(30)
    return 1.0, {"feedback": "ok"}
'''


def test_a_call_tampered_with_twice_is_a_failure_not_an_error(tmp_path):
    metric = _metric(tmp_path, DOUBLE_TAMPER)
    try:
        _, score = _call(metric, "tamper")
        assert score.result.failure is Failure.CRASHED
        _assert_good(metric)
    finally:
        metric.close()


# -- processes the metric starts ----------------------------------------------------------------------------


def _sleeper(tag: str) -> str:
    return f"sleep {1000 + int(tag, 16) % 1000}.{int(tag, 16) % 10**6:06d}"  # a command line no one else has


CHILDREN = '''
import subprocess

def score(input, output, expected=None):
    command = input["case"].partition(":")[2]
    if input["case"].startswith("setsid:"):
        subprocess.Popen(command.split(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if input["case"].startswith("daemon:"):  # setsid and a double fork: the child is orphaned at once
        subprocess.Popen(["sh", "-c", command + " &"], start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL).wait()
    if input["case"].startswith("bare_daemon:"):  # the same, in an environment of the metric's own making
        subprocess.Popen(["sh", "-c", command + " &"], start_new_session=True, env={"PATH": os.environ["PATH"]},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()
    if input["case"].startswith("hang:"):
        subprocess.Popen(command.split(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(10**6)
    return 1.0, {"feedback": "ok"}
'''


@pytest.mark.parametrize("how", ["setsid", "daemon", "hang", "bare_daemon"])
def test_a_child_that_left_the_workers_process_group_is_stopped_with_the_worker(tmp_path, how):
    """A daemon started with an environment of the metric's own making carries no worker mark and is no longer
    below the worker: only the sandbox (its PID namespace ends with the template) stops it."""
    tag = uuid.uuid4().hex[:8]
    command = _sleeper(tag)
    metric = _metric(tmp_path, CHILDREN)
    try:
        _, score = _call(metric, f"{how}:{command}")
        if how == "hang":  # the call timed out: its worker was killed, and the child with it
            assert score.result.failure is Failure.TIMEOUT
            assert _wait_gone(command.split()[1]) == [], "a process the metric started outlived its worker"
        else:
            time.sleep(0.2)
            assert _tagged(command.split()[1]), "the metric's child was started"
        _assert_good(metric)
    finally:
        metric.close()
    left = _wait_gone(command.split()[1])
    for pid in left:  # this test's own sleeper, when it escaped: never left running
        os.kill(pid, 9)
    assert left == [], "a process the metric started outlived its worker"


USER_SCRIPT = '''
import sys, time
import dspy, skynet_dspy
metric = skynet_dspy.load_metric(sys.argv[1], timeout=5, workers=1, sandbox=True)
metric(dspy.Example(case="plain:" + sys.argv[2], label="yes").with_inputs("case"), dspy.Prediction(label="yes"))
print("scored", flush=True)
time.sleep(60)
'''

PLAIN_CHILD = '''
import subprocess

def score(input, output, expected=None):
    subprocess.Popen(input["case"].partition(":")[2].split(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return 1.0, {"feedback": "ok"}
'''


def test_the_metrics_children_end_when_the_users_process_is_killed(tmp_path):
    tag = uuid.uuid4().hex[:8]
    command = _sleeper(tag)
    path = write_metric(tmp_path, PLAIN_CHILD)
    script = write_metric(tmp_path, USER_SCRIPT, "user.py")
    user = subprocess.Popen([sys.executable, str(script), str(path), command], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert user.stdout.readline().strip() == "scored"
        assert _tagged(command.split()[1])
        user.kill()  # SIGKILL: no finalizer of the package runs
        user.wait()
        assert _wait_gone(command.split()[1]) == [], "the metric's child outlived the killed user process"
    finally:
        user.kill()
        user.wait()


BLINDS_ITS_WATCH = '''
import os, sys, time

_parent, _real_sleep = os.getppid(), time.sleep
os.getppid = lambda: _parent  # the worker's watch on the user's process would never see it go
time.sleep = lambda seconds: None

def score(input, output, expected=None):
    with open("/proc/self/comm", "w") as comm:  # its name, seen from outside: the call is in progress
        comm.write("scoring")
    _real_sleep(10**6)
'''

HANGING_USER = '''
import sys, threading
import skynet_dspy
metric = skynet_dspy.load_metric(sys.argv[1], timeout=600, workers=1, sandbox=True)
print("worker", *metric.scorer.executor.worker_pids, file=sys.stderr, flush=True)  # as this process sees it
threading.Thread(target=metric.score, args=({}, "x"), daemon=True).start()
threading.Event().wait()
'''


def test_a_worker_ends_when_the_users_process_is_killed_even_if_the_metric_blinds_its_watch(tmp_path):
    path = write_metric(tmp_path, BLINDS_ITS_WATCH)
    script = write_metric(tmp_path, HANGING_USER, "user.py")
    user = subprocess.Popen([sys.executable, str(script), str(path)], stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = user.stderr.readline()
        assert line.startswith("worker "), line
        worker = int(line.split()[1])
        deadline = time.monotonic() + TIMEOUT + SLACK  # what score prints is captured: its name says it runs
        while _name(worker) != "scoring" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _name(worker) == "scoring"
        user.kill()
        user.wait()
        deadline = time.monotonic() + 5
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker), "the worker outlived the killed user process"
    finally:
        user.kill()
        user.wait()


# -- text the metric chose, in a failure ---------------------------------------------------------------------


NAMED_CLASS = '''
def score(input, output, expected=None):
    raise type("Wrong_" + expected["label"], (ValueError,), {})("no")
'''


def test_an_exception_class_named_at_run_time_from_the_labels_does_not_reach_the_optimizer(tmp_path):
    metric = _metric(tmp_path, NAMED_CLASS)
    try:
        _, score = _call(metric, "x", label="CANARY77")
        assert score.result.failure is Failure.EXCEPTION
        assert "CANARY77" not in score.result.feedback
        assert "CANARY77" in score.result.detail  # the user still sees it
    finally:
        metric.close()


NAMED_BY_HAND = {
    "qualname_says_local": 'raise type(L, (ValueError,), {"__qualname__": "score.<locals>." + L})("x")',
    "module_says_builtins": 'raise type(L, (ValueError,), {"__module__": "builtins"})("x")',
    "renamed_class": 'Base.__name__ = L\n    raise Base("x")',
    "planted_in_the_metric": 'cls = type(L, (ValueError,), {"__module__": __name__})\n    '
                             'setattr(sys.modules[__name__], L, cls)\n    raise cls("x")',
}
# Not here: a class planted into a library module at run time (a library's class is taken at its word), or an
# exception type written into a forged reply. Both are deliberate leaks, like writing the labels into a
# successful call's feedback, which the contract allows (docs/sandbox.md, "What it does not stop").


@pytest.mark.parametrize("how", sorted(NAMED_BY_HAND))
def test_an_exception_type_a_metric_names_from_the_labels_by_hand_does_not_reach_the_optimizer(tmp_path, how):
    """All a class says of itself (__qualname__, __module__, __name__, where it is found) can be set at run
    time: a class of the metric's own is shown only when a class statement in a source file names it."""
    body = ("class Base(Exception):\n    pass\n\n\n"
            "def score(input, output, expected=None):\n    L = expected['label']\n    ")
    metric = _metric(tmp_path, body + NAMED_BY_HAND[how] + "\n")
    try:
        _, score = _call(metric, "x", label="CANARY55")
        assert score.result.failure is Failure.EXCEPTION
        assert "CANARY55" not in score.result.feedback, score.result.feedback
    finally:
        metric.close()


NAMED_IN_SOURCE = '''
import json


class ParseError(ValueError):
    pass


def score(input, output, expected=None):
    class LocalError(Exception):
        pass

    if input["case"] == "module":
        raise ParseError("x")
    if input["case"] == "local":
        raise LocalError("x")
    if input["case"] == "numpy":  # a library's class that says it comes from the package, not its own file
        import numpy
        numpy.linalg.inv(numpy.zeros((2, 2)))
    json.loads("{")
'''


@pytest.mark.parametrize("sandbox", [True, False])
def test_exception_types_named_in_source_still_reach_the_optimizer(tmp_path, sandbox):
    path = write_metric(tmp_path, textwrap.dedent(NAMED_IN_SOURCE))
    options = {"sandbox": True} if sandbox else {"isolation": "thread"}
    with skynet_dspy.load_metric(str(path), timeout=10, **options) as metric:
        feedback = {case: metric.score({"case": case}, "x", {}).feedback
                    for case in ("module", "local", "library", "numpy")}
    assert "raised LinAlgError" in feedback["numpy"]
    assert "raised ParseError" in feedback["module"]
    assert "raised LocalError" in feedback["local"]
    assert "raised JSONDecodeError" in feedback["library"]


# -- bulk that is cheap for the worker and dear for the user's process ---------------------------------------


BULK = '''
def score(input, output, expected=None):
    if input["case"] == "shared":  # two million references to one 1 kB string: a small pickle
        return 1.0, {"feedback": "x", "k": ["s" * 1000] * 2_000_000}
    if input["case"] == "big":
        return 1.0, {"feedback": "x", "k": "b" * 40_000_000}
    return 1.0, {"feedback": "ok"}
'''


@pytest.mark.parametrize("case", ["shared", "big"])
def test_bulky_extra_values_are_bounded_so_the_call_ends_in_about_its_timeout(tmp_path, case):
    metric = _metric(tmp_path, BULK)
    try:
        seconds, score = _call(metric, case)
        assert seconds < TIMEOUT + SLACK
        assert len(json.dumps(score.result.extra, default=repr)) < 35_000_000
        _assert_good(metric)
    finally:
        metric.close()


# -- the user's process: out of the sandbox's sight ----------------------------------------------------------


KILLS_PARENT = '''
def score(input, output, expected=None):
    for pid in {os.getppid(), int(input["case"].partition(":")[2])}:  # its parent, and the user's pid, told to it
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    return 1.0, {"feedback": "ok"}
'''

def test_a_metric_cannot_kill_the_users_process(tmp_path):
    path = write_metric(tmp_path, FORGER + textwrap.dedent(KILLS_PARENT))
    script = write_metric(tmp_path, USER_SCRIPT.replace("time.sleep(60)", "").replace(
        '"plain:" + sys.argv[2]', '"plain:" + str(os.getpid())').replace("import sys, time", "import os, sys, time")
        , "user.py")
    done = subprocess.run([sys.executable, str(script), str(path), "x"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0 and "scored" in done.stdout, done.returncode


READS_PARENT = '''
def score(input, output, expected=None):
    seen = False
    for pid in {os.getppid(), 1, int(input["case"])}:  # its parent, the sandbox's init, the user's pid told to it
        try:
            seen = seen or b"ATTACK_API_KEY=" in open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            pass
    return 1.0, {"feedback": "ok", "seen": seen}
'''


def test_a_metric_cannot_read_the_users_keys(tmp_path):
    path = write_metric(tmp_path, FORGER + textwrap.dedent(READS_PARENT))
    script = write_metric(tmp_path, textwrap.dedent('''
        import os, sys, dspy, skynet_dspy
        metric = skynet_dspy.load_metric(sys.argv[1], timeout=5, workers=1, sandbox=True)
        example = dspy.Example(case=str(os.getpid()), label="yes").with_inputs("case")
        score = metric(example, dspy.Prediction(label="yes"))
        print(score.result.extra.get("seen"))
    '''), "user.py")
    env = {**os.environ, "ATTACK_API_KEY": "attack-" + uuid.uuid4().hex}
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert done.stdout.strip() == "False", (done.stdout, done.stderr[-500:])


READS_PARENT_MEMORY = '''
import re

def _scan(pid, needle):
    """Whether `needle` is in the writable memory of `pid`, read through /proc/<pid>/mem."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            bounds, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(part, 16) for part in bounds.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False

def score(input, output, expected=None):
    seen, needle = False, "".join(["mem", "canary-"]).encode()  # never whole in this file, nor in its compiled code
    for pid in {os.getppid(), 1, int(input["case"])}:
        try:
            seen = seen or _scan(pid, needle)
        except OSError:
            pass
    return 1.0, {"feedback": "ok", "seen": seen}
'''


def test_a_metric_cannot_read_a_key_given_only_in_python_from_the_users_memory(tmp_path):
    path = write_metric(tmp_path, FORGER + textwrap.dedent(READS_PARENT_MEMORY))
    script = write_metric(tmp_path, textwrap.dedent('''
        import os, sys, uuid, dspy, skynet_dspy
        key = "memcanary-" + uuid.uuid4().hex  # only in this process's memory: no file, no environment
        metric = skynet_dspy.load_metric(sys.argv[1], timeout=30, workers=1, sandbox=True,
                                         metric_lm={"model": "openai/x", "api_key": key})
        example = dspy.Example(case=str(os.getpid()), label="yes").with_inputs("case")
        score = metric(example, dspy.Prediction(label="yes"))
        print(score.result.failure, score.result.extra.get("seen"))
    '''), "user.py")
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=90,
                          cwd=tmp_path)
    assert done.stdout.strip() == "None False", (done.stdout, done.stderr[-500:])


# -- the same attacks under a real optimizer: dspy.GEPA and the command-line check ------------------------


GEPA_METRIC = '''
def score(input, output, expected):
    mode = expected["mode"]
    if mode == "ok":
        right = str(output).strip().lower() == expected["label"]
        return float(right), {"feedback": f"Checked [{expected['shown']}]", "canary_extra": expected["canary"]}
    if mode == "class_name":
        raise type("Wrong_" + expected["canary"], (ValueError,), {})("no")
    if mode == "forged_names":
        forge({"result": {"score": 1.0, "feedback": "fine", "scores": {expected["canary"] + str(i): 1.0
                                                                      for i in range(100)}}})
        return 1.0, {"feedback": "the real reply, after a forged one"}
    if mode == "huge_header":
        _raw(struct.pack("!i", 2**30))
        return 1.0, {"feedback": expected["canary"]}
    raise AssertionError(mode)
'''
GEPA_MODES = ("ok", "class_name", "forged_names", "huge_header", "ok")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dspy_gepa_runs_through_every_attack_and_no_canary_reaches_a_model(tmp_path):
    from examples.program import load_split
    from skynet_dspy.devserver import requests_by_role, scripted_server

    canaries, shown, train = [], [], []
    for number, (mode, example) in enumerate(zip(GEPA_MODES, load_split("train"), strict=False)):
        tag = uuid.uuid4().hex[:10]
        canaries.append(f"CANARY{tag}")
        shown.append(f"SHOWN{number}x{tag}")
        train.append(dspy.Example(ticket=example.ticket, label=example.label, mode=mode, canary=canaries[-1],
                                  shown=shown[-1]).with_inputs("ticket"))
    path = write_metric(tmp_path, FORGER + textwrap.dedent(GEPA_METRIC))
    metric = skynet_dspy.load_metric(str(path), output_fields="label", timeout=TIMEOUT, sandbox=True)
    server = scripted_server()
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    optimizer = dspy.GEPA(metric=metric, reflection_lm=lm, max_metric_calls=3 * len(train), num_threads=4,
                          reflection_minibatch_size=len(train), seed=0, track_stats=False)
    start = time.monotonic()
    try:
        with dspy.context(lm=lm):
            optimizer.compile(dspy.Predict("ticket -> label"), trainset=train, valset=train)
    finally:
        server.stop()
        metric.close()
    assert time.monotonic() - start < 120
    reflections = requests_by_role(server.requests, "reflection")
    assert reflections, "GEPA asked the reflection model for a new instruction"
    sent = "\n".join(json.dumps(request.body, ensure_ascii=False) + request.text for request in server.requests)
    leaked = [canary for canary in canaries if canary in sent]
    assert leaked == [], [sent[max(0, sent.index(c) - 300):sent.index(c) + 100] for c in leaked]
    assert any(marker in sent for marker in shown), "the metric's own feedback reached the reflection model"
    assert metric.stats["crashed"] >= 1 and metric.stats["exception"] >= 1


CLI_METRIC = '''
import subprocess

def score(input, output, expected=None):
    case = input["case"]
    if case == "huge_header":
        _raw(struct.pack("!i", 2**30))
    if case == "daemon":
        subprocess.Popen(["sh", "-c", expected["command"] + " &"], start_new_session=True).wait()
    if case == "class_name":
        raise type("E_" + expected["label"], (Exception,), {})()
    return 1.0, {"feedback": "ok"}
'''


def test_the_command_line_check_reports_socket_and_daemon_attacks_and_leaves_nothing(tmp_path):
    command = _sleeper(uuid.uuid4().hex[:8])
    path = write_metric(tmp_path, FORGER + textwrap.dedent(CLI_METRIC))
    cases = tmp_path / "cases.jsonl"
    rows = [{"input": {"case": case}, "expected": {"label": "CANARY5", "command": command}}
            for case in ("huge_header", "daemon", "class_name", "good")]
    cases.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    cli = Path(sys.executable).with_name("skynet-dspy")
    done = subprocess.run([str(cli), "check", str(path), "--data", str(cases), "--all", "--timeout", "1"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "The contract is broken" in done.stdout
    calls = done.stdout[done.stdout.index("Calls:"):]
    assert "CANARY5" not in calls  # the feedback column: what an optimizer would read
    left = _wait_gone(command.split()[1])
    for pid in left:
        os.kill(pid, 9)
    assert left == []
