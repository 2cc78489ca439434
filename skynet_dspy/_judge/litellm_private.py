"""LiteLLM's private API the judge layer reads, in one place below DSPy (the judge must not import DSPy).

Everything else private that the package uses is in skynet_dspy/_dspy/hooks.py, whose problems() also
checks what is here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
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


_quiet_lock = threading.Lock()
_quiet_count = 0
_quiet_saved: Any = None


@contextlib.contextmanager
def no_banner(litellm: Any) -> Iterator[None]:
    """While skynet-dspy's calls are in flight, LiteLLM prints no "Give Feedback / Get Help" banner.

    LiteLLM prints it to stdout from its exception mapping whenever `litellm.suppress_debug_info` is False
    (litellm 1.110.2: litellm_core_utils/exception_mapping_utils.py); it has no per-call switch. So the
    flag is set by the first of skynet-dspy's calls in flight and put back as it was by the last (a
    user's own LiteLLM call made meanwhile prints no banner either; their setting is kept after).
    """
    global _quiet_count, _quiet_saved
    with _quiet_lock:
        if _quiet_count == 0:
            _quiet_saved = getattr(litellm, "suppress_debug_info", False)
            litellm.suppress_debug_info = True
        _quiet_count += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_count -= 1
            if _quiet_count == 0:
                if litellm.suppress_debug_info is True:  # unless the user changed it meanwhile
                    litellm.suppress_debug_info = _quiet_saved
                _quiet_saved = None


def problems() -> list[str]:
    """One sentence per private LiteLLM API above that the installed LiteLLM no longer offers."""
    try:
        import litellm
        from litellm.types.utils import ModelResponse
    except ImportError as exc:
        return [f"response_cost: litellm cannot be imported ({exc})"]
    if not isinstance(getattr(litellm, "suppress_debug_info", None), bool):
        version = getattr(litellm, "__version__", None) or "installed"
        return [f"no_banner: litellm {version} (checked against {LITELLM_CHECKED}) has no suppress_debug_info flag"]
    response = ModelResponse()
    if not isinstance(getattr(response, "_hidden_params", None), dict):
        version = getattr(litellm, "__version__", None) or "installed"
        return [
            f"response_cost: litellm {version} (checked against {LITELLM_CHECKED}): ModelResponse has no "
            "_hidden_params dict"
        ]
    return []
