"""What one optimization run used, recorded around it: wall time, and the judge's, program's and reflection's usage.

`skynet_dspy.gepa()` records every `compile` of the dspy.GEPA it builds, and `optimize_anything` its run; the
record (a RunRecord, plain figures) goes on the optimizer and the compiled program as `skynet_run`, and is kept
beside the GEPAResult (record_of(), never written into it), where `skynet_dspy.report()` reads it for the cost
receipt. The figures are differences taken across the run, so what the metric did before it (a baseline
evaluation) is not counted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gepa.lm import LM as GepaLM

from .._core import secrets
from .._core.types import JudgeUsage, ProgramUsage, Usage
from .._core.values import COMPLETION_TOKENS, PROMPT_TOKENS, exception_text, token_count, usd
from .._judge.litellm_private import no_banner
from . import hooks
from .ledger import ById

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
    """gepa.lm.LM (LiteLLM with retries, cost and tokens) that also counts its calls, prints no LiteLLM banner on
    them, and keeps the API key out of its repr and its kwargs' repr."""

    def __init__(self, model: str, **kwargs: Any):
        super().__init__(model, **kwargs)
        self.completion_kwargs: dict[str, Any] = secrets.RedactedDict(self.completion_kwargs)
        self._calls_lock = threading.Lock()
        self.calls = 0

    def _counted(self, calls: int, call: Callable[[], Any]) -> Any:
        import litellm

        with self._calls_lock:
            self.calls += calls
        with no_banner(litellm):  # LiteLLM's "Provider List" banner for a model it cannot price
            return call()

    def __call__(self, prompt: Any) -> str:
        return str(self._counted(1, lambda: super(CountingLM, self).__call__(prompt)))

    def batch_complete(self, messages_list: list[list[dict[str, Any]]], max_workers: int = 10, **kwargs: Any) -> Any:
        return self._counted(len(messages_list), lambda: super(CountingLM, self).batch_complete(
            messages_list, max_workers=max_workers, **kwargs))

    def __repr__(self) -> str:
        return secrets.redact(f"<reflection model {self.model!r}>")


# -- reading the reflection model -----------------------------------------------------------------------


def _dspy_lm_of(model: Any) -> Any:
    """The dspy.LM behind a reflection model (itself, or the one _gepa's wrapper calls), or None."""
    import dspy

    return next((lm for lm in (model, getattr(model, "lm", None)) if isinstance(lm, dspy.BaseLM)), None)


def _history_reader(lm: Any) -> Callable[[], ReflectionUsage]:
    """What a dspy.LM's history gains from now on, read when called."""
    before = getattr(lm, "history", None)
    last = before[-1] if isinstance(before, list) and before else None

    def usage() -> ReflectionUsage:
        if not isinstance(before, list):
            return ReflectionUsage(None, 0, None, None, None, "the reflection model keeps no history to read")
        history = list(getattr(lm, "history", None) or [])
        found = next((i for i in range(len(history) - 1, -1, -1) if history[i] is last), None)
        notes = [] if last is None or found is not None else [
            "its history was trimmed during the run (dspy.settings.max_history_size): figures are a floor"]
        new = [hooks.history_entry_figures(entry) for entry in history[0 if found is None else found + 1:]]
        made = [figures for figures in new if not figures["cache_hit"]]
        costs = [figures["cost"] for figures in made]
        cost = None if None in costs else sum((float(cost) for cost in costs), 0.0)
        if cost is None:
            notes.append("a call's price is unknown (LiteLLM has no price for the model)")
        return ReflectionUsage(
            len(made), len(new) - len(made), sum(token_count(f["usage"], PROMPT_TOKENS) for f in made),
            sum(token_count(f["usage"], COMPLETION_TOKENS) for f in made), cost, "; ".join(notes) or None)

    return usage


def _counters_reader(lm: Any) -> Callable[[], ReflectionUsage]:
    """What a gepa.lm.LM's running totals (cost, tokens; calls when a CountingLM) gain from now on."""

    def now() -> tuple[Any, float, int, int]:
        return getattr(lm, "calls", None), lm.total_cost, lm.total_tokens_in, lm.total_tokens_out

    start = now()

    def usage() -> ReflectionUsage:
        (calls, cost, prompt, completion), (calls0, cost0, prompt0, completion0) = now(), start
        counted = calls - calls0 if isinstance(calls, int) and isinstance(calls0, int) else None
        notes = [] if counted is not None else ["gepa's LM does not count calls"]
        spent: float | None = cost - cost0
        used = (counted or 0) > 0 or (prompt - prompt0) + (completion - completion0) > 0
        # gepa's LM books a call LiteLLM cannot price as $0: unknown, unless LiteLLM prices the model at $0
        if used and spent == 0 and not _priced_at_zero(lm):
            spent = None
            notes.append(f"no price known for model {lm.model} (gepa's LM books its calls as $0; register "
                         "the price with litellm.register_model(...) to count them)")
        return ReflectionUsage(counted, 0, prompt - prompt0, completion - completion0, spent, "; ".join(notes) or None)

    return usage


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


def _reader(model: Any) -> Callable[[], ReflectionUsage]:
    lm = _dspy_lm_of(model)
    if lm is not None:
        return _history_reader(lm)
    if isinstance(model, GepaLM):
        return _counters_reader(model)
    return lambda: ReflectionUsage(None, 0, None, None, None,
                                   "a reflection model given as a function: its calls are not seen by skynet-dspy")


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
        reflection = self._reflection()
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


_records: ById[RunRecord] = ById()


def attach(target: Any, record: RunRecord | None) -> Any:
    """Keep `record` as the record of `target` (a compiled program, a GEPAResult) for record_of(); returns target.

    A DSPy program also gets it as its `skynet_run` attribute (an ordinary attribute; a GEPAResult is frozen
    and left untouched).
    """
    if target is None or record is None:
        return target
    with contextlib.suppress(TypeError):  # an object that takes no weak reference: the attribute alone
        _records.put(target, record)
    with contextlib.suppress(AttributeError, TypeError):  # a frozen dataclass raises FrozenInstanceError
        setattr(target, ATTRIBUTE, record)
    return target


def record_of(target: Any) -> RunRecord | None:
    """The record attach() kept of `target` (or its `skynet_run` attribute), or None."""
    found = _records.get(target)
    if found is not None:
        return found
    value = getattr(target, ATTRIBUTE, None)
    return value if isinstance(value, RunRecord) else None


def program_models(student: Any) -> list[Any]:
    """The models a DSPy program runs on: DSPy's configured LM and any LM set on one of its predictors."""
    import dspy

    models = [dspy.settings.lm]
    with contextlib.suppress(Exception):  # not a dspy.Module: nothing more to find
        models += [getattr(predictor, "lm", None) for _, predictor in student.named_predictors()]
    return [model for model in models if model is not None]
