"""One row per scored example in plain values (frame.py lays them out as columns), and their score means and
failure counts."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.types import Observation, Result

PROGRAM_ERROR = "program_error"  # dspy.Evaluate's row for an example whose program raised: the metric never ran
MEASURED = ("run_ms", "cost_usd", "model_calls")  # the measured run's columns, when the run was measured
FIXED = ("output", "score", "feedback", "failure", *MEASURED, "printed")


@dataclass(frozen=True)
class Row:
    """One example as scored: what went in, what came out, and what the metric said."""

    inputs: dict[str, Any]
    output: Any  # the bare value for one output field, a dict for several (as the metric saw it)
    expected: dict[str, Any] | None
    score: float
    feedback: str
    scores: dict[str, float] = field(default_factory=dict)
    failure: str = ""  # "" when the call worked; else a Failure kind, or "program_error"
    observation: Observation | None = None
    printed: str | None = None  # what score wrote to stdout/stderr during the call (its first few kB)


def row_of(example: Any, prediction: Any, score: Any) -> Row:
    """The Row of one (example, prediction, score) triple from dspy.Evaluate's `results`."""
    from .._dspy import translate
    from .._dspy.score import Score

    try:
        inputs, expected = translate.split_example(example)
    except Exception:  # not a dspy.Example with inputs marked: its fields, all as inputs
        inputs, expected = dict(example.items()) if hasattr(example, "items") else {"example": example}, None
    try:
        output = translate.prediction_output(prediction)
    except Exception:
        output = prediction
    if isinstance(score, Score):  # the output the metric was given (output_fields, to_output), when kept
        return row_of_result(inputs, score.output if score.has_output else output, expected, score.result)
    empty = translate.is_record(prediction) and not translate.fields_of(prediction)
    # dspy.Evaluate puts (dspy.Prediction(), failure_score) where the program raised: no metric call was made
    return Row(inputs, None if empty else output, expected, _number(score), "", {}, PROGRAM_ERROR if empty else "")


def row_of_result(inputs: dict[str, Any], output: Any, expected: dict[str, Any] | None, result: Result) -> Row:
    """The Row of one metric call on plain values."""
    return Row(
        inputs, output, expected, float(result.score), result.feedback, dict(result.scores or {}),
        str(result.failure) if result.failure is not None else "", result.observation, result.output,
    )


def rows_of(evaluation: Any) -> list[Row]:
    """Rows of what dspy.Evaluate returned (an EvaluationResult) or of a list of (example, prediction, score)."""
    triples = getattr(evaluation, "results", evaluation)
    if isinstance(triples, (str, bytes, dict)) or not isinstance(triples, Iterable):
        raise TypeError(
            "results_frame() takes what dspy.Evaluate(...)(program) returns (an EvaluationResult), or a list of "
            f"(example, prediction, score); got {type(evaluation).__name__}"
        )
    rows = []
    for number, triple in enumerate(triples):
        if not isinstance(triple, Sequence) or isinstance(triple, (str, bytes)) or len(triple) != 3:
            raise TypeError(
                f"result {number} is not an (example, prediction, score) triple as dspy.Evaluate gives; got "
                f"{type(triple).__name__}"
            )
        rows.append(row_of(*triple))
    return rows


def named(names: Iterable[str], taken: set[str], prefix: str) -> dict[str, str]:
    """name → column for each name, prefixed `prefix.` when the bare name is taken; adds the columns to `taken`."""
    columns = {}
    for name in names:
        column = str(name)
        while column in taken:
            column = f"{prefix}.{column}"
        columns[name] = column
        taken.add(column)
    return columns


def score_means(rows: Sequence[Row | Result]) -> dict[str, float]:
    """The mean "score" (absent for no rows) and each named score's mean over the rows that have it
    ("scores/NAME"), failed calls included."""
    named = {
        f"scores/{name}": statistics.fmean(row.scores[name] for row in rows if row.scores and name in row.scores)
        for name in dict.fromkeys(key for row in rows for key in (row.scores or {}))
    }
    return ({"score": statistics.fmean(float(row.score) for row in rows)} if rows else {}) | named


def failure_counts(rows: Sequence[Row | Result]) -> dict[str, int]:
    """How many rows (or Results) failed, by failure kind, in order of first appearance."""
    return dict(Counter(str(row.failure) for row in rows if row.failure))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
