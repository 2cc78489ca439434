"""The helper module metric code imports as `skynet`: llm, reward, observation, service_cost.

`import skynet_dspy` (and loading any metric file) registers this module as `skynet`, so
`from skynet import llm, reward, observation, service_cost` works unchanged in metric.py.
"""

from __future__ import annotations

import sys
from typing import Any

from . import _context, _reward
from ._measure import Observation

__all__ = ["llm", "reward", "observation", "service_cost"]


def llm(instructions: str, input: str | None = None, **overrides: Any) -> str:
    """Ask the metric model (or, when none is set, the reflection model) and return its text.

    `instructions` is the system message and `input` the user message; without `input`,
    `instructions` is the only (user) message. `overrides` are LiteLLM settings for this call
    (temperature, max_tokens, ...).
    """
    from . import _models

    call = _context.current_or_none()
    models = call.models if call is not None else _models.default_models()
    return models.complete(instructions, input, **overrides)


def reward(spec: dict, accuracy: float, feedback: str) -> tuple[float, dict[str, Any]]:
    """Combine `accuracy` with the measured speed and cost of this example's run (SPEC §5).

    Returns a valid metric return value: (total, {"feedback": ..., "scores": {accuracy, speed, cost}}).
    """
    call = _context.current("reward")
    return _reward.compute(spec, accuracy, feedback, call.observation, call.unmeasured_reason)


def observation() -> Observation:
    """The program's measured run on the example being scored (read-only).

    Fields: run_ms (wall time, ms), cost_usd (USD, None when a price is unknown), model_calls,
    prompt_tokens, completion_tokens, total_tokens; a figure that was not measured is None,
    and cost_unknown_reason / unmeasured_reason say why.
    """
    return _observed(_context.current("observation"))


def service_cost() -> float | None:
    """The USD cost of the model calls this example's run made, or None when it cannot be measured."""
    return _observed(_context.current("service_cost")).cost_usd


def _observed(call: _context.MetricCall) -> Observation:
    if call.observation is None:
        return Observation.unmeasured(call.unmeasured_reason)
    return call.observation


def register() -> None:
    """Make this module importable as `skynet` (kept if it already is)."""
    if sys.modules.get("skynet") is not sys.modules[__name__]:
        sys.modules["skynet"] = sys.modules[__name__]
