"""What one optimization run used, recorded around it: wall time, and the judge's, program's and reflection's usage.

`skynet_dspy.gepa()` records every `compile` of the dspy.GEPA it builds, and `optimize_anything` its run; the
record (a RunRecord, plain figures) goes on the optimizer and the compiled program as `skynet_run`, and is kept
beside the GEPAResult (record_of(), never written into it), where `skynet_dspy.report()` reads it for the cost
receipt. The figures are differences taken across the run, so what the metric did before it (a baseline
evaluation) is not counted.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from gepa.lm import LM as GepaLM

from .._core.types import JudgeUsage, ProgramUsage, Usage
from .._core.values import COMPLETION_TOKENS, PROMPT_TOKENS, exception_text, token_count, usd
from . import hooks

ATTRIBUTE = "skynet_run"


@dataclass(frozen=True)
class ReflectionUsage:
    """The reflection model's calls during the run. A figure is None when it could not be told; `note` says why."""

    calls: int | None = 0
    cache_hits: int = 0
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    cost_usd: float | None = 0.0
    note: str | None = None

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    @property
    def usage(self) -> Usage | None:
        """The calls made now (cache hits left out) as a Usage, or None when they could not be counted."""
        if self.calls is None or self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return Usage(self.calls, self.prompt_tokens, self.completion_tokens, self.cost_usd)


@dataclass(frozen=True)
class RunRecord:
    """What one optimization run used, as differences across the run (plain figures only).

    `judge` is the metric's llm() usage, `program` the measured runs it scored (None when the metric does
    not measure runs), `reflection` the reflection model's calls; `metric_calls` the metric's score calls
    (`memo_hits` answered from memory) and `failures` the failed calls by kind. `error` names the exception
    that ended the run, when one did.
    """

    metric: str
    started_at: float  # time.time() at the start
    seconds: float
    judge: JudgeUsage
    program: ProgramUsage | None
    reflection: ReflectionUsage
    metric_calls: int = 0
    memo_hits: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    error: str | None = None


class CountingLM(GepaLM):  # type: ignore[misc, unused-ignore]  # gepa ships no type hints
    """gepa.lm.LM that also counts its calls (gepa's LM keeps cost and tokens, not how many calls)."""

    def __init__(self, model: str, **kwargs: Any):
        super().__init__(model, **kwargs)
        self._calls_lock = threading.Lock()
        self.calls = 0

    def _count(self, calls: int) -> None:
        with self._calls_lock:
            self.calls += calls

    def __call__(self, prompt: Any) -> str:
        self._count(1)
        return str(super().__call__(prompt))

    def batch_complete(self, messages_list: list[list[dict[str, Any]]], max_workers: int = 10, **kwargs: Any) -> Any:
        self._count(len(messages_list))
        return super().batch_complete(messages_list, max_workers=max_workers, **kwargs)


# -- reading the reflection model -----------------------------------------------------------------------


def _dspy_lm_of(model: Any) -> Any:
    """The dspy.LM behind a reflection model (itself, or the one _gepa's wrapper calls), or None."""
    import dspy

    for candidate in (model, getattr(model, "lm", None)):
        if isinstance(candidate, dspy.BaseLM):
            return candidate
    return None


class _History:
    """Reads the entries a dspy.LM's history gained during the run."""

    def __init__(self, lm: Any):
        self.lm = lm
        history = getattr(lm, "history", None)
        self.readable = isinstance(history, list)
        self.last = history[-1] if self.readable and history else None

    def usage(self) -> ReflectionUsage:
        history = list(getattr(self.lm, "history", None) or [])
        if not self.readable:
            return ReflectionUsage(None, 0, None, None, None, "the reflection model keeps no history to read")
        notes = []
        start = 0
        if self.last is not None:
            found = next((i for i in range(len(history) - 1, -1, -1) if history[i] is self.last), None)
            if found is None:
                notes.append("its history was trimmed during the run (dspy.settings.max_history_size): "
                             "figures are a floor")
            else:
                start = found + 1
        calls = hits = prompt = completion = 0
        cost: float | None = 0.0
        for entry in history[start:]:
            figures = hooks.history_entry_figures(entry)
            if figures["cache_hit"]:
                hits += 1
                continue
            calls += 1
            usage = figures["usage"]
            prompt += token_count(usage, PROMPT_TOKENS)
            completion += token_count(usage, COMPLETION_TOKENS)
            if figures["cost"] is None:
                cost = None
            elif cost is not None:
                cost += float(figures["cost"])
        if calls and cost is None:
            notes.append("a call's price is unknown (LiteLLM has no price for the model)")
        return ReflectionUsage(calls, hits, prompt, completion, cost, "; ".join(notes) or None)


class _GepaCounters:
    """Reads a gepa.lm.LM's running totals (cost, tokens; calls when it is a CountingLM)."""

    def __init__(self, lm: Any):
        self.lm = lm
        self.start = self._now()

    def _now(self) -> tuple[Any, float, int, int]:
        lm = self.lm
        return getattr(lm, "calls", None), lm.total_cost, lm.total_tokens_in, lm.total_tokens_out

    def usage(self) -> ReflectionUsage:
        calls, cost, prompt, completion = self._now()
        start_calls, start_cost, start_prompt, start_completion = self.start
        counted = calls - start_calls if isinstance(calls, int) and isinstance(start_calls, int) else None
        notes = [] if counted is not None else ["gepa's LM does not count calls"]
        spent: float | None = cost - start_cost
        used = (counted or 0) > 0 or (prompt - start_prompt) + (completion - start_completion) > 0
        # gepa's LM books a call LiteLLM cannot price as $0: nothing booked for calls made means unknown,
        # unless LiteLLM prices this model at $0 (a free model's $0 is its cost)
        if used and spent == 0 and not _priced_at_zero(self.lm):
            spent = None
            notes.append(f"no price known for model {self.lm.model} (gepa's LM books its calls as $0; register "
                         "the price with litellm.register_model(...) to count them)")
        return ReflectionUsage(counted, 0, prompt - start_prompt, completion - start_completion, spent,
                               "; ".join(notes) or None)


def _priced_at_zero(lm: Any) -> bool:
    """Whether LiteLLM prices `lm`'s tokens at $0 (settings given to the LM first, then LiteLLM's price list)."""
    settings = getattr(lm, "completion_kwargs", None) or {}
    rates = [settings.get("input_cost_per_token"), settings.get("output_cost_per_token")]
    if all(rate is None for rate in rates):
        try:
            import litellm

            info = litellm.get_model_info(model=lm.model)
        except Exception:  # no price entry for the model
            return False
        rates = [info.get("input_cost_per_token"), info.get("output_cost_per_token")]
    return all(isinstance(rate, (int, float)) and rate == 0 for rate in rates)


class _Unknown:
    def usage(self) -> ReflectionUsage:
        return ReflectionUsage(None, 0, None, None, None,
                               "a reflection model given as a function: its calls are not seen by skynet-dspy")


def _reader(model: Any) -> Any:
    lm = _dspy_lm_of(model)
    if lm is not None:
        return _History(lm)
    if isinstance(model, GepaLM):
        return _GepaCounters(model)
    return _Unknown()


# -- the record ------------------------------------------------------------------------------------------


def _without_program(reflection: ReflectionUsage, program: ProgramUsage | None) -> ReflectionUsage:
    """The reflection model's figures when it is also the program's model: the program's runs taken out."""
    if reflection.calls is None:
        return reflection
    if program is None:
        spent = usd(reflection.cost_usd) if reflection.cost_usd is not None else "an unknown cost"
        return ReflectionUsage(
            None, reflection.cache_hits, None, None, None,
            f"the reflection model is also the program's model and the program's runs were not measured, so their "
            f"calls cannot be told apart: {reflection.calls} calls and {spent} together "
            "(load_metric(..., measure=True) measures the program)",
        )
    cost = None
    if reflection.cost_usd is not None and not program.unpriced:
        cost = max(0.0, reflection.cost_usd - program.cost_usd)
    return ReflectionUsage(
        max(0, reflection.calls - program.model_calls), reflection.cache_hits,
        max(0, (reflection.prompt_tokens or 0) - program.prompt_tokens),
        max(0, (reflection.completion_tokens or 0) - program.completion_tokens),
        cost, "the reflection model is also the program's model: the program's measured calls are taken out",
    )


class Recorder:
    """Takes the figures at the start and the end of a run (a `with` block); `.record` holds the difference."""

    def __init__(self, metric: Any, reflection_model: Any, program_models: list[Any] | tuple[Any, ...] = ()):
        self.metric = metric
        self.reflection_model = reflection_model
        lm = _dspy_lm_of(reflection_model)
        self.shared = lm is not None and any(model is lm for model in program_models)
        self.record: RunRecord | None = None

    def __enter__(self) -> Recorder:
        self._started_at = time.time()
        self._started = time.perf_counter()
        self._judge = self.metric.judge_usage
        self._program = self.metric.program_usage
        self._stats = dict(self.metric.stats)
        self._reflection = _reader(self.reflection_model)
        self._run = self.metric.scorer.run()  # says at its end how many calls could not reach the judge
        self._run.__enter__()
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self._run.__exit__(kind, error, traceback)
        seconds = time.perf_counter() - self._started
        stats = self.metric.stats
        program = self.metric.program_usage - self._program if self.metric.measuring else None
        reflection = self._reflection.usage()
        if self.shared:
            reflection = _without_program(reflection, program)
        spent = {name: stats.get(name, 0) - self._stats.get(name, 0) for name in stats}
        self.record = RunRecord(
            metric=self.metric.name,
            started_at=self._started_at,
            seconds=seconds,
            judge=self.metric.judge_usage - self._judge,
            program=program,
            reflection=reflection,
            metric_calls=spent.pop("calls", 0),
            memo_hits=spent.pop("memo_hits", 0),
            failures={name: count for name, count in spent.items() if count},
            error=exception_text(error) if error is not None else None,
        )


class _Records:
    """Run records by the object they describe, matched by identity and held weakly: an entry lives as long as
    its object, and nothing is written into an object of another library (GEPA's frozen GEPAResult)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, tuple[weakref.ref[Any], RunRecord]] = {}

    def put(self, target: Any, record: RunRecord) -> None:
        key = id(target)

        def forget(ref: weakref.ref[Any]) -> None:
            with self._lock:
                entry = self._by_id.get(key)
                if entry is not None and entry[0] is ref:
                    del self._by_id[key]

        ref = weakref.ref(target, forget)
        with self._lock:
            self._by_id[key] = (ref, record)

    def get(self, target: Any) -> RunRecord | None:
        with self._lock:
            entry = self._by_id.get(id(target))
        return entry[1] if entry is not None and entry[0]() is target else None


_records = _Records()


def attach(target: Any, record: RunRecord | None) -> Any:
    """Keep `record` as the record of `target` (a compiled program, a GEPAResult) for record_of(); returns target.

    A DSPy program also gets it as its `skynet_run` attribute (an ordinary attribute; a GEPAResult is frozen
    and left untouched).
    """
    if target is None or record is None:
        return target
    try:
        _records.put(target, record)
    except TypeError:  # an object that takes no weak reference: the attribute alone, where it can be set
        pass
    if not _is_frozen(target):
        try:
            setattr(target, ATTRIBUTE, record)
        except (AttributeError, TypeError):
            pass
    return target


def record_of(target: Any) -> RunRecord | None:
    """The record attach() kept of `target` (or its `skynet_run` attribute), or None."""
    found = _records.get(target)
    if found is not None:
        return found
    value = getattr(target, ATTRIBUTE, None)
    return value if isinstance(value, RunRecord) else None


def _is_frozen(target: Any) -> bool:
    params = getattr(type(target), "__dataclass_params__", None)
    return bool(getattr(params, "frozen", False))


def program_models(student: Any) -> list[Any]:
    """The models a DSPy program runs on: DSPy's configured LM and any LM set on one of its predictors."""
    import dspy

    models = [dspy.settings.lm]
    try:
        models += [getattr(predictor, "lm", None) for _, predictor in student.named_predictors()]
    except Exception:  # not a dspy.Module: nothing more to find
        pass
    return [model for model in models if model is not None]


def record_compiles(optimizer: Any, metric: Any) -> None:
    """Make each `optimizer.compile(...)` record what it used, on the optimizer and the program it returns."""
    cls = type(optimizer)

    def compile(student: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = Recorder(metric, getattr(optimizer, "reflection_lm", None), program_models(student))
        try:
            with recorder:
                program = cls.compile(optimizer, student, *args, **kwargs)  # the class's, as patched now (MLflow)
        finally:
            setattr(optimizer, ATTRIBUTE, recorder.record)
            optimizer.skynet_program = None
        optimizer.skynet_program = program
        return attach(program, recorder.record)

    compile.__doc__ = cls.compile.__doc__
    optimizer.compile = compile
    setattr(optimizer, ATTRIBUTE, None)
    optimizer.skynet_program = None
