"""Measurement of the program's own run on each example: wall time and model usage (docs/contract.md#helpers).

Installed only for a metric that uses reward(), observation() or service_cost(): a wrapper around
dspy.Module's call times each run's outermost module call, hooks on DSPy's LM execution and LiteLLM's
entry points (hooks.py) add each model call's tokens and cost to the run in progress, and the finished
run is filed under the prediction it returned, where the metric call that follows finds it. The judge's
calls are never counted as the program's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from .._core import context
from .._core.types import Observation
from .._core.values import COMPLETION_TOKENS, PROMPT_TOKENS, token_count
from .._judge import response_usage
from .._judge.spend import SpendCap
from . import hooks
from .ledger import file as _file
from .ledger import observation_for
from .replay import CallFigures, replay
from .steady import OWN_BAND, OWN_FLOOR_MS, OWN_RESET_FLOOR_MS, WAIT_FLOOR_MS, anchors

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
    """Figures of one run, added to from every thread the run uses.

    Its time is the program's own work plus its model calls' latencies, each call timed by itself: a call
    answered from a cache counts the latency (and tokens and cost) it had when first made (replay.py), so a
    cached run measures as the run it replays.
    """

    __slots__ = ("started", "lock", "calls", "cached", "prompt", "completion", "cost", "unpriced", "caps",
                 "spans", "kinds", "cached_prompt", "cached_completion", "cached_cost", "overhead", "program",
                 "thread", "cpu_started", "cpu_in_calls")

    def __init__(self, program: str = "a program") -> None:
        self.started = time.perf_counter()
        self.thread = threading.get_ident()
        self.cpu_started = time.thread_time()  # the thread's CPU time: waiting (for the GIL, for I/O) apart
        self.cpu_in_calls = 0.0  # CPU seconds this thread spent inside the run's model calls
        self.program = program  # what ran (its class or function), whose own work keeps one anchor (steady.py)
        self.caps = _scoped_caps()  # the program caps in scope where the run started
        self.lock = threading.Lock()
        self.calls = 0
        self.cached = 0
        self.prompt = 0
        self.completion = 0
        self.cost = 0.0
        self.unpriced: list[str] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of each model call, perf_counter seconds
        self.kinds: list[tuple[Any, float]] = []  # each call's kind (steady.py) and latency as first made
        self.cached_prompt = 0
        self.cached_completion = 0
        self.cached_cost = 0.0
        self.overhead = 0.0  # seconds of measurement's own bookkeeping inside the run (not the program's work)

    def add(self, figures: CallFigures, span: tuple[float, float], cached: bool = False, model: Any = None) -> None:
        """Count one model call (a cache hit with the figures of the call it replays); its latency steadied
        per model (steady.py), so jitter is not news."""
        kind = _kind(model, figures)
        anchors.steady(kind, figures.latency_ms)  # moves the kind's anchor down when due
        with self.lock:
            self.kinds.append((kind, figures.latency_ms))
            self.calls += figures.calls
            self.prompt += figures.prompt_tokens
            self.completion += figures.completion_tokens
            self.spans.append(span)
            if cached:
                self.cached += figures.calls
                self.cached_prompt += figures.prompt_tokens
                self.cached_completion += figures.completion_tokens
            if figures.cost_usd is None:
                reason = figures.unpriced or "a model call reported no cost"
                if reason not in self.unpriced:
                    self.unpriced.append(reason)
            else:
                self.cost += figures.cost_usd
                if cached:
                    self.cached_cost += figures.cost_usd
        if not cached:  # a cache hit spends nothing now
            for cap in self.caps:
                cap.charge(figures.cost_usd, figures.unpriced)

    def finish(self) -> Observation:
        ended = time.perf_counter()
        with self.lock:
            waited = _covered(self.spans, self.started, ended)  # wall time spent inside model calls
            actual = sum(end - start for start, end in self.spans)
            own_ms = _own_work(self, ended, waited)
            # each call counts its kind's latency as known now (the fastest seen, so a run that finished after
            # other calls of its kind did is not penalised for the process's warm-up), unless it was clearly
            # slower than that (steady.CALL_BAND): a slower provider is news; concurrent calls
            # (dspy.Parallel) overlap: their latencies count in the share their wall time had
            latency_ms = sum(anchors.current(kind, made) for kind, made in self.kinds)
            model_ms = latency_ms * (waited / actual) if actual > 0 else 0.0
            return Observation(
                run_ms=own_ms + model_ms,
                cost_usd=None if self.unpriced else self.cost,
                model_calls=self.calls,
                prompt_tokens=self.prompt,
                completion_tokens=self.completion,
                cost_unknown_reason="; ".join(self.unpriced) or None,
                cached_calls=self.cached,
                cached_prompt_tokens=self.cached_prompt,
                cached_completion_tokens=self.cached_completion,
                cached_cost_usd=self.cached_cost,
            )


def _own_work(run: _Run, ended: float, waited: float) -> float:
    """The program's own work in a run, milliseconds, steadied (steady.py): its CPU time outside model calls,
    plus the time it waited outside them (for I/O, a retrieval; for the GIL other threads held), each against
    its own anchor. Waiting for the GIL on a busy machine is noise; a retrieval's 200 ms is not."""
    wall = max(0.0, (ended - run.started) - waited - run.overhead) * 1000.0
    if threading.get_ident() != run.thread:  # finished on another thread (an async run): wall time only
        return anchors.steady(("program", run.program), wall, OWN_BAND, OWN_FLOOR_MS, OWN_RESET_FLOOR_MS)
    cpu = max(0.0, time.thread_time() - run.cpu_started - run.cpu_in_calls) * 1000.0
    cpu = min(cpu, wall)
    return (anchors.steady(("program cpu", run.program), cpu, OWN_BAND, OWN_FLOOR_MS, OWN_RESET_FLOOR_MS)
            + anchors.steady(("program wait", run.program), wall - cpu, OWN_BAND, WAIT_FLOOR_MS, OWN_RESET_FLOOR_MS))


def _kind(model: Any, figures: CallFigures) -> tuple[str, str, int]:
    """The anchor a call's latency is steadied by: its model and its answer's size (doubling steps). Not the
    prompt's size: a reworded instruction would make a kind of its own, measured afresh, noise and all."""
    return "model", str(model), max(0, figures.completion_tokens).bit_length()


def _covered(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by at least one span."""
    total, reach = 0.0, start
    for left, right in sorted(spans):
        left, right = max(left, reach), min(right, end)
        if right > left:
            total += right - left
            reach = right
    return total


_run: ContextVar[_Run | None] = ContextVar("skynet_measured_run", default=None)
# True inside a model call already being counted (DSPy's LM execution, an outer LiteLLM call):
# the LiteLLM calls it makes underneath are the same call, not new ones.
_counting: ContextVar[bool] = ContextVar("skynet_counting_model_call", default=False)


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
    run = _Run(_program_key(fn))
    token = _run.set(run)
    try:
        value = fn(*args, **kwargs)
    finally:
        _run.reset(token)
    return value, run.finish()


# -- timing each program run ----------------------------------------------------------------------

# A run is carried in DSPy's own context too, which DSPy copies into the threads it starts (dspy.Parallel).
_CONTEXT_KEY = "skynet_measured_run"


def _joined_run() -> _Run | None:
    """The run a module call in a thread DSPy started belongs to, if any."""
    import dspy

    run = dspy.settings.get(_CONTEXT_KEY)
    return run if isinstance(run, _Run) else None


def _timed_module_call(original: Callable[..., Any], asynchronous: bool) -> Callable[..., Any]:
    """dspy.Module.__call__ (or acall) timing the outermost module call: the program's run on one example."""
    import dspy

    def begin(module: Any) -> tuple[_Run | None, Any, bool]:
        """(run, contextvar token, whether this call is the run's root)."""
        if context.is_judging():
            return None, None, False  # a module the judge or a metric runs is not the program
        run = _run.get()
        if run is not None:
            return run, None, False
        joined = _joined_run()
        if joined is not None or hooks.inside_a_module():
            return joined, (_run.set(joined) if joined is not None else None), False
        run = _Run(_program_key(module))
        return run, _run.set(run), True

    if asynchronous:

        async def measured_acall(module: Any, /, *args: Any, **kwargs: Any) -> Any:
            run, token, root = begin(module)
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
        run, token, root = begin(module)
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


def _program_key(program: Any) -> str:
    """What a run's own work is anchored by: the program's class, or the function's qualified name."""
    import dspy

    target = type(program) if isinstance(program, dspy.Module) else program
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{getattr(target, '__module__', None) or ''}.{name}"


def _measured_program(program: Any) -> Any:
    """What dspy.Evaluate calls instead of `program`: a dspy.Module as it is (its own call is measured), any
    other callable (a plain function) timed as one program run."""
    import dspy

    if isinstance(program, dspy.Module) or not callable(program):
        return program
    timed = _timed_module_call(lambda _program, *args, **kwargs: program(*args, **kwargs), False)
    return functools.wraps(program)(functools.partial(timed, program))


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
            hooks.wrap_overridden_calls(_timed_module_call)
            hooks.wrap_evaluate_programs(_measured_program)
            hooks.wrap_dspy_execution(_counted_dspy)
            hooks.wrap_dspy_pricing(_timed_pricing)
            hooks.warm_dspy_pricing()
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


def _dspy_figures(result: Any, args: tuple[Any, ...], latency_ms: float) -> CallFigures:
    figures = hooks.call_result_figures(result)
    cost = figures["cost"]
    model = getattr(args[0], "model", None) if args else None
    return CallFigures(
        calls=figures["calls"],
        prompt_tokens=token_count(figures["usage"], PROMPT_TOKENS),
        completion_tokens=token_count(figures["usage"], COMPLETION_TOKENS),
        cost_usd=None if cost is None else float(cost),
        unpriced=None if cost is not None else _no_price(model or figures["model"], figures["unpriced_detail"]),
        latency_ms=latency_ms,
    )


def _count_dspy_result(run: _Run, result: Any, call: _Call) -> None:
    """Add one DSPy LM execution, execute(lm, call) -> CallResult, to the run; a cache hit as the call it replays."""
    key, folder = hooks.dspy_call_cache(call.args, call.asynchronous)
    model = getattr(call.args[0], "model", None) if call.args else None
    if hooks.call_result_figures(result)["cache_hit"]:
        found = _replayed(key, folder, model)
        if found is None:  # cached before anything here saw it made: DSPy kept its cost, not its tokens or time
            found = replace(_dspy_figures(result, call.args, call.latency_ms), prompt_tokens=0, completion_tokens=0)
        run.add(found, call.span, cached=True, model=model)
        return
    figures = _first_of_its_model(_dspy_figures(result, call.args, call.latency_ms), model)
    if key is not None:
        replay.remember(key, figures, folder)
    run.add(figures, call.span, model=model)


def _first_of_its_model(figures: CallFigures, model: Any) -> CallFigures:
    """`figures`, marked when they are of the first call of its kind in this process (see steady.at_most)."""
    return figures if anchors.known(_kind(model, figures)) else replace(figures, first=True)


def _replayed(key: str | None, folder: str | None, model: Any) -> CallFigures | None:
    """The figures a cache hit replays; a first call's latency no higher than its kind's time known now."""
    found = replay.recall(key, folder) if key is not None else None
    if found is not None and found.first:
        found = replace(found, latency_ms=anchors.at_most(_kind(model, found), found.latency_ms))
    return found


def _litellm_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """A key for a LiteLLM request (its settings minus where it goes and the credentials), or None."""
    request = {name: value for name, value in kwargs.items() if name not in _NOT_THE_REQUEST}
    if args:
        request["_args"] = list(args)
    try:
        text = json.dumps(request, sort_keys=True, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return "litellm:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


_NOT_THE_REQUEST = frozenset({"api_key", "api_base", "base_url", "metadata", "litellm_logging_obj", "client",
                              "timeout", "num_retries", "extra_headers", "headers"})


def _count_litellm_response(run: _Run, response: Any, call: _Call) -> None:
    """Add one LiteLLM response to the run; one answered from LiteLLM's cache as the call it replays."""
    args, kwargs = call.args, call.kwargs
    model = kwargs.get("model") or (args[0] if args and isinstance(args[0], str) else None)
    if getattr(response, "usage", None) is None:  # a stream, or an unknown shape: its usage is not known here
        unknown = f"the LiteLLM call to {model or 'a model'} reported no usage (streamed?)"
        run.add(CallFigures(1, 0, 0, None, unknown, call.latency_ms), call.span, model=model)
        return
    key = _litellm_key(args, kwargs)
    if hooks.litellm_cache_hit(response):
        found = _replayed(key, None, model)
        if found is not None:
            run.add(found, call.span, cached=True, model=model)
            return
    prompt, completion, cost = response_usage(response)
    unpriced = None if cost is not None else _no_price(getattr(response, "model", None) or model)
    figures = _first_of_its_model(CallFigures(1, prompt, completion, cost, unpriced, call.latency_ms), model)
    if hooks.litellm_cache_hit(response):
        run.add(figures, call.span, cached=True, model=model)
        return
    if key is not None:
        replay.remember(key, figures)
    run.add(figures, call.span, model=model)


@dataclass(frozen=True, slots=True)
class _Call:
    """One model call as the wrapper saw it: its arguments, its span, and its latency (pricing left out)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    asynchronous: bool
    span: tuple[float, float]
    latency_ms: float


# The seconds DSPy's cache and pricing steps took inside the model call being counted (a list, shared with the thread
# asyncio.to_thread prices in, which gets a copy of this context).
_pricing: ContextVar[list[float] | None] = ContextVar("skynet_pricing_seconds", default=None)


def _timed_pricing(original: Callable[..., Any]) -> Callable[..., Any]:
    def priced(*args: Any, **kwargs: Any) -> Any:
        spent = _pricing.get()
        if spent is None:
            return original(*args, **kwargs)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    return priced


_Count = Callable[[_Run, Any, _Call], None]


def _counted(count: _Count) -> Callable[[Callable[..., Any], bool], Callable[..., Any]]:
    """A wrapper factory: `original` wrapped so a call made in a run is counted once (not the calls underneath),
    timed by itself (DSPy's pricing left out)."""

    def begin() -> tuple[_Run | None, Any, Any, list[float]]:
        run = _active_run()
        if run is None:
            return None, None, None, []
        for cap in run.caps:
            cap.check()  # SpendCapReached once a cap of the run's optimization is reached
        spent = [0.0]
        return run, _counting.set(True), _pricing.set(spent), spent

    def end(run: _Run, result: Any, args: Any, kwargs: Any, asynchronous: bool, started: float,
            spent: list[float]) -> None:
        ended = time.perf_counter()
        latency_ms = max(0.0, (ended - started - spent[0]) * 1000.0)
        count(run, result, _Call(args, kwargs, asynchronous, (started, ended), latency_ms))
        with run.lock:
            run.overhead += time.perf_counter() - ended

    def wrap(original: Callable[..., Any], asynchronous: bool) -> Callable[..., Any]:
        if asynchronous:

            @functools.wraps(original)
            async def counted_async(*args: Any, **kwargs: Any) -> Any:
                run, counting, pricing, spent = begin()
                if run is None:
                    return await original(*args, **kwargs)
                started = time.perf_counter()
                try:
                    result = await original(*args, **kwargs)
                finally:
                    _counting.reset(counting)
                    _pricing.reset(pricing)
                end(run, result, args, kwargs, True, started, spent)
                return result

            return counted_async

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            run, counting, pricing, spent = begin()
            if run is None:
                return original(*args, **kwargs)
            cpu = time.thread_time()
            started = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                _counting.reset(counting)
                _pricing.reset(pricing)
                if threading.get_ident() == run.thread:
                    with run.lock:
                        run.cpu_in_calls += time.thread_time() - cpu
            end(run, result, args, kwargs, False, started, spent)
            return result

        return counted

    return wrap


_counted_dspy = _counted(_count_dspy_result)
_counted_litellm = _counted(_count_litellm_response)
