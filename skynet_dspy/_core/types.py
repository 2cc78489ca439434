"""The plain values every layer passes around: results, failure kinds, measurements, judge usage, metric facts."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Self

from . import secrets


class Failure(StrEnum):
    """How a metric call failed. Members compare equal to their strings ("timeout" == Failure.TIMEOUT)."""

    EXCEPTION = "exception"  # score() raised
    TIMEOUT = "timeout"  # score() ran past its timeout
    INVALID = "invalid"  # the return value broke the contract (docs/contract.md#return-value)
    MISSING_FIELD = "missing_field"  # the prediction lacks an output field the user named
    CRASHED = "crashed"  # the metric's worker process died (exit, signal, crash) or forked
    LOAD = "load"  # no worker process could load the metric any more (a setup problem, not the output's fault)
    MEMORY = "memory"  # the call's worker process passed worker_max_memory and was replaced
    OVERLOADED = "overloaded"  # thread isolation only: too many earlier calls still stuck
    JUDGE_NOT_CONFIGURED = "judge_not_configured"  # llm() had no model to call
    JUDGE_ERROR = "judge_error"  # llm() failed for a setup reason: a refused key, a bad request
    JUDGE_UNREACHABLE = "judge_unreachable"  # llm()'s judge could not be reached or kept failing after its retries
    SPEND_CAP = "spend_cap"  # a spending cap (judge or program) was reached
    RUN_EXCEPTION = "run_exception"  # plain GEPA: run(artifact, input) raised


class Status(StrEnum):
    """The status of one item of the contract check."""

    PASSED = "passed"
    FAILED = "failed"
    WARNING = "warning"
    NOT_RUN = "not run"


class Item(StrEnum):
    """The items of the contract check, in report order; errors name the item they fail."""

    LOADS = "Metric loads"
    SIGNATURE = "Metric signature"
    REWARD_SPEC = "Reward spec"
    RETURN_VALUE = "Metric return value"
    TIMEOUT = "Metric timeout"
    NAMED_SCORES = "Named scores"
    PERFECT_OUTPUT = "Perfect output scores highest"
    STABLE = "Scores are stable"  # only with repeat= (docs/trustworthy.md)
    AGREES = "Agrees with people"  # only with human=


@dataclass(frozen=True, slots=True, repr=False)
class Result:
    """One metric call, validated: what the optimizer may see (score, feedback, scores) and the rest.

    Attributes:
        score: The score (the failure score for a failed call).
        feedback: The feedback text, what an optimizer's reflection model reads.
        scores: The named scores, when the metric gave them (GEPA's objectives).
        extra: Side-information keys other than feedback and scores: kept for the user, never shown to an
            optimizer.
        failure: How the call failed; None on success.
        detail: The full message of a failure, never shown to an optimizer.
        observation: The program's measured run the call was given (None when it was not measured), for
            results tables and receipts; it never reaches an optimizer either.
    """

    score: float
    feedback: str
    scores: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None
    detail: str | None = None
    observation: Observation | None = None
    output: str | None = None  # what score wrote to stdout/stderr during the call: its first few kB (workers only)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def __repr__(self) -> str:
        # redacted: with isolation="thread", `extra` holds the metric's own values, a key among them maybe
        return secrets.redact(
            f"Result(score={self.score!r}, feedback={self.feedback!r}, scores={self.scores!r}, extra={self.extra!r}, "
            f"failure={self.failure!r}, detail={self.detail!r})"
        )

    def copy(self) -> Result:
        """A copy whose dicts are the caller's own: changing them changes no other call's result."""
        if not self.scores and not self.extra:
            return self
        try:
            extra = copy.deepcopy(self.extra)
        except Exception:  # a value that refuses copying is shared, the dict itself is not
            extra = dict(self.extra)
        return replace(self, scores=dict(self.scores) if self.scores is not None else None, extra=extra)


@dataclass(frozen=True, slots=True, repr=False)
class Outcome:
    """What an executor reports of one call of `score` (exactly one of `result` and `failure` set).

    `rule`: the broken contract rule (INVALID), safe for an optimizer; `error_type`: the exception's type name;
    `detail`: the full message, for the user only; `judge_problem`: a setup problem llm() hit during the call.
    """

    result: Result | None = None
    failure: Failure | None = None
    detail: str | None = None
    rule: str | None = None
    error_type: str | None = None
    judge_problem: Failure | None = None
    judge_detail: str | None = None
    output: str | None = None  # what score wrote to stdout/stderr during the call (bounded)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return secrets.redact(f"Outcome({fields})")


class _Counts:
    """`+` and `-` field by field, for frozen dataclasses of figures: a None (unknown) figure stays None."""

    __slots__ = ()

    def _combined(self, other: Self, sign: int) -> Self:
        if type(other) is not type(self):
            raise TypeError(f"a {type(self).__name__} adds up only with another, not with {type(other).__name__}")
        values: dict[str, Any] = {}
        for entry in fields(self):  # type: ignore[arg-type]
            mine, theirs = getattr(self, entry.name), getattr(other, entry.name)
            values[entry.name] = None if mine is None or theirs is None else mine + sign * theirs
        return replace(self, **values)  # type: ignore[type-var]

    def __add__(self, other: Self) -> Self:
        return self._combined(other, 1)

    def __sub__(self, other: Self) -> Self:
        """The figures spent between `other` (taken earlier) and these."""
        return self._combined(other, -1)


@dataclass(frozen=True, slots=True)
class Usage(_Counts):
    """What some model calls used: calls, tokens, USD cost (None when a price is unknown) and seconds.

    One type for the program's runs, the judge and the reflection model (their `.usage`, and a receipt's
    `total`): `a + b` adds two, `after - before` is what was spent between two readings.

    Attributes:
        calls: Model calls (for the judge: HTTP requests sent, retries included).
        prompt_tokens: Prompt tokens of the calls.
        completion_tokens: Completion tokens of the calls.
        cost_usd: USD cost; None when the price of any call is unknown.
        seconds: Time the calls took.
        total_tokens: prompt_tokens + completion_tokens.
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    seconds: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def usage(self) -> Usage:
        """These figures as a plain Usage (a JudgeUsage's without the judge's own counts)."""
        return Usage(self.calls, self.prompt_tokens, self.completion_tokens, self.cost_usd, self.seconds)


@dataclass(frozen=True, slots=True)
class Observation:
    """The program's measured run on the example being scored (read-only); a figure is None when not measured.

    A model call answered from DSPy's or LiteLLM's cache counts as the call it replays (its first tokens, cost and
    latency); the cached_* figures are the part of the totals replayed, not spent now.

    Attributes:
        run_ms: Wall time of the program's run on the example, in milliseconds.
        cost_usd: USD cost of the run's model calls (0.0 when it made none).
        model_calls: Model calls the run made, those answered from a cache included.
        prompt_tokens: Prompt tokens of the run's model calls.
        completion_tokens: Completion tokens of the run's model calls.
        cost_unknown_reason: Why `cost_usd` is None while the run was measured (e.g. a model with no known price).
        unmeasured_reason: Why the run was not measured; None when it was.
        cached_calls: Of model_calls, those answered from DSPy's or LiteLLM's cache.
        cached_prompt_tokens: Of prompt_tokens, those of the calls answered from a cache.
        cached_completion_tokens: Of completion_tokens, those of the calls answered from a cache.
        cached_cost_usd: Of cost_usd, that of the calls answered from a cache.
    """

    run_ms: float | None
    cost_usd: float | None
    model_calls: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_unknown_reason: str | None = None
    unmeasured_reason: str | None = None
    cached_calls: int | None = None
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0
    cached_cost_usd: float = 0.0

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

    @property
    def usage(self) -> Usage:
        """The run's model calls, tokens, cost and time as a Usage (zeros when the run was not measured)."""
        return Usage(self.model_calls or 0, self.prompt_tokens or 0, self.completion_tokens or 0,
                     self.cost_usd if self.measured else None, (self.run_ms or 0.0) / 1000.0)

    @classmethod
    def unmeasured(cls, reason: str | None) -> Observation:
        """An observation of a run that was not measured, saying why."""
        return cls(run_ms=None, cost_usd=None, unmeasured_reason=reason or "the run was not measured")


@dataclass(frozen=True, slots=True)
class ProgramUsage(_Counts):
    """What the program's measured runs that a metric scored used, added up: the program's side of a receipt.

    `a + b` and `after - before` work field by field; `.usage` gives the figures as a Usage.

    Attributes:
        runs: Scored calls given a measured run.
        model_calls: Model calls made now: a call answered from a cache is in cached_calls instead.
        prompt_tokens: Prompt tokens of the calls made now.
        completion_tokens: Completion tokens of the calls made now.
        cost_usd: USD cost of the runs whose cost is known.
        unpriced: Runs whose cost is unknown (a model with no known price): not in cost_usd.
        run_ms: Wall time of the runs added up, in milliseconds.
        unmeasured: Scored calls given an observation saying the run was not measured.
        cached_calls: Model calls answered from DSPy's or LiteLLM's cache (nothing spent now).
    """

    runs: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced: int = 0
    run_ms: float = 0.0
    unmeasured: int = 0
    cached_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def usage(self) -> Usage:
        """The calls made now (not those answered from a cache), their tokens, cost (None when a run's price is
        unknown) and the runs' time, as a Usage."""
        return Usage(self.model_calls, self.prompt_tokens, self.completion_tokens,
                     None if self.unpriced else self.cost_usd, self.run_ms / 1000.0)

    def plus(self, observation: Observation) -> ProgramUsage:
        """These figures with one more run added."""
        if not observation.measured:
            return replace(self, unmeasured=self.unmeasured + 1)
        cached = observation.cached_calls or 0
        return self + ProgramUsage(
            runs=1,
            model_calls=(observation.model_calls or 0) - cached,
            prompt_tokens=(observation.prompt_tokens or 0) - observation.cached_prompt_tokens,
            completion_tokens=(observation.completion_tokens or 0) - observation.cached_completion_tokens,
            cost_usd=max(0.0, (observation.cost_usd or 0.0) - observation.cached_cost_usd),
            unpriced=int(observation.cost_usd is None),
            run_ms=observation.run_ms or 0.0,
            cached_calls=cached,
        )


@dataclass(frozen=True, slots=True)
class JudgeUsage(Usage):
    """What a metric's llm() calls used (docs/judge.md#usage): a Usage with the judge's own counts.

    Attributes:
        calls: HTTP requests sent to the judge model, retries included (what the server saw); also `requests`.
        prompt_tokens: Prompt tokens of the answered requests.
        completion_tokens: Completion tokens of the answered requests.
        cost_usd: USD cost; None when the price of any answered request is unknown.
        seconds: Wall-clock time during which at least one request was in progress (its waits and retries
            included), not a sum over threads.
        retries: Of the requests, the ones that repeated a failed request (a 429, a 5xx, a timeout, an empty answer).
        failed: llm() calls that got no answer: their requests failed after their retries, or were refused.
        cache_hits: llm() calls answered from the judge's cache (nothing sent).
        total_tokens: prompt_tokens + completion_tokens.
    """

    retries: int = 0
    failed: int = 0
    cache_hits: int = 0

    @property
    def requests(self) -> int:
        """HTTP requests sent to the judge model, retries included: `calls` by the judge's own name."""
        return self.calls

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready), `calls` named `requests`, with total_tokens."""
        plain = {("requests" if each.name == "calls" else each.name): getattr(self, each.name) for each in fields(self)}
        return {**plain, "total_tokens": self.total_tokens}


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """What loading a metric found out about it, in plain values (`metric.info`; it crosses from a worker process).

    Attributes:
        name: For messages and result columns: the file's stem, or the function's name.
        label: The source as the user gave it: a path, a module name, a function's qualified name.
        takes_expected: Whether it is score(input, output, expected) rather than score(input, output).
        reward_spec: The metric's REWARD_SPEC, when it defines one.
        uses_measurement: Whether its code refers to reward, observation or service_cost.
        file: The metric's source file, when it has one.
        hint: Advice about the signature (e.g. a DSPy-style score(example, pred, trace)).
        is_async: Whether score is an `async def` (awaited on an event loop of each call's own).
    """

    name: str
    label: str
    takes_expected: bool
    reward_spec: dict[str, Any] | None = None
    uses_measurement: bool = False
    file: str | None = None
    hint: str | None = None
    is_async: bool = False
