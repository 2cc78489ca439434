"""The worker-process pool (isolation="process"): its wire format, its sizing, and what it never does."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy._core.isolation import wire
from skynet_dspy._core.isolation.process import START_VARIABLE

PID_METRIC = """
import os, time
def score(input, output, expected=None):
    time.sleep(input.get("sleep", 0))
    if "meet" in input:  # a rendezvous of two calls: each marks its start, then waits for the other's
        open(os.path.join(input["meet"], str(input["n"])), "w").close()
        while len(os.listdir(input["meet"])) < 2:
            time.sleep(0.01)
    return 1.0, {"feedback": "ok", "pid": os.getpid(), "env": sorted(os.environ)}
"""


@pytest.fixture(autouse=True, params=["template", "fresh"])
def start_mode(request, monkeypatch) -> str:
    """Every test here runs twice: workers forked from the template, and fresh-interpreter workers."""
    monkeypatch.setenv(START_VARIABLE, request.param)
    return request.param



class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_replies_from_a_worker_may_hold_plain_values_only():
    plain = {"a": [1, 2.5, None, True, b"x", ("t", 1)], "b": {"c": "d"}, "s": {1, 2}, "f": frozenset({3})}
    assert wire.from_worker(wire.to_parent(plain)) == plain
    for hostile in (Evil(), Path("/tmp"), complex(1, 2)):
        with pytest.raises(pickle.UnpicklingError, match="only plain values are accepted"):
            wire.from_worker(pickle.dumps(hostile))


def test_values_that_are_not_plain_travel_as_their_repr():
    class Mine:
        def __repr__(self):
            return "<mine>"

    converted = wire.to_plain({"x": Mine(), "n": [float("inf"), 1], (1, 2): "tuple key", Mine(): 1})
    assert converted == {"x": "<mine>", "n": [float("inf"), 1], (1, 2): "tuple key", "<mine>": 1}
    deep: list = []
    cursor = deep
    for _ in range(50):
        cursor.append([])
        cursor = cursor[0]
    assert isinstance(wire.to_plain(deep), list)  # cut to a repr past the depth limit, never a RecursionError


def test_the_pool_grows_to_the_concurrency_used_and_no_further(tmp_path):
    path = write_metric(tmp_path, PID_METRIC)
    with skynet_dspy.load_metric(path, workers=3) as metric:
        assert len(metric.scorer.executor.worker_pids) == 1  # the worker that loaded the metric
        results = []
        threads = [threading.Thread(target=lambda: results.append(metric.score({"sleep": 0.3}, 1))) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 6 and all(result.ok for result in results)
        pids = {result.extra["pid"] for result in results}
        assert len(pids) == 3 and os.getpid() not in pids
        assert sorted(pids) == metric.scorer.executor.worker_pids
    assert metric.scorer.executor.worker_pids == []


def test_workers_hold_no_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-123")
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("PLAIN_SETTING", "kept")
    with skynet_dspy.load_metric(write_metric(tmp_path, PID_METRIC)) as metric:
        env = metric.score({}, 1).extra["env"]
    assert "PLAIN_SETTING" in env
    assert not {"OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_SERVICE_PASSWORD"} & set(env)


CREDENTIALS_BY_VALUE_OR_NAME = {
    "DATABASE_URL": "postgres://app:hunter2pw@db/prod",
    "HTTPS_PROXY": "http://u:hunter2px@proxy:8080",
    "REDIS_URL": "redis://:hunter2redis@cache:6379/0",
    "GH_PAT": "ghp_hunter2abcdefghijklmnopqrstuv",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T00/B00/hunter2hook",
    "PGPASSFILE_AUTH": "hunter2auth",
    "CI_NOTE": "deploy with xoxb-1234567890-hunter2",
}


def test_workers_hold_no_credential_named_otherwise_or_shaped_like_one(tmp_path, monkeypatch):
    """Not only *_KEY / *_TOKEN: a password in a URL, a GitHub or Slack token, a webhook, *_AUTH, *_PAT."""
    for name, value in CREDENTIALS_BY_VALUE_OR_NAME.items():
        monkeypatch.setenv(name, value)
    settings = {
        "GIT_AUTHOR_NAME": "Ada Lovelace",  # AUTHOR is not AUTH
        "TOKENIZERS_PARALLELISM": "false",  # a credential-like name with a setting's value
        "MAX_TOKENS_DEFAULT": "256",
        "DATA_DIR": "/data/sk-learn-models/v1",  # "sk-" inside a path is not a key
        "PATH": "/opt/sk-toolkit-2024/bin:" + os.environ["PATH"],
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    environment = ("import os\n\ndef score(input, output, expected=None):\n"
                   "    return 1.0, {'feedback': 'ok', 'env': dict(os.environ)}\n")
    with skynet_dspy.load_metric(write_metric(tmp_path, environment)) as metric:
        env = metric.score({}, 1).extra["env"]
    assert not set(CREDENTIALS_BY_VALUE_OR_NAME) & set(env)
    assert set(settings) <= set(env)  # (values that look like a key are masked on the way back, not dropped)
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["GIT_AUTHOR_NAME"] == "Ada Lovelace"


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_closed_metric_refuses_calls_clearly(tmp_path, isolation):
    """Scoring with a closed metric is the caller's mistake: an error, not a call scored as the metric's fault."""
    metric = skynet_dspy.load_metric(write_metric(tmp_path, PID_METRIC), isolation=isolation)
    metric.close()
    with pytest.raises(skynet_dspy.WorkerError, match="was closed; load it again"):
        metric.score({}, 1)


FORKING_USER = """
import os, sys
import skynet_dspy
metric = skynet_dspy.load_metric(sys.argv[1])
before = metric.scorer.executor.worker_pids
child = os.fork()
if child == 0:
    result = metric.score({}, 1)
    assert result.ok and result.extra["pid"] not in before, result
    sys.exit(0)  # the child's exit must not stop the parent's workers
os.waitpid(child, 0)
result = metric.score({}, 1)
assert result.ok and result.extra["pid"] in before, result
print("ok")
"""


def test_a_fork_of_the_users_process_starts_its_own_workers_and_leaves_the_parents_alone(tmp_path):
    path = write_metric(tmp_path, PID_METRIC)
    done = subprocess.run([sys.executable, "-c", FORKING_USER, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


UNGUARDED_SCRIPT = """
import sys
import skynet_dspy
print("script body ran", flush=True)  # no __main__ guard: workers must never run this again
metric = skynet_dspy.load_metric(sys.argv[1], workers=4)
import threading
threads = [threading.Thread(target=metric.score, args=({"sleep": 1.0}, 1)) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("workers", len(metric.scorer.executor.worker_pids))
"""


def test_a_script_without_a_main_guard_runs_once_not_once_per_worker(tmp_path):
    path = write_metric(tmp_path, PID_METRIC)
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("script body ran") == 1
    # calls take whichever worker is ready first (a new one, or one that became idle): at least one more started
    assert int(done.stdout.split("workers ")[1]) >= 2, done.stdout
    assert time.monotonic() - started < 60


MAIN_VALUES_SCRIPT = """
import sys
from dataclasses import dataclass
import skynet_dspy

@dataclass
class Answer:  # defined in the user's script (__main__): a worker cannot import it, so it travels by value
    label: str

with skynet_dspy.load_metric(sys.argv[1]) as metric:
    plain = metric.score({"question": "q"}, "billing", {"label": "billing"})
    mine = metric.score({"question": "q"}, Answer("billing"), {"label": "billing"})
    local = metric.score({"question": "q"}, (lambda: "billing")(), {"label": "billing"})
print(plain.score, mine.score, mine.feedback, local.score)
"""

LABEL_METRIC = """
def score(input, output, expected=None):
    label = getattr(output, "label", output)
    return float(label == expected["label"]), {"feedback": type(output).__name__}
"""


def test_values_a_script_defines_reach_the_worker(tmp_path):
    """Call messages go by plain pickle, or by value (cloudpickle) when they hold what only the user's script or
    notebook defines."""
    path = write_metric(tmp_path, LABEL_METRIC)
    script = tmp_path / "train.py"
    script.write_text(MAIN_VALUES_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1.0", "1.0", "Answer", "1.0"], done.stdout


def _stop(pid: int) -> None:
    """SIGSTOP `pid`, and wait until it is stopped (the kernel stops it when next it runs)."""
    os.kill(pid, signal.SIGSTOP)
    for _ in range(1000):
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("T", "t"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def test_a_worker_stopped_while_idle_never_takes_the_next_call(tmp_path):
    """Stopped between calls (a SIGSTOP from outside, or from a thread its metric left behind), a worker never reads
    the next call: it goes to another worker, and the stopped one is stopped for good."""
    metric = skynet_dspy.load_metric(write_metric(tmp_path, PID_METRIC), timeout=60)
    try:
        stopped = metric.score({}, "x").extra["pid"]
        _stop(stopped)
        again = metric.score({}, "x")  # not a timeout: scored by another worker
        assert again.failure is None and again.extra["pid"] != stopped, again.detail
        assert stopped not in metric.scorer.executor.worker_pids
    finally:
        metric.close()


def test_a_call_message_is_plain_pickle_unless_it_needs_the_users_script():
    from skynet_dspy._core.call import CallRequest

    message = {"kind": "call", "call": 1, "request": CallRequest({"q": "x"}, "billing", {"label": "billing"})}
    assert wire.to_worker(message) == pickle.dumps(message, protocol=wire.PROTOCOL)
    assert pickle.loads(wire.to_worker({"value": lambda: 1})) is not None  # by value: cloudpickle


def test_a_call_request_crosses_to_a_worker_with_every_field():
    """CallRequest pickles as its constructor's arguments (call.py): a field added later must travel too."""
    import dataclasses

    from skynet_dspy._core.call import CallRequest

    values = {field.name: f"value of {field.name}" for field in dataclasses.fields(CallRequest)}
    request = CallRequest(**values)
    assert pickle.loads(pickle.dumps(request)) == request
    assert CallRequest(*request.args()) == request  # what a call sends its worker


def test_a_bare_result_comes_back_as_a_pair_and_is_checked_again_where_it_arrives():
    from skynet_dspy._core.contract import CUT_MARGIN
    from skynet_dspy._core.types import Failure, Outcome, Result

    bare = Outcome(result=Result(0.5, "fine"))
    assert wire.outcome_to_plain(bare) == (0.5, "fine")
    assert wire.outcome_from_plain(wire.outcome_to_plain(bare), 4000) == bare
    fuller = Outcome(result=Result(0.5, "fine", {"a": 1.0}, {"k": "v"}))
    assert isinstance(wire.outcome_to_plain(fuller), dict)
    assert wire.outcome_from_plain(wire.outcome_to_plain(fuller), 4000) == fuller
    for forged in ((float("nan"), "x"), (10**400, "x"), ("1", "x"), (0.5, None), (0.5, ["x"])):
        assert wire.outcome_from_plain(forged, 4000).failure is Failure.INVALID, forged
    cut = wire.outcome_from_plain((0.5, "x" * 10**6), 4000).result
    assert cut is not None and len(cut.feedback) <= 4000 + CUT_MARGIN  # cut, as a dict's feedback is
    assert wire.outcome_from_plain((0.5, "x", "more"), 4000).failure is Failure.CRASHED


LEAVES_A_SIGNAL_PENDING = """
import os, signal, time

def score(input, output, expected=None):
    if input.get("case") == "pending_alarm":  # blocks SIGALRM, and its alarm fires while blocked: pending
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        signal.setitimer(signal.ITIMER_REAL, 0.001)
        time.sleep(0.01)
    if input.get("case") == "pending_alarm_with_handler":  # the same, with a handler of its own that ends it
        signal.signal(signal.SIGALRM, lambda *_: (time.sleep(0.2), os._exit(7)))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        signal.setitimer(signal.ITIMER_REAL, 0.001)
        time.sleep(0.01)
    return 1.0, {"feedback": "ok", "pid": os.getpid()}
"""


@pytest.mark.parametrize("case", ["pending_alarm", "pending_alarm_with_handler"])
def test_a_signal_score_left_blocked_and_pending_never_fails_the_next_call(tmp_path, case):
    """The signal fires once the worker unblocks it, before its reply: it ends the call that left it, never the next
    one."""
    metric = skynet_dspy.load_metric(write_metric(tmp_path, LEAVES_A_SIGNAL_PENDING), timeout=10)
    try:
        for _ in range(5):
            metric.score({"case": case}, "x")  # its own call may fail: it left the signal
            following = metric.score({}, "x")
            assert following.failure is None, following.detail
    finally:
        metric.close()


def test_two_idle_workers_stopped_by_what_their_calls_left_behind_do_not_fail_the_next_call(tmp_path):
    """Two workers stopped between calls (test_attacks.py's timer_stop, twice): the next call passes over both
    before it is sent."""
    metric = skynet_dspy.load_metric(write_metric(tmp_path, PID_METRIC), timeout=60)
    try:
        results: list = [None, None]
        meet = tmp_path / "meet"
        meet.mkdir()

        def call(n: int) -> None:  # each call waits for the other to start: two workers, however busy the machine
            results[n] = metric.score({"meet": str(meet), "n": n}, "x")

        threads = [threading.Thread(target=call, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pids = {result.extra["pid"] for result in results}
        assert len(pids) == 2
        for pid in pids:
            _stop(pid)
        again = metric.score({}, "x")
        assert again.failure is None, again.detail
    finally:
        metric.close()


@pytest.mark.timeout(60)  # a send to the stopped worker would block for the call's timeout, twice
def test_a_big_call_never_goes_to_a_worker_stopped_while_idle(tmp_path):
    """A call bigger than the socket's buffer is never sent to a worker stopped between calls."""
    metric = skynet_dspy.load_metric(write_metric(tmp_path, PID_METRIC), timeout=60)
    try:
        stopped = metric.score({}, "x").extra["pid"]
        _stop(stopped)
        again = metric.score({"blob": "b" * 4_000_000}, "x")
        assert again.failure is None and again.extra["pid"] != stopped, again.detail
    finally:
        metric.close()
