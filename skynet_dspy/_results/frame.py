"""results_frame(): what dspy.Evaluate returned as a plain pandas DataFrame, one row per example; results_style()
colours it for Jupyter (every cell escaped), results_csv() writes it safe for a spreadsheet (_core/safe_text.py).
"""

from __future__ import annotations

import csv
import math
from typing import TYPE_CHECKING, Any

from .._core import safe_text, secrets
from .._core.errors import require_extra
from . import table

if TYPE_CHECKING:
    import pandas as pd
    from dspy.evaluate import EvaluationResult
    from pandas.io.formats.style import Styler

    from .._check import ContractReport

_FAILED_ROW = "background-color: #ffebe9"
_FAILURE_CELL = "color: #cf222e; font-weight: bold"
_LOW, _MID, _HIGH = (248, 215, 218), (255, 255, 255), (212, 237, 218)  # red, white, green
HTML_CELL_LIMIT = 10_000  # characters of one cell results_style() shows (the frame keeps them all)


def results_frame(evaluation: EvaluationResult | ContractReport, *, include_expected: bool = False) -> pd.DataFrame:
    """One row per example of `evaluation` (what `dspy.Evaluate(...)(program)` returns), as a plain DataFrame.

    Given a ContractReport (check_contract), one row per case scored; with repeat= the columns runs, score_min,
    score_max, spread and verdict_changed, with human= human_score and human.NAME (docs/trustworthy.md).

    Columns: the example's input fields, the output (`output`, or `output.NAME` for several fields), `score`,
    one column per named score, `feedback`, `failure` (the failure kind, "" when the call worked) and, when
    the runs were measured, `run_ms`, `cost_usd` and `model_calls`. Expected values (`expected.NAME`) only with
    `include_expected=True`. Text cells are stored with credentials masked and as valid UTF-8, so printing or
    writing the frame never shows a credential. `frame.attrs["skynet"]` names the column groups (inputs,
    outputs, expected, scores). `results_style(frame)` colours it in Jupyter; `results_csv(frame, path)` writes a
    CSV safe to open in a spreadsheet. Needs pandas (the [report] or [notebooks] extra).

    Args:
        evaluation: What `dspy.Evaluate(...)(program)` returned (or a ContractReport from check_contract).
        include_expected: Add the expected values, as `expected.NAME` columns.

    Returns:
        The DataFrame, one row per example.

    Raises:
        TypeError: include_expected is not True or False.
        MissingExtra: pandas is not installed.
    """
    if not isinstance(include_expected, bool):
        raise TypeError(f"include_expected must be True or False, got {include_expected!r}")
    require_extra("pandas", "report", "skynet_dspy.results_frame()")
    case_rows = getattr(evaluation, "case_rows", None)
    if callable(case_rows):  # a ContractReport: a row per case, with the columns of its repeats and human scores
        cases = case_rows()
        rows = [table.row_of_result(run.input, run.output, run.expected, run.own) for run, _ in cases]
    else:
        cases, rows = [], table.rows_of(evaluation)
    frame = _frame_of(rows, include_expected)
    for column in dict.fromkeys(name for _, columns in cases for name in columns):
        frame[column] = [columns.get(column) for _, columns in cases]
    return frame


def _frame_of(rows: list[table.Row], include_expected: bool) -> pd.DataFrame:
    """The frame of `rows`: inputs, output(s), expected, score, named scores, feedback, failure, the measured run
    and what score printed; numeric dtypes for the number columns, text made safe. A column name already taken
    gets its group's prefix: input.NAME, scores.NAME; several output fields are output.NAME each."""
    import pandas as pd

    output = _outputs([row.output for row in rows])
    expected = pd.DataFrame([row.expected or {} for row in rows] if include_expected else [{}] * len(rows))
    expected = expected.add_prefix("expected.")
    taken = {*table.FIXED, *output.columns, *expected.columns}
    scores = _named(pd.DataFrame([row.scores for row in rows]), taken, "scores")
    inputs = _named(pd.DataFrame([row.inputs for row in rows]), taken, "input")
    rest = _rest(rows)
    parts = [inputs, output, expected, pd.DataFrame({"score": [row.score for row in rows]}), scores, rest]
    frame = pd.concat(parts, axis=1).map(
        lambda value: safe_text.valid_utf8(secrets.redact(value)) if isinstance(value, str) else value)
    measured = "run_ms" in rest
    for column in ["score", *scores.columns, *(("run_ms", "cost_usd") if measured else ())]:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    if measured:
        frame["model_calls"] = pd.to_numeric(frame["model_calls"], errors="coerce").astype("Int64")
    frame[["feedback", "failure"]] = frame[["feedback", "failure"]].astype(str)
    frame.attrs["skynet"] = {group: list(part.columns) for group, part in
                             (("inputs", inputs), ("outputs", output), ("expected", expected), ("scores", scores))}
    return frame


def _outputs(outputs: list[Any]) -> pd.DataFrame:
    """One "output" column, or an "output.NAME" column per field when some output has several fields."""
    import pandas as pd

    if any(isinstance(output, dict) and len(output) > 1 for output in outputs):
        return pd.DataFrame([out if isinstance(out, dict) else {} for out in outputs]).add_prefix("output.")
    return pd.DataFrame({"output": outputs})


def _rest(rows: list[table.Row]) -> pd.DataFrame:
    """feedback and failure; the measured run's columns when some run was measured; "printed" when score printed."""
    import pandas as pd

    runs = [row.observation if row.observation is not None and row.observation.measured else None for row in rows]
    rest: dict[str, list[Any]] = {"feedback": [row.feedback for row in rows], "failure": [row.failure for row in rows]}
    if any(runs):
        rest |= {name: [getattr(run, name) if run else None for run in runs] for name in table.MEASURED}
    if any(row.printed for row in rows):
        rest["printed"] = [row.printed for row in rows]
    return pd.DataFrame(rest)


def _named(part: pd.DataFrame, taken: set[str], prefix: str) -> pd.DataFrame:
    part.columns = list(table.named(part.columns, taken, prefix).values())
    return part


def results_style(frame: pd.DataFrame) -> Styler:
    """A results frame styled for Jupyter: failed rows tinted red, score columns shaded red (low) to green (high).

    Every cell, header and index label is escaped HTML with credentials masked; a cell shows at most 10,000
    characters; at most pandas' `display.max_rows` rows are shown, with a caption counting examples and failures.

    Args:
        frame: What results_frame() returned, or a slice of it.

    Returns:
        A pandas Styler (`frame.style` with the colours set); Jupyter renders it, `.to_html()` writes it.
    """
    import pandas as pd

    require_extra("jinja2", "report", "skynet_dspy.results_style()")
    groups = frame.attrs.get("skynet", {})
    shown = frame.head(pd.get_option("display.max_rows") or len(frame))
    styler = shown.style
    if "failure" in shown.columns:
        styler = styler.apply(lambda row: [_FAILED_ROW if row["failure"] else "" for _ in row], axis=1)
        styler = styler.map(lambda value: _FAILURE_CELL if value else "", subset=["failure"])
    for column in ["score", *groups.get("scores", [])]:
        if column in shown.columns:
            numbers = pd.to_numeric(frame[column], errors="coerce").dropna()
            low, high = (float(numbers.min()), float(numbers.max())) if len(numbers) else (0.0, 0.0)
            styler = styler.map(lambda value, low=low, high=high: _shade(value, low, high), subset=[column])
    numeric = [column for column in shown.columns if pd.api.types.is_float_dtype(shown[column])]
    # Styler's escape="html" skips values that are not str (a dict output's repr would go in raw): escape all
    styler = styler.format(_html_text).format(precision=3, subset=numeric, na_rep="")
    styler = styler.format_index(_html_text, axis=0).format_index(_html_text, axis=1)
    failed = int((frame["failure"] != "").sum()) if "failure" in frame.columns else 0
    caption = f"{len(frame)} example(s), {failed} failed"
    if len(frame) > len(shown):
        caption += f"; showing the first {len(shown)} (pandas display.max_rows)"
    return styler.set_caption(safe_text.for_html(caption))


def results_csv(frame: pd.DataFrame, path_or_buf: Any = None, **options: Any) -> str | None:
    """`frame.to_csv(...)`, safe to open in a spreadsheet.

    A text cell or header that starts with = + - @, a tab or a carriage return (and is not a number) gets a
    leading `'` (OWASP); numbers stay numbers; text fields are quoted (QUOTE_NONNUMERIC, unless `quoting` is
    given), so a line break never starts a row; credentials in text are masked.

    Args:
        frame: What results_frame() returned, or any DataFrame.
        path_or_buf: A path or file to write to; None returns the CSV as a string.
        **options: What `DataFrame.to_csv` takes (index=False, sep=...).

    Returns:
        The CSV text when `path_or_buf` is None, else None.
    """
    import pandas as pd

    options.setdefault("quoting", csv.QUOTE_NONNUMERIC)
    plain = _text_cells(frame, _csv_value)
    plain.columns = [_csv_value(str(name)) for name in plain.columns]
    if not pd.api.types.is_numeric_dtype(plain.index):
        plain.index = [_csv_value(str(label)) for label in plain.index]
    result: str | None = plain.to_csv(path_or_buf, **options)
    return result


def _text_cells(frame: pd.DataFrame, convert: Any) -> pd.DataFrame:
    """A copy of `frame` with `convert` applied to every cell of its columns that are not numbers."""
    import pandas as pd

    plain = pd.DataFrame(frame).copy()
    for column in plain.columns:
        if not (pd.api.types.is_numeric_dtype(plain[column]) or pd.api.types.is_bool_dtype(plain[column])):
            plain[column] = [convert(value) for value in plain[column]]
    return plain


def _csv_value(value: Any) -> Any:
    plain = value is None or isinstance(value, (int, float, bool))
    return safe_text.csv_cell(value if plain else secrets.redact(str(value)))


def _html_text(value: Any) -> str:
    """One cell as escaped HTML text, credentials masked, at most HTML_CELL_LIMIT characters shown."""
    import pandas as pd

    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = secrets.redact(value if isinstance(value, str) else str(value))
    if len(text) > HTML_CELL_LIMIT:
        text = f"{text[:HTML_CELL_LIMIT]}… ({len(text) - HTML_CELL_LIMIT} more characters)"
    return safe_text.for_html(text)


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
