"""The DataFrame results_frame() returns: plain pandas, rendered in Jupyter with failures and low scores marked.

Its cells hold what a model or a dataset wrote, so its HTML escapes every cell, header and index label, and
its CSV marks every text cell a spreadsheet would evaluate (_core/safe_text.py).
Imported only once pandas is known to be installed (results_frame checks first).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .._core import safe_text, secrets
from . import table

_FAILED_ROW = "background-color: #ffebe9"
_FAILURE_CELL = "color: #cf222e; font-weight: bold"
_LOW, _MID, _HIGH = (248, 215, 218), (255, 255, 255), (212, 237, 218)  # red, white, green
HTML_CELL_LIMIT = 10_000  # characters of one cell the notebook view shows (the frame keeps them all)


class ResultsFrame(pd.DataFrame):
    """A DataFrame of scored examples (results_frame()); slices and copies stay ResultsFrames.

    `attrs["skynet"]` names the column groups (inputs, outputs, expected, scores). In Jupyter the rows whose
    call failed are tinted red and the score columns shaded from red (low) to green (high).
    """

    @property
    def _constructor(self) -> type[ResultsFrame]:
        return ResultsFrame

    def __repr__(self) -> str:
        """pandas' text view, safe to print: credentials masked, control characters visible, valid UTF-8 (what
        Jupyter shows as text/plain)."""
        return safe_text.for_terminal(secrets.redact(super().__repr__()))

    def _repr_html_(self) -> str | None:
        try:
            return styled_html(self)
        except ImportError:  # Styler needs jinja2: plain pandas then, every cell as escaped text
            html: str = pd.DataFrame(self.map(_html_text)).to_html(escape=False)
            return html

    def to_csv(self, path_or_buf: Any = None, **options: Any) -> Any:
        """DataFrame.to_csv, safe to open in a spreadsheet: a text cell or header that starts with = + - @, tab
        or carriage return (and is not a number) gets a leading `'` (OWASP); numbers stay numbers; text fields
        are quoted (QUOTE_NONNUMERIC, unless `quoting` is given), so a line break never starts a row; credentials
        in text are masked, as in everything the package writes."""
        options.setdefault("quoting", csv.QUOTE_NONNUMERIC)
        return csv_safe(self).to_csv(path_or_buf, **options)


def csv_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """A plain DataFrame of `frame` whose text cells, headers and index labels are safe CSV cells."""
    plain = pd.DataFrame(frame).copy()
    for column in plain.columns:
        if not (pd.api.types.is_numeric_dtype(plain[column]) or pd.api.types.is_bool_dtype(plain[column])):
            plain[column] = [_csv_value(value) for value in plain[column]]
    plain.columns = [safe_text.csv_cell(secrets.redact(str(name))) for name in plain.columns]
    if not pd.api.types.is_numeric_dtype(plain.index):
        plain.index = [safe_text.csv_cell(secrets.redact(str(label))) for label in plain.index]
    return plain


def _csv_value(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return safe_text.csv_cell(secrets.redact(value if isinstance(value, str) else str(value)))


def _html_text(value: Any) -> str:
    """One cell as escaped HTML text, credentials masked, at most HTML_CELL_LIMIT characters shown."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = secrets.redact(value if isinstance(value, str) else str(value))
    if len(text) > HTML_CELL_LIMIT:
        text = f"{text[:HTML_CELL_LIMIT]}… ({len(text) - HTML_CELL_LIMIT} more characters)"
    return safe_text.for_html(text)


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
    # Every cell, header and index label through our escaping: Styler's escape="html" skips non-str values
    # (a dict output's repr would go in raw), so the formatter escapes str() of anything itself.
    styler = styler.format(_html_text)
    styler = styler.format(precision=3, subset=numeric, na_rep="")
    styler = styler.format_index(_html_text, axis=0).format_index(_html_text, axis=1)
    failed = int((frame["failure"] != "").sum()) if "failure" in frame.columns else 0
    caption = f"{len(frame)} example(s), {failed} failed"
    if len(frame) > len(shown):
        caption += f"; showing the first {len(shown)} (pandas display.max_rows)"
    html: str = styler.set_caption(safe_text.for_html(caption)).to_html()
    return html


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
