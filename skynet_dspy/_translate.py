"""DSPy ↔ Skynet values (SPEC §3): dspy.Example / dspy.Prediction → plain input, output, expected."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

# Fields DSPy modules add to a prediction that are not the program's answer.
BOOKKEEPING_FIELDS = frozenset({"reasoning", "trajectory"})
_IMMUTABLE = (str, int, float, bool, bytes, type(None), complex)


class MissingOutputField(LookupError):
    """The prediction lacks an output column the user named."""


def detach(value: Any) -> Any:
    """A copy of `value` the metric may change without touching the dataset or prediction."""
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, dict):
        return {key: detach(item) for key, item in value.items()}
    if isinstance(value, list):
        return [detach(item) for item in value]
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


def _fields(record: Any) -> dict[str, Any]:
    """The user fields of an Example/Prediction (DSPy's own dspy_* keys left out)."""
    store = getattr(record, "_store", None)
    if store is None:
        store = dict(record)
    return {key: value for key, value in store.items() if not key.startswith("dspy_")}


def example_input(example: Any) -> dict[str, Any]:
    """`input`: the example's input fields as a plain dict."""
    keys = getattr(example, "_input_keys", None)
    if keys is None:
        raise ValueError(
            "the dspy.Example has no input fields marked; call example.with_inputs('field', ...) on the dataset"
        )
    return {key: detach(value) for key, value in _fields(example).items() if key in keys}


def example_expected(example: Any) -> dict[str, Any] | None:
    """`expected`: the example's label fields as a plain dict, or None when it has none."""
    keys = getattr(example, "_input_keys", None) or ()
    labels = {key: detach(value) for key, value in _fields(example).items() if key not in keys}
    return labels or None


def output_columns(prediction: Any, columns: Sequence[str] | None = None) -> dict[str, Any]:
    """The prediction's output columns: the ones named, or every field but DSPy's bookkeeping."""
    fields = _fields(prediction)
    if columns is None:
        return {key: value for key, value in fields.items() if key not in BOOKKEEPING_FIELDS}
    missing = [name for name in columns if name not in fields]
    if missing:
        raise MissingOutputField(
            f"the prediction has no field {', '.join(repr(name) for name in missing)} "
            f"(fields present: {', '.join(fields) or 'none'}); the program must produce every output column "
            "named in output_fields"
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
    """`output`: what the metric sees for a prediction."""
    if to_output is not None:
        return detach(to_output(prediction))
    return detach(collapse(output_columns(prediction, columns)))


def perfect_output(expected: dict[str, Any] | None, columns: Sequence[str] | None = None) -> Any:
    """The output a perfect program would give: the expected values, shaped like a real output."""
    if not expected:
        return None
    if columns is not None:
        expected = {name: expected[name] for name in columns if name in expected}
    return detach(collapse(expected))
