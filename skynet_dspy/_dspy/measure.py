"""Measurement of the program's own run on each example: wall time and model usage (docs/contract.md#helpers).

Installed only for a metric that uses reward(), observation() or service_cost(): a wrapper around
dspy.Module's call times each run's outermost module call, hooks on DSPy's LM execution and LiteLLM's
entry points (hooks.py) add each model call's tokens and cost to the run in progress, and the finished
run is filed under the prediction it returned, where the metric call that follows finds it. The judge's
calls are never counted as the program's.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .._core import context
from .._core.lru import LRU
from .._core.types import Observation
from .._core.values import COMPLETION_TOKENS, PROMPT_TOKENS, token_count
from .._judge import response_usage
from .._judge.spend import SpendCap
from . import hooks

__all__ = ["cap_in_scope", "install", "installed", "measure", "observation_for", "program_caps"]

# A metric's max_program_cost_usd= cap governs only the program's runs inside its own optimization: the scope
# program_caps(cap) opens (skynet_dspy.gepa()'s compile, optimize_anything's run() calls, `metric.capping()`).
# A run takes the caps in scope where it starts; its model calls are checked against them before they are made
# and charged to them after. Runs outside every scope are never refused. The scope is a context variable, and is
# carried in DSPy's own context too, which DSPy copies into the threads it starts (dspy.Evaluate, dspy.Parallel).
_caps: ContextVar[tuple[SpendCap, ...]] = ContextVar("skynet_program_caps", default=())
_CAPS_KEY = "skynet_program_caps"


def _scoped_caps() -> tuple[SpendCap, ...]:
    """The program caps in scope here: this context's, else those DSPy carried into this thread."""
    caps = _caps.get()
    if caps:
        return caps
    import dspy

    return dspy.settings.get(_CAPS_KEY) or ()


def cap_in_scope(cap: SpendCap) -> bool:
    """Whether `cap` governs a program run started here."""
    return any(scoped is cap for scoped in _scoped_caps())


@contextmanager
def program_caps(cap: SpendCap | None) -> Iterator[None]:
    """Within the block, program runs started here (and in threads DSPy starts) are checked and charged
    against `cap`, beside any cap already in scope; None: the block changes nothing."""
    if cap is None or cap_in_scope(cap):
        yield
        return
    import dspy

    install()
    caps = (*_scoped_caps(), cap)
    token = _caps.set(caps)
    try:
        with dspy.context(**{_CAPS_KEY: caps}):
            yield
    finally:
        _caps.reset(token)


class _Run:
    """Figures of one run, added to from every thread the run uses."""

    __slots__ = ("started", "lock", "calls", "prompt", "completion", "cost", "unpriced", "caps")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.caps = _scoped_caps()  # the program caps in scope where the run started
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
        for cap in self.caps:
            cap.charge(cost, unpriced)

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
# The run that last finished in this thread/task, with the objects it returned: the metric call
# that follows the program (dspy.Evaluate) finds it here first.
_last: ContextVar[tuple[tuple[Any, ...], Observation] | None] = ContextVar("skynet_last_run", default=None)


def _active_run() -> _Run | None:
    """The run a model call made now belongs to, or None when it is nobody's run to count."""
    if _counting.get() or context.is_judging():
        return None
    return _run.get()


def measure(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Observation]:
    """Run fn(*args, **kwargs) and return (its value, its Observation); exceptions propagate.

    Counts the wall time and the model calls fn makes in this thread/context (through DSPy or LiteLLM,
    and in threads DSPy starts for it), as for a DSPy program's run.
    """
    install()
    run = _Run()
    token = _run.set(run)
    try:
        value = fn(*args, **kwargs)
    finally:
        _run.reset(token)
    return value, run.finish()


# -- where finished runs are filed --------------------------------------------------------------------


class _Ledger:
    """Finished runs by the object their program returned, matched by identity, never by id alone.

    Objects that take weak references (dspy.Prediction) are held weakly, so entries die with their
    predictions; others (tuples, strings) are held strongly, the most recent few only.
    """

    def __init__(self, strong_limit: int = 1024):
        self._lock = threading.Lock()
        self._weak: dict[int, tuple[weakref.ref, Observation]] = {}
        self._strong: LRU[int, tuple[Any, Observation]] = LRU(strong_limit)
        self._sweep_at = 512

    def put(self, obj: Any, observation: Observation) -> None:
        key = id(obj)
        try:
            ref = weakref.ref(obj)
        except TypeError:
            self._strong.put(key, (obj, observation))
            return
        with self._lock:
            self._weak[key] = (ref, observation)
            if len(self._weak) >= self._sweep_at:
                self._weak = {k: entry for k, entry in self._weak.items() if entry[0]() is not None}
                self._sweep_at = max(512, 2 * len(self._weak))

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
    "no measured run of the program returned this prediction (it was not made by calling a dspy.Module)"
)


def observation_for(prediction: Any) -> tuple[Observation | None, str | None]:
    """The measured run that produced `prediction`, or (None, why it was not measured)."""
    if prediction is None:
        return None, "the program returned no prediction"
    last = _last.get()
    if last is not None and any(key is prediction for key in last[0]):
        return last[1], None
    found = _ledger.get(prediction)
    if found is not None:
        return found, None
    return None, NOT_FOUND


# -- timing each program run ----------------------------------------------------------------------

# A run is carried in DSPy's own context too, which DSPy copies into the threads it starts (dspy.Parallel).
_CONTEXT_KEY = "skynet_measured_run"


def _joined_run() -> _Run | None:
    """The run a module call in a thread DSPy started belongs to, if any."""
    import dspy

    return dspy.settings.get(_CONTEXT_KEY)


def _timed_module_call(original: Callable[..., Any], asynchronous: bool) -> Callable[..., Any]:
    """dspy.Module.__call__ (or acall) timing the outermost module call: the program's run on one example."""
    import dspy

    def begin() -> tuple[_Run | None, Any, bool]:
        """(run, contextvar token, whether this call is the run's root)."""
        if context.is_judging():
            return None, None, False  # a module the judge or a metric runs is not the program
        run = _run.get()
        if run is not None:
            return run, None, False
        joined = _joined_run()
        if joined is not None or hooks.inside_a_module():
            return joined, (_run.set(joined) if joined is not None else None), False
        run = _Run()
        return run, _run.set(run), True

    if asynchronous:

        async def measured_acall(module: Any, /, *args: Any, **kwargs: Any) -> Any:
            run, token, root = begin()
            try:
                if root:
                    with dspy.context(**{_CONTEXT_KEY: run}):
                        outputs = await original(module, *args, **kwargs)
                    _file(outputs, run.finish())  # type: ignore[union-attr]
                    return outputs
                return await original(module, *args, **kwargs)
            finally:
                if token is not None:
                    _run.reset(token)

        return measured_acall

    def measured_call(module: Any, /, *args: Any, **kwargs: Any) -> Any:
        run, token, root = begin()
        try:
            if root:
                with dspy.context(**{_CONTEXT_KEY: run}):
                    outputs = original(module, *args, **kwargs)
                _file(outputs, run.finish())  # type: ignore[union-attr]
                return outputs
            return original(module, *args, **kwargs)
        finally:
            if token is not None:
                _run.reset(token)

    return measured_call


_install_lock = threading.Lock()
_installed = False


def install() -> None:
    """Start measuring DSPy program runs in this process (idempotent; cheap after the first call)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            hooks.wrap_module_calls(_timed_module_call)
            hooks.wrap_dspy_execution(_counted_dspy)
            hooks.wrap_litellm(_counted_litellm)
            _installed = True


def installed() -> bool:
    """Whether measurement was installed in this process (some loaded metric uses it)."""
    return _installed


# -- counting model calls -------------------------------------------------------------------------------

# DSPy's words for "this model has no price entry", which the reason below already says
_GENERIC_PRICE_GAPS = ("no matching pricing entry", "a billed token dimension has no known rate")


def _no_price(model: Any, detail: Any = None) -> str:
    reason = f"no price known for model {model or 'unknown'}"
    if isinstance(detail, str) and detail and detail not in _GENERIC_PRICE_GAPS:
        reason += f" ({detail})"
    return reason


def _count_dspy_result(run: _Run, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add one DSPy LM execution, execute(lm, call) -> CallResult, to the run."""
    figures = hooks.call_result_figures(result)
    if figures["cache_hit"]:
        return
    cost = figures["cost"]
    model = getattr(args[0], "model", None) or figures["model"]
    run.add(
        figures["calls"],
        token_count(figures["usage"], PROMPT_TOKENS),
        token_count(figures["usage"], COMPLETION_TOKENS),
        None if cost is None else float(cost),
        None if cost is not None else _no_price(model, figures["unpriced_detail"]),
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


def _counted(count: _Count) -> Callable[[Callable[..., Any], bool], Callable[..., Any]]:
    """A wrapper factory: `original` wrapped so a call made in a run is counted once (not the calls underneath)."""

    def wrap(original: Callable[..., Any], asynchronous: bool) -> Callable[..., Any]:
        if asynchronous:

            @functools.wraps(original)
            async def counted_async(*args: Any, **kwargs: Any) -> Any:
                run = _active_run()
                if run is None:
                    return await original(*args, **kwargs)
                for cap in run.caps:
                    cap.check()  # SpendCapReached once a cap of the run's optimization is reached
                token = _counting.set(True)
                try:
                    result = await original(*args, **kwargs)
                finally:
                    _counting.reset(token)
                count(run, result, args, kwargs)
                return result

            return counted_async

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            run = _active_run()
            if run is None:
                return original(*args, **kwargs)
            for cap in run.caps:
                cap.check()  # SpendCapReached once a cap of the run's optimization is reached
            token = _counting.set(True)
            try:
                result = original(*args, **kwargs)
            finally:
                _counting.reset(token)
            count(run, result, args, kwargs)
            return result

        return counted

    return wrap


_counted_dspy = _counted(_count_dspy_result)
_counted_litellm = _counted(_count_litellm_response)
