"""skynet_dspy.report(): what a GEPA run (dspy.GEPA's `detailed_results`, or a GEPAResult) found and cost, as
text, HTML in Jupyter and a PNG plot; every text made safe for its medium (_core/safe_text.py).
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core import safe_text, secrets
from .._core.errors import require_extra
from .._core.safe_text import for_html, for_plot, literal_text
from .._dspy.record import ATTRIBUTE, RunRecord, record_of
from .receipt import CostReceipt

if TYPE_CHECKING:
    import dspy
    from gepa.core.result import GEPAResult


@dataclass(frozen=True)
class Candidate:
    """One candidate GEPA proposed: its mean validation score, the metric calls spent when it was found,
    its parents, its named-score means on the validation set and its texts (instructions) by component."""

    index: int
    score: float
    metric_calls: int | None
    parents: tuple[int, ...]
    scores: dict[str, float]
    texts: dict[str, str]


@dataclass(frozen=True)
class OptimizationReport:
    """A GEPA run: every candidate (the seed is #0), the best one, and the cost receipt (None when not recorded).

    `str(report)` is the text report, `report` alone renders as HTML in Jupyter, `report.plot("run.png")`
    draws the candidates' validation scores against metric calls spent (matplotlib, the [report] extra).

    Attributes:
        candidates: Every candidate, in the order GEPA proposed them (the seed is #0): its validation score,
            the metric calls spent when it was found, its parents, named scores and texts.
        best: The index of the best candidate in `candidates`.
        receipt: What the run used; None when the run was not recorded.
        total_metric_calls: The metric calls GEPA made in all, when its result gives them.
        source: What ran: "dspy.GEPA" or "optimize_anything".
        notes: What the report could not tell, and why.
        seed: The seed candidate (None without candidates).
        best_candidate: The best candidate (None without candidates).
        named_scores: Named score → (the seed's validation mean, the best candidate's).
    """

    candidates: list[Candidate]
    best: int
    receipt: CostReceipt | None = None
    total_metric_calls: int | None = None
    source: str = "dspy.GEPA"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def seed(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def best_candidate(self) -> Candidate | None:
        return self.candidates[self.best] if self.candidates else None

    @property
    def named_scores(self) -> dict[str, tuple[float | None, float | None]]:
        """Named score → (the seed's validation mean, the best candidate's)."""
        seed, best = self.seed, self.best_candidate
        if seed is None or best is None:
            return {}
        names = list(dict.fromkeys([*seed.scores, *best.scores]))
        return {name: (seed.scores.get(name), best.scores.get(name)) for name in names}

    def diff(self) -> str:
        """The best candidate's texts against the seed's, as a unified diff (empty when they are the same)."""
        seed, best = self.seed, self.best_candidate
        if seed is None or best is None:
            return ""
        chunks: list[str] = []
        for name in dict.fromkeys([*seed.texts, *best.texts]):
            before, after = seed.texts.get(name, ""), best.texts.get(name, "")
            if before == after:
                continue
            chunks.extend(difflib.unified_diff(
                before.splitlines(), after.splitlines(), f"seed: {name}", f"best (#{best.index}): {name}",
                lineterm="",
            ))
        return "\n".join(chunks)

    def plot(self, path: str | Path | None = None) -> Any:
        """A matplotlib Figure of validation score against metric calls spent; saved as PNG at `path` if given.

        Candidates are points, the best score so far a step line, named-score means dashed. The Figure is its own
        (no pyplot), every label drawn literally (no mathtext)."""
        require_extra("matplotlib", "report", "report.plot()")
        from matplotlib.figure import Figure

        figure = Figure(figsize=(8.5, 4.2))
        axes = figure.add_subplot()
        if any(c.metric_calls is not None for c in self.candidates):
            _draw(axes, self)
        else:
            axes.text(0.5, 0.5, "no candidates to plot", ha="center", va="center", transform=axes.transAxes)
            axes.set_axis_off()
        literal_text(figure)
        if path is not None:
            figure.savefig(Path(path), format="png", dpi=110, bbox_inches="tight")
        return figure

    def _table(self) -> list[list[str]]:
        """The candidates as rows of text cells, the header first."""
        names = list(dict.fromkeys(name for candidate in self.candidates for name in candidate.scores))
        return [["#", "parents", "metric calls", "val score", *names]] + [
            [f"{c.index}{' best' if c.index == self.best else ''}", ",".join(map(str, c.parents)) or "-",
             "-" if c.metric_calls is None else str(c.metric_calls), f"{c.score:.3f}",
             *(_number(c.scores.get(name)) for name in names)]
            for c in self.candidates
        ]

    def _named_text(self, arrow: str) -> str:
        return f"Named scores, seed {arrow} best: " + ", ".join(
            f"{name} {_number(seed)} {arrow} {_number(best)}" for name, (seed, best) in self.named_scores.items())

    def __str__(self) -> str:
        lines = [f"{self.source} run: {len(self.candidates)} candidate(s)"
                 + (f", {self.total_metric_calls} metric calls" if self.total_metric_calls is not None else "")]
        table = self._table() if self.candidates else []
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))] if table else []
        lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                  for row in table]
        if self.named_scores:
            lines.append(self._named_text("->"))
        best = self.best_candidate
        if best is not None:
            difference = self.diff()
            if difference:
                lines += [f"Best candidate #{best.index} against the seed:", difference]
            else:
                lines.append("The best candidate is the seed: no text changed.")
        if self.receipt is not None:
            lines.append(str(self.receipt))
        lines += [f"note: {note}" for note in self.notes]
        return safe_text.for_terminal(secrets.redact("\n".join(lines)))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head, *rows = self._table()
        body = "".join(
            f"<tr style='{'font-weight:bold;background:#dafbe1' if row[0].endswith(' best') else ''}'>"
            + "".join(f"<td>{for_html(cell.removesuffix(' best'))}</td>" for cell in row) + "</tr>"
            for row in rows
        )
        parts = [f"<div><b>{for_html(self.source)} run</b>: {len(self.candidates)} candidate(s)",
                 f"<table><tr>{''.join(f'<th>{for_html(text)}</th>' for text in head)}</tr>{body}</table>"]
        if self.named_scores:
            parts.append(f"<p>{for_html(self._named_text('→'))}</p>")
        difference = self.diff()
        if difference:
            parts.append("<pre style='text-align:left'>" + "".join(_diff_line(line) for line in difference.splitlines())
                         + "</pre>")
        parts.append(self._plot_html())
        if self.receipt is not None:
            parts.append(self.receipt._repr_html_())
        parts += [f"<p style='color:#6e7781'>note: {for_html(note)}</p>" for note in self.notes]
        return safe_text.valid_utf8(secrets.redact("".join(parts) + "</div>"))  # the receipt's parts too

    def _plot_html(self) -> str:
        import base64
        import io

        try:
            figure = self.plot()
        except ImportError:  # no matplotlib: the tables alone
            return ""
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
        return f"<img src='data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}'/>"

    def to_dict(self) -> dict[str, Any]:
        """The report in plain values (JSON-ready: every string valid UTF-8)."""
        plain: dict[str, Any] = safe_text.json_safe({  # tuples become lists
            "source": self.source,
            "best": self.best,
            "total_metric_calls": self.total_metric_calls,
            "candidates": [asdict(candidate) for candidate in self.candidates],
            "named_scores": {name: {"seed": seed, "best": best} for name, (seed, best) in self.named_scores.items()},
            "diff": self.diff(),
            "receipt": self.receipt.to_dict() if self.receipt is not None else None,
            "notes": list(self.notes),
        })
        return plain


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _diff_line(line: str) -> str:
    color = "#1a7f37" if line.startswith("+") else "#cf222e" if line.startswith("-") else "#6e7781"
    return f"<span style='color:{color}'>{for_html(line)}</span>\n"


def _draw(axes: Any, report: Any) -> None:
    """The plot's marks: candidates, the best score so far, named-score means, the best one, the calls spent."""
    candidates = [c for c in report.candidates if c.metric_calls is not None]
    calls = [c.metric_calls for c in candidates]
    scores = [c.score for c in candidates]
    best_so_far = list(itertools.accumulate(scores, max))
    end = max(report.total_metric_calls or 0, calls[-1])
    axes.step([*calls, end], [*best_so_far, best_so_far[-1]], where="post", color="#1a7f37", label="best so far")
    axes.scatter(calls, scores, color="#0969da", zorder=3, label="candidate (validation mean)")
    _named_score_lines(axes, candidates)
    best = report.best_candidate
    if best is not None and best.metric_calls is not None:
        axes.annotate(f"best #{best.index}: {best.score:.3f}", (best.metric_calls, best.score),
                      textcoords="offset points", xytext=(6, -14))
    if report.total_metric_calls:
        axes.axvline(report.total_metric_calls, color="#6e7781", linestyle=":", label="metric calls spent")
    axes.set_xlabel("metric calls spent when found")
    axes.set_ylabel("validation score")
    axes.set_title(f"{for_plot(report.source)}: {len(report.candidates)} candidate(s)")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def _named_score_lines(axes: Any, candidates: list[Candidate]) -> None:
    for name in dict.fromkeys(n for c in candidates for n in c.scores):
        points = [(c.metric_calls, c.scores[name]) for c in candidates if name in c.scores]
        axes.plot([x for x, _ in points], [y for _, y in points], linestyle="--", marker=".", alpha=0.6,
                  label=f"{for_plot(name)} (mean)")


# -- building a report ---------------------------------------------------------------------------------


def report(run: dspy.GEPA | dspy.Module | GEPAResult) -> OptimizationReport:
    """The report of a GEPA run: its candidates, the best one, and what the run cost.

    Args:
        run: The dspy.GEPA skynet_dspy.gepa() built (after compile), the program its compile returned, or the
            GEPAResult skynet_dspy.optimize_anything() returned.

    Returns:
        The OptimizationReport (`str()` of it is the text report; in Jupyter it renders as HTML).
    """
    results, record, source = _sources(run)
    receipt = CostReceipt.from_record(record) if record is not None else None
    notes = () if record is not None else (
        "no cost receipt: the run was not made through skynet_dspy.gepa() or skynet_dspy.optimize_anything()",)
    if results is None:  # the run ended before GEPA returned (an error, a spending cap): the receipt alone
        return OptimizationReport([], 0, receipt, None, source, notes)
    candidates = _candidates(results)
    best = max(range(len(candidates)), key=lambda i: candidates[i].score) if candidates else 0
    return OptimizationReport(candidates, best, receipt, getattr(results, "total_metric_calls", None), source, notes)


def _sources(run: Any) -> tuple[Any, RunRecord | None, str]:
    """(GEPA's results or None, the run's record or None, what ran) for what report() was given."""
    import dspy
    from gepa.core.result import GEPAResult

    if all(hasattr(run, name) for name in ("candidates", "val_aggregate_scores", "discovery_eval_counts")):
        return run, record_of(run), "optimize_anything" if isinstance(run, GEPAResult) else "dspy.GEPA"
    if isinstance(run, dspy.GEPA):
        if not hasattr(run, ATTRIBUTE):
            raise ValueError(
                "this dspy.GEPA was not built by skynet_dspy.gepa(), so its run was not recorded; pass the program "
                "its compile() returned (compiled with track_stats=True) to skynet_dspy.report()"
            )
        record = getattr(run, ATTRIBUTE)
        if record is None:
            raise ValueError("this optimizer has not run yet: call optimizer.compile(program, trainset=...) first")
        program = getattr(run, "skynet_program", None)
        return (None if program is None else _detailed(program)), record, "dspy.GEPA"
    if isinstance(run, dspy.Module):
        return _detailed(run), record_of(run), "dspy.GEPA"
    raise TypeError(
        "skynet_dspy.report() takes the dspy.GEPA built by skynet_dspy.gepa() after compile(), the program compile() "
        f"returned, or the result of skynet_dspy.optimize_anything(); got {type(run).__name__}"
    )


def _detailed(program: Any) -> Any:
    results = getattr(program, "detailed_results", None)
    if results is None:
        raise ValueError(
            "this program has no GEPA results: compile it with dspy.GEPA(..., track_stats=True) "
            "(skynet_dspy.gepa() sets track_stats=True)"
        )
    return results


def _candidates(results: Any) -> list[Candidate]:
    def column(name: str) -> list[Any]:  # GEPA's optional per-candidate figures, None where missing
        values = list(getattr(results, name, None) or [])
        return values + [None] * (len(results.candidates) - len(values))

    found = zip(results.candidates, results.val_aggregate_scores, column("discovery_eval_counts"),
                column("parents"), column("val_aggregate_subscores"), strict=False)
    return [
        Candidate(
            index=index,
            score=float(score),
            metric_calls=int(spent) if spent is not None else None,
            parents=tuple(int(parent) for parent in parents or () if parent is not None),
            scores={str(name): float(value) for name, value in (named or {}).items()},
            texts=_texts(candidate),
        )
        for index, (candidate, score, spent, parents, named) in enumerate(found)
    ]


def _texts(candidate: Any) -> dict[str, str]:
    """A candidate's optimized texts by component: a DSPy program's instructions, or plain GEPA's dict."""
    if isinstance(candidate, dict):
        return {str(name): str(text) for name, text in candidate.items()}
    try:
        return {name: predictor.signature.instructions for name, predictor in candidate.named_predictors()}
    except Exception:
        return {}
