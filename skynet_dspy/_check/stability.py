"""Score stability (repeat=): each case's own output scored `repeat` times, the judge's cache bypassed within its
limits and spending cap, the cost estimated from the first pass and logged first (docs/trustworthy.md#stability).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .._core import context, secrets
from .._core.logs import logger
from .._core.types import Failure, Item, JudgeUsage, Result, Status
from .._core.values import finite_number, usd, whole_number
from .items import STOPPING
from .report import CheckItem, ContractReport

if TYPE_CHECKING:
    from .._dspy.metric import Metric

DEFAULT_MAX_SPREAD = 0.1  # a case whose score (or a named score) varies by more than this over its repeats warns
# A repeat failing so stops the repeats: the metric hung, or its judge cannot answer (a cap, an error, no model).
_STOPPING = STOPPING | {Failure.SPEND_CAP, Failure.JUDGE_ERROR, Failure.JUDGE_NOT_CONFIGURED, Failure.LOAD}


@dataclass(frozen=True)
class Spread:
    """One score's values over a case's runs, their min, max and spread (`Spread.of(values)`)."""

    values: tuple[float, ...]
    min: float
    max: float
    spread: float

    @classmethod
    def of(cls, values: tuple[float, ...]) -> Spread:
        return cls(values, min(values), max(values), max(values) - min(values))

    def text(self) -> str:
        return f"{self.min:.3g}" if self.min == self.max else f"{self.min:.3g} to {self.max:.3g}"


@dataclass(frozen=True)
class CaseStability:
    """A case's runs: the score's and each named score's spread, whether the verdict changed, the failed runs."""

    case: int  # 1-based, as the report's calls name cases
    score: Spread
    scores: dict[str, Spread]
    verdict_changed: bool  # a success (score above 0, or at/above success_threshold) on some runs, not on others
    failures: tuple[str, ...]  # the failure kinds of the runs that failed
    runs: int
    feedback: tuple[str, ...] = ()  # each run's feedback, in order: where the reasons differ, the judge has room

    @property
    def spread(self) -> float:
        """The largest spread of the score and the named scores."""
        return max([self.score.spread, *(named.spread for named in self.scores.values())])

    def describe(self) -> str:
        """'case 2: score 0 to 1, verdict changed, accuracy 0.5 to 1, 1 run failed (exception)'."""
        parts = [f"score {self.score.text()}", *(["verdict changed"] if self.verdict_changed else [])]
        parts += [f"{name} {named.text()}" for name, named in self.scores.items() if named.spread > 0]
        if self.failures:
            parts.append(f"{len(self.failures)} run(s) failed ({', '.join(dict.fromkeys(self.failures))})")
        return f"case {self.case}: {', '.join(parts)}"


@dataclass
class Stability:
    """What the repeats found: per case its spreads; the estimate logged before, what the repeats sent to the
    judge, and why they stopped early (None when every run was made)."""

    runs: int
    max_spread: float
    cases: list[CaseStability] = field(default_factory=list)
    estimate: str = ""
    judge_requests: int = 0
    judge_cost_usd: float | None = 0.0
    stopped: str | None = None

    @property
    def unstable(self) -> list[CaseStability]:
        """The cases whose spread passes max_spread, or whose verdict changed, or with a failed run."""
        return [case for case in self.cases if case.spread > self.max_spread or case.verdict_changed or case.failures]

    @property
    def changed_share(self) -> float | None:
        """The share of cases whose verdict changed between runs (None with no case run)."""
        return sum(case.verdict_changed for case in self.cases) / len(self.cases) if self.cases else None

    def columns(self, case: int) -> dict[str, Any]:
        """A case's figures as results_frame() columns."""
        for found in self.cases:
            if found.case == case:
                return {"runs": found.runs, "score_min": found.score.min, "score_max": found.score.max,
                        "spread": found.spread, "verdict_changed": found.verdict_changed}
        return {"runs": None}

    def lines(self) -> list[str]:
        """The report's section on stability, as text lines."""
        lines = [f"Stability ({self.runs} runs per case, max_spread {self.max_spread:g}):"]
        lines += [f"  {case.describe()}" for case in self.cases]
        if self.changed_share is not None:
            cost = f" ({usd(self.judge_cost_usd)})" if self.judge_cost_usd else ""
            lines.append(f"  verdict changed on {self.changed_share:.0%} of cases; the repeats sent "
                         f"{self.judge_requests} judge request(s){cost}")
        return lines + ([f"  repeats stopped early: {self.stopped}"] if self.stopped else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "verdict_changed_share": self.changed_share,
            "unstable_cases": [case.case for case in self.unstable],
            "stopped": None if self.stopped is None else secrets.redact(self.stopped),
        }


def check_repeat(repeat: Any, max_spread: Any) -> tuple[int, float]:
    """repeat= and max_spread=, checked (a ValueError naming the option)."""
    runs = whole_number("repeat", repeat, minimum=1, unit="runs per case")
    spread = finite_number("max_spread", max_spread, default=DEFAULT_MAX_SPREAD)
    if spread < 0:
        raise ValueError(f"max_spread must be 0 or more (a score's largest allowed spread), got {max_spread!r}")
    return runs, spread


def announce(metric: Metric, report: ContractReport, runs: int, max_spread: float, before: JudgeUsage) -> Stability:
    """The Stability the repeats will fill, having logged their cost estimated from the first pass (the judge's
    usage since `before`)."""
    more = (runs - 1) * sum(run.own is not None for run in report.cases)
    stability = Stability(runs, max_spread, estimate=_estimate(metric.judge_usage - before, len(report.calls), more))
    logger.warning("skynet-dspy check: %s", stability.estimate)
    return stability


def repeat_cases(
    metric: Metric, report: ContractReport, stability: Stability, progress: Callable[[int, int], None] | None = None
) -> None:
    """Score each case's own output until it has `stability.runs` runs, asking the judge again each time."""
    own = [(number, run, run.own) for number, run in enumerate(report.cases, 1) if run.own is not None]
    start = metric.judge_usage
    done, planned = len(report.calls), len(report.calls) + (stability.runs - 1) * len(own)
    handler = metric.scorer.llm

    def asking_again(instructions: str, input: str | None, settings: dict[str, Any]) -> str:
        with context.fresh_answers():
            return handler(instructions, input, settings)

    metric.scorer.llm = asking_again
    try:
        for number, run, first in own:
            results = [first]
            while len(results) < stability.runs and not stability.stopped:
                result = metric.score(run.input, run.output, run.expected)
                done += 1
                if progress is not None:
                    progress(done, planned)
                if result.failure in _STOPPING:
                    stability.stopped = f"case {number}: {result.detail or result.feedback}"
                else:
                    results.append(result)
            stability.cases.append(_case(number, results, metric.success_threshold))
            if stability.stopped:
                break
    finally:
        metric.scorer.llm = handler
        spent = metric.judge_usage - start
        stability.judge_requests, stability.judge_cost_usd = spent.requests, spent.cost_usd


def stability_item(stability: Stability | None, broken: list[str]) -> CheckItem:
    """'Scores are stable': warns naming the cases whose runs differ by more than max_spread."""
    name = Item.STABLE
    if stability is None and broken:
        return CheckItem(name, Status.NOT_RUN, f"not run: the contract is broken ({', '.join(broken)}); fix it "
                                               "first, since repeating a broken call only repeats its failure")
    if stability is None:
        return CheckItem(name, Status.NOT_RUN, "not run: no case was scored")
    if not stability.cases:
        why = f": {stability.stopped}" if stability.stopped else ""
        return CheckItem(name, Status.NOT_RUN, f"not run: no case could be repeated{why}")
    runs = f"over {stability.runs} runs per case"
    stopped = f"; the repeats stopped early ({stability.stopped})" if stability.stopped else ""
    unstable = stability.unstable
    if unstable:
        return CheckItem(
            name, Status.WARNING,
            f"{len(unstable)} of {len(stability.cases)} case(s) score differently {runs} (more than max_spread "
            f"{stability.max_spread:g} apart, a verdict changed, or a run failed): "
            f"{'; '.join(case.describe() for case in unstable)}. The verdict changed on "
            f"{stability.changed_share or 0.0:.0%} of cases. An optimizer would chase this noise: make the judge's "
            "answer deterministic (temperature 0, a stricter prompt, a fixed answer format) or score from several "
            f"answers (docs/trustworthy.md){stopped}",
        )
    largest = max(case.spread for case in stability.cases)
    return CheckItem(
        name, Status.WARNING if stability.stopped else Status.PASSED,
        f"every case scored within {stability.max_spread:g} {runs} (largest spread {largest:.3g}); no verdict "
        f"changed{stopped}",
    )


def _case(number: int, results: list[Result], threshold: float | None) -> CaseStability:
    names = dict.fromkeys(name for result in results for name in (result.scores or {}))
    # a call's verdict as DSPy reads a Score: a success above 0, or at or above success_threshold when set
    verdicts = {result.score > 0 if threshold is None else result.score >= threshold for result in results}
    return CaseStability(
        number,
        Spread.of(tuple(result.score for result in results)),
        {name: Spread.of(tuple(result.scores[name] for result in results if result.scores and name in result.scores))
         for name in names},
        len(verdicts) > 1,
        tuple(str(result.failure) for result in results if result.failure is not None),
        len(results),
        tuple(secrets.redact(result.feedback) for result in results),  # again: a key may be set since
    )


def _estimate(first_pass: JudgeUsage, calls: int, more_calls: int) -> str:
    """What the repeats will cost, from what the first pass used: judge requests per call, dollars per request."""
    head = f"repeating each case's call: {more_calls} more call(s) of score"
    asked = first_pass.requests - first_pass.retries + first_pass.cache_hits  # each asks the judge again
    if not asked or not calls:
        return f"{head}; the first pass made no llm() request, so the repeats should cost no judge request"
    requests = math.ceil(asked / calls * more_calls)
    if first_pass.requests and first_pass.cost_usd is not None:
        price = f", about {usd(first_pass.cost_usd / first_pass.requests * requests)}"
    else:
        price = " (their price is unknown: the first pass's answers came from the cache or had no price)"
    return (f"{head}, about {requests} judge request(s){price}, estimated from the first pass; a judge spending cap "
            "(max_judge_cost_usd) still holds and stops the repeats")
