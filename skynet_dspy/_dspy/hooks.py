"""Every use of DSPy's, LiteLLM's or GEPA's private API in the package, in one place, each with its version check.

Measurement (reward(), observation(), service_cost()) needs most of them, and only for a metric that uses those
helpers. DSPy's public seams were weighed first, and serve none of its needs:

- `dspy.settings.callbacks` (on_module_start/end, on_lm_start/end): DSPy's callback machinery runs
  `inspect.getcallargs` on every module, LM and adapter call once one callback is set. `make bench` row 5 (3,000
  Predict calls on DummyLM, best of 3 fresh processes, 2 cores): DSPy alone 642 µs per call, one no-op callback
  982 µs (1.53x), a reward() metric measuring through the wrappers below 612 µs; again on 2 Dec 2026 at load 8-11:
  700 µs, 1,231 µs (1.76x), 909 µs (1.30x). A no-op callback costs more than all of measurement. on_lm_end gets
  the LM's outputs, not the call's CallResult (cost, cache hit), and a program calling LiteLLM directly (plain
  GEPA's run()) is never seen by a callback.
- `track_usage` / `Prediction.get_lm_usage()`: tokens per model only: no cost, no latency, cache hits left out
  (so a cached run could not be measured as the run it replays), and only on a returned dspy.Prediction.

So: a run is timed around dspy.Module's call, and its model calls are counted where they execute (DSPy's
execute(), LiteLLM's entry points). `problems()` says in words which private API an installed DSPy, LiteLLM or
GEPA no longer offers, _judge/litellm_private.py's included (tests/unit/dspy/test_hooks.py fails on it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .._core.errors import installed_version
from .._judge.litellm_private import LITELLM_CHECKED  # the one LiteLLM version both files are checked against

DSPY_CHECKED = "3.4.1"
GEPA_CHECKED = "0.1.4"

# The LiteLLM entry points a program may call directly (plain GEPA's run(), a custom DSPy engine), and which are async.
_LITELLM_CALLS = (("completion", False), ("text_completion", False), ("responses", False),
                  ("acompletion", True), ("atext_completion", True), ("aresponses", True))
# The CallResult fields measurement reads (dspy/clients/call_result.py).
CALL_RESULT_FIELDS = ("responses", "usage", "cost", "cost_details", "cache_hit", "response_model")
# DSPy's bookkeeping inside execute() (its engine, cache lookup and store, pricing), timed apart from the model's
# latency: the first store opens DSPy's disk cache (about a second), the first pricing loads a price list.
PRICING = ("_engine", "_cached", "_store", "_price_result", "_price_legacy")

Wrap = Callable[[Callable[..., Any], bool], Callable[..., Any]]
_lock = threading.Lock()


def _replace(owner: Any, name: str, wrapped_of: Callable[..., Callable[..., Any]], *args: Any) -> None:
    """Set `owner.name` to wrapped_of(original, *args), once (a wrapper is marked, and never wrapped again)."""
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if callable(original) and not getattr(original, "_skynet_wrapped", False):
        wrapped = functools.wraps(original)(wrapped_of(original, *args))
        wrapped._skynet_wrapped = True  # type: ignore[attr-defined]
        setattr(owner, name, wrapped)


def _wrap_calls(owner: Any, wrap: Wrap, names: tuple[tuple[str, bool], ...]) -> None:
    for name, asynchronous in names:
        _replace(owner, name, wrap, asynchronous)


_MODULE_CALLS = (("__call__", False), ("acall", True))


# -- DSPy's module calls and Evaluate (checked against dspy 3.4.1) ------------------------------------------


def wrap_module_calls(wrap: Wrap) -> None:
    """Replace `__call__` / `acall` of dspy.Module and of every subclass defining its own (now and when defined
    later, through a subclass hook: ProgramMeta defines no __init_subclass__) with `wrap(original, asynchronous)`.

    A program whose class overrides __call__ (DSPy's facility-support tutorial) is a run Module.__call__ never sees.
    """
    import dspy

    with _lock:
        _wrap_calls(dspy.Module, wrap, _MODULE_CALLS)
        current = dspy.Module.__dict__.get("__init_subclass__")
        if not getattr(getattr(current, "__func__", None), "_skynet_wrapped", False):

            def init_subclass(cls: type, **kwargs: Any) -> None:
                if current is not None:
                    current.__func__(cls, **kwargs)
                else:
                    super(dspy.Module, cls).__init_subclass__(**kwargs)
                _wrap_calls(cls, wrap, _MODULE_CALLS)

            init_subclass._skynet_wrapped = True  # type: ignore[attr-defined]
            dspy.Module.__init_subclass__ = classmethod(init_subclass)  # type: ignore[arg-type]
        stack = list(dspy.Module.__subclasses__())
        while stack:
            cls = stack.pop()
            _wrap_calls(cls, wrap, _MODULE_CALLS)
            stack.extend(cls.__subclasses__())


def wrap_evaluate(wrapped_of: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace dspy.Evaluate.__call__(self, program, metric=None, ...) (public) on the class (not public)."""
    import dspy

    _replace(dspy.Evaluate, "__call__", wrapped_of)


def module_calls_wrapped() -> bool:
    """Whether wrap_module_calls() has been applied in this process."""
    import dspy

    return bool(getattr(dspy.Module.__dict__.get("__call__"), "_skynet_wrapped", False))


def inside_a_module() -> bool:
    """Whether code runs inside a dspy.Module call (the `caller_modules` setting DSPy carries into its threads)."""
    import dspy

    return bool(dspy.settings.get("caller_modules"))


# -- DSPy's LM execution (checked against dspy 3.4.1) --------------------------------------------------------


def wrap_dspy_execution(wrap: Wrap, time_apart: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
                        ) -> bool:
    """Replace dspy.clients.execution.execute / aexecute with `wrap(original, asynchronous)`, and execute()'s engine,
    cache and pricing steps (PRICING) with `time_apart(original)`; False without them.

    Every LM call of a program passes there (DSPy 3.4's native engines never reach LiteLLM); LM.forward imports
    them at call time, so the module attribute is what it calls.
    """
    try:
        from dspy.clients import execution
    except ImportError:
        return False
    _wrap_calls(execution, wrap, (("execute", False), ("aexecute", True)))
    for name in PRICING:
        if time_apart is not None:
            _replace(execution, name, time_apart)
    return True


def warm_dspy_pricing() -> None:
    """Load DSPy's price list (dspy.clients.model_metadata._load) now, not inside a measured run's first call,
    where its 80 ms JSON parse would hold the GIL; on a thread unless LITELLM_LOCAL_MODEL_COST_MAP (a download)."""
    try:
        from dspy.clients.model_metadata import _load
    except ImportError:
        return

    def warm() -> None:
        with contextlib.suppress(Exception):  # the first model call will say what is wrong
            _load()

    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "").lower() == "true":
        warm()
    else:
        threading.Thread(target=warm, name="skynet-dspy-price-list", daemon=True).start()


def dspy_call_cache(args: tuple[Any, ...], asynchronous: bool) -> tuple[str | None, str | None]:
    """(DSPy's cache key of execute(lm, call), its disk cache folder), or (None, None) when not cached
    (PreparedCall.key() and IGNORED_CACHE_KEYS)."""
    if len(args) < 2 or not getattr(args[1], "cache", False):
        return None, None
    try:
        import dspy
        from dspy.clients import execution

        key = dspy.cache.cache_key(args[1].key(args[0], asynchronous), execution.IGNORED_CACHE_KEYS)
    except Exception:  # a call shape this DSPy does not have: not replayable, measured as made
        return None, None
    cache = dspy.cache
    return key, cache.disk_cache_dir if getattr(cache, "enable_disk_cache", False) else None


def call_result_figures(result: Any) -> dict[str, Any]:
    """What one DSPy LM execution used, from its CallResult: calls, usage, cost, why unpriced, cache hit, model."""
    details = getattr(result, "cost_details", None)
    return {
        "cache_hit": bool(getattr(result, "cache_hit", False)),
        "calls": max(1, len(getattr(result, "responses", None) or ())),
        "usage": getattr(result, "usage", None) or {},
        "cost": getattr(result, "cost", None),
        "unpriced_detail": details.get("reason") if isinstance(details, dict) else None,
        "model": getattr(result, "response_model", None),
    }


def history_entry_figures(entry: Any) -> dict[str, Any]:
    """One dspy.LM `history` entry's cache hit, usage and cost: the keys are public, the cache hit is only the
    `cache_hit` attribute DSPy sets on the response it keeps (dspy/clients/base_lm.py)."""
    if not isinstance(entry, dict):
        return {"cache_hit": False, "usage": {}, "cost": None}
    return {
        "cache_hit": bool(getattr(entry.get("response"), "cache_hit", False)),
        "usage": entry.get("usage") or {},
        "cost": entry.get("cost"),
    }


# -- LiteLLM's entry points (checked against litellm 1.110.2) ----------------------------------------------


def wrap_litellm(wrap: Wrap) -> None:
    """Replace LiteLLM's completion functions with `wrap(original, asynchronous)`, now or when LiteLLM is imported
    (seconds to import: an import hook wraps it as the user imports it, `from litellm import completion` too)."""
    module = sys.modules.get("litellm")
    if module is not None:
        _wrap_calls(module, wrap, _LITELLM_CALLS)
        return
    with _lock:
        if not any(isinstance(finder, _LiteLLMImportHook) for finder in sys.meta_path):
            sys.meta_path.insert(0, _LiteLLMImportHook(wrap))


def litellm_cache_hit(response: Any) -> bool:
    """Whether LiteLLM answered `response` from its cache (the "cache_hit" of its `_hidden_params`)."""
    hidden = getattr(response, "_hidden_params", None)
    return bool(hidden.get("cache_hit")) if isinstance(hidden, dict) else False


class _LiteLLMImportHook:
    """A sys.meta_path finder wrapping LiteLLM's entry points right after LiteLLM's own module runs."""

    def __init__(self, wrap: Wrap):
        self._wrap = wrap
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "litellm" or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None
        finally:
            self._busy.on = False
        loader: Any = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            _wrap_calls(module, self._wrap, _LITELLM_CALLS)
            if self in sys.meta_path:
                sys.meta_path.remove(self)

        try:
            loader.exec_module = exec_and_wrap  # our own spec's loader object, made for this import
        except (AttributeError, TypeError):
            return None
        return spec


# -- GEPA's optimize_anything adapter (checked against gepa 0.1.4) -----------------------------------------

def example_input_keys(example: Any) -> Any:
    """A dspy.Example's input field names (None: with_inputs() was not called), read without building the Example
    `inputs()` returns: the metric reads them on every call."""
    return example._input_keys


PREDICTION_STATE = ("_store", "_completions", "_lm_usage")  # what dspy.Prediction.__init__ leaves on a Prediction


def init_prediction(prediction: Any, fields: dict[str, Any]) -> None:
    """Set up a dspy.Prediction subclass instance (a Score) holding `fields`, as Prediction.__init__ would, without
    its setattr round trips: a Score is built on every metric call, and that __init__ was a third of its cost."""
    object.__setattr__(prediction, "_store", fields)
    object.__setattr__(prediction, "_completions", None)
    object.__setattr__(prediction, "_lm_usage", None)


_NOT_CACHED_KEY = "_gepa_transient_failure"


def keep_out_of_gepas_cache(side_info: dict[str, Any]) -> dict[str, Any]:
    """`side_info` marked so GEPA's evaluation cache does not keep it (a call never run): the adapter skips results
    whose side info holds the key GEPA sets for a batch that raised; there is no public way."""
    return {**side_info, _NOT_CACHED_KEY: True}


# -- what an upgrade broke -----------------------------------------------------------------------------------


def problems() -> list[str]:
    """One sentence per private API above that the installed DSPy / LiteLLM / GEPA no longer offer (empty: fine)."""
    import dspy

    from .._judge import litellm_private

    found = _gone(f"dspy {dspy.__version__} (hooks checked against {DSPY_CHECKED})", _DSPY_APIS, _dspy_changes)
    try:
        import litellm  # noqa: F401
    except ImportError as exc:
        found.append(f"wrap_litellm: litellm cannot be imported ({exc})")
    else:
        where = f"litellm {installed_version('litellm')} (hooks checked against {LITELLM_CHECKED})"
        found += _gone(where, {"wrap_litellm": [f"litellm:{name}" for name, _ in _LITELLM_CALLS]})
    return found + _gepa_problems() + litellm_private.problems()


_DSPY_APIS = {
    "wrap_module_calls": ["dspy:Module.__call__", "dspy:Module.acall"],
    "wrap_evaluate": ["dspy:Evaluate.__call__"],
    "warm_dspy_pricing": ["dspy.clients.model_metadata:_load"],
    "wrap_dspy_execution": [f"dspy.clients.execution:{name}" for name in ("execute", "aexecute", *PRICING)],
    "dspy_call_cache": ["dspy.clients.execution:PreparedCall.key", "dspy.clients.execution:IGNORED_CACHE_KEYS"],
}


def _find(path: str) -> Any:
    """The object at "module:attr.attr" (a class's own attribute, not an inherited one), or None."""
    module, _, names = path.partition(":")
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        return None
    for name in names.split("."):
        found = vars(found).get(name) if isinstance(found, type) else getattr(found, name, None)
    return found


def _gone(where: str, apis: dict[str, list[str]], changes: Callable[[], list[tuple[str, str]]] | None = None
          ) -> list[str]:
    found = [f"{hook}: {where}: {path.replace(':', '.')} is gone" for hook, paths in apis.items() for path in paths
             if _find(path) is None]
    try:
        found += [f"{hook}: {where}: {what}" for hook, what in (changes() if changes else [])]
    except Exception as exc:  # the module or class a check reads is gone
        found.append(f"hooks: {where}: what they read is gone ({exc})")
    return found


def _dspy_changes() -> list[tuple[str, str]]:
    """What changed in DSPy's private API that is still there."""
    import dataclasses
    import inspect

    import dspy
    from dspy.clients.base_lm import BaseLM
    from dspy.clients.call_result import CallResult
    from dspy.dsp.utils.settings import DEFAULT_CONFIG

    found = []
    own = dspy.Module.__dict__.get("__init_subclass__")
    if own is not None and not getattr(getattr(own, "__func__", None), "_skynet_wrapped", False):
        found.append(("wrap_module_calls", "dspy.Module defines its own __init_subclass__"))
    if "caller_modules" not in DEFAULT_CONFIG:
        found.append(("inside_a_module", "the caller_modules setting is gone"))
    if getattr(dspy.Example(a=1).with_inputs("a"), "_input_keys", None) != {"a"}:
        found.append(("example_input_keys", "dspy.Example no longer keeps its input keys in _input_keys"))
    if tuple(vars(dspy.Prediction(a=1))) != PREDICTION_STATE:
        found.append(("init_prediction", "dspy.Prediction.__init__ sets other attributes"))
    names = {f.name for f in dataclasses.fields(CallResult)}
    found += [("call_result_figures", f"CallResult has no field {name!r}") for name in CALL_RESULT_FIELDS
              if name not in names]
    recorded = inspect.getsource(BaseLM._record_response)
    found += [("history_entry_figures", f"BaseLM._record_response no longer records {name}")
              for name in ('"usage"', '"cost"', "cache_hit") if name not in recorded]
    return found


def _gepa_problems() -> list[str]:
    import inspect

    where = f"gepa {installed_version('gepa')} (hooks checked against {GEPA_CHECKED})"
    try:
        from gepa.adapters.optimize_anything_adapter import optimize_anything_adapter as adapter

        source = inspect.getsource(adapter)
    except (ImportError, OSError, TypeError) as exc:
        return [f"keep_out_of_gepas_cache: {where}: the optimize_anything adapter's source cannot be read ({exc})"]
    if _NOT_CACHED_KEY not in source:
        return [f"keep_out_of_gepas_cache: {where}: the adapter no longer reads {_NOT_CACHED_KEY!r}"]
    return []
