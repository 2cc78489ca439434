"""Measurement of the program's own run on each example: wall time and model usage (docs/measurement.md).

Installed only for a metric that uses reward(), observation() or service_cost() (why through private hooks:
hooks.py). A wrapper around dspy.Module's call times each run's outermost module call; hooks on DSPy's LM execution
and LiteLLM's entry points add each model call's tokens and cost to the run in progress; the finished run is filed
under the prediction it returned (ledger.py), where the metric call that follows finds it. The judge's calls are
never counted as the program's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from .._core import context
from .._core.types import Observation, Usage
from .._core.values import COMPLETION_TOKENS, PROMPT_TOKENS, token_count
from .._judge import response_usage
from .._judge.spend import SpendCap
from . import hooks
from .ledger import file as _file
from .ledger import observation_for
from .replay import CallFigures, replay
from .steady import OWN, WAIT, anchors, clocks

__all__ = ["cap_in_scope", "install", "installed", "measure", "measured_program", "observation_for", "program_caps"]

# The program caps (max_program_cost_usd=) in scope: a run takes those where it starts, and its model calls are
# checked against them before they are made and charged after. Carried in DSPy's context (a ContextVar), which DSPy
# copies into the threads it starts (dspy.Evaluate, dspy.Parallel), as is the run in progress.
_CAPS_KEY = "skynet_program_caps"
_RUN_KEY = "skynet_measured_run"


def _scoped_caps() -> tuple[SpendCap, ...]:
    import dspy

    return dspy.settings.get(_CAPS_KEY) or ()


def cap_in_scope(cap: SpendCap) -> bool:
    """Whether `cap` governs a program run started here."""
    return any(scoped is cap for scoped in _scoped_caps())


@contextmanager
def program_caps(cap: SpendCap | None) -> Iterator[None]:
    """Within the block, program runs started here (and in DSPy's threads) are checked and charged against `cap`."""
    if cap is None or cap_in_scope(cap):
        yield
        return
    import dspy

    install()
    with dspy.context(**{_CAPS_KEY: (*_scoped_caps(), cap)}):
        yield


class _Run:
    """Figures of one run, added to from every thread it uses. Its time is the program's own work plus its model
    calls' latencies, each as first made (a cache hit replays it: replay.py), steadied by kind (steady.py)."""

    def __init__(self, program: str = "a program") -> None:
        self.started = time.perf_counter()
        self.collected_started = clocks.collected  # garbage collection in the process, seconds
        self.collected_in_calls = 0.0  # of which, during the run's model calls
        self.thread = threading.get_ident()
        self.cpu_started = clocks.cpu()  # the thread's CPU time: waiting (for the GIL, for I/O) apart
        self.cpu_in_calls = 0.0  # CPU seconds this thread spent inside the run's model calls
        self.overhead = 0.0  # seconds of measurement's own bookkeeping inside the run
        self.program = program  # what ran, whose own work keeps its anchor
        self.caps = _scoped_caps()
        self.lock = threading.Lock()
        self.total = Usage()  # model calls, tokens, and the cost of those priced
        self.cached = Usage()  # of the total, the calls answered from a cache
        self.unpriced: list[str] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of each model call, perf_counter seconds
        self.kinds: list[tuple[Any, float]] = []  # each call's kind and latency as first made

    def add(self, figures: CallFigures, span: tuple[float, float], cached: bool, model: str) -> None:
        kind = _kind(model, figures)
        anchors.steady(kind, figures.latency_ms, started=span[0])  # taken into the kind's first times
        used = Usage(figures.calls, figures.prompt_tokens, figures.completion_tokens, figures.cost_usd or 0.0)
        with self.lock:
            self.kinds.append((kind, figures.latency_ms))
            self.spans.append(span)
            self.total += used
            if cached:
                self.cached += used
            if figures.cost_usd is None:
                reason = figures.unpriced or "a model call reported no cost"
                if reason not in self.unpriced:
                    self.unpriced.append(reason)
        if not cached:  # a cache hit spends nothing now
            for cap in self.caps:
                cap.charge(figures.cost_usd, figures.unpriced)

    def finish(self) -> Observation:
        ended = time.perf_counter()
        with self.lock:
            waited = _covered(self.spans, self.started, ended)  # wall time spent inside model calls
            actual = sum(end - start for start, end in self.spans)
            own_ms = _own_work(self, ended, waited)
            # each call counts its kind's anchor unless clearly slower (steady.CALL); concurrent calls
            # (dspy.Parallel) overlap, so their latencies count in the share their wall time had
            latency_ms = sum(anchors.current(kind, made) for kind, made in self.kinds)
            model_ms = latency_ms * (waited / actual) if actual > 0 else 0.0
            total, cached = self.total, self.cached
            return Observation(
                run_ms=own_ms + model_ms,
                cost_usd=None if self.unpriced else total.cost_usd,
                model_calls=total.calls,
                prompt_tokens=total.prompt_tokens,
                completion_tokens=total.completion_tokens,
                cost_unknown_reason="; ".join(self.unpriced) or None,
                cached_calls=cached.calls,
                cached_prompt_tokens=cached.prompt_tokens,
                cached_completion_tokens=cached.completion_tokens,
                cached_cost_usd=cached.cost_usd or 0.0,
            )


def _own_work(run: _Run, ended: float, waited: float) -> float:
    """The program's own work, ms, steadied: its CPU time outside model calls and its waiting outside them (I/O,
    the GIL), each against its own anchor; only the wall time when the run finished on another thread."""
    collected = max(0.0, clocks.collected - run.collected_started - run.collected_in_calls)  # outside the calls
    wall = max(0.0, (ended - run.started) - waited - run.overhead - collected) * 1000.0
    if threading.get_ident() != run.thread:
        return anchors.steady(("program", run.program), wall, OWN, run.started)
    cpu = min(wall, max(0.0, clocks.cpu() - run.cpu_started - run.cpu_in_calls) * 1000.0)
    return (anchors.steady(("program cpu", run.program), cpu, OWN, run.started)
            + anchors.steady(("program wait", run.program), wall - cpu, WAIT, run.started))


def _kind(model: Any, figures: CallFigures) -> tuple[str, str, int]:
    """A call's anchor: its model and endpoint (_served_by) and its answer's size in doubling steps (not the
    prompt's: a reworded instruction would be measured afresh, noise and all)."""
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


_run: ContextVar[_Run | None] = ContextVar("skynet_measured_run", default=None)  # measure()'s


def _current() -> _Run | None:
    """The run in progress here: measure()'s, or the module run DSPy's context carries (into DSPy's threads too)."""
    import dspy

    return _run.get() or dspy.settings.get(_RUN_KEY)


def measure(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Observation]:
    """(fn(*args, **kwargs), its Observation): the wall time and model calls fn makes here and in DSPy's threads."""
    install()
    run = _Run(_program_key(fn))
    token = _run.set(run)
    try:
        value = fn(*args, **kwargs)
    finally:
        _run.reset(token)
    return value, run.finish()


_Around = Callable[[tuple[Any, ...], dict[str, Any], bool], AbstractContextManager[Callable[[Any], Any]]]


def _around(enter: _Around, original: Callable[..., Any], asynchronous: bool) -> Callable[..., Any]:
    """`original` (sync or async) called inside `enter(args, kwargs, asynchronous)`, which yields done(result):
    measurement's wrappers of module calls and of model calls."""
    if asynchronous:

        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            with enter(args, kwargs, True) as done:
                return done(await original(*args, **kwargs))

        return wrapped_async

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with enter(args, kwargs, False) as done:
            return done(original(*args, **kwargs))

    return wrapped


@contextmanager
def _module_run(args: tuple[Any, ...], kwargs: dict[str, Any], asynchronous: bool) -> Iterator[Callable[[Any], Any]]:
    """Around a module call (`args[0]` the module): yields done(outputs), which files the run the call started (when
    it is the outermost one, not the judge's, and no run is in progress) and returns them."""
    import dspy

    run = None
    if not context.is_judging() and _current() is None and not hooks.inside_a_module():
        run = _Run(_program_key(args[0]))

    def done(outputs: Any) -> Any:
        if run is not None:
            _file(outputs, run.finish())
        return outputs

    with dspy.context(**{_RUN_KEY: run}) if run is not None else nullcontext():
        yield done


def _program_key(program: Any) -> str:
    """What a run's own work is anchored by: the program's class, or the function's qualified name."""
    import dspy

    target = type(program) if isinstance(program, dspy.Module) else program
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{getattr(target, '__module__', None) or ''}.{name}"


def measured_program(program: Any) -> Any:
    """What dspy.Evaluate calls instead of `program`: a dspy.Module as it is (its own call is measured), any other
    callable (a plain function) timed as one program run."""
    import dspy

    if not installed() or isinstance(program, dspy.Module) or not callable(program):
        return program
    timed = _around(_module_run, lambda _program, *args, **kwargs: program(*args, **kwargs), False)
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
            hooks.wrap_module_calls(functools.partial(_around, _module_run))  # times a program's run on one example
            hooks.wrap_dspy_execution(_counted(_count_dspy_result), _timed_pricing)
            hooks.warm_dspy_pricing()
            hooks.wrap_litellm(_counted(_count_litellm_response))
            clocks.start()
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


@dataclass(frozen=True, slots=True)
class _Call:
    """One model call as the wrapper saw it: its arguments, its span, its latency (DSPy's pricing left out)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    asynchronous: bool
    span: tuple[float, float]
    latency_ms: float


def _count_dspy_result(run: _Run, result: Any, call: _Call) -> None:
    """Add one DSPy LM execution, execute(lm, call) -> CallResult; a cache hit as the call it replays."""
    key, folder = hooks.dspy_call_cache(call.args, call.asynchronous)
    lm = call.args[0] if call.args else None
    model = getattr(lm, "model", None)
    found = hooks.call_result_figures(result)
    cost, hit = found["cost"], found["cache_hit"]
    figures = CallFigures(
        calls=found["calls"],
        # a hit cached before anything here saw it made, and not replayed: DSPy kept its cost, not its tokens or time
        prompt_tokens=0 if hit else token_count(found["usage"], PROMPT_TOKENS),
        completion_tokens=0 if hit else token_count(found["usage"], COMPLETION_TOKENS),
        cost_usd=None if cost is None else float(cost),
        unpriced=None if cost is not None else _no_price(model or found["model"], found["unpriced_detail"]),
        latency_ms=call.latency_ms,
    )
    _add(run, call, figures, hit, _served_by(model, getattr(lm, "kwargs", None) or {}), key, folder)


def _served_by(model: Any, settings: Mapping[str, Any]) -> str:
    """What a call's latency is anchored by: its model and where it was sent (the same model name at another
    endpoint has a latency of its own)."""
    endpoint = settings.get("api_base") or settings.get("base_url")
    return f"{model} at {endpoint}" if endpoint else str(model)


def _add(run: _Run, call: _Call, figures: CallFigures, hit: bool, served: str, key: str | None,
         folder: str | None = None) -> None:
    """Add one model call to `run`: a cache hit as the call it replays when that was kept (else as `figures`), a
    call made now kept for the hits that will replay it, marked when its kind's anchor was not fixed yet."""
    found = replay.recall(key, folder) if hit and key is not None else None
    if found is None:
        found = replace(figures, first=True) if anchors.warming(_kind(served, figures)) else figures
        if key is not None and not hit:
            replay.remember(key, found, folder)
    elif found.first:  # measured while its kind warmed up (a first connection): no higher than its anchor now
        found = replace(found, latency_ms=anchors.at_most(_kind(served, found), found.latency_ms))
    run.add(found, call.span, hit, served)


_NOT_THE_REQUEST = frozenset({"api_key", "api_base", "base_url", "metadata", "litellm_logging_obj", "client",
                              "timeout", "num_retries", "extra_headers", "headers"})


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


def _count_litellm_response(run: _Run, response: Any, call: _Call) -> None:
    """Add one LiteLLM response; one answered from LiteLLM's cache as the call it replays."""
    args, kwargs = call.args, call.kwargs
    model = kwargs.get("model") or (args[0] if args and isinstance(args[0], str) else None)
    served = _served_by(model, kwargs)
    if getattr(response, "usage", None) is None:  # a stream, or an unknown shape: its usage is not known here
        unknown = f"the LiteLLM call to {model or 'a model'} reported no usage (streamed?)"
        run.add(CallFigures(1, 0, 0, None, unknown, call.latency_ms), call.span, False, served)
        return
    prompt, completion, cost = response_usage(response)
    unpriced = None if cost is not None else _no_price(getattr(response, "model", None) or model)
    figures = CallFigures(1, prompt, completion, cost, unpriced, call.latency_ms)
    _add(run, call, figures, hooks.litellm_cache_hit(response), served, _litellm_key(args, kwargs))


# Inside a model call being counted: the seconds DSPy's cache and pricing steps took in it (a list, shared with the
# thread asyncio.to_thread prices in, which gets a copy of this context); None outside one. The LiteLLM calls DSPy
# makes underneath a counted call are the same call.
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


@contextmanager
def _counted_call(count: _Count, args: Any, kwargs: Any, asynchronous: bool) -> Iterator[Callable[[Any], Any]]:
    """Around a model call: yields done(result), and the result is counted to the run in progress, once (not the
    calls underneath), checked against the run's caps first, timed by itself (DSPy's pricing left out)."""
    run = None if _pricing.get() is not None or context.is_judging() else _current()
    if run is None:
        yield _as_is
        return
    for cap in run.caps:
        cap.check()  # SpendCapReached once a cap of the run's optimization is reached
    box: list[Any] = []

    def done(result: Any) -> Any:
        box.append(result)
        return result

    spent = [0.0]
    pricing = _pricing.set(spent)
    cpu, started, collected = clocks.cpu(), time.perf_counter(), clocks.collected
    try:
        yield done
    finally:
        _pricing.reset(pricing)
        if not asynchronous and threading.get_ident() == run.thread:
            with run.lock:
                run.cpu_in_calls += clocks.cpu() - cpu
    ended = time.perf_counter()
    # collections stay in: one may run while the answer is still on its way, and a call never measures faster
    # than its provider answered
    latency_ms = max(0.0, (ended - started - spent[0]) * 1000.0)
    count(run, box[0], _Call(args, kwargs, asynchronous, (started, ended), latency_ms))
    with run.lock:
        run.overhead += time.perf_counter() - ended
        run.collected_in_calls += clocks.collected - collected  # one in the bookkeeping is in the overhead already


def _as_is(result: Any) -> Any:
    return result


def _counted(count: _Count) -> hooks.Wrap:
    """A wrapper factory for model calls: each counted by `count` to the run in progress (_counted_call)."""
    return functools.partial(_around, functools.partial(_counted_call, count))
