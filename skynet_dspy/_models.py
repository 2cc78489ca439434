"""Model routing for llm(): the metric model, falling back to the reflection model, via LiteLLM.

Placeholder interface; the calls themselves land with the llm() issue.
"""

from __future__ import annotations

from typing import Any


class ModelNotConfigured(RuntimeError):
    """llm() was called with neither a metric model nor a reflection model set."""


class Models:
    """Where a metric's llm() calls go: `metric_lm`, else `reflection_lm`."""

    def __init__(self, metric_lm: Any = None, reflection_lm: Any = None, cache: Any = True):
        self.cache = cache
        self.metric_lm = metric_lm
        self.reflection_lm = reflection_lm

    def complete(self, instructions: str, input: str | None = None, **overrides: Any) -> str:
        raise ModelNotConfigured(
            "skynet.llm() is not configured yet: no metric model and no reflection model. "
            "Pass metric_lm=... or reflection_lm=... to skynet_dspy.load_metric()."
        )


_default = Models()


def default_models() -> Models:
    """The routing llm() uses outside a metric call run by skynet-dspy."""
    return _default
