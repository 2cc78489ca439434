"""The helper module metric code imports as `skynet`: llm, allm, reward, observation, service_cost.

`import skynet_dspy` (and loading any metric file, in any process) registers this module as `skynet`,
so `from skynet import llm, reward, observation, service_cost` works unchanged in metric.py. It needs
nothing but the DSPy-free core: it is what metric worker processes import.
"""

from __future__ import annotations

from typing import Any

from ._core import aio, context
from ._core import reward as _reward
from ._core.errors import NO_JUDGE_MODEL, ModelNotConfigured, judge_failure
from ._core.types import Observation
from ._core.values import check_llm_arguments

__all__ = ["llm", "allm", "reward", "observation", "service_cost", "Observation"]


def llm(instructions: str, input: str | None = None, **settings: Any) -> str:
    """Ask the metric model (or, when none is set, the reflection model) and return its text.

    `instructions` is the system message and `input` the user message; without `input`,
    `instructions` is the only (user) message. `settings` are LiteLLM settings for this call
    (temperature, max_tokens, ...). Raises ModelNotConfigured when no model is set, LLMCallError
    when the model cannot answer.
    """
    check_llm_arguments(instructions, input, settings)
    call = context.current_or_none("llm")
    handler = call.llm if call is not None else context.default_llm()
    if handler is None:
        raise ModelNotConfigured(NO_JUDGE_MODEL)
    try:
        return handler(instructions, input, settings)
    except Exception as exc:
        kind = judge_failure(exc)
        if call is not None and kind is not None and not call.judge_problems:
            call.judge_problems.append((kind, str(exc)))
        raise


async def allm(instructions: str, input: str | None = None, **settings: Any) -> str:
    """`await allm(...)`: llm() for an `async def score`, awaited without blocking its event loop.

    The same request, model, cache, limits, spending caps and errors as llm(): it runs llm() on a thread of its
    own, so `asyncio.gather(allm(...), allm(...), ...)` asks its questions at once (within judge_max_concurrency,
    and at most 16 of one call at a time; more wait their turn).
    """
    check_llm_arguments(instructions, input, settings)
    return await aio.llm_turn(lambda: llm(instructions, input, **settings))


def reward(spec: dict[str, Any], accuracy: float, feedback: str) -> tuple[float, dict[str, Any]]:
    """Combine `accuracy` with the measured speed and cost of this example's run (docs/contract.md#helpers).

    Returns a valid metric return value: (total, {"feedback": ..., "scores": {accuracy, speed, cost}}).
    """
    call = context.current("reward")
    return _reward.compute(spec, accuracy, feedback, call.observation, call.unmeasured_reason)


def observation() -> Observation:
    """The program's measured run on the example being scored (read-only).

    Fields: run_ms (wall time, ms), cost_usd (USD, None when a price is unknown), model_calls,
    prompt_tokens, completion_tokens, total_tokens; a figure that was not measured is None,
    and cost_unknown_reason / unmeasured_reason say why.
    """
    return _observed(context.current("observation"))


def service_cost() -> float | None:
    """The USD cost of the model calls this example's run made, or None when it cannot be measured."""
    return _observed(context.current("service_cost")).cost_usd


def _observed(call: context.MetricCall) -> Observation:
    if call.observation is None:
        return Observation.unmeasured(call.unmeasured_reason)
    return call.observation
