"""One row per scored example in plain values, and the column layout every results table shares (a taken name
gets its group's prefix: input.NAME, scores.NAME)."""

from __future__ import annotations

import itertools
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
    detail: str | None = None  # the failure's full message (the user's only; never an optimizer's)
    observation: Observation | None = None
    printed: str | None = None  # what score wrote to stdout/stderr during the call (its first few kB)


@dataclass(frozen=True)
class Layout:
    """Column names for a set of rows: input field → column, named score → column, output fields."""

    inputs: dict[str, str]
    outputs: dict[str, str]  # output field → column ("output" alone when the output is one value)
    expected: dict[str, str]
    scores: dict[str, str]
    measured: bool
    printed: bool = False  # some call printed: a "printed" column

    @property
    def columns(self) -> list[str]:
        """Every column, in table order: inputs, output(s), expected, score, named scores, feedback, failure, run."""
        return [
            *self.inputs.values(), *self.outputs.values(), *self.expected.values(), "score", *self.scores.values(),
            "feedback", "failure", *(MEASURED if self.measured else ()), *(("printed",) if self.printed else ()),
        ]


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
        str(result.failure) if result.failure is not None else "", result.detail, result.observation, result.output,
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


def layout(rows: Sequence[Row], include_expected: bool = False) -> Layout:
    """The columns for `rows`: fixed ones first, then named scores, then inputs; a taken name gets a prefix."""
    taken: set[str] = set(FIXED)
    outputs = _output_columns(rows)
    taken |= set(outputs.values())
    expected: dict[str, str] = {}
    if include_expected:
        expected = {name: f"expected.{name}" for name in _union((row.expected or {}).keys() for row in rows)}
        taken |= set(expected.values())
    scores = named(_union(row.scores.keys() for row in rows), taken, "scores")
    inputs = named(_union(row.inputs.keys() for row in rows), taken, "input")
    measured = any(row.observation is not None and row.observation.measured for row in rows)
    return Layout(inputs, outputs, expected, scores, measured, any(row.printed for row in rows))


def _output_columns(rows: Sequence[Row]) -> dict[str, str]:
    """field → column: "output" alone, or "output.NAME" per field when some output has several fields."""
    dicts = [row.output for row in rows if isinstance(row.output, dict) and row.output]
    if not any(len(output) > 1 for output in dicts):
        return {"": "output"}
    return {name: f"output.{name}" for name in _union(output.keys() for output in dicts)}


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


def values(row: Row, columns: Layout) -> dict[str, Any]:
    """One row's cells, keyed by column (a missing named score or field is None)."""
    cells: dict[str, Any] = {column: row.inputs.get(name) for name, column in columns.inputs.items()}
    if "" in columns.outputs:
        cells["output"] = row.output
    else:
        output = row.output if isinstance(row.output, dict) else {}
        cells.update({column: output.get(name) for name, column in columns.outputs.items()})
    cells.update({column: (row.expected or {}).get(name) for name, column in columns.expected.items()})
    cells["score"] = row.score
    cells.update({column: row.scores.get(name) for name, column in columns.scores.items()})
    cells["feedback"] = row.feedback
    cells["failure"] = row.failure
    if columns.measured:
        run = row.observation if row.observation is not None and row.observation.measured else None
        cells.update({name: getattr(run, name) if run else None for name in MEASURED})
    if columns.printed:
        cells["printed"] = row.printed
    return cells


def score_means(rows: Sequence[Row | Result]) -> dict[str, float]:
    """The mean "score" (absent for no rows) and each named score's mean over the rows that have it
    ("scores/NAME"), failed calls included."""
    named = {
        f"scores/{name}": statistics.fmean(row.scores[name] for row in rows if row.scores and name in row.scores)
        for name in _union((row.scores or {}).keys() for row in rows)
    }
    return ({"score": statistics.fmean(float(row.score) for row in rows)} if rows else {}) | named


def failure_counts(rows: Sequence[Row | Result]) -> dict[str, int]:
    """How many rows (or Results) failed, by failure kind, in order of first appearance."""
    return dict(Counter(str(row.failure) for row in rows if row.failure))


def _union(groups: Iterable[Iterable[str]]) -> list[str]:
    return list(dict.fromkeys(itertools.chain.from_iterable(groups)))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
