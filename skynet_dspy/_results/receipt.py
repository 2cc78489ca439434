"""The cost receipt of an optimization run, from the RunRecord skynet_dspy.gepa() / optimize_anything() keep."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .._core import secrets
from .._core.safe_text import for_html
from .._core.types import JudgeUsage, ProgramUsage, Usage
from .._core.values import usd
from .._dspy.record import ReflectionUsage, RunRecord

_NOT_MEASURED = (
    "the program's runs were not measured: the metric does not use reward(), observation() or service_cost() "
    "(load_metric(..., measure=True) or skynet_dspy.gepa(..., measure=True) measures them)"
)


@dataclass(frozen=True)
class CostReceipt:
    """What one optimization run used (`report.receipt`; docs/results.md). A figure skynet-dspy could not tell is
    None, with a note saying why, never zero.

    Attributes:
        program: The measured runs of the program the metric scored; None when the runs were not measured.
        judge: The metric's llm() calls.
        reflection: The reflection model's calls.
        seconds: The run's wall time.
        metric: The metric's name.
        metric_calls: The metric's score calls.
        memo_hits: Of those, the calls answered from memory (GEPA asks twice for the same example and output).
        failures: The failed calls by kind (timeout, exception, ...).
        notes: Why a figure is unknown, one note each.
        total: The program's, the judge's and the reflection model's calls, tokens, USD and seconds as one Usage.
        total_usd: Their USD added up; None when one of them is unknown.
    """

    program: ProgramUsage | None
    judge: JudgeUsage
    reflection: ReflectionUsage
    seconds: float
    metric: str = "metric"
    metric_calls: int = 0
    memo_hits: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, record: RunRecord) -> CostReceipt:
        notes = []
        if record.program is None:
            notes.append(f"program: {_NOT_MEASURED}")
        elif record.program.unpriced:
            notes.append(f"program: {record.program.unpriced} run(s) used a model with no known price; "
                         "their cost is not in the total")
        if record.judge.cost_usd is None:
            notes.append("judge: a call's price is unknown (LiteLLM has no price for the model)")
        if record.reflection.note:
            notes.append(f"reflection: {record.reflection.note}")
        if record.error:
            notes.append(f"the run ended with an error: {record.error}")
        return cls(record.program, record.judge, record.reflection, record.seconds, record.metric,
                   record.metric_calls, record.memo_hits, dict(record.failures), tuple(notes))

    @property
    def total(self) -> Usage | None:
        """The program's, the judge's and the reflection model's calls, tokens, USD and model seconds added up;
        None when the program's runs or the reflection model's calls could not be counted."""
        reflection = self.reflection.usage
        if self.program is None or reflection is None:
            return None
        return self.program.usage + self.judge.usage + reflection

    @property
    def total_usd(self) -> float | None:
        """The program's, the judge's and the reflection model's USD added up; None when one of them is unknown."""
        program = None if self.program is None or self.program.unpriced else self.program.cost_usd
        parts = [program, self.judge.cost_usd, self.reflection.cost_usd]
        return None if None in parts else math.fsum(part or 0.0 for part in parts)

    def lines(self) -> list[tuple[str, str]]:
        """(what, figures) per line of the receipt, in words."""
        program, judge, reflection = self.program, self.judge, self.reflection
        program_text = "not measured"
        if program is not None:
            cost = usd(program.cost_usd) + (f" (+{program.unpriced} unpriced run(s))" if program.unpriced else "")
            cached = f" (+{program.cached_calls} answered from a cache)" if program.cached_calls else ""
            program_text = (f"{program.runs} run(s), {program.model_calls} model call(s){cached}, "
                            f"{program.total_tokens:,} tokens, {cost}, {program.run_ms / 1000:.2f} s of runs")
        judge_text = (f"{judge.requests} request(s), {judge.cache_hits} cache hit(s), {judge.total_tokens:,} tokens, "
                      f"{usd(judge.cost_usd)}, {judge.seconds:.2f} s")
        judge_text += f", {judge.failed} failed" if judge.failed else ""
        calls = "? calls" if reflection.calls is None else f"{reflection.calls} call(s)"
        tokens = "? tokens" if reflection.total_tokens is None else f"{reflection.total_tokens:,} tokens"
        hits = f", {reflection.cache_hits} cache hit(s)" if reflection.cache_hits else ""
        known = [program.cost_usd if program is not None else None, judge.cost_usd, reflection.cost_usd]
        total = self.total_usd
        kinds = ", ".join(f"{count} {kind}" for kind, count in self.failures.items())
        return [
            ("program", program_text),
            ("judge", judge_text),
            ("reflection", f"{calls}, {tokens}, {usd(reflection.cost_usd)}{hits}"),
            ("total", usd(total) if total is not None else
             f"at least {usd(math.fsum(part for part in known if part is not None))} (some costs unknown)"),
            ("wall time", f"{self.seconds:.2f} s"),
            ("metric", f"{self.metric_calls} score() call(s), {self.memo_hits} answered from memory, "
                       f"{sum(self.failures.values())} failed" + (f" ({kinds})" if kinds else "")),
        ]

    def __str__(self) -> str:
        width = max(len(name) for name, _ in self.lines())
        text = [f"Cost receipt of the run (metric: {self.metric}):"]
        text += [f"  {name:<{width}}  {figures}" for name, figures in self.lines()]
        text += [f"  note: {note}" for note in self.notes]
        return secrets.redact("\n".join(text))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return f"<pre>{for_html(str(self))}</pre>"

    def to_dict(self) -> dict[str, Any]:
        """The receipt in plain values (JSON-ready): program, judge, reflection, total_usd, seconds, notes."""
        def usage(part: Any) -> dict[str, Any] | None:
            return None if part is None else {**asdict(part), "total_tokens": part.total_tokens}

        return {
            "program": usage(self.program), "judge": self.judge.to_dict(),
            "reflection": usage(self.reflection),
            "total_usd": self.total_usd, "seconds": self.seconds, "metric": self.metric,
            "metric_calls": self.metric_calls, "memo_hits": self.memo_hits, "failures": dict(self.failures),
            "notes": list(self.notes),
        }
