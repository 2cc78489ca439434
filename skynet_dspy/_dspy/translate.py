"""DSPy ↔ Skynet values: dspy.Example / dspy.Prediction → plain input, output, expected.

The rules: docs/contract.md#what-the-metric-sees.

Everything handed to a metric is detached: plain dicts, lists and copies, so nothing the metric
does to its arguments reaches the dataset or the prediction, and no dspy.Example or
dspy.Prediction ever reaches it. DSPy's public Example API is used (items(), inputs() but for a plain Example,
whose input keys hooks.py reads).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dspy.primitives.example import Example

from .._core.values import closest
from . import hooks

# Fields DSPy modules add to a prediction that are not the program's answer.
BOOKKEEPING_FIELDS = frozenset({"reasoning", "trajectory"})
_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None), complex})


class MissingOutputField(LookupError):
    """The prediction lacks an output column the user named; the message names it and the fields present."""

    def __init__(self, missing: list[str], present: list[str]):
        self.missing = missing
        self.present = present
        names = ", ".join(repr(name) for name in missing)
        guess = closest(missing[0], present) if present else None
        hint = f" (did you mean {guess!r}?)" if guess else ""
        super().__init__(
            f"the prediction has no field {names}{hint}; fields present: {', '.join(present) or 'none'}. The program "
            "must produce every output column named in output_fields"
        )


def detach(value: Any) -> Any:
    """A copy of `value` the metric may change without touching the dataset or prediction.

    Nested dspy.Example / dspy.Prediction values become plain dicts of their fields.
    """
    if type(value) in _IMMUTABLE:
        return value
    if isinstance(value, dict):
        return {key: detach(item) for key, item in value.items()}
    if isinstance(value, list):
        return [detach(item) for item in value]
    if type(value) is tuple:
        return tuple(detach(item) for item in value)
    if isinstance(value, Example):  # a dspy.Example or dspy.Prediction nested in a field
        return {key: detach(item) for key, item in value.items()}
    try:
        return copy.deepcopy(value)
    except Exception:
        return value  # an object that cannot be copied is handed over as it is


def split_example(
    example: Any, fields: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(`input`, `expected`) of a dspy.Example: its input fields, and its label fields or None (`fields`: its fields
    as fields_of() gave them, when the caller has them already)."""
    # a plain Example's fields are read directly: inputs() builds a new Example on every metric call
    keys = hooks.example_input_keys(example) if type(example) is Example else _input_keys(example)
    if keys is None:
        raise ValueError(
            "the dspy.Example has no input fields marked; call example.with_inputs('field', ...) on the dataset"
        )
    input_values: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    for key, value in (fields if fields is not None else fields_of(example)).items():
        (input_values if key in keys else labels)[key] = detach(value)
    return input_values, (labels or None)


def _input_keys(example: Any) -> Any:
    try:
        return example.inputs().keys()
    except ValueError:
        return None


def fields_of(record: Any) -> dict[str, Any]:
    """The user fields of an Example/Prediction or a mapping (DSPy's own dspy_* fields left out)."""
    if isinstance(record, Example):
        return dict(record.items())
    return dict(record)


def is_record(prediction: Any) -> bool:
    """Whether the program's return value is read field by field (a Prediction, an Example, a mapping)."""
    return isinstance(prediction, (Example, Mapping))


def _collapsed(columns: dict[str, Any]) -> Any:
    """One column → its bare value; several → a dict of them."""
    return next(iter(columns.values())) if len(columns) == 1 else columns


def prediction_output(
    prediction: Any,
    columns: Sequence[str] | None = None,
    to_output: Callable[[Any], Any] | None = None,
    fields: Mapping[str, Any] | None = None,
) -> Any:
    """`output`: what the metric sees for what the program returned (docs/contract.md#what-the-metric-sees): a
    Prediction's (Example's, mapping's) output columns, anything else (a str, a Pydantic object) as it is
    (`fields`: the record's fields as fields_of() gave them, when the caller has them already)."""
    if to_output is not None:
        return detach(to_output(prediction))
    if not is_record(prediction):
        return detach(prediction)
    if fields is None:
        fields = fields_of(prediction)
    if columns is None:
        fields = {key: value for key, value in fields.items() if key not in BOOKKEEPING_FIELDS}
        return {} if not fields else detach(_collapsed(fields))
    missing = [name for name in columns if name not in fields]
    if missing:
        raise MissingOutputField(missing, list(fields))
    return detach(_collapsed({name: fields[name] for name in columns}))


def perfect_output(expected: dict[str, Any] | None, columns: Sequence[str] | None = None) -> Any:
    """The output a perfect program would give: the expected values, shaped like a real output."""
    if not expected:
        return None
    if columns is not None:
        labelled = {name: expected[name] for name in columns if name in expected}
        if not labelled:
            return None
        # shaped as prediction_output shapes it: several named columns give a dict, even when some are unlabelled
        return detach(_collapsed(labelled) if len(columns) == 1 else labelled)
    return detach(_collapsed(expected))
