"""Score: what a Metric returns to DSPy, a dspy.Prediction for GEPA and a float (the score) for everything else."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import dspy

from .._core.types import Result
from . import hooks


class _NoOutput:
    """The metric was given no output (the prediction could not be read): a Score's `has_output` is False."""

    def __reduce__(self) -> str:
        return "_NO_OUTPUT"


_NO_OUTPUT: Any = _NoOutput()


class Score(dspy.Prediction, float):
    """What the adapter returns to DSPy: `score`, `feedback` and (when the metric named scores) `objective_scores`.

    A dspy.Prediction for GEPA, and a float (the score) everywhere DSPy or the user wants a number:
    sum(), averages, csv and json files, pandas, `f"{s:.2f}"`. A failed call is falsy and never at or
    above a threshold, so BootstrapFewShot never takes it as a demo; a successful call is truthy when its
    score is above zero, or at or above the metric's `success_threshold` when one is set. The full Result
    (extra side-information keys, the failure's detail) is on
    `.result`, and the output the metric was given on `.output`, never among the fields DSPy reads.

    Args:
        result: The Result of the call (or, as dspy.Prediction is built, a score to rebuild one from).
        base: A Score or dspy.Example whose fields it is rebuilt from (dspy.Prediction's copy protocol).
        **fields: Prediction fields to rebuild from: score, feedback, objective_scores.
    """

    _result: Result
    _output: Any = _NO_OUTPUT
    _threshold: float | None = None  # success_threshold: truthy only at or above it (None: above zero)

    def __new__(cls, result: Any = None, base: Any = None, **fields: Any) -> Score:
        return float.__new__(cls, _as_result(result, base, fields).score)

    def __setattr__(self, key: str, value: Any) -> None:
        # its own "_" attributes skip dspy.Example's field lookup
        if key[:1] == "_":
            object.__setattr__(self, key, value)
        else:
            super().__setattr__(key, value)

    def __init__(self, result: Any = None, base: Any = None, **fields: Any):
        result = _as_result(result, base, fields)
        shown: dict[str, Any] = {"score": result.score, "feedback": result.feedback}
        if result.scores:
            shown["objective_scores"] = dict(result.scores)
        hooks.init_prediction(self, shown)
        self._result = result

    @property
    def result(self) -> Result:
        """The metric call in full: score, feedback, named scores, extra keys, failure kind and detail."""
        return self._result

    @property
    def output(self) -> Any:
        """The output the metric was given (the prediction as output_fields / to_output made it); None when the
        metric was given none (`has_output` False: the prediction could not be read, or the Score was rebuilt)."""
        return None if self._output is _NO_OUTPUT else self._output

    @property
    def has_output(self) -> bool:
        """Whether `output` is what the metric was given."""
        return self._output is not _NO_OUTPUT

    def _with(self, output: Any, threshold: float | None) -> Score:
        """This Score, with the output the metric was given (_NO_OUTPUT: none) and its success threshold (None:
        above zero); set by Metric.__call__."""
        self._output = output
        if threshold is not None:
            self._threshold = threshold
        return self

    @property
    def ok(self) -> bool:
        return self._result.ok

    def __bool__(self) -> bool:
        if not self._result.ok:
            return False
        if self._threshold is None:
            return self._result.score > 0
        return self._result.score >= self._threshold

    def __ge__(self, other: object) -> bool:
        return self._result.ok and float(self) >= _number(other)

    def __gt__(self, other: object) -> bool:
        return self._result.ok and float(self) > _number(other)

    def __le__(self, other: object) -> bool:
        return float(self) <= _number(other)

    def __lt__(self, other: object) -> bool:
        return float(self) < _number(other)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dspy.Example) and not isinstance(other, float):
            return bool(dspy.Example.__eq__(self, other))
        return float.__eq__(float(self), other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = float.__hash__

    def __float__(self) -> float:
        return self._result.score

    # csv.writer and Evaluate's table write repr() of a float: a Score is written as its number
    def __repr__(self) -> str:
        return float.__repr__(self)

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy.copy (the same Result, the same output)
        return (_rebuilt, (self._result, self._output, self._threshold))

    def __deepcopy__(self, memo: dict[int, Any]) -> Score:  # _NO_OUTPUT is copied as itself (its __reduce__)
        return Score(self._result.copy())._with(copy.deepcopy(self._output, memo), self._threshold)


def _rebuilt(result: Result, output: Any, threshold: float | None = None) -> Score:
    """A Score from its pickled parts."""
    return Score(result)._with(output, threshold)


def _number(other: object) -> float:
    return float(other)  # type: ignore[arg-type]


def _as_result(result: Any, base: Any, fields: Mapping[str, Any]) -> Result:
    """The Result a Score is built on: given, or rebuilt from Prediction-style arguments (copy(), Score(0.5))."""
    if isinstance(result, Result):
        return result
    previous = base.result if isinstance(base, Score) else None
    values = dict(base.items()) if isinstance(base, dspy.Example) else dict(base or {})
    values.update(fields)
    if result is not None:
        values.setdefault("score", result)
    scores = values.get("objective_scores")
    return Result(
        score=float(values.get("score", 0.0)),
        feedback=str(values.get("feedback") or ""),
        scores=dict(scores) if scores else None,
        extra=dict(previous.extra) if previous is not None else {},
        failure=previous.failure if previous is not None else None,
        detail=previous.detail if previous is not None else None,
        observation=previous.observation if previous is not None else None,
    )
