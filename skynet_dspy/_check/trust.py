"""The check's items on whether a metric can be trusted, beyond its contract: "Scores are stable" (repeat=) and
"Agrees with people" (human=). Each is shown only when asked for. docs/trustworthy.md
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._core.types import Item, JudgeUsage, Status
from .agreement import (
    DEFAULT_MIN_AGREEMENT,
    HumanLabel,
    agreement,
    agreement_item,
    check_labels,
    check_min_agreement,
    human_labels,
)
from .cases import Case
from .report import ContractReport
from .stability import DEFAULT_MAX_SPREAD, RepeatedMetric, announce, check_repeat, repeat_cases, stability_item

__all__ = ["DEFAULT_MAX_SPREAD", "DEFAULT_MIN_AGREEMENT", "HumanScores", "Trust"]

# human=: a JSONL file, or one label per case in order: a score, None, or {"score": ..., "scores": {...}}
HumanScores = str | Path | Sequence[float | dict[str, Any] | None]


class Trust:
    """repeat=, max_spread=, human= and min_agreement=, checked before any call; then the items they ask for."""

    def __init__(self, repeat: Any, max_spread: Any, human: Any, min_agreement: Any) -> None:
        self.runs, self.max_spread = check_repeat(repeat, max_spread)
        self.min_agreement = check_min_agreement(min_agreement)
        self.labels: list[HumanLabel | None] | None = None if human is None else human_labels(human)

    @property
    def items(self) -> list[Item]:
        """The items asked for, in report order."""
        return [item for item, asked in ((Item.STABLE, self.runs > 1), (Item.AGREES, self.labels is not None))
                if asked]

    def check_cases(self, examples: Any, checked: list[Case]) -> None:
        if self.labels is not None:
            check_labels(self.labels, examples, checked)

    def add_items(
        self, metric: RepeatedMetric, report: ContractReport, before: JudgeUsage,
        progress: Callable[[int, int], None] | None,
        quiet: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """Run the repeats (after the check's own calls, `before` being the judge's usage before them) and compare
        with the person's scores; add the items and the figures to `report`."""
        if self.runs > 1:
            broken = [item.name for item in report.items if item.status is Status.FAILED]
            if not broken and report.cases:
                report.stability = announce(metric, report, self.runs, self.max_spread, before)
                with quiet():
                    repeat_cases(metric, report, report.stability, progress)
            report.items.append(stability_item(report.stability, broken))
        if self.labels is not None:
            report.agreement = agreement(report.cases, self.labels, self.min_agreement)
            report.items.append(agreement_item(report.agreement))

