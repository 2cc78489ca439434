"""The DataFrame results_frame() returns: plain pandas, rendered in Jupyter with failures and low scores marked.

Imported only once pandas is known to be installed (results_frame checks first).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from . import table

_FAILED_ROW = "background-color: #ffebe9"
_FAILURE_CELL = "color: #cf222e; font-weight: bold"
_LOW, _MID, _HIGH = (248, 215, 218), (255, 255, 255), (212, 237, 218)  # red, white, green


class ResultsFrame(pd.DataFrame):
    """A DataFrame of scored examples (results_frame()); slices and copies stay ResultsFrames.

    `attrs["skynet"]` names the column groups (inputs, outputs, expected, scores). In Jupyter the rows whose
    call failed are tinted red and the score columns shaded from red (low) to green (high).
    """

    @property
    def _constructor(self) -> type[ResultsFrame]:
        return ResultsFrame

    def _repr_html_(self) -> str | None:
        try:
            return styled_html(self)
        except ImportError:  # Styler needs jinja2: plain pandas then
            return super()._repr_html_()


def frame_of(rows: Sequence[table.Row], layout: table.Layout) -> ResultsFrame:
    """The frame of `rows` laid out as `layout`, with numeric dtypes for every number column."""
    records = [table.values(row, layout) for row in rows]
    frame = ResultsFrame.from_records(records, columns=layout.columns) if records else ResultsFrame(
        columns=layout.columns)
    numbers = ["score", *layout.scores.values(), *(("run_ms", "cost_usd") if layout.measured else ())]
    for column in numbers:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    if layout.measured:
        frame["model_calls"] = pd.to_numeric(frame["model_calls"], errors="coerce").astype("Int64")
    frame["feedback"] = frame["feedback"].astype(str)
    frame["failure"] = frame["failure"].astype(str)
    frame.attrs["skynet"] = {
        "inputs": list(layout.inputs.values()),
        "outputs": list(layout.outputs.values()),
        "expected": list(layout.expected.values()),
        "scores": list(layout.scores.values()),
    }
    return frame


def styled_html(frame: pd.DataFrame) -> str:
    """HTML of the frame: failed rows tinted, score columns shaded, at most display.max_rows rows."""
    groups = frame.attrs.get("skynet", {})
    limit = pd.get_option("display.max_rows") or len(frame)
    shown = frame.head(limit)
    score_columns = [column for column in ["score", *groups.get("scores", [])] if column in shown.columns]
    styler = shown.style
    if "failure" in shown.columns:
        styler = styler.apply(lambda row: [_FAILED_ROW if row["failure"] else "" for _ in row], axis=1)
        styler = styler.map(lambda value: _FAILURE_CELL if value else "", subset=["failure"])
    for column in score_columns:
        low, high = _range(frame[column])
        styler = styler.map(lambda value, low=low, high=high: _shade(value, low, high), subset=[column])
    numeric = [column for column in shown.columns if pd.api.types.is_float_dtype(shown[column])]
    styler = styler.format(precision=3, subset=numeric, na_rep="")
    failed = int((frame["failure"] != "").sum()) if "failure" in frame.columns else 0
    caption = f"{len(frame)} example(s), {failed} failed"
    if len(frame) > len(shown):
        caption += f"; showing the first {len(shown)} (pandas display.max_rows)"
    return styler.set_caption(html.escape(caption)).to_html()


def _range(values: pd.Series) -> tuple[float, float]:
    numbers = pd.to_numeric(values, errors="coerce").dropna()
    if numbers.empty:
        return 0.0, 0.0
    return float(numbers.min()), float(numbers.max())


def _shade(value: Any, low: float, high: float) -> str:
    """A background from red (the column's lowest) through white to green (its highest); none when all equal."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    if math.isnan(number) or high <= low:
        return ""
    share = (number - low) / (high - low)
    start, end, t = (_LOW, _MID, share * 2) if share < 0.5 else (_MID, _HIGH, share * 2 - 1)
    red, green, blue = (round(a + (b - a) * t) for a, b in zip(start, end, strict=True))
    return f"background-color: rgb({red}, {green}, {blue})"
