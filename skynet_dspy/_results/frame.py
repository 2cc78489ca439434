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

    Columns: the example's input fields, the output (`output`, or `output.NAME` for several fields), `score`,
    one column per named score, `feedback`, `failure` (the failure kind, "" when the call worked) and, when
    the runs were measured, `run_ms`, `cost_usd` and `model_calls`. Expected values (`expected.NAME`) only with
    `include_expected=True`. In Jupyter, failures and low scores stand out, and every cell, header and index label
    is escaped; `.to_csv()` writes plain numbers and no cell a spreadsheet would evaluate (docs/safe-output.md).
    Needs pandas (the [report] or [notebooks] extra).
    """
    if not isinstance(include_expected, bool):
        raise TypeError(f"include_expected must be True or False, got {include_expected!r}")
    require("pandas", "report", "skynet_dspy.results_frame()")
    from .styled import frame_of

    rows = table.rows_of(evaluation)
    return frame_of(rows, table.layout(rows, include_expected))
