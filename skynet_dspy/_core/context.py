"""The context of one metric call, read by the `skynet` helpers (llm, observation, reward, service_cost).

A contextvar, so each call sees its own values under DSPy's thread pool, in the timeout's worker thread
(which runs in a copy of the caller's context) and in a worker process (which sets it per call). A thread
the metric starts itself has no copy of the context: it is given the one call in progress in the process
(a worker process runs one call at a time), and a clear error when several are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .errors import OutsideMetricCall
from .types import Failure, Observation

# llm(instructions, input, settings) -> the model's text
LLMHandler = Callable[[str, "str | None", dict[str, Any]], str]


@dataclass(frozen=True, slots=True)
class MetricCall:
    """What a helper may know about the metric call it runs in."""

    llm: LLMHandler | None  # answers llm() for this call; None when no model can be reached
    observation: Observation | None  # the program's measured run on this example, if measured
    unmeasured_reason: str | None = None  # why observation is None, in words for feedback
    # setup problems llm() hit during the call (kind, message), reported even if the metric carried on
    judge_problems: list[tuple[Failure, str]] = field(default_factory=list)

    def note_judge_problem(self, kind: Failure, message: str) -> None:
        if not self.judge_problems:
            self.judge_problems.append((kind, message))


_current: ContextVar[MetricCall | None] = ContextVar("skynet_metric_call", default=None)
_judging: ContextVar[bool] = ContextVar("skynet_judging", default=False)
_default_llm: LLMHandler | None = None  # llm() outside a metric call (a notebook): set by configure_llm()
_in_progress: list[MetricCall] = []  # every call in progress in this process, for threads the metric starts
_in_progress_lock = threading.Lock()

SEVERAL_CALLS = (
    "was called from a thread the metric started while several metric calls run at once in this process "
    "(isolation='thread'), so it cannot tell which call it belongs to. Start the thread in a copy of the "
    "metric's context (contextvars.copy_context().run(...)), or use the default isolation='process'"
)


def current(helper: str) -> MetricCall:
    """The metric call in progress, or a clear error naming the helper called outside one."""
    call = current_or_none()
    if call is None:
        if several_in_progress():
            raise OutsideMetricCall(f"skynet.{helper}() {SEVERAL_CALLS}.")
        raise OutsideMetricCall(
            f"skynet.{helper}() was called outside a metric call. It reads the example being scored, "
            "so call it from inside score() while skynet-dspy runs the metric "
            "(dspy.Evaluate / dspy.GEPA with metric=load_metric(...), or check_contract)."
        )
    return call


def current_or_none() -> MetricCall | None:
    """The metric call in progress in this context, else the only one in progress in the process, else None."""
    call = _current.get()
    if call is None:
        in_progress = _in_progress
        if len(in_progress) == 1:
            try:
                return in_progress[0]
            except IndexError:  # it ended meanwhile
                return None
    return call


def several_in_progress() -> bool:
    return len(_in_progress) > 1


@contextmanager
def calling(call: MetricCall) -> Iterator[MetricCall]:
    """Within this block, `call` is the metric call in progress."""
    token = _current.set(call)
    with _in_progress_lock:
        _in_progress.append(call)
    try:
        yield call
    finally:
        _current.reset(token)
        with _in_progress_lock:
            _in_progress.remove(call)


def set_default_llm(handler: LLMHandler | None) -> None:
    """Set what llm() calls outside a metric call (skynet_dspy.configure_llm does, in the user's process)."""
    global _default_llm
    _default_llm = handler


def default_llm() -> LLMHandler | None:
    return _default_llm


@contextmanager
def judging() -> Iterator[None]:
    """Within this block, model calls are the judge's (llm()), never counted as the program's run."""
    token = _judging.set(True)
    try:
        yield
    finally:
        _judging.reset(token)


def is_judging() -> bool:
    """True inside judging(), or inside a metric call (whatever a metric calls is not the program's run)."""
    return _judging.get() or _current.get() is not None
