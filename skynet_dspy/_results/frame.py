"""results_frame(): what dspy.Evaluate returned, as a pandas DataFrame with one row per example."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import table
from .extras import require

if TYPE_CHECKING:
    import pandas as pd
    from dspy.evaluate import EvaluationResult


def results_frame(evaluation: EvaluationResult, *, include_expected: bool = False) -> pd.DataFrame:
    """One row per example of `evaluation` (what `dspy.Evaluate(...)(program)` returns), as a DataFrame.

    Given a ContractReport (check_contract), one row per case scored; with repeat= the columns runs, score_min,
    score_max, spread and verdict_changed, with human= human_score and human.NAME (docs/trustworthy.md).

    Columns: the example's input fields, the output (`output`, or `output.NAME` for several fields), `score`,
    one column per named score, `feedback`, `failure` (the failure kind, "" when the call worked) and, when
    the runs were measured, `run_ms`, `cost_usd` and `model_calls`. Expected values (`expected.NAME`) only with
    `include_expected=True`. In Jupyter, failures and low scores stand out, and every cell, header and index label
    is escaped; `.to_csv()` writes plain numbers and no cell a spreadsheet would evaluate (docs/safe-output.md).
    Needs pandas (the [report] or [notebooks] extra).

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
    require("pandas", "report", "skynet_dspy.results_frame()")
    from .styled import frame_of

    case_rows = getattr(evaluation, "case_rows", None)
    if callable(case_rows):  # a ContractReport: a row per case, with the columns of its repeats and human scores
        cases = case_rows()
        rows = [table.row_of_result(case.input, case.output, case.expected, case.result) for case in cases]
        frame = frame_of(rows, table.layout(rows, include_expected))
        for column in dict.fromkeys(name for case in cases for name in case.columns):
            frame[column] = [case.columns.get(column) for case in cases]
        return frame
    rows = table.rows_of(evaluation)
    return frame_of(rows, table.layout(rows, include_expected))
