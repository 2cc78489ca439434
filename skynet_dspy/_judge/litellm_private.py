"""LiteLLM's private API the judge layer reads (below DSPy), checked by problems(), which _dspy/hooks.py runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .._core.errors import installed_version
from .._core.values import as_number

LITELLM_CHECKED = "1.110.2"


def response_cost(response: Any) -> float | None:
    """The USD cost LiteLLM computed for a response (`_hidden_params["response_cost"]`), or None when unpriced; the
    public litellm.completion_cost() recomputes it and prints a banner when it cannot."""
    hidden = getattr(response, "_hidden_params", None)
    return as_number(hidden.get("response_cost")) if isinstance(hidden, dict) else None


_quiet_lock = threading.Lock()
_quiet_count, _quiet_saved = 0, None  # calls in flight, and the user's suppress_debug_info before the first


@contextlib.contextmanager
def no_banner(litellm: Any) -> Iterator[None]:
    """No LiteLLM banner while skynet-dspy's calls are in flight: `litellm.suppress_debug_info` (it has no per-call
    switch) is set by the first call in flight and put back by the last."""
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
            if _quiet_count == 0 and litellm.suppress_debug_info is True:  # unless the user changed it meanwhile
                litellm.suppress_debug_info = _quiet_saved


def problems() -> list[str]:
    """One sentence per private LiteLLM API above that the installed LiteLLM no longer offers."""
    try:
        import litellm
        from litellm.types.utils import ModelResponse
    except ImportError as exc:
        return [f"response_cost: litellm cannot be imported ({exc})"]
    version = f"litellm {installed_version('litellm')} (checked against {LITELLM_CHECKED})"  # it has no __version__
    if not isinstance(getattr(litellm, "suppress_debug_info", None), bool):
        return [f"no_banner: {version} has no suppress_debug_info flag"]
    if not isinstance(getattr(ModelResponse(), "_hidden_params", None), dict):
        return [f"response_cost: {version}: ModelResponse has no _hidden_params dict"]
    return []
