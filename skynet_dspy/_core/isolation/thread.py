"""isolation="thread": score runs in the user's own process, under a timeout it cannot always enforce.

For people who accept its limits in exchange for microsecond overhead: Python cannot stop a thread,
so a CPU-bound or C-level loop keeps running after its timeout, and a metric can block signals.

- On the main thread (dspy.Evaluate with one thread, BootstrapFewShot, direct calls, the contract
  check) the call runs inline, watched by one shared watchdog thread. Past the deadline the
  watchdog sends the main thread a real-time signal whose handler raises CallTimedOut inside
  `score`; a signal interrupts sleeps, socket reads and lock waits, so the call returns at the
  timeout. No thread handoff: this is the cheap path.
- On any other thread (DSPy's parallel executors) the call runs on a daemon thread from a
  process-wide pool and the caller waits at most `timeout`. A thread whose call overran is
  abandoned, finishes on its own and rejoins the pool; once `max_stuck` calls of one executor are
  stuck so, its further calls are refused at once instead of piling up threads.

Where signals are unavailable (not Linux, or the signal is taken), pooled threads serve the main
thread too.
"""

from __future__ import annotations

import contextvars
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from ..call import CallRequest, CallTimedOut, run_call
from ..context import CallScope, LLMHandler
from ..loading import LoadedMetric
from ..types import Failure, MetricInfo, Outcome
from ..values import whole_number

DEFAULT_MAX_STUCK = 16
_MAX_IDLE = 64  # idle threads kept in the process-wide pool; more exit when they finish
_REFIRE = 1.0  # seconds between signals to a main-thread call that swallowed CallTimedOut

_copy_context = contextvars.copy_context
_get_ident = threading.get_ident
_monotonic = time.monotonic
_MAIN_IDENT = threading.main_thread().ident or 0  # never None: the main thread has started


class Ran(StrEnum):
    """How a call on the runner ended."""

    DONE = "done"
    RAISED = "raised"
    TIMED_OUT = "timed_out"
    OVERLOADED = "overloaded"


# -- pooled threads ----------------------------------------------------------------------------


class _PooledThread:
    """A daemon thread that runs one call at a time, for whichever runner took it from the pool."""

    __slots__ = ("runner", "wake", "done", "fn", "args", "context", "ran", "value", "abandoned")

    def __init__(self) -> None:
        self.runner: TimeoutRunner | None = None  # the runner of the call in progress
        self.wake = threading.Lock()  # held while there is no job
        self.wake.acquire()
        self.done = threading.Lock()  # held until the job's result is ready
        self.done.acquire()
        self.fn: Callable[..., Any] | None = None
        self.args: tuple[Any, ...] = ()
        self.context: contextvars.Context | None = None
        self.ran = Ran.DONE
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
                self.ran = Ran.DONE
            except BaseException as exc:  # noqa: BLE001 - contained, handed to the caller
                self.value = exc
                self.ran = Ran.RAISED
            fn = None  # hold no reference while idle
            if not self._hand_back():
                return

    def _hand_back(self) -> bool:
        """Give the result to the waiting caller, or, when it gave up, rejoin the pool on our own."""
        runner = self.runner
        with runner._lock:  # type: ignore[union-attr]
            if not self.abandoned:
                self.done.release()  # the caller takes the result and returns this thread to the pool
                return True
            self.abandoned = False
            runner.stuck -= 1  # type: ignore[union-attr]
        return _release(self)


_idle: list[_PooledThread] = []  # the process-wide pool (list.pop and list.append are atomic)


def _release(worker: _PooledThread) -> bool:
    """Put a thread whose call is over back in the pool; False (and it should exit) when the pool is full."""
    worker.runner = worker.fn = worker.context = worker.value = None
    worker.args = ()
    if len(_idle) >= _MAX_IDLE:
        return False
    _idle.append(worker)
    return True


# -- the main thread's watchdog ------------------------------------------------------------------


class _InlineCall:
    """An inline main-thread call in progress, as the watchdog sees it."""

    __slots__ = ("deadline", "timeout", "fired", "finished")

    def __init__(self, timeout: float):
        self.deadline = _monotonic() + timeout
        self.timeout = timeout
        self.fired = False  # the watchdog signalled it
        self.finished = False


class _Watchdog:
    """One thread that signals the main thread when the inline call in progress passes its deadline.

    It sleeps until the active call's deadline, or, with no call, for the shortest timeout seen:
    a new call's deadline is then never earlier than the next wake-up, so starting a call only
    writes a field, without waking this thread.
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.cond = threading.Condition(threading.Lock())
        self.active: _InlineCall | None = None
        self.wake_at = math.inf
        self.shortest = math.inf
        threading.Thread(target=self._loop, name="skynet-metric-watchdog", daemon=True).start()

    def wake_for(self, call: _InlineCall) -> None:
        """Wake the thread to look at a call that ends before its planned wake-up."""
        with self.cond:
            self.shortest = min(self.shortest, call.timeout)
            self.wake_at = min(self.wake_at, call.deadline)  # so the next calls need not wake it again
            self.cond.notify()

    def _loop(self) -> None:
        with self.cond:
            while True:
                now = _monotonic()
                call = self.active
                if call is not None and call.finished:
                    call = None
                if call is None:
                    wait = self.shortest
                elif now < call.deadline:
                    wait = call.deadline - now
                else:
                    call.fired = True
                    if signal.getsignal(self.signum) is _on_signal:
                        signal.pthread_kill(_MAIN_IDENT, self.signum)
                    wait = _REFIRE
                self.wake_at = now + wait
                self.cond.wait(None if math.isinf(wait) else wait)


_watchdog: _Watchdog | None = None
_inline_ready: bool | None = None  # None: not tried yet; False: unavailable here


def _on_signal(signum: int, frame: Any) -> None:
    watchdog = _watchdog
    call = watchdog.active if watchdog is not None else None
    if call is not None and call.fired and not call.finished:
        raise CallTimedOut(f"the metric ran past its timeout of {call.timeout:g} s")


def _inline_watchdog() -> _Watchdog | None:
    """The watchdog for inline main-thread calls, set up on first use; None when they are unavailable."""
    global _watchdog, _inline_ready
    if _inline_ready:
        watchdog = _watchdog
        if watchdog is not None and signal.getsignal(watchdog.signum) is _on_signal:
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


# -- the runner ------------------------------------------------------------------------------------

_runners: weakref.WeakSet[TimeoutRunner] = weakref.WeakSet()


class TimeoutRunner:
    """Runs callables under a timeout, returning (how it ended, value) no later than the timeout.

    (DONE, value), (RAISED, exception), (TIMED_OUT, None), or (OVERLOADED, stuck count) when
    `max_stuck` earlier calls of this runner are still running past their timeout.
    `inline_main=False` sends main-thread calls to pooled threads as well.
    """

    def __init__(self, max_stuck: int = DEFAULT_MAX_STUCK, *, inline_main: bool = True):
        self.max_stuck = whole_number("max_stuck", max_stuck, minimum=1, unit="stuck calls")
        self.inline_main = inline_main
        self.stuck = 0  # calls of this runner abandoned at their timeout and still running
        self._lock = threading.Lock()
        _runners.add(self)

    def run(self, fn: Callable[..., Any], timeout: float, args: tuple[Any, ...] = ()) -> tuple[Ran, Any]:
        """Call fn(*args) in a copy of the caller's context; see the class for what comes back."""
        if self.inline_main and _get_ident() == _MAIN_IDENT:
            watchdog = _inline_watchdog()
            if watchdog is not None and watchdog.active is None:  # a nested call goes to a pooled thread
                return _run_inline(watchdog, fn, args, timeout)
        return self._run_on_worker(fn, args, timeout)

    def _run_on_worker(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> tuple[Ran, Any]:
        if self.stuck >= self.max_stuck:
            return Ran.OVERLOADED, self.stuck
        try:
            worker = _idle.pop()
        except IndexError:
            worker = _PooledThread()
        worker.runner, worker.fn, worker.args, worker.context = self, fn, args, _copy_context()
        worker.wake.release()
        try:
            finished = worker.done.acquire(True, timeout)
        except BaseException:  # e.g. KeyboardInterrupt while waiting: leave the thread to finish alone
            if self._abandon(worker) and not _release(worker):
                worker.wake.release()  # fn is None now: the thread exits
            raise
        if not finished and not self._abandon(worker):
            return Ran.TIMED_OUT, None
        ran, value = worker.ran, worker.value
        if not _release(worker):
            worker.wake.release()
        return ran, value

    def _abandon(self, worker: _PooledThread) -> bool:
        """Give up on the thread's call; True when it had finished after all (the result is ready)."""
        with self._lock:
            if worker.done.acquire(False):
                return True
            worker.abandoned = True
            self.stuck += 1
            return False


def _run_inline(watchdog: _Watchdog, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> tuple[Ran, Any]:
    call = _InlineCall(timeout)
    watchdog.active = call
    if call.deadline < watchdog.wake_at or timeout < watchdog.shortest:
        watchdog.wake_for(call)
    try:
        try:
            ran, value = Ran.DONE, _copy_context().run(fn, *args)
        finally:
            call.finished = True
    except CallTimedOut:  # each handler marks the call finished again: the signal may land before the finally did
        call.finished = True
        ran, value = Ran.TIMED_OUT, None
    except KeyboardInterrupt:
        call.finished = True
        watchdog.active = None
        raise
    except BaseException as exc:  # noqa: BLE001 - contained, handed to the caller
        call.finished = True
        ran, value = Ran.RAISED, exc
    watchdog.active = None
    if call.fired:  # ran past the deadline, whatever it did with the CallTimedOut
        return Ran.TIMED_OUT, None
    return ran, value


def _after_fork_in_child() -> None:
    """In a forked child only the forking thread exists: forget the parent's threads and watchdog."""
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


# -- the executor ----------------------------------------------------------------------------------


class ThreadExecutor:
    """Runs the metric in this process: loaded here, each call under the timeout on the runner above."""

    def __init__(self, loaded: LoadedMetric, timeout: float, feedback_limit: int):
        self.loaded = loaded
        self.info: MetricInfo = loaded.info()
        self.timeout = timeout
        self.feedback_limit = feedback_limit
        self._runner = TimeoutRunner()

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score under the timeout; an Outcome whatever the metric does (short of a C-level hang)."""
        contain = _get_ident() != _MAIN_IDENT  # on the main thread a KeyboardInterrupt may be the user's Ctrl-C
        scope = CallScope()  # ended with the call, even one left running past its timeout: its llm() requests stop
        try:
            ran, value = self._runner.run(
                run_call, self.timeout, (self.loaded, request, scope.bind(llm), self.feedback_limit, contain)
            )
        finally:
            scope.end()
        if ran is Ran.DONE:
            outcome: Outcome = value
            return outcome
        if ran is Ran.TIMED_OUT:
            return Outcome(failure=Failure.TIMEOUT, detail=f"score() did not return within {self.timeout:g} s")
        if ran is Ran.OVERLOADED:
            return Outcome(
                failure=Failure.OVERLOADED,
                detail=f"{value} earlier calls are still running past their timeout of {self.timeout:g} s "
                "(isolation='thread' cannot stop them; the default isolation='process' can)",
            )
        raise value  # KeyboardInterrupt on a pooled thread while the user's process is stopping

    def close(self) -> None:
        """Nothing to release: pooled threads are shared and exit with the process."""
