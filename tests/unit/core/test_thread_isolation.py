"""isolation="thread", the timeout runner: calls return at their timeout whatever the metric does, no thread pile-up."""

from __future__ import annotations

import contextvars
import os
import sys
import threading
import time

import pytest

from skynet_dspy._core.isolation import thread as _runner
from skynet_dspy._core.isolation.thread import Ran, TimeoutRunner

DONE, RAISED, TIMED_OUT, OVERLOADED = Ran.DONE, Ran.RAISED, Ran.TIMED_OUT, Ran.OVERLOADED

pytestmark = pytest.mark.timeout(120)

_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_runner_var", default="unset")


def _on_thread(fn, *args):
    """Run fn(*args) on a fresh non-main thread (as DSPy's executors do) and return its value."""
    box: dict[str, object] = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# Both ways a call can run: inline on the main thread under the watchdog, or on a worker thread.
MODES = ["main", "worker"]


def _run(mode: str, runner: TimeoutRunner, fn, timeout: float, args=()):
    if mode == "main":
        assert threading.current_thread() is threading.main_thread()
        return runner.run(fn, timeout, args)
    return _on_thread(runner.run, fn, timeout, args)


@pytest.mark.parametrize("mode", MODES)
def test_returns_the_value_or_the_exception(mode):
    runner = TimeoutRunner()
    assert _run(mode, runner, lambda a, b: a + b, 5, (2, 3)) == (DONE, 5)
    outcome, error = _run(mode, runner, lambda: 1 / 0, 5)
    assert outcome == RAISED and isinstance(error, ZeroDivisionError)
    outcome, error = _run(mode, runner, sys.exit, 5, (3,))
    assert outcome == RAISED and isinstance(error, SystemExit) and error.code == 3


@pytest.mark.parametrize("mode", MODES)
def test_the_call_sees_the_callers_context_and_cannot_change_it(mode):
    runner = TimeoutRunner()

    def read_and_write():
        seen = _var.get()
        _var.set("changed inside")
        return seen

    def caller():
        _var.set("from the caller")
        value = runner.run(read_and_write, 5)
        return value, _var.get()

    if mode == "main":
        ctx = contextvars.copy_context()
        result = ctx.run(caller)
    else:
        result = _on_thread(caller)
    assert result == ((DONE, "from the caller"), "from the caller")


def _sleeper(seconds: float):
    time.sleep(seconds)
    return "late"


_stop_spinning = threading.Event()


def _spinner():
    while not _stop_spinning.is_set():
        pass
    return "stopped"


def _swallower():
    """A metric with a bare except around a stuck call: it catches the timeout and returns anyway."""
    try:
        time.sleep(30)
    except BaseException:
        pass
    return "swallowed"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stuck", [_sleeper, _spinner, _swallower], ids=["sleep", "busy-loop", "swallows"])
def test_a_stuck_call_returns_timed_out(mode, stuck):
    runner = TimeoutRunner()
    args = (30,) if stuck is _sleeper else ()
    _stop_spinning.clear()
    try:
        assert _run(mode, runner, stuck, 0.2, args) == (TIMED_OUT, None)
        assert _run(mode, runner, lambda: "next", 5) == (DONE, "next")  # the run goes on
    finally:
        _stop_spinning.set()  # an abandoned busy loop on a worker ends here


def test_a_call_blocked_on_a_lock_is_interrupted_on_the_main_thread():
    runner = TimeoutRunner()
    release = threading.Event()
    assert runner.run(release.wait, 0.2) == (TIMED_OUT, None)
    assert not release.is_set()
    assert runner.stuck == 0  # interrupted, not abandoned: no thread is left behind


def test_no_timeout_signal_escapes_after_a_call_finished():
    runner = TimeoutRunner()
    for _ in range(200):
        assert runner.run(lambda: 1, 0.01) == (DONE, 1)
    time.sleep(0.1)  # a late signal would raise CallTimedOut here, outside any call
    assert runner.run(lambda: 2, 0.01) == (DONE, 2)


def test_keyboard_interrupt_on_the_main_thread_is_not_swallowed():
    runner = TimeoutRunner()

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run(interrupted, 5)
    assert runner.run(lambda: "after", 5) == (DONE, "after")


def test_a_nested_call_on_the_main_thread_runs_and_times_out_on_its_own():
    runner = TimeoutRunner()

    def outer():
        inner = runner.run(_sleeper, 0.2, (30,))
        return inner, runner.run(lambda: "inner ok", 5)

    assert runner.run(outer, 10) == (DONE, ((TIMED_OUT, None), (DONE, "inner ok")))


def test_worker_threads_are_reused():
    runner = TimeoutRunner()
    before = threading.active_count()

    def many():
        return [runner.run(lambda i=i: i * 2, 5) for i in range(100)]

    assert _on_thread(many) == [(DONE, i * 2) for i in range(100)]
    assert threading.active_count() <= before + 1  # one worker at most, reused for every call


@pytest.mark.parametrize("inline_main", [True, False], ids=["main-thread-inline", "main-thread-on-workers"])
def test_repeated_stuck_calls_do_not_pile_up_threads(inline_main):
    runner = TimeoutRunner(max_stuck=4, inline_main=inline_main)
    release = threading.Event()
    before = threading.active_count()

    def stuck():
        release.wait(30)
        return "released"

    on_workers = [_on_thread(runner.run, stuck, 0.05) for _ in range(10)]
    assert on_workers[:4] == [(TIMED_OUT, None)] * 4
    assert on_workers[4:] == [(OVERLOADED, 4)] * 6  # refused at once: no fifth stuck thread
    assert threading.active_count() - before <= 4
    on_main = [runner.run(stuck, 0.05) for _ in range(10)]
    if inline_main:
        assert on_main == [(TIMED_OUT, None)] * 10  # interrupted on the main thread: nothing left running
    else:
        assert on_main == [(OVERLOADED, 4)] * 10
    assert threading.active_count() - before <= 4
    release.set()
    assert _wait_for(lambda: runner.stuck == 0), "abandoned calls rejoin the pool when they finish"
    assert _on_thread(runner.run, lambda: "recovered", 5) == (DONE, "recovered")
    assert threading.active_count() - before <= 4  # the released workers serve the next calls


def test_calls_that_overran_give_their_workers_back_when_they_finish():
    runner = TimeoutRunner(max_stuck=8)
    results = [_on_thread(runner.run, _sleeper, 0.05, (0.1,)) for _ in range(6)]
    assert set(results) <= {(TIMED_OUT, None), (DONE, "late")} and (TIMED_OUT, None) in results
    assert _wait_for(lambda: runner.stuck == 0)
    threads = threading.active_count()
    assert _on_thread(lambda: [runner.run(lambda: "fine", 5) for _ in range(6)]) == [(DONE, "fine")] * 6
    assert threading.active_count() <= threads  # the returned workers served these calls


def test_runners_share_one_pool_of_idle_workers():
    runners = [TimeoutRunner() for _ in range(20)]
    _on_thread(lambda: [runner.run(lambda: 1, 5) for runner in runners])
    before = threading.active_count()
    results = _on_thread(lambda: [runner.run(lambda: 2, 5) for runner in runners * 5])
    assert results == [(DONE, 2)] * 100
    assert threading.active_count() == before  # no runner keeps threads of its own


def test_a_runner_dropped_by_its_metric_is_freed():
    import gc
    import weakref

    runner = TimeoutRunner()
    _on_thread(runner.run, lambda: 1, 5)
    ref = weakref.ref(runner)
    del runner
    gc.collect()
    assert ref() is None  # idle workers hold no reference to the runner they last served


def test_ran_members_are_their_strings():
    assert (DONE, RAISED, TIMED_OUT, OVERLOADED) == ("done", "raised", "timed_out", "overloaded")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4", None])
def test_bad_max_stuck_is_refused(bad):
    with pytest.raises(ValueError, match="max_stuck"):
        TimeoutRunner(max_stuck=bad)


def test_a_forked_child_runs_calls_with_its_own_threads():
    runner = TimeoutRunner()
    assert _on_thread(runner.run, lambda: 1, 5) == (DONE, 1)  # the parent now holds an idle worker
    assert runner.run(lambda: 1, 5) == (DONE, 1)  # and the watchdog
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker and watchdog threads do not exist here
        code = 1
        try:
            ok_worker = _on_thread(runner.run, lambda: "child", 5) == (DONE, "child")
            ok_timeout = runner.run(_sleeper, 0.2, (30,)) == (TIMED_OUT, None)
            code = 0 if ok_worker and ok_timeout else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_main_thread_calls_run_inline_under_the_watchdog_on_linux():
    import signal

    runner = TimeoutRunner()
    ran_on: list[threading.Thread] = []
    runner.run(lambda: ran_on.append(threading.current_thread()), 5)
    assert _runner._inline_ready is sys.platform.startswith("linux")
    if _runner._inline_ready:
        assert ran_on == [threading.main_thread()]  # no thread handoff on the main thread
        assert signal.getsignal(_runner._watchdog.signum) is _runner._on_signal
    assert _on_thread(runner.run, lambda: threading.current_thread().name, 5) == (DONE, "skynet-metric")
