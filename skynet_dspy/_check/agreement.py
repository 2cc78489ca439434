"""Agreement with people (human=): Spearman, Cohen's kappa and mean |difference| per score, and the cases that
differ most (docs/trustworthy.md). Hand-written: no scipy, and 3.11's statistics.correlation has no ranked method.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._core import secrets
from .._core.errors import DataError
from .._core.types import Item, Status
from .._core.values import as_number, clip, finite_number, shorten
from .cases import Case, read_json_lines
from .report import CaseRun, CheckItem

DEFAULT_MIN_AGREEMENT = 0.6  # kappa (or Spearman's rho without kappa) below this warns
MIN_CASES = 5  # fewer labelled cases compared than this: the figures are too rough to trust, and the item says so
KAPPA_LEVELS = 5  # Cohen's kappa when metric and person together use at most this many distinct values
SHOWN_DISAGREEMENTS = 5  # cases listed where metric and person differ most
_FEEDBACK_SHOWN = 300  # characters of the metric's feedback beside a disagreement

# human=: a JSONL file, or one label per case in order: a score, None, or {"score": ..., "scores": {...}}
HumanScores = str | Path | Sequence[float | dict[str, Any] | None]


@dataclass(frozen=True)
class HumanLabel:
    """A person's verdict on one case: a score, and named scores (either may be absent)."""

    score: float | None
    scores: dict[str, float] = field(default_factory=dict)
    input: dict[str, Any] | None = None  # when given, it must be the case's input (labels kept in order)


@dataclass(frozen=True)
class Figures:
    """Agreement on one score ("score" or a named score) over the cases where both sides gave it."""

    name: str
    cases: int
    spearman: float | None  # None: undefined (a side gave every case the same value, or fewer than 2 cases)
    kappa: float | None  # None: too many levels, or undefined
    mean_abs_diff: float

    @property
    def agreement(self) -> float | None:
        """The figure the item judges: kappa when there is one, else Spearman's rho."""
        return self.kappa if self.kappa is not None else self.spearman

    def describe(self) -> str:
        kappa = f", kappa {_figure(self.kappa)}" if self.kappa is not None else ""
        return (f"{self.name}: Spearman {_figure(self.spearman)}{kappa}, mean |difference| "
                f"{self.mean_abs_diff:.3g} ({self.cases} cases)")


@dataclass(frozen=True)
class Disagreement:
    """A case where metric and person differ: both scores, and what the metric said."""

    case: int  # 1-based
    name: str
    metric: float
    person: float
    feedback: str

    @property
    def difference(self) -> float:
        return abs(self.metric - self.person)


@dataclass
class Agreement:
    """The agreement figures per score, and the cases where metric and person differ most."""

    min_agreement: float
    figures: list[Figures] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    labels: list[HumanLabel | None] = field(default_factory=list)  # the person's, one per case checked
    labelled: int = 0  # cases checked that carry a person's score
    skipped: int = 0  # of those, cases whose call failed: not compared

    @property
    def low(self) -> list[Figures]:
        """The scores whose agreement is below min_agreement, or cannot be measured."""
        return [f for f in self.figures if f.agreement is None or f.agreement < self.min_agreement]

    def columns(self, case: int) -> dict[str, Any]:
        """A case's person's scores as results_frame() columns."""
        label = self.labels[case - 1] if case <= len(self.labels) else None
        if label is None:
            return {"human_score": None}
        return {"human_score": label.score, **{f"human.{name}": value for name, value in label.scores.items()}}

    def lines(self) -> list[str]:
        """The report's section on agreement, as text lines."""
        lines = [f"Agreement with people ({self.labelled} labelled case(s), min_agreement {self.min_agreement:g}):"]
        lines += [f"  {figures.describe()}" for figures in self.figures]
        if self.skipped:
            lines.append(f"  {self.skipped} labelled case(s) not compared: the metric's call failed")
        if self.disagreements:
            lines.append("  where they differ most:")
            lines += [f"    case {d.case}, {d.name}: metric {d.metric:.3g}, person {d.person:.3g}; feedback: "
                      f"{' '.join(clip(d.feedback, _FEEDBACK_SHOWN).split())}" for d in self.disagreements]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_agreement": self.min_agreement,
            "labelled_cases": self.labelled,
            "skipped_cases": self.skipped,
            "figures": [asdict(figures) for figures in self.figures],
            "disagreements": [{**asdict(d), "feedback": secrets.redact(d.feedback)} for d in self.disagreements],
        }


def human_labels(human: Any) -> list[HumanLabel | None]:
    """human=: a JSONL file's path, or a list with one label per case, in the cases' order; a DataError otherwise.

    A label is a number (the person's score), None (no label for that case), or a dict {"score": ..., "scores":
    {...}, "input": {...}} (each key optional; "input", when given, must be the case's input).
    """
    if isinstance(human, (str, Path)):
        path = Path(human)
        rows = read_json_lines(path, "human labels file", '{"score": 1, "scores": {"accuracy": 1}}')
        if not rows:
            raise DataError(f"the human labels file {path} holds no labels; write one per line, one line per case")
        return [_label(row, f"{path}, line {line}") for line, row in rows]
    if isinstance(human, (bytes, dict)) or not isinstance(human, Iterable):
        raise TypeError(
            "human= takes a JSONL file's path or a list with one person's score per case, in the cases' order "
            f"(a number, None, or {{'score': ..., 'scores': {{...}}}}); got {type(human).__name__}"
        )
    return [_label(item, f"human label {number}") for number, item in enumerate(human, 1)]


def check_labels(labels: list[HumanLabel | None], examples: Any, cases: list[Case]) -> None:
    """The labels match the cases: one per case (when the cases can be counted), each "input" the case's own."""
    count = len(examples) if isinstance(examples, Sequence) else None
    if (count is not None and len(labels) != count) or len(labels) < len(cases):
        given = f"{count} cases" if count is not None else f"at least {len(cases)} cases"
        raise DataError(
            f"human= holds {len(labels)} label(s) for {given}: give one per case, in the cases' order (null, or "
            "None, for a case nobody labelled)"
        )
    for number, (label, case) in enumerate(zip(labels, cases, strict=False), 1):
        if label is not None and label.input is not None and label.input != case.input:
            raise DataError(
                f"human label {number} is for another case: its input {shorten(label.input)} is not case "
                f"{number}'s {shorten(case.input)}; keep the labels in the order of the cases"
            )


def _label(item: Any, where: str) -> HumanLabel | None:
    if item is None or not isinstance(item, dict):
        return None if item is None else HumanLabel(_number(item, where, "score"))
    unknown = [str(key) for key in item if key not in ("score", "scores", "input")]
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; a label holds 'score', 'scores' "
                        "(named scores) and, to check it matches its case, 'input'")
    score, named, given = item.get("score"), item.get("scores") or {}, item.get("input")
    if not isinstance(named, dict):
        raise DataError(f"{where}: 'scores' must be a dict of named scores, got {shorten(named)}")
    if given is not None and not isinstance(given, dict):
        raise DataError(f"{where}: 'input' must be the case's input dict, got {shorten(given)}")
    if score is None and not named:
        raise DataError(f"{where}: the label gives no 'score' and no 'scores' (use null for a case without a label)")
    return HumanLabel(
        None if score is None else _number(score, where, "score"),
        {str(name): _number(value, where, f"named score {name!r}") for name, value in named.items()},
        given,
    )


def _number(value: Any, where: str, what: str) -> float:
    number = None if isinstance(value, bool) else as_number(value)
    if number is None or not math.isfinite(number):
        raise DataError(f"{where}: the person's {what} must be a finite number, got {shorten(value)}")
    return number


def check_min_agreement(value: Any) -> float:
    number = finite_number("min_agreement", value, default=DEFAULT_MIN_AGREEMENT)
    if not -1 <= number <= 1:
        raise ValueError(f"min_agreement must be from -1 to 1 (a kappa or a correlation), got {value!r}")
    return number


def agreement(runs: list[CaseRun], labels: list[HumanLabel | None], min_agreement: float) -> Agreement:
    """The metric's score on each case's own output (its first run) beside the person's, per score name, over the
    labelled cases whose call succeeded."""
    found = Agreement(min_agreement, labels=labels[: len(runs)])
    pairs: dict[str, list[Disagreement]] = {}
    for number, (run, label) in enumerate(zip(runs, labels, strict=False), 1):
        if label is None:
            continue
        found.labelled += 1
        result = run.own
        if result is None or not result.ok:
            found.skipped += 1
            continue
        given = {"score": (result.score, label.score),
                 **{name: ((result.scores or {}).get(name), value) for name, value in label.scores.items()}}
        for name, (metric, person) in given.items():
            if metric is not None and person is not None:
                pairs.setdefault(name, []).append(Disagreement(number, name, metric, person, result.feedback))
    found.figures = [_figures(name, compared) for name, compared in pairs.items()]
    differing = [pair for compared in pairs.values() for pair in compared if pair.difference > 0]
    found.disagreements = sorted(differing, key=lambda pair: -pair.difference)[:SHOWN_DISAGREEMENTS]
    return found


def _figures(name: str, compared: list[Disagreement]) -> Figures:
    metric_side = [pair.metric for pair in compared]
    person_side = [pair.person for pair in compared]
    few_levels = len(set(metric_side) | set(person_side)) <= KAPPA_LEVELS
    return Figures(
        name, len(compared), spearman(metric_side, person_side),
        cohen_kappa(metric_side, person_side) if few_levels else None,
        statistics.fmean(pair.difference for pair in compared),
    )


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties get their average rank); None when undefined (a constant side)."""
    try:
        return statistics.correlation(_ranks(x), _ranks(y))
    except statistics.StatisticsError:  # fewer than two pairs, or one side constant
        return None


def cohen_kappa(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Cohen's kappa: agreement beyond chance of two raters on the same levels; None when chance agreement is 1."""
    count = len(x)
    observed = sum(a == b for a, b in zip(x, y, strict=True)) / count
    chance = sum(x.count(level) * y.count(level) for level in set(x) | set(y)) / count**2
    return None if chance >= 1 else (observed - chance) / (1 - chance)


def _ranks(values: Sequence[float]) -> list[float]:
    """Each value's rank from 1; tied values share the mean of their ranks."""
    ordered = sorted(values)
    return [(bisect.bisect_left(ordered, value) + bisect.bisect_right(ordered, value) + 1) / 2 for value in values]


def agreement_item(found: Agreement) -> CheckItem:
    """'Agrees with people': warns when a score's agreement is below min_agreement, or cannot be measured."""
    name = Item.AGREES
    if not found.figures:
        why = "their calls failed" if found.skipped else "no case checked carries a person's score"
        return CheckItem(name, Status.NOT_RUN, f"not checked: {why}")
    figures = "; ".join(figures.describe() for figures in found.figures)
    few = min(figures.cases for figures in found.figures)
    rough = (f". Only {few} case(s) compared: too few for a figure to trust; label and check more cases (max_cases="
             "None / --all)") if few < MIN_CASES else ""
    low = found.low
    if not low:
        status = Status.WARNING if rough else Status.PASSED
        return CheckItem(name, status, f"agrees with the person's scores (at least {found.min_agreement:g}): "
                                       f"{figures}{rough}")
    return CheckItem(
        name, Status.WARNING,
        f"agreement below {found.min_agreement:g} on {', '.join(f.name for f in low)}: {figures}. "
        f"{'; '.join(_advice(low, found.min_agreement))} (docs/trustworthy.md){rough}",
    )


def _advice(low: list[Figures], min_agreement: float) -> list[str]:
    """What to do about low agreement: an inverted metric, one that cannot be measured, the cases to read."""
    inverted = [f.name for f in low if f.agreement is not None and f.agreement <= -min_agreement]
    undefined = [f.name for f in low if f.agreement is None]
    return [
        *([f"{', '.join(inverted)} runs against the person's: the metric looks inverted (a negated check, PASS and "
           "FAIL swapped, a score of 1 - x)"] if inverted else []),
        *([f"{', '.join(undefined)} cannot be measured: one side gave every case the same value; label cases of "
           "both kinds"] if undefined else []),
        "read the cases where they differ most (below) beside the metric's feedback, and improve the judge prompt "
        "or the scoring there",
    ]


def _figure(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3g}"
