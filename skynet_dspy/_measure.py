"""Measurement of the program's own run on each example: wall time and model usage (SPEC §5).

With no change to the user's program: a DSPy callback times each run's outermost module call,
hooks on DSPy's LM execution and on LiteLLM's entry points add each model call's tokens and cost
to the run in progress, and the finished run is filed under the prediction it returned, where the
metric call that follows finds it. The judge's calls (while a metric is scored, or under
`not_measured()`) are never counted as the program's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from . import _context

__all__ = ["Observation", "install", "measure", "not_measured", "observation_for"]


@dataclass(frozen=True, slots=True)
class Observation:
    """The program's measured run on the example being scored (read-only).

    A figure is None when it could not be measured; `unmeasured_reason` (the whole run) and
    `cost_unknown_reason` (the cost alone, e.g. a model with no known price) say why.
    """

    run_ms: float | None  # wall time of the program's run on the example, milliseconds
    cost_usd: float | None  # USD cost of the run's model calls (0.0 when it made none)
    model_calls: int | None = None  # model calls the run made (cache hits are not calls)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_unknown_reason: str | None = None
    unmeasured_reason: str | None = None

    @property
    def total_tokens(self) -> int | None:
        """prompt_tokens + completion_tokens, or None when the run was not measured."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    @property
    def measured(self) -> bool:
        """Whether the run was measured (its cost may still be unknown)."""
        return self.run_ms is not None

    @classmethod
    def unmeasured(cls, reason: str | None) -> Observation:
        """An observation of a run that was not measured, saying why."""
        return cls(run_ms=None, cost_usd=None, unmeasured_reason=reason or "the run was not measured")


# -- one run in progress ----------------------------------------------------------------------


class _Run:
    """Figures of one run, added to from every thread the run uses."""

    __slots__ = ("started", "lock", "calls", "prompt", "completion", "cost", "unpriced")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.lock = threading.Lock()
        self.calls = 0
        self.prompt = 0
        self.completion = 0
        self.cost = 0.0
        self.unpriced: list[str] = []

    def add(self, calls: int, prompt: int, completion: int, cost: float | None, unpriced: str | None) -> None:
        with self.lock:
            self.calls += calls
            self.prompt += prompt
            self.completion += completion
            if cost is None:
                reason = unpriced or "a model call reported no cost"
                if reason not in self.unpriced:
                    self.unpriced.append(reason)
            else:
                self.cost += cost

    def finish(self) -> Observation:
        elapsed_ms = (time.perf_counter() - self.started) * 1000.0
        with self.lock:
            return Observation(
                run_ms=elapsed_ms,
                cost_usd=None if self.unpriced else self.cost,
                model_calls=self.calls,
                prompt_tokens=self.prompt,
                completion_tokens=self.completion,
                cost_unknown_reason="; ".join(self.unpriced) or None,
            )


_run: ContextVar[_Run | None] = ContextVar("skynet_measured_run", default=None)
# True inside a model call already being counted (DSPy's LM execution, an outer LiteLLM call):
# the LiteLLM calls it makes underneath are the same call, not new ones.
_counting: ContextVar[bool] = ContextVar("skynet_counting_model_call", default=False)
_unmeasured: ContextVar[bool] = ContextVar("skynet_not_measured", default=False)
# The run that last finished in this thread/task, with the objects it returned: the metric
# call that follows the program (dspy.Evaluate) finds it here first.
_last: ContextVar[tuple[tuple[Any, ...], Observation] | None] = ContextVar("skynet_last_run", default=None)


def _active_run() -> _Run | None:
    """The run a model call made now belongs to, or None when it is nobody's run to count."""
    if _unmeasured.get() or _counting.get() or _context.current_or_none() is not None:
        return None
    return _run.get()


@contextlib.contextmanager
def not_measured() -> Iterator[None]:
    """Within this block, model calls and module runs are never counted as a program's (the judge's calls)."""
    token = _unmeasured.set(True)
    try:
        yield
    finally:
        _unmeasured.reset(token)


def measure(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Observation]:
    """Run fn(*args, **kwargs) and return (its value, its Observation); exceptions propagate.

    Counts the wall time and the model calls fn makes in this thread/context (through DSPy or
    LiteLLM, and in threads DSPy starts for it), as for a DSPy program's run.
    """
    install()
    run = _Run()
    token = _run.set(run)
    try:
        value = fn(*args, **kwargs)
    finally:
        _run.reset(token)
    return value, run.finish()


# -- where finished runs are filed ------------------------------------------------------------


class _Ledger:
    """Finished runs by the object their program returned, matched by identity, never by id alone.

    Objects that take weak references (dspy.Prediction) are held weakly, so entries die with
    their predictions; others (tuples, strings) are held strongly, the most recent few only.
    """

    def __init__(self, strong_limit: int = 1024):
        self._lock = threading.Lock()
        self._weak: dict[int, tuple[weakref.ref, Observation]] = {}
        self._strong: OrderedDict[int, tuple[Any, Observation]] = OrderedDict()
        self._strong_limit = strong_limit
        self._sweep_at = 512

    def put(self, obj: Any, observation: Observation) -> None:
        key = id(obj)
        try:
            ref = weakref.ref(obj)
        except TypeError:
            ref = None
        with self._lock:
            if ref is not None:
                self._strong.pop(key, None)
                self._weak[key] = (ref, observation)
                if len(self._weak) >= self._sweep_at:
                    self._weak = {k: entry for k, entry in self._weak.items() if entry[0]() is not None}
                    self._sweep_at = max(512, 2 * len(self._weak))
            else:
                self._weak.pop(key, None)
                self._strong[key] = (obj, observation)
                self._strong.move_to_end(key)
                while len(self._strong) > self._strong_limit:
                    self._strong.popitem(last=False)

    def get(self, obj: Any) -> Observation | None:
        key = id(obj)
        with self._lock:
            weak = self._weak.get(key)
            if weak is not None and weak[0]() is obj:
                return weak[1]
            strong = self._strong.get(key)
            if strong is not None and strong[0] is obj:
                return strong[1]
        return None


_ledger = _Ledger()


def _file(outputs: Any, observation: Observation) -> None:
    # GEPA's trace capture makes forward return (prediction, trace): the metric gets the prediction.
    # The ledger keeps only the prediction, not the tuple (nor the trace it holds).
    if isinstance(outputs, tuple) and outputs:
        keys: tuple[Any, ...] = (outputs, outputs[0])
        filed = outputs[0]
    else:
        keys, filed = (outputs,), outputs
    if filed is not None:
        _ledger.put(filed, observation)
    _last.set((keys, observation))


NOT_FOUND = (
    "no measured run of the program returned this prediction (it was not made by calling a dspy.Module, "
    "or DSPy's callbacks were replaced, e.g. by dspy.context(callbacks=[...]), while it ran)"
)


def observation_for(prediction: Any) -> tuple[Observation | None, str | None]:
    """The measured run that produced `prediction`, or (None, why it was not measured)."""
    if not _installed:
        return None, "measurement is off for this metric (load_metric(..., measure=False))"
    if prediction is None:
        return None, "the program returned no prediction"
    last = _last.get()
    if last is not None and any(key is prediction for key in last[0]):
        return last[1], None
    found = _ledger.get(prediction)
    if found is not None:
        return found, None
    _ensure_callback()  # if dspy.configure(callbacks=...) dropped it, measure the next runs again
    return None, NOT_FOUND


# -- the DSPy callback ------------------------------------------------------------------------


def _make_callback() -> Any:
    from dspy.utils.callback import BaseCallback
    from dspy.utils.callback_context import ACTIVE_CALL_ID

    class MeasureRuns(BaseCallback):
        """Times each program's outermost module call and files its figures under what it returned.

        Threads DSPy starts inside a run (dspy.Parallel) join it through DSPy's active call id.
        """

        def __init__(self) -> None:
            self._open: dict[str, tuple[_Run, Any, bool]] = {}
            self._lock = threading.Lock()

        def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            if _unmeasured.get() or _context.current_or_none() is not None:
                return  # a module the judge runs is not the program
            run = _run.get()
            token = None
            root = False
            if run is None:
                parent = ACTIVE_CALL_ID.get()  # DSPy carries it into the threads it starts
                with self._lock:
                    entry = self._open.get(parent) if parent is not None else None
                if entry is not None:
                    run = entry[0]
                else:
                    run, root = _Run(), True
                token = _run.set(run)
            with self._lock:
                self._open[call_id] = (run, token, root)

        def on_module_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
            with self._lock:
                entry = self._open.pop(call_id, None)
            if entry is None:
                return
            run, token, root = entry
            if token is not None:
                try:
                    _run.reset(token)
                except ValueError:  # ended in another context than it started: restore by value
                    _run.set(None)
            if root and exception is None:
                _file(outputs, run.finish())

    return MeasureRuns()


_install_lock = threading.Lock()
_installed = False
_callback: Any = None


def _ensure_callback() -> None:
    """Keep the callback in DSPy's global callbacks, appended in place (no dspy.configure needed)."""
    # the module, not the Settings object that `dspy.dsp.utils.settings` also names
    config = sys.modules["dspy.dsp.utils.settings"].main_thread_config
    if _has_callback(config.get("callbacks")):  # the usual case, checked without the lock
        return
    with _install_lock:
        callbacks = config.get("callbacks")
        if isinstance(callbacks, list):
            if not _has_callback(callbacks):
                callbacks.append(_callback)
        else:
            config["callbacks"] = [*(callbacks or ()), _callback]


def _has_callback(callbacks: Any) -> bool:
    return isinstance(callbacks, list) and any(existing is _callback for existing in callbacks)


def install() -> None:
    """Start measuring DSPy program runs in this process (idempotent; cheap after the first call)."""
    global _installed, _callback
    if not _installed:
        with _install_lock:
            if not _installed:
                _callback = _make_callback()
                _hook_dspy_execution()
                _hook_litellm()
                _installed = True
    _ensure_callback()


# -- counting model calls ---------------------------------------------------------------------


def _count(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _field(container: Any, *names: str) -> Any:
    for name in names:
        value = container.get(name) if isinstance(container, dict) else getattr(container, name, None)
        if value is not None:
            return value
    return None


# DSPy's words for "this model has no price entry", which the reason above already says
_GENERIC_PRICE_GAPS = ("no matching pricing entry", "a billed token dimension has no known rate")


def _no_price(model: Any, detail: Any = None) -> str:
    reason = f"no price known for model {model or 'unknown'}"
    if isinstance(detail, str) and detail and detail not in _GENERIC_PRICE_GAPS:
        reason += f" ({detail})"
    return reason


def response_usage(response: Any) -> tuple[int, int, float | None]:
    """(prompt tokens, completion tokens, USD cost or None when unpriced) of one LiteLLM response."""
    usage = getattr(response, "usage", None)
    hidden = getattr(response, "_hidden_params", None)
    cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    try:
        cost = None if cost is None else float(cost)
    except (TypeError, ValueError):
        cost = None
    return (
        _count(_field(usage, "prompt_tokens", "input_tokens")),
        _count(_field(usage, "completion_tokens", "output_tokens")),
        cost,
    )


def _count_dspy_result(run: _Run, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add one DSPy LM execution, execute(lm, call) -> CallResult, to the run."""
    if getattr(result, "cache_hit", False):
        return
    usage = getattr(result, "usage", None) or {}
    cost = getattr(result, "cost", None)
    details = getattr(result, "cost_details", None)
    detail = details.get("reason") if isinstance(details, dict) else None
    model = getattr(args[0], "model", None) or getattr(result, "response_model", None)
    run.add(
        max(1, len(getattr(result, "responses", None) or ())),
        _count(_field(usage, "prompt_tokens", "input_tokens")),
        _count(_field(usage, "completion_tokens", "output_tokens")),
        None if cost is None else float(cost),
        None if cost is not None else _no_price(model, detail),
    )


def _count_litellm_response(run: _Run, response: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add one LiteLLM response to the run."""
    model = kwargs.get("model") or (args[0] if args and isinstance(args[0], str) else None)
    if getattr(response, "usage", None) is None:  # a stream, or an unknown shape: its usage is not known here
        run.add(1, 0, 0, None, f"the LiteLLM call to {model or 'a model'} reported no usage (streamed?)")
        return
    prompt, completion, cost = response_usage(response)
    unpriced = None if cost is not None else _no_price(getattr(response, "model", None) or model)
    run.add(1, prompt, completion, cost, unpriced)


_Count = Callable[[_Run, Any, tuple[Any, ...], dict[str, Any]], None]


def _counted(original: Callable[..., Any], count: _Count, asynchronous: bool) -> Callable[..., Any]:
    """`original` wrapped so that a call made in a run is counted once (the calls it makes underneath are not)."""
    if asynchronous:

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            run = _active_run()
            if run is None:
                return await original(*args, **kwargs)
            token = _counting.set(True)
            try:
                result = await original(*args, **kwargs)
            finally:
                _counting.reset(token)
            count(run, result, args, kwargs)
            return result

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            run = _active_run()
            if run is None:
                return original(*args, **kwargs)
            token = _counting.set(True)
            try:
                result = original(*args, **kwargs)
            finally:
                _counting.reset(token)
            count(run, result, args, kwargs)
            return result

    wrapper._skynet_measured = True  # type: ignore[attr-defined]
    return wrapper


def _wrap(module: Any, names: tuple[str, ...], count: _Count, asynchronous: bool) -> None:
    for name in names:
        original = getattr(module, name, None)
        if callable(original) and not getattr(original, "_skynet_measured", False):
            setattr(module, name, _counted(original, count, asynchronous))


def _hook_dspy_execution() -> None:
    """Count every DSPy LM call where it executes (dspy.clients.execution.execute / aexecute).

    DSPy's LM.__call__/forward import these at call time, so replacing the module's attributes
    reaches every engine (DSPy's native one, LiteLLM, custom engines) and cache hits are seen.
    """
    try:
        from dspy.clients import execution
    except ImportError:  # another DSPy layout: LiteLLM's wrappers still count calls made through it
        return
    _wrap(execution, ("execute",), _count_dspy_result, asynchronous=False)
    _wrap(execution, ("aexecute",), _count_dspy_result, asynchronous=True)


def _wrap_litellm(module: Any) -> None:
    """Replace LiteLLM's entry points with transparent wrappers that count calls made in a run."""
    _wrap(module, ("completion", "text_completion", "responses"), _count_litellm_response, asynchronous=False)
    _wrap(module, ("acompletion", "atext_completion", "aresponses"), _count_litellm_response, asynchronous=True)


class _LiteLLMImportHook:
    """Wraps LiteLLM's entry points the moment `litellm` is imported.

    LiteLLM takes seconds to import, so it is never imported here just to be wrapped; wrapping
    at import time also catches `from litellm import completion` in the user's code.
    """

    def __init__(self) -> None:
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
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            _wrap_litellm(module)
            _remove_import_hook()

        try:
            loader.exec_module = exec_and_wrap
        except (AttributeError, TypeError):
            return None
        return spec


_import_hook: _LiteLLMImportHook | None = None


def _remove_import_hook() -> None:
    global _import_hook
    if _import_hook is not None:
        try:
            sys.meta_path.remove(_import_hook)
        except ValueError:
            pass
        _import_hook = None


def _hook_litellm() -> None:
    global _import_hook
    module = sys.modules.get("litellm")
    if module is not None:
        _wrap_litellm(module)
    elif _import_hook is None:
        _import_hook = _LiteLLMImportHook()
        sys.meta_path.insert(0, _import_hook)
