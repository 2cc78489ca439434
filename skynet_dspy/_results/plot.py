"""The report's plot: candidates' validation scores against metric calls spent; its own Figure (no pyplot), every
label drawn literally (no mathtext)."""

from __future__ import annotations

import itertools
from typing import Any

from .._core.safe_text import for_plot, literal_text
from .extras import require


def _named_score_lines(axes: Any, candidates: list[Any]) -> None:
    for name in dict.fromkeys(n for c in candidates for n in c.scores):
        points = [(c.metric_calls, c.scores[name]) for c in candidates if name in c.scores]
        axes.plot([x for x, _ in points], [y for _, y in points], linestyle="--", marker=".", alpha=0.6,
                  label=f"{for_plot(name)} (mean)")


def _marks(axes: Any, report: Any) -> None:
    """The best candidate's label and the line of the metric calls spent."""
    best = report.best_candidate
    if best is not None and best.metric_calls is not None:
        axes.annotate(f"best #{best.index}: {best.score:.3f}", (best.metric_calls, best.score),
                      textcoords="offset points", xytext=(6, -14))
    if report.total_metric_calls:
        axes.axvline(report.total_metric_calls, color="#6e7781", linestyle=":", label="metric calls spent")


def candidates_figure(report: Any) -> Any:
    """A Figure: candidates as points, the best score so far as a step line, named-score means dashed."""
    require("matplotlib", "report", "report.plot()")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.5, 4.2))
    axes = figure.add_subplot()
    candidates = [c for c in report.candidates if c.metric_calls is not None]
    if not candidates:
        axes.text(0.5, 0.5, "no candidates to plot", ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
        return literal_text(figure)
    calls = [c.metric_calls for c in candidates]
    scores = [c.score for c in candidates]
    best_so_far = list(itertools.accumulate(scores, max))
    end = max(report.total_metric_calls or 0, calls[-1])
    axes.step([*calls, end], [*best_so_far, best_so_far[-1]], where="post", color="#1a7f37", label="best so far")
    axes.scatter(calls, scores, color="#0969da", zorder=3, label="candidate (validation mean)")
    _named_score_lines(axes, candidates)
    _marks(axes, report)
    axes.set_xlabel("metric calls spent when found")
    axes.set_ylabel("validation score")
    axes.set_title(f"{for_plot(report.source)}: {len(report.candidates)} candidate(s)")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return literal_text(figure)
