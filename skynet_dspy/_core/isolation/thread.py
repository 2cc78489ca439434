"""isolation="thread": score runs in this process under a timeout it cannot always enforce (a thread cannot be
stopped). On the main thread the call runs inline and a watchdog thread's real-time signal raises CallTimedOut
in it at the deadline; elsewhere (DSPy's parallel executors) it runs on a pooled daemon thread the caller waits
for at most `timeout`, abandoned if it overruns (at most `max_stuck` of one runner, then calls are refused)."""

from __future__ import annotations

import contextvars
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .. import aio
from ..call import CallRequest, CallTimedOut, run_call
from ..context import CallScope, LLMHandler
from ..loading import LoadedMetric
from ..types import Failure, MetricInfo, Outcome
from ..values import whole_number

_MAX_IDLE = 64  # idle threads kept in the process-wide pool; more exit when they finish
_REFIRE = 1.0  # seconds between signals to a main-thread call that swallowed CallTimedOut
_MAIN_IDENT = threading.main_thread().ident or 0


class Ran(StrEnum):
    """How a call on the runner ended."""

    DONE = "done"
    RAISED = "raised"
    TIMED_OUT = "timed_out"
    OVERLOADED = "overloaded"


class _PooledThread:
    """A daemon thread that runs one call at a time, for whichever runner took it from the pool."""

    __slots__ = ("runner", "wake", "done", "job", "ran", "value", "abandoned")

    def __init__(self) -> None:
        self.runner: TimeoutRunner | None = None
        self.wake, self.done = threading.Lock(), threading.Lock()  # held while there is no job / no result
        self.wake.acquire()
        self.done.acquire()
        self.job: tuple[contextvars.Context, Callable[..., Any], tuple[Any, ...]] | None = None
        self.ran, self.abandoned = Ran.DONE, False
        self.value: Any = None
        threading.Thread(target=self._loop, name="skynet-metric", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.wake.acquire()
            if self.job is None:
                return
            context, fn, args = self.job
            try:
                self.ran, self.value = Ran.DONE, context.run(fn, *args)
            except BaseException as exc:  # noqa: BLE001 - contained, handed to the caller
                self.ran, self.value = Ran.RAISED, exc
            del context, fn, args  # hold no reference while idle
            if not self._hand_back():
                return

    def _hand_back(self) -> bool:
        """Give the result to the caller, or (it gave up) rejoin the pool; apart, so no idle frame holds the runner."""
        runner = self.runner
        assert runner is not None
        with runner._lock:
            if not self.abandoned:
                self.done.release()  # the caller takes the result and returns this thread to the pool
                return True
            self.abandoned = False
            runner.stuck -= 1
        return _release(self)


_idle: list[_PooledThread] = []  # the process-wide pool (list.pop and list.append are atomic)


def _release(worker: _PooledThread) -> bool:
    """Put a thread whose call is over back in the pool; False (and it should exit) when the pool is full."""
    worker.runner = worker.job = worker.value = None
    if len(_idle) >= _MAX_IDLE:
        return False
    _idle.append(worker)
    return True


@dataclass(slots=True)
class _InlineCall:
    timeout: float
    deadline: float
    fired: bool = False  # the watchdog signalled it
    finished: bool = False


class _Watchdog:
    """Signals the main thread when the inline call passes its deadline. With no call it sleeps for the shortest
    timeout seen, so starting a call only writes a field, without waking this thread."""

    def __init__(self, signum: int):
        self.signum = signum
        self.cond = threading.Condition(threading.Lock())
        self.active: _InlineCall | None = None
        self.wake_at = self.shortest = math.inf
        threading.Thread(target=self._loop, name="skynet-metric-watchdog", daemon=True).start()

    def wake_for(self, call: _InlineCall) -> None:
        with self.cond:
            self.shortest = min(self.shortest, call.timeout)
            self.wake_at = min(self.wake_at, call.deadline)  # so the next calls need not wake it again
            self.cond.notify()

    def _loop(self) -> None:
        global _inline_ready
        with self.cond:
            while True:
                now, call = time.monotonic(), self.active
                if call is None or call.finished:
                    wait = self.shortest
                elif now < call.deadline:
                    wait = call.deadline - now
                else:
                    call.fired = True
                    if signal.getsignal(self.signum) is _on_signal:  # checked here: too slow for every call
                        signal.pthread_kill(_MAIN_IDENT, self.signum)
                    else:  # our handler was replaced, so a signal stops no call: later calls go to pooled threads
                        _inline_ready = False
                    wait = _REFIRE
                self.wake_at = now + wait
                self.cond.wait(None if math.isinf(wait) else wait)


_watchdog: _Watchdog | None = None
_inline_ready: bool | None = None  # None: not tried yet; False: unavailable here


def _on_signal(signum: int, frame: Any) -> None:
    call = _watchdog.active if _watchdog is not None else None
    if call is not None and call.fired and not call.finished:
        raise CallTimedOut(f"the metric ran past its timeout of {call.timeout:g} s")


def _inline_watchdog() -> _Watchdog | None:
    """The watchdog for inline main-thread calls, set up on first use; None when they are unavailable."""
    global _watchdog, _inline_ready
    if _inline_ready is not None:
        return _watchdog if _inline_ready else None
    _inline_ready = False
    if os.environ.get("SKYNET_DSPY_INLINE_TIMEOUT", "1") == "0" or not hasattr(signal, "SIGRTMAX"):
        return None
    signum = signal.SIGRTMAX - 2
    try:
        if signal.getsignal(signum) not in (signal.SIG_DFL, None, _on_signal):
            return None  # someone else uses this signal
        signal.signal(signum, _on_signal)
    except (ValueError, OSError, RuntimeError):
        return None
    _watchdog, _inline_ready = _Watchdog(signum), True
    return _watchdog


_runners: weakref.WeakSet[TimeoutRunner] = weakref.WeakSet()


class TimeoutRunner:
    """Runs callables under a timeout: (DONE, value), (RAISED, exception), (TIMED_OUT, None), or (OVERLOADED,
    stuck count) when `max_stuck` earlier calls still run past theirs. `inline_main=False`: main thread pooled too."""

    def __init__(self, max_stuck: int = 16, *, inline_main: bool = True):
        self.max_stuck = whole_number("max_stuck", max_stuck, minimum=1, unit="stuck calls")
        self.inline_main = inline_main
        self.stuck = 0  # calls abandoned at their timeout and still running
        self._lock = threading.Lock()
        _runners.add(self)

    def run(self, fn: Callable[..., Any], timeout: float, args: tuple[Any, ...] = ()) -> tuple[Ran, Any]:
        """Call fn(*args) in a copy of the caller's context; see the class for what comes back."""
        if self.inline_main and threading.get_ident() == _MAIN_IDENT:
            watchdog = _inline_watchdog()
            if watchdog is not None and watchdog.active is None:  # a nested call goes to a pooled thread
                return _run_inline(watchdog, fn, args, timeout)
        if self.stuck >= self.max_stuck:
            return Ran.OVERLOADED, self.stuck
        worker = _idle.pop() if _idle else _PooledThread()
        worker.runner, worker.job = self, (contextvars.copy_context(), fn, args)
        worker.wake.release()
        try:
            finished = worker.done.acquire(True, timeout)
        except BaseException:  # e.g. KeyboardInterrupt while waiting: leave the thread to finish alone
            if self._abandon(worker) and not _release(worker):
                worker.wake.release()  # job is None now: the thread exits
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
    call = _InlineCall(timeout, time.monotonic() + timeout)
    watchdog.active = call
    if call.deadline < watchdog.wake_at or timeout < watchdog.shortest:
        watchdog.wake_for(call)
    try:
        try:
            ran, value = Ran.DONE, contextvars.copy_context().run(fn, *args)
        finally:
            call.finished = True
    except BaseException as exc:  # noqa: BLE001 - the signal may land before the finally did: mark it finished again
        call.finished = True
        ran, value = (Ran.TIMED_OUT, None) if isinstance(exc, CallTimedOut) else (Ran.RAISED, exc)
    finally:
        watchdog.active = None
    if isinstance(value, KeyboardInterrupt) and ran is Ran.RAISED:
        raise value  # the user's Ctrl-C
    return (Ran.TIMED_OUT, None) if call.fired else (ran, value)  # past the deadline, whatever it did


def _after_fork_in_child() -> None:
    """In a forked child only the forking thread exists: forget the parent's threads and watchdog."""
    global _watchdog, _inline_ready, _MAIN_IDENT
    _MAIN_IDENT, _watchdog, _inline_ready = threading.get_ident(), None, None
    _idle.clear()
    for runner in list(_runners):
        runner._lock, runner.stuck = threading.Lock(), 0


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        contain = threading.get_ident() != _MAIN_IDENT  # on the main thread a KeyboardInterrupt may be a Ctrl-C
        scope = CallScope()  # ended with the call, even one left running past its timeout: its llm() requests stop
        # an async score's loop cancels it at the timeout; this backstop, a grace later, never cuts that short
        limit = self.timeout if request.timeout is None else self.timeout + aio.GRACE
        try:
            ran, value = self._runner.run(
                run_call, limit, (self.loaded, request, scope.bind(llm), self.feedback_limit, contain)
            )
        finally:
            scope.end()
        if ran is Ran.DONE:
            return value  # type: ignore[no-any-return]
        if ran is Ran.RAISED:
            raise value  # KeyboardInterrupt on a pooled thread while the user's process is stopping
        if ran is Ran.TIMED_OUT:
            return Outcome(failure=Failure.TIMEOUT, detail=f"score() did not return within {self.timeout:g} s")
        return Outcome(failure=Failure.OVERLOADED, detail=f"{value} earlier calls are still running past their "
                       f"timeout of {self.timeout:g} s (isolation='thread' cannot stop them; isolation='process' can)")

    def close(self) -> None:
        """Nothing to release: pooled threads are shared and exit with the process."""
