"""LiteLLM's private API the judge layer reads, in one place below DSPy (the judge must not import DSPy).

Everything else private that the package uses is in skynet_dspy/_dspy/hooks.py, whose problems() also
checks what is here.
"""

from __future__ import annotations

from typing import Any

LITELLM_CHECKED = "1.110.2"


def response_cost(response: Any) -> float | None:
    """The USD cost LiteLLM computed for a response, or None when it has no price for the model.

    Private: `response._hidden_params["response_cost"]` (litellm 1.110.2). The public
    litellm.completion_cost() recomputes it, takes ~0.3 ms, and prints LiteLLM's provider banner to
    stdout for a model it cannot price.
    """
    hidden = getattr(response, "_hidden_params", None)
    cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    try:
        return None if cost is None else float(cost)
    except (TypeError, ValueError):
        return None


def problems() -> list[str]:
    """One sentence per private LiteLLM API above that the installed LiteLLM no longer offers."""
    try:
        import litellm
        from litellm.types.utils import ModelResponse
    except ImportError as exc:
        return [f"response_cost: litellm cannot be imported ({exc})"]
    response = ModelResponse()
    if not isinstance(getattr(response, "_hidden_params", None), dict):
        version = getattr(litellm, "__version__", None) or "installed"
        return [
            f"response_cost: litellm {version} (checked against {LITELLM_CHECKED}): ModelResponse has no "
            "_hidden_params dict"
        ]
    return []
