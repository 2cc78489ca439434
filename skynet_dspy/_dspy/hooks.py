"""Every use of DSPy's, LiteLLM's or GEPA's private API in the package, in one place.

Measurement (reward(), observation(), service_cost()) needs most of them, and only for a metric that
uses those helpers: a program run is timed around dspy.Module's call, and its model calls are counted
where they execute. The optimization report reads a dspy.LM's history; plain GEPA keeps results that were
never run out of GEPA's cache. The one LiteLLM field the judge reads is in _judge/litellm_private.py (the
judge layer cannot import this module). Each hook names the version it was checked against; `problems()`
says, in words, which of them an installed DSPy, LiteLLM or GEPA no longer offers, those of
_judge/litellm_private.py included (tests/unit/dspy/test_hooks.py fails on it).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

DSPY_CHECKED = "3.4.1"
LITELLM_CHECKED = "1.110.2"
GEPA_CHECKED = "0.1.4"

# The LiteLLM entry points a program may call directly (plain GEPA's run(), a custom DSPy engine).
LITELLM_SYNC = ("completion", "text_completion", "responses")
LITELLM_ASYNC = ("acompletion", "atext_completion", "aresponses")
# The CallResult fields measurement reads (dspy/clients/call_result.py).
CALL_RESULT_FIELDS = ("responses", "usage", "cost", "cost_details", "cache_hit", "response_model")

_lock = threading.Lock()


# -- DSPy's module calls (checked against dspy 3.4.1) ------------------------------------------------


def wrap_module_calls(wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> None:
    """Replace dspy.Module.__call__ / acall with `wrap(original, asynchronous)`, to time each program run.

    Private: DSPy's public way to see a run, a callback, sends every module call (Predict's LM and adapter
    calls included) through inspect.getcallargs. Measured again side by side (`make bench`, row 5, 3,000
    calls, best of 3 fresh processes, a loaded 2-core machine): DSPy alone 642 µs per Predict call, with
    one no-op callback 982 µs (1.53x), with a reward() metric measuring through this wrapper 612 µs
    (within the run's noise of DSPy alone). The callbacks would cost more than all of measurement.
    """
    import dspy

    for name, asynchronous in (("__call__", False), ("acall", True)):
        original = dspy.Module.__dict__.get(name)
        if callable(original) and not getattr(original, "_skynet_wrapped", False):
            wrapped = functools.wraps(original)(wrap(original, asynchronous))
            wrapped._skynet_wrapped = True  # type: ignore[attr-defined]
            setattr(dspy.Module, name, wrapped)


def wrap_overridden_calls(wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> None:
    """Also wrap `__call__` / `acall` of every dspy.Module subclass that defines its own, now and when defined later.

    DSPy's tutorials write programs whose class overrides __call__ (the facility-support analyzer) and returns
    a new dspy.Prediction: Module.__call__ never sees that run, only its sub-modules' calls. Private: a
    subclass hook set on dspy.Module (ProgramMeta creates the classes; dspy 3.4.1 defines no __init_subclass__).
    """
    import dspy

    def wrap_class(cls: type) -> None:
        for name, asynchronous in (("__call__", False), ("acall", True)):
            original = cls.__dict__.get(name)
            if callable(original) and not getattr(original, "_skynet_wrapped", False):
                wrapped = functools.wraps(original)(wrap(original, asynchronous))
                wrapped._skynet_wrapped = True  # type: ignore[attr-defined]
                setattr(cls, name, wrapped)

    with _lock:
        current = dspy.Module.__dict__.get("__init_subclass__")
        if not getattr(getattr(current, "__func__", None), "_skynet_wrapped", False):
            def init_subclass(cls: type, **kwargs: Any) -> None:
                if current is not None:
                    current.__func__(cls, **kwargs)
                else:
                    super(dspy.Module, cls).__init_subclass__(**kwargs)
                wrap_class(cls)

            init_subclass._skynet_wrapped = True  # type: ignore[attr-defined]
            dspy.Module.__init_subclass__ = classmethod(init_subclass)  # type: ignore[arg-type]
        seen: set[type] = set()
        stack = list(dspy.Module.__subclasses__())
        while stack:
            cls = stack.pop()
            if cls not in seen:
                seen.add(cls)
                wrap_class(cls)
                stack.extend(cls.__subclasses__())


def wrap_evaluate_programs(measured: Callable[[Any], Any]) -> None:
    """Make dspy.Evaluate call `measured(program)` instead of `program`, so a plain function passed as the
    program is measured too (a dspy.Module is measured by its own call; `measured` returns it unchanged).

    Evaluate.__call__(program, ...) is public; replacing it on the class is not (checked against dspy 3.4.1).
    """
    import dspy

    original = dspy.Evaluate.__dict__.get("__call__")
    if not callable(original) or getattr(original, "_skynet_wrapped", False):
        return

    @functools.wraps(original)
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            args = (measured(args[0]), *args[1:])
        elif kwargs.get("program") is not None:
            kwargs["program"] = measured(kwargs["program"])
        return original(self, *args, **kwargs)

    evaluate._skynet_wrapped = True  # type: ignore[attr-defined]
    dspy.Evaluate.__call__ = evaluate


def wrap_evaluate_runs(run_of: Callable[[Any], AbstractContextManager[Any]]) -> None:
    """Run each dspy.Evaluate call inside `run_of(metric)`, its metric (the summary said at the end of a run).

    Evaluate.__call__(program, metric=None, ...) and Evaluate.metric are public; replacing __call__ on the class is
    not (checked against dspy 3.4.1).
    """
    import dspy

    original = dspy.Evaluate.__dict__.get("__call__")
    if not callable(original) or getattr(original, "_skynet_runs", False):
        return

    @functools.wraps(original)
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        with run_of(kwargs.get("metric") or getattr(self, "metric", None)):
            return original(self, *args, **kwargs)

    evaluate._skynet_runs = True  # type: ignore[attr-defined]
    dspy.Evaluate.__call__ = evaluate


def module_calls_wrapped() -> bool:
    """Whether wrap_module_calls() has been applied in this process."""
    import dspy

    return bool(getattr(dspy.Module.__dict__.get("__call__"), "_skynet_wrapped", False))


def inside_a_module() -> bool:
    """Whether the code running now runs inside a dspy.Module call (DSPy's `caller_modules` setting, which
    Module.__call__ sets and DSPy carries into the threads it starts)."""
    import dspy

    return bool(dspy.settings.get("caller_modules"))


# -- DSPy's LM execution (checked against dspy 3.4.1) ------------------------------------------------


def wrap_dspy_execution(wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> bool:
    """Replace dspy.clients.execution.execute / aexecute with `wrap(original, asynchronous)`.

    Private, and the only place every LM call of a program passes through: DSPy 3.4's native engine
    (openai/*, anthropic/*, ...) never reaches LiteLLM. LM.forward imports these at call time, so the
    module attribute is what it calls. False when this DSPy has no such module (LiteLLM hooks still count).
    """
    try:
        from dspy.clients import execution
    except ImportError:
        return False
    for name, asynchronous in (("execute", False), ("aexecute", True)):
        original = getattr(execution, name, None)
        if callable(original) and not getattr(original, "_skynet_wrapped", False):
            wrapped = wrap(original, asynchronous)
            wrapped._skynet_wrapped = True  # type: ignore[attr-defined]
            setattr(execution, name, wrapped)
    return True


# DSPy's bookkeeping around a model call: choosing (and first building) its engine, its cache lookup and store,
# and its pricing. Not the model's latency:
# the first store of a process opens DSPy's disk cache (about a second), the first pricing loads a price list.
PRICING = ("_engine", "_cached", "_store", "_price_result", "_price_legacy")


def wrap_dspy_pricing(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace dspy.clients.execution's cache and pricing steps with `wrap(original)`, to time them apart.

    Private (dspy 3.4.1): execute() looks the call up in DSPy's cache, stores it there and prices it; the first
    store of a process opens the disk cache and the first pricing loads DSPy's model metadata, which would
    otherwise count as the first call's latency.
    """
    try:
        from dspy.clients import execution
    except ImportError:
        return
    for name in PRICING:
        original = getattr(execution, name, None)
        if callable(original) and not getattr(original, "_skynet_wrapped", False):
            wrapped = functools.wraps(original)(wrap(original))
            wrapped._skynet_wrapped = True  # type: ignore[attr-defined]
            setattr(execution, name, wrapped)


def warm_dspy_pricing() -> None:
    """Load DSPy's model price list now, not inside a measured run's first model call (private, dspy 3.4.1:
    dspy.clients.model_metadata._load). Its JSON parse holds the GIL for about 80 ms, which would slow every
    other thread's calls in a parallel first run. With LITELLM_LOCAL_MODEL_COST_MAP=True it reads the bundled
    copy at once; otherwise DSPy may fetch the list (up to 5 s), so it loads on a background thread."""
    import os

    try:
        from dspy.clients import model_metadata
    except ImportError:
        return
    load = getattr(model_metadata, "_load", None)
    if not callable(load):
        return

    def warm() -> None:
        try:
            load()
        except Exception:  # the first model call will say what is wrong
            pass

    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "").lower() == "true":
        warm()
    else:
        threading.Thread(target=warm, name="skynet-dspy-price-list", daemon=True).start()


def dspy_call_cache(args: tuple[Any, ...], asynchronous: bool) -> tuple[str | None, str | None]:
    """(DSPy's cache key of an execute(lm, call) call, DSPy's disk cache folder), or (None, None) when the call
    does not use DSPy's cache. Private: PreparedCall.key() and IGNORED_CACHE_KEYS (dspy/clients/execution.py)."""
    if len(args) < 2 or not getattr(args[1], "cache", False):
        return None, None
    try:
        import dspy
        from dspy.clients import execution

        key = dspy.cache.cache_key(args[1].key(args[0], asynchronous), execution.IGNORED_CACHE_KEYS)
    except Exception:  # a call shape this DSPy does not have: not replayable, measured as made
        return None, None
    cache = dspy.cache
    folder = cache.disk_cache_dir if getattr(cache, "enable_disk_cache", False) else None
    return key, folder


def call_result_figures(result: Any) -> dict[str, Any]:
    """What one DSPy LM execution used: calls, usage, cost, why it is unpriced, cache hit (CallResult, dspy 3.4.1)."""
    details = getattr(result, "cost_details", None)
    return {
        "cache_hit": bool(getattr(result, "cache_hit", False)),
        "calls": max(1, len(getattr(result, "responses", None) or ())),
        "usage": getattr(result, "usage", None) or {},
        "cost": getattr(result, "cost", None),
        "unpriced_detail": details.get("reason") if isinstance(details, dict) else None,
        "model": getattr(result, "response_model", None),
    }


# -- LiteLLM's entry points (checked against litellm 1.110.2) --------------------------------------


def wrap_litellm(wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> None:
    """Replace LiteLLM's completion functions with `wrap(original, asynchronous)`, now or when LiteLLM is imported.

    LiteLLM takes seconds to import, so it is never imported just to be wrapped: an import hook wraps it
    the moment the user's code imports it (which also catches `from litellm import completion`).
    """
    module = sys.modules.get("litellm")
    if module is not None:
        _wrap_module(module, wrap)
        return
    with _lock:
        if not any(isinstance(finder, _LiteLLMImportHook) for finder in sys.meta_path):
            sys.meta_path.insert(0, _LiteLLMImportHook(wrap))


def _wrap_module(module: Any, wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> None:
    for names, asynchronous in ((LITELLM_SYNC, False), (LITELLM_ASYNC, True)):
        for name in names:
            original = getattr(module, name, None)
            if callable(original) and not getattr(original, "_skynet_wrapped", False):
                wrapped = functools.wraps(original)(wrap(original, asynchronous))
                wrapped._skynet_wrapped = True  # type: ignore[attr-defined]
                setattr(module, name, wrapped)


def litellm_cache_hit(response: Any) -> bool:
    """Whether LiteLLM answered `response` from its cache (the "cache_hit" it notes in `_hidden_params`)."""
    hidden = getattr(response, "_hidden_params", None)
    return bool(hidden.get("cache_hit")) if isinstance(hidden, dict) else False


class _LiteLLMImportHook:
    """A sys.meta_path finder that wraps LiteLLM's entry points right after LiteLLM's own module runs."""

    def __init__(self, wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]):
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
        hook, wrap = self, self._wrap

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            _wrap_module(module, wrap)
            try:
                sys.meta_path.remove(hook)
            except ValueError:
                pass

        try:
            loader.exec_module = exec_and_wrap  # our own spec's loader object, made for this import
        except (AttributeError, TypeError):
            return None
        return spec


# -- a dspy.LM's history (checked against dspy 3.4.1) ------------------------------------------------


def history_entry_figures(entry: Any) -> dict[str, Any]:
    """What one entry of a dspy.LM's `history` used: cache hit, usage, cost (dspy/clients/base_lm.py).

    `history`, its "usage" and "cost" keys are public; whether the call was a cache hit is only on the
    LiteLLM response DSPy keeps, as the `cache_hit` attribute DSPy sets (a hit keeps the first call's cost).
    """
    if not isinstance(entry, dict):
        return {"cache_hit": False, "usage": {}, "cost": None}
    return {
        "cache_hit": bool(getattr(entry.get("response"), "cache_hit", False)),
        "usage": entry.get("usage") or {},
        "cost": entry.get("cost"),
    }


# -- GEPA's optimize_anything adapter (checked against gepa 0.1.4) -----------------------------------

# The side-info key GEPA's own adapter sets on results it must not keep in its evaluation cache.
_NOT_CACHED_KEY = "_gepa_transient_failure"


def keep_out_of_gepas_cache(side_info: dict[str, Any]) -> dict[str, Any]:
    """`side_info` marked so GEPA's evaluation cache does not keep the result (a call that was never run).

    Private: gepa 0.1.4's OptimizeAnythingAdapter skips caching results whose side info holds
    "_gepa_transient_failure" (set by GEPA itself for a batch that raised); there is no public way.
    """
    return {**side_info, _NOT_CACHED_KEY: True}


# -- what an upgrade broke ----------------------------------------------------------------------------


def problems() -> list[str]:
    """One sentence per private API above that the installed DSPy / LiteLLM no longer offer (empty: all fine)."""
    import dspy

    from .._judge import litellm_private

    where = f"dspy {dspy.__version__} (hooks checked against {DSPY_CHECKED})"
    found: list[str] = []
    checks = (("wrap_module_calls", _module_problems), ("inside_a_module", _settings_problems),
              ("warm_dspy_pricing", _metadata_problems), ("wrap_dspy_execution", _execution_problems),
              ("call_result_figures", _call_result_problems), ("history_entry_figures", _history_problems))
    for hook, check in checks:
        try:
            found.extend(check(where))
        except Exception as exc:  # the module or class the check reads is gone
            found.append(f"{hook}: {where}: what it reads is gone ({exc})")
    found.extend(_litellm_problems())
    found.extend(_gepa_problems())
    found.extend(litellm_private.problems())
    return found


def _module_problems(where: str) -> list[str]:
    import dspy

    found = [f"wrap_module_calls: {where}: dspy.Module.{name} is gone"
             for name in ("__call__", "acall") if not callable(dspy.Module.__dict__.get(name))]
    own = dspy.Module.__dict__.get("__init_subclass__")
    if own is not None and not getattr(getattr(own, "__func__", None), "_skynet_wrapped", False):
        found.append(f"wrap_overridden_calls: {where}: dspy.Module defines its own __init_subclass__")
    if not callable(dspy.Evaluate.__dict__.get("__call__")):
        found.append(f"wrap_evaluate_programs: {where}: dspy.Evaluate.__call__ is gone")
    return found


def _settings_problems(where: str) -> list[str]:
    from dspy.dsp.utils.settings import DEFAULT_CONFIG

    if "caller_modules" in DEFAULT_CONFIG:
        return []
    return [f"inside_a_module: {where}: the caller_modules setting is gone"]


def _metadata_problems(where: str) -> list[str]:
    from dspy.clients import model_metadata

    if callable(getattr(model_metadata, "_load", None)):
        return []
    return [f"warm_dspy_pricing: {where}: dspy.clients.model_metadata._load is gone"]


def _execution_problems(where: str) -> list[str]:
    from dspy.clients import execution

    found = [f"wrap_dspy_execution: {where}: dspy.clients.execution.{name} is gone"
             for name in ("execute", "aexecute", *PRICING) if not callable(getattr(execution, name, None))]
    if not isinstance(getattr(execution, "IGNORED_CACHE_KEYS", None), list) or not callable(
        getattr(getattr(execution, "PreparedCall", None), "key", None)
    ):
        found.append(f"dspy_call_cache: {where}: PreparedCall.key or IGNORED_CACHE_KEYS is gone")
    return found


def _call_result_problems(where: str) -> list[str]:
    import dataclasses

    from dspy.clients.call_result import CallResult

    names = {f.name for f in dataclasses.fields(CallResult)}
    return [f"call_result_figures: {where}: CallResult has no field {name!r}"
            for name in CALL_RESULT_FIELDS if name not in names]


def _history_problems(where: str) -> list[str]:
    import inspect

    from dspy.clients.base_lm import BaseLM

    recorded = inspect.getsource(BaseLM._record_response)
    return [f"history_entry_figures: {where}: BaseLM._record_response no longer records {name}"
            for name in ('"usage"', '"cost"', "cache_hit") if name not in recorded]


def _litellm_problems() -> list[str]:
    try:
        import litellm
    except ImportError as exc:
        return [f"wrap_litellm: litellm cannot be imported ({exc})"]
    where = f"litellm {_version('litellm')} (hooks checked against {LITELLM_CHECKED})"
    return [f"wrap_litellm: {where}: litellm.{name} is gone"
            for name in (*LITELLM_SYNC, *LITELLM_ASYNC) if not callable(getattr(litellm, name, None))]


def _gepa_problems() -> list[str]:
    import inspect

    where = f"gepa {_version('gepa')} (hooks checked against {GEPA_CHECKED})"
    try:
        from gepa.adapters.optimize_anything_adapter import optimize_anything_adapter as adapter

        source = inspect.getsource(adapter)
    except (ImportError, OSError, TypeError) as exc:
        return [f"keep_out_of_gepas_cache: {where}: the optimize_anything adapter's source cannot be read ({exc})"]
    if _NOT_CACHED_KEY not in source:
        return [f"keep_out_of_gepas_cache: {where}: the adapter no longer reads {_NOT_CACHED_KEY!r}"]
    return []


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"
