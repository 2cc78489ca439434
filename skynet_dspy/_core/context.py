"""The context of one metric call, read by the `skynet` helpers (llm, observation, reward, service_cost).

A contextvar, so each call sees its own values in DSPy's threads, the timeout's thread and a worker process; a
thread the metric starts itself is given the one call in progress in the process (a clear error when several are).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .errors import NO_JUDGE_MODEL, LLMCallError, ModelNotConfigured, OutsideMetricCall, judge_error_to_plain
from .types import Failure, Observation
from .values import check_llm_arguments

# llm(instructions, input, settings) -> the model's text
LLMHandler = Callable[[str, "str | None", dict[str, Any]], str]


@dataclass(frozen=True, slots=True)
class MetricCall:
    """What a helper may know about the metric call it runs in."""

    llm: LLMHandler | None  # answers llm() for this call; None when no model can be reached
    observation: Observation | None  # the program's measured run on this example, if measured
    unmeasured_reason: str | None = None  # why observation is None, in words for feedback
    # the first setup problem llm() hit during the call (kind, message), reported even if the metric carried on
    judge_problems: list[tuple[Failure, str]] = field(default_factory=list)


class CallScope:
    """llm() requests that end together: one metric call's (the executor calls end() when it is scored, timed out or
    its worker killed) or a judge's (Judge.close()). Every request still waiting, queued or retrying stops."""

    __slots__ = ("_lock", "_ended", "_watchers")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = False
        self._watchers: set[threading.Event] = set()

    @property
    def ended(self) -> bool:
        return self._ended

    def watch(self, event: threading.Event) -> None:
        """Set `event` when the call ends (at once if it has)."""
        with self._lock:
            if not self._ended:
                self._watchers.add(event)
                return
        event.set()

    def unwatch(self, event: threading.Event) -> None:
        with self._lock:
            self._watchers.discard(event)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            watchers, self._watchers = self._watchers, set()
        for event in watchers:
            event.set()

    def bind(self, llm: LLMHandler | None) -> LLMHandler | None:
        """`llm`, answering within this scope (the judge reads it with current_scope())."""
        if llm is None:
            return None

        def scoped(instructions: str, input: str | None, settings: dict[str, Any]) -> str:
            if self._ended:  # queued on the llm() pool when its call ended: it never starts
                raise LLMCallError("llm() was called after its metric call had ended")
            token = _scope.set(self)
            try:
                return llm(instructions, input, settings)
            finally:
                _scope.reset(token)

        return scoped


_scope: ContextVar[CallScope | None] = ContextVar("skynet_call_scope", default=None)


def current_scope() -> CallScope | None:
    """The scope of the metric call whose llm() request is being answered on this thread, if any."""
    return _scope.get()


class LLMPool:
    """A bounded set of daemon threads answering llm() requests for worker processes, reused across calls.

    At most `size` threads run requests at once. A request that waits (for its rate-limit or concurrency turn, a
    429's pause, a retry's backoff: `waiting()`) gives its place back while it waits, so one metric's limits never
    hold the threads another metric's requests need. Hand-written rather than concurrent.futures.ThreadPoolExecutor:
    that one's threads are joined at interpreter exit, so a request hung in HTTP would hold the user's process from
    exiting, and it has no way to give a place back.
    """

    def __init__(self, size: int):
        self.size = size
        self._mine = threading.local()  # .pool is self on this pool's threads
        self._reset()

    def _reset(self) -> None:
        """Empty: a fork of the process has none of the parent's threads (os.register_at_fork calls this)."""
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for work (a thread being started counts as waiting)
        self._pending = 0  # work queued and not taken yet
        self._waiting = 0  # threads whose request waits for its turn (not counted against `size`)

    def submit(self, work: Callable[[], None]) -> None:
        """Run `work` on a pool thread: one waiting, else a new one while fewer than `size` run requests, else the
        first to finish its work or to start waiting."""
        with self._lock:
            self._queue.put(work)
            self._pending += 1
        self._grow()

    def _grow(self) -> None:
        with self._lock:
            start = self._pending > self._idle and self._threads - self._waiting < self.size
            if start:
                self._threads += 1
                self._idle += 1
        if start:
            threading.Thread(target=self._loop, name="skynet-llm-pool", daemon=True).start()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Within this block, a pool thread's request waits and does not count against the pool's size (elsewhere,
        nothing changes)."""
        if getattr(self._mine, "pool", None) is not self:
            yield
            return
        with self._lock:
            self._waiting += 1
        self._grow()
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1
                if self._threads - self._waiting > self.size and self._idle > self._pending:
                    self._queue.put(_leave)  # a thread started while this one waited, idle now: one fewer
                    self._pending += 1

    def _loop(self) -> None:
        self._mine.pool = self
        while True:
            work = self._queue.get()
            with self._lock:
                self._pending -= 1
                self._idle -= 1
                self._threads -= work is _leave
            if work is _leave:
                return
            with suppress(BaseException):  # a pool thread outlives what it ran
                work()
            with self._lock:
                surplus = self._threads - self._waiting > self.size  # started while others waited: not kept
                self._threads -= surplus
                self._idle += not surplus
            if surplus:
                return


def _leave() -> None:
    """Queued to an LLMPool: the thread that takes it ends (the pool is above its size)."""


LLM_POOL_SIZE = 32  # threads answering worker processes' llm() requests, per process
llm_pool = LLMPool(LLM_POOL_SIZE)
os.register_at_fork(after_in_child=llm_pool._reset)


_current: ContextVar[MetricCall | None] = ContextVar("skynet_metric_call", default=None)
_judging: ContextVar[bool] = ContextVar("skynet_judging", default=False)
_default_llm: LLMHandler | None = None  # llm() outside a metric call (a notebook): set by configure_llm()
_in_progress: list[MetricCall] = []  # every call in progress in this process, for threads the metric starts
_in_progress_lock = threading.Lock()

_SEVERAL_CALLS = (
    "was called from a thread the metric started while several metric calls run at once in this process "
    "(isolation='thread'), so it cannot tell which call it belongs to. Start the thread in a copy of the "
    "metric's context (contextvars.copy_context().run(...)), or use the default isolation='process'"
)


def current(helper: str) -> MetricCall:
    """The metric call in progress, or a clear error naming the helper called outside one."""
    call = current_or_none(helper)
    if call is None:
        raise OutsideMetricCall(
            f"skynet.{helper}() was called outside a metric call. It reads the example being scored, "
            "so call it from inside score() while skynet-dspy runs the metric "
            "(dspy.Evaluate / dspy.GEPA with metric=load_metric(...), or check_contract)."
        )
    return call


def current_or_none(helper: str) -> MetricCall | None:
    """The metric call in progress in this context, else (on a thread the metric started: never the main one) the
    only one in progress in the process, else None; an OutsideMetricCall naming `helper` when several are (a thread
    the metric started cannot tell which is its own)."""
    call = _current.get()
    if call is None and _in_progress and threading.current_thread() is not threading.main_thread():
        if len(_in_progress) > 1:
            raise OutsideMetricCall(f"skynet.{helper}() {_SEVERAL_CALLS}.")
        try:
            return _in_progress[0]
        except IndexError:  # it ended meanwhile
            return None
    return call


class calling:  # noqa: N801 - used as a function; a class, not @contextmanager: it runs on every call (~1 µs less)
    """Within this block, `call` is the metric call in progress."""

    __slots__ = ("call", "token")

    def __init__(self, call: MetricCall) -> None:
        self.call = call

    def __enter__(self) -> MetricCall:
        self.token = _current.set(self.call)
        with _in_progress_lock:
            _in_progress.append(self.call)
        return self.call

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self.token)
        with _in_progress_lock:
            _in_progress.remove(self.call)


def set_default_llm(handler: LLMHandler | None) -> None:
    """Set what llm() calls outside a metric call (skynet_dspy.configure_llm does, in the user's process)."""
    global _default_llm
    _default_llm = handler


def default_llm() -> LLMHandler | None:
    return _default_llm


@contextmanager
def _setting(var: ContextVar[bool]) -> Iterator[None]:
    token = var.set(True)
    try:
        yield
    finally:
        var.reset(token)


_fresh: ContextVar[bool] = ContextVar("skynet_fresh_answers", default=False)


def judging() -> AbstractContextManager[None]:
    """Within this block, model calls are the judge's (llm()), never counted as the program's run."""
    return _setting(_judging)


def fresh_answers() -> AbstractContextManager[None]:
    """Within this block, llm() asks its model again: the judge's cache is neither read nor written (the contract
    check's repeats, which measure how much the judge's answers vary)."""
    return _setting(_fresh)


def wants_fresh_answers() -> bool:
    return _fresh.get()


def is_judging() -> bool:
    """True inside judging(), or inside a metric call (whatever a metric calls is not the program's run)."""
    return _judging.get() or _current.get() is not None


def answer_llm(
    llm: LLMHandler | None, instructions: Any, input: Any, settings: Any, ended: bool = False
) -> dict[str, Any]:
    """The answer to a worker's llm() request, as plain values: {"text": ...}, or {"error": ...} that
    errors.judge_error raises in the worker. `ended`: its metric call had ended when it came."""
    try:
        if ended:
            raise LLMCallError("llm() was called after its metric call had ended")
        if llm is None:
            raise ModelNotConfigured(NO_JUDGE_MODEL)
        settings = settings if isinstance(settings, dict) else {}
        check_llm_arguments(instructions, input, settings)  # again here: a worker may write its own request
        return {"text": str(llm(instructions, input, settings))}
    except Exception as exc:  # noqa: BLE001 - every failure is answered, or the worker would wait forever
        return {"error": judge_error_to_plain(exc)}
