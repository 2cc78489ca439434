"""Running a metric call under a timeout without being held up by it (SPEC §6).

Python cannot kill a thread, so a call that may hang must be run where the caller can walk
away from it. Two ways, chosen per call:

- On the main thread (dspy.Evaluate with one thread, BootstrapFewShot, direct calls, the
  contract check) the call runs inline, watched by one shared watchdog thread. Past the
  deadline the watchdog sends the main thread a real-time signal whose handler raises
  MetricTimeout inside `score`; a signal interrupts sleeps, socket reads and lock waits, so the
  call returns at the timeout. No thread handoff: this is the cheap path.
- On any other thread (DSPy's parallel executors) the call runs on a daemon worker thread
  from a process-wide pool and the caller waits at most `timeout`. A worker whose call overran
  is abandoned, finishes on its own and rejoins the pool; once `max_stuck` calls of one runner
  are stuck so, its further calls are refused at once instead of piling up threads.

Where signals are unavailable (not Linux, or the signal is taken), the worker threads serve
the main thread too.
"""

from __future__ import annotations

import _signal  # the C module: signal.getsignal() wraps it in a slow enum lookup
import contextvars
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

DONE, RAISED, TIMED_OUT, OVERLOADED = "done", "raised", "timed_out", "overloaded"
DEFAULT_MAX_STUCK = 16
_MAX_IDLE = 64  # idle workers kept in the process-wide pool; more exit when they finish
_REFIRE = 1.0  # seconds between signals to a main-thread call that swallowed MetricTimeout

_copy_context = contextvars.copy_context
_get_ident = threading.get_ident
_monotonic = time.monotonic
_MAIN_IDENT = threading.main_thread().ident


class MetricTimeout(BaseException):
    """Raised inside a `score` running on the main thread when its timeout has passed.

    A BaseException, like KeyboardInterrupt, so a metric's `except Exception:` does not swallow it.
    """


# -- worker threads -------------------------------------------------------------------------


class _Worker:
    """A daemon thread that runs one call at a time, for whichever runner took it from the pool."""

    __slots__ = ("runner", "wake", "done", "fn", "args", "context", "outcome", "value", "abandoned")

    def __init__(self) -> None:
        self.runner: TimeoutRunner | None = None  # the runner of the call in progress
        self.wake = threading.Lock()  # held while there is no job
        self.wake.acquire()
        self.done = threading.Lock()  # held until the job's result is ready
        self.done.acquire()
        self.fn: Callable[..., Any] | None = None
        self.args: tuple[Any, ...] = ()
        self.context: contextvars.Context | None = None
        self.outcome = DONE
        self.value: Any = None
        self.abandoned = False
        threading.Thread(target=self._loop, name="skynet-metric", daemon=True).start()

    def _loop(self) -> None:
        wake = self.wake
        while True:
            wake.acquire()
            fn = self.fn
            if fn is None:
                return
            try:
                self.value = self.context.run(fn, *self.args)  # type: ignore[union-attr]
                self.outcome = DONE
            except BaseException as exc:  # SystemExit from a metric is contained too
                self.value = exc
                self.outcome = RAISED
            fn = None  # hold no reference while idle
            if not self._hand_back():
                return

    def _hand_back(self) -> bool:
        """Give the result to the waiting caller, or, when it gave up, rejoin the pool on our own."""
        runner = self.runner
        with runner._lock:  # type: ignore[union-attr]
            if not self.abandoned:
                self.done.release()  # the caller takes the result and returns this worker to the pool
                return True
            self.abandoned = False
            runner.stuck -= 1  # type: ignore[union-attr]
        return _release(self)


_idle: list[_Worker] = []  # the process-wide pool (list.pop and list.append are atomic)


def _release(worker: _Worker) -> bool:
    """Put a worker whose call is over back in the pool; False (and it should exit) when the pool is full."""
    worker.runner = worker.fn = worker.context = worker.value = None
    worker.args = ()
    if len(_idle) >= _MAX_IDLE:
        return False
    _idle.append(worker)
    return True


# -- the main thread's watchdog ------------------------------------------------------------


# An inline call in progress is a list, the cheapest mutable record to make per call:
# [deadline (monotonic s), timeout (s), fired (the watchdog signalled it), finished].
_DEADLINE, _TIMEOUT, _FIRED, _FINISHED = 0, 1, 2, 3


class _Watchdog:
    """One thread that signals the main thread when the inline call in progress passes its deadline.

    It sleeps until the active call's deadline, or, with no call, for the shortest timeout seen:
    a new call's deadline is then never earlier than the next wake-up, so starting a call only
    writes a field, without waking this thread.
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.cond = threading.Condition(threading.Lock())
        self.active: list[Any] | None = None
        self.wake_at = math.inf
        self.shortest = math.inf
        threading.Thread(target=self._loop, name="skynet-metric-watchdog", daemon=True).start()

    def wake_for(self, deadline: float, timeout: float) -> None:
        """Wake the thread to look at a call that ends before its planned wake-up."""
        with self.cond:
            self.shortest = min(self.shortest, timeout)
            self.wake_at = min(self.wake_at, deadline)  # so the next calls need not wake it again
            self.cond.notify()

    def _loop(self) -> None:
        with self.cond:
            while True:
                now = _monotonic()
                call = self.active
                if call is not None and call[_FINISHED]:
                    call = None
                if call is None:
                    wait = self.shortest
                elif now < call[_DEADLINE]:
                    wait = call[_DEADLINE] - now
                else:
                    call[_FIRED] = True
                    if _signal.getsignal(self.signum) is _on_signal:
                        signal.pthread_kill(_MAIN_IDENT, self.signum)
                    wait = _REFIRE
                self.wake_at = now + wait
                self.cond.wait(None if math.isinf(wait) else wait)


_watchdog: _Watchdog | None = None
_inline_ready: bool | None = None  # None: not tried yet; False: unavailable here


def _on_signal(signum: int, frame: Any) -> None:
    watchdog = _watchdog
    call = watchdog.active if watchdog is not None else None
    if call is not None and call[_FIRED] and not call[_FINISHED]:
        raise MetricTimeout(f"the metric ran past its timeout of {call[_TIMEOUT]:g} s")


def _inline_watchdog() -> _Watchdog | None:
    """The watchdog for inline main-thread calls, set up on first use; None when they are unavailable."""
    global _watchdog, _inline_ready
    if _inline_ready:
        watchdog = _watchdog
        if watchdog is not None and _signal.getsignal(watchdog.signum) is _on_signal:
            return watchdog
        _inline_ready = False  # someone replaced our handler: a signal would not stop the call any more
        return None
    if _inline_ready is not None:
        return None
    _inline_ready = False
    if os.environ.get("SKYNET_DSPY_INLINE_TIMEOUT", "1") == "0":
        return None
    if not hasattr(signal, "pthread_kill") or not hasattr(signal, "SIGRTMAX"):
        return None
    signum = signal.SIGRTMAX - 2
    try:
        if signal.getsignal(signum) not in (signal.SIG_DFL, None, _on_signal):
            return None  # someone else uses this signal
        signal.signal(signum, _on_signal)
    except (ValueError, OSError, RuntimeError):
        return None
    _watchdog = _Watchdog(signum)
    _inline_ready = True
    return _watchdog


# -- the runner ------------------------------------------------------------------------------

_runners: weakref.WeakSet[TimeoutRunner] = weakref.WeakSet()


class TimeoutRunner:
    """Runs callables under a timeout, returning (outcome, value) no later than the timeout.

    Outcomes: (DONE, value), (RAISED, exception), (TIMED_OUT, None), or (OVERLOADED, stuck count)
    when `max_stuck` earlier calls of this runner are still running past their timeout.
    `inline_main=False` sends main-thread calls to worker threads as well.
    """

    def __init__(self, max_stuck: int = DEFAULT_MAX_STUCK, *, inline_main: bool = True):
        if not isinstance(max_stuck, int) or isinstance(max_stuck, bool) or max_stuck < 1:
            raise ValueError(f"max_stuck must be a positive int, got {max_stuck!r}")
        self.max_stuck = max_stuck
        self.inline_main = inline_main
        self.stuck = 0  # calls of this runner abandoned at their timeout and still running
        self._lock = threading.Lock()
        _runners.add(self)

    def run(self, fn: Callable[..., Any], timeout: float, args: tuple[Any, ...] = ()) -> tuple[str, Any]:
        """Call fn(*args) in a copy of the caller's context; see the class for the outcomes."""
        if self.inline_main and _get_ident() == _MAIN_IDENT:
            watchdog = _inline_watchdog()
            if watchdog is not None and watchdog.active is None:  # a nested call goes to a worker
                return _run_inline(watchdog, fn, args, timeout)
        return self._run_on_worker(fn, args, timeout)

    def _run_on_worker(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> tuple[str, Any]:
        if self.stuck >= self.max_stuck:
            return OVERLOADED, self.stuck
        try:
            worker = _idle.pop()
        except IndexError:
            worker = _Worker()
        worker.runner, worker.fn, worker.args, worker.context = self, fn, args, _copy_context()
        worker.wake.release()
        try:
            finished = worker.done.acquire(True, timeout)
        except BaseException:  # e.g. KeyboardInterrupt while waiting: leave the worker to finish alone
            if self._abandon(worker) and not _release(worker):
                worker.wake.release()  # fn is None now: the worker exits
            raise
        if not finished and not self._abandon(worker):
            return TIMED_OUT, None
        outcome, value = worker.outcome, worker.value
        if not _release(worker):
            worker.wake.release()
        return outcome, value

    def _abandon(self, worker: _Worker) -> bool:
        """Give up on the worker's call; True when it had finished after all (the result is ready)."""
        with self._lock:
            if worker.done.acquire(False):
                return True
            worker.abandoned = True
            self.stuck += 1
            return False


def _run_inline(watchdog: _Watchdog, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> tuple[str, Any]:
    call = [_monotonic() + timeout, timeout, False, False]
    watchdog.active = call
    if call[_DEADLINE] < watchdog.wake_at or timeout < watchdog.shortest:
        watchdog.wake_for(call[_DEADLINE], timeout)
    try:
        try:
            outcome, value = DONE, _copy_context().run(fn, *args)
        finally:
            call[_FINISHED] = True
    except MetricTimeout:  # each handler marks the call finished again: the signal may land before the finally did
        call[_FINISHED] = True
        outcome, value = TIMED_OUT, None
    except KeyboardInterrupt:
        call[_FINISHED] = True
        watchdog.active = None
        raise
    except BaseException as exc:  # SystemExit from a metric is contained too
        call[_FINISHED] = True
        outcome, value = RAISED, exc
    watchdog.active = None
    if call[_FIRED]:  # ran past the deadline, whatever it did with the MetricTimeout
        return TIMED_OUT, None
    return outcome, value


def _after_fork_in_child() -> None:
    """In a forked child only the forking thread exists: forget the parent's workers and watchdog."""
    global _watchdog, _inline_ready, _MAIN_IDENT
    _MAIN_IDENT = threading.get_ident()
    _watchdog = None
    _inline_ready = None
    _idle.clear()
    for runner in list(_runners):
        runner._lock = threading.Lock()
        runner.stuck = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
