"""DSPy ↔ Skynet values (SPEC §3): dspy.Example / dspy.Prediction → plain input, output, expected.

Everything handed to a metric is detached: plain dicts, lists and copies, so nothing the metric
does to its arguments reaches the dataset or the prediction, and no dspy.Example or
dspy.Prediction ever reaches it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from dspy.primitives.example import Example

# Fields DSPy modules add to a prediction that are not the program's answer.
BOOKKEEPING_FIELDS = frozenset({"reasoning", "trajectory"})
_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None), complex})
_DSPY_PREFIX = "dspy_"


class MissingOutputField(LookupError):
    """The prediction lacks an output column the user named."""


def detach(value: Any) -> Any:
    """A copy of `value` the metric may change without touching the dataset or prediction.

    Nested dspy.Example / dspy.Prediction values become plain dicts of their fields.
    """
    if type(value) in _IMMUTABLE:
        return value
    return _detach_slow(value)


def _detach_slow(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: detach(item) for key, item in value.items()}
    if isinstance(value, list):
        return [detach(item) for item in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(detach(item) for item in value)
    if isinstance(value, Example):  # a dspy.Example or dspy.Prediction nested in a field
        return {key: detach(item) for key, item in value._store.items() if not key.startswith(_DSPY_PREFIX)}
    try:
        return copy.deepcopy(value)
    except Exception:
        return value  # an object that cannot be copied is handed over as it is


def _fields(record: Any) -> dict[str, Any]:
    """The user fields of an Example/Prediction (DSPy's own dspy_* keys left out)."""
    store = getattr(record, "_store", None)
    if store is None:
        store = dict(record)
    return {key: value for key, value in store.items() if not key.startswith(_DSPY_PREFIX)}


def split_example(example: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(`input`, `expected`) of a dspy.Example: its input fields, and its label fields or None."""
    keys = getattr(example, "_input_keys", None)
    if keys is None:
        raise ValueError(
            "the dspy.Example has no input fields marked; call example.with_inputs('field', ...) on the dataset"
        )
    store = getattr(example, "_store", None)
    if store is None:
        store = dict(example)
    inputs: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    for key, value in store.items():
        if key in keys:
            inputs[key] = value if type(value) in _IMMUTABLE else _detach_slow(value)
        elif not key.startswith(_DSPY_PREFIX):
            labels[key] = value if type(value) in _IMMUTABLE else _detach_slow(value)
    return inputs, (labels or None)


def output_columns(prediction: Any, columns: Sequence[str]) -> dict[str, Any]:
    """The prediction's output columns named in `columns`; MissingOutputField when one is absent."""
    fields = _fields(prediction)
    missing = [name for name in columns if name not in fields]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise MissingOutputField(
            f"the prediction has no field {names} (fields present: {', '.join(fields) or 'none'}); "
            "the program must produce every output column named in output_fields"
        )
    return {name: fields[name] for name in columns}


def collapse(columns: dict[str, Any]) -> Any:
    """One column → its bare value; several → a dict of them (SPEC §3)."""
    if len(columns) == 1:
        return next(iter(columns.values()))
    return columns


def prediction_output(
    prediction: Any,
    columns: Sequence[str] | None = None,
    to_output: Callable[[Any], Any] | None = None,
) -> Any:
    """`output`: what the metric sees for a prediction (see SPEC §3)."""
    if to_output is not None:
        return detach(to_output(prediction))
    if columns is None:
        store = getattr(prediction, "_store", None)
        if store is None:
            store = dict(prediction)
        # One pass without building a dict for the commonest case, a single output field.
        found = None
        many: dict[str, Any] | None = None
        for key, value in store.items():
            if key in BOOKKEEPING_FIELDS or key.startswith(_DSPY_PREFIX):
                continue
            if many is not None:
                many[key] = value
            elif found is None:
                found = (key, value)
            else:
                many = {found[0]: found[1], key: value}
        if many is not None:
            return detach(many)
        return {} if found is None else detach(found[1])
    return detach(collapse(output_columns(prediction, columns)))


def perfect_output(expected: dict[str, Any] | None, columns: Sequence[str] | None = None) -> Any:
    """The output a perfect program would give: the expected values, shaped like a real output."""
    if not expected:
        return None
    if columns is not None:
        expected = {name: expected[name] for name in columns if name in expected}
    return detach(collapse(expected))
