"""GEPA's reflection model, callable(prompt) -> str, from a LiteLLM model string, a dict of settings or a dspy.LM."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from .._core import secrets
from .._core.values import shorten
from .._dspy import record
from .._judge import endpoint, is_lm


class _DspyReflectionLM:
    """A dspy.LM as GEPA's reflection model: prompt (str or chat messages) -> text."""

    def __init__(self, lm: Any, **overrides: Any):
        self.lm = lm
        self.overrides = secrets.RedactedDict(overrides)

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        outputs = self.lm(messages=messages, **self.overrides)
        first = outputs[0] if outputs else ""
        if isinstance(first, dict):
            first = first.get("text") or ""
        return str(first or "")

    def __repr__(self) -> str:
        return secrets.redact(f"<reflection model {getattr(self.lm, 'model', self.lm)!r}>")


def reflection_callable(model: Any, **overrides: Any) -> Callable[[Any], str]:
    """GEPA's reflection model, callable(prompt) -> str, from a LiteLLM model string, a dict or a dspy.LM.

    A string or dict goes through gepa.lm.LM (LiteLLM, with retries); a dict's keys are LiteLLM
    settings (model, api_base, api_key, temperature, ...). `overrides` are further settings.
    """
    if isinstance(model, (str, Mapping)):
        found = endpoint(model, "reflection model")
        assert found is not None
        settings = {**found.litellm_kwargs(), **overrides}
        return record.CountingLM(settings.pop("model"), **settings)
    if is_lm(model) and callable(model):
        endpoint(model, "reflection model")  # registers its key for redaction
        return _DspyReflectionLM(model, **overrides)
    if callable(model):
        return cast(Callable[[Any], str], model)
    raise TypeError(
        "reflection_lm must be a LiteLLM model string ('openai/gpt-4o-mini'), a dict of LiteLLM settings "
        f"({{'model': ..., 'api_base': ..., 'api_key': ...}}), a dspy.LM or a callable(prompt) -> str; "
        f"got {shorten(model)}"
    )
