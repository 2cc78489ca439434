"""The context of one metric call, read by the `skynet` helpers (llm, observation, reward...).

A contextvar, so each call sees its own values even under DSPy's thread pool, and the
timeout's worker thread sees them too (it runs in a copy of the caller's context).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._measure import Observation


@dataclass(frozen=True, slots=True)
class MetricCall:
    """What a helper may know about the metric call it runs in."""

    models: Any  # the adapter's model routing (a _models.Models), used by llm()
    observation: Observation | None  # the program's measured run on this example, if measured
    unmeasured_reason: str | None = None  # why observation is None, in words for feedback


_current: ContextVar[MetricCall | None] = ContextVar("skynet_metric_call", default=None)


def current(helper: str) -> MetricCall:
    """The metric call in progress, or a clear error naming the helper called outside one."""
    call = _current.get()
    if call is None:
        raise RuntimeError(
            f"skynet.{helper}() was called outside a metric call. It reads the example being scored, "
            "so call it from inside score() while skynet-dspy runs the metric "
            "(dspy.Evaluate / dspy.GEPA with metric=load_metric(...), or check_contract)."
        )
    return call


def current_or_none() -> MetricCall | None:
    """The metric call in progress, or None outside one."""
    return _current.get()


def run_in(call: MetricCall, fn: Any, *args: Any) -> Any:
    """Run fn(*args) with `call` as the current metric call."""
    token = _current.set(call)
    try:
        return fn(*args)
    finally:
        _current.reset(token)
