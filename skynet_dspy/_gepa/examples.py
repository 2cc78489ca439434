"""Plain GEPA's examples: flat rows split by column roles, each example checked up front, and GEPA's data loaders."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dspy.primitives.example import Example

from .._core.values import shorten
from .._dspy import translate


def split_row(
    row: Mapping[str, Any], inputs: Sequence[str] | str, outputs: Sequence[str] | str | None = None
) -> dict[str, Any]:
    """Split a flat row into an example by column roles: {"input": {...}, "expected": {...} | None}.

    Args:
        row: The row, a dict of columns.
        inputs: The columns `run` gets (one name or a list).
        outputs: The label columns the metric gets as `expected` (None: `expected` is None).

    Returns:
        The example, {"input": {...}, "expected": {...} | None}, its values copied.

    Raises:
        ValueError: A column named but absent from the row, or named in both roles.
        TypeError: The row is not a dict.
    """
    if not isinstance(row, Mapping):
        raise TypeError(f"split_row() takes a row as a dict of columns, got {type(row).__name__}")
    input_names = _column_names(inputs, "inputs")
    output_names = _column_names(outputs, "outputs") if outputs is not None else []
    if not input_names:
        raise ValueError("split_row() needs at least one input column: inputs=['question', ...]")
    both = [name for name in input_names if name in output_names]
    if both:
        raise ValueError(f"column(s) {', '.join(map(repr, both))} are named in both inputs and outputs; pick one role")
    missing = [name for name in [*input_names, *output_names] if name not in row]
    if missing:
        present = ", ".join(map(repr, row)) or "none"
        raise ValueError(
            f"the row has no column {', '.join(map(repr, missing))} (columns present: {present}); "
            "fix inputs=/outputs= or the data"
        )
    expected = {name: translate.detach(row[name]) for name in output_names}
    return {"input": {name: translate.detach(row[name]) for name in input_names}, "expected": expected or None}


def _column_names(names: Sequence[str] | str, role: str) -> list[str]:
    if isinstance(names, str):
        return [names]
    if not isinstance(names, Sequence) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"{role}= takes a list of column names, got {shorten(names)}")
    return list(names)


def as_example(item: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(input, expected) of one example: a split dict {"input", "expected"} or a dspy.Example."""
    if isinstance(item, Example):
        return translate.split_example(item)
    if isinstance(item, Mapping):
        if "input" not in item:
            raise ValueError(
                f"an example dict needs an 'input' key (and optionally 'expected'); got keys "
                f"{', '.join(map(repr, item)) or 'none'}. Split flat rows with "
                "skynet_dspy.split_row(row, inputs=[...], outputs=[...])"
            )
        extra = [key for key in item if key not in ("input", "expected")]
        if extra:
            raise ValueError(
                f"an example dict holds only 'input' and 'expected'; it also has {', '.join(map(repr, extra))}. "
                "Put label fields inside 'expected'"
            )
        input_values, expected = item["input"], item.get("expected")
        if not isinstance(input_values, Mapping):
            raise TypeError(f"an example's 'input' must be a dict of input fields, got {shorten(input_values)}")
        if expected is not None and not isinstance(expected, Mapping):
            raise TypeError(f"an example's 'expected' must be a dict of label fields or None, got {shorten(expected)}")
        return dict(input_values), (dict(expected) if expected is not None else None)
    raise TypeError(
        f"an example is a dict {{'input': {{...}}, 'expected': {{...}}}} or a dspy.Example, got {type(item).__name__}"
    )


def checked_examples(items: Any, name: str) -> list[dict[str, Any]]:
    """Every example checked up front (so a bad row fails before the run), as plain split dicts."""
    if items is None or isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{name} must be a list of examples, got {type(items).__name__}")
    examples = []
    for number, item in enumerate(items):
        try:
            input_values, expected = as_example(item)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}[{number}]: {exc}") from None
        examples.append({"input": input_values, "expected": expected})
    if not examples:
        raise ValueError(f"{name} is empty; give at least one example")
    return examples


class ExampleLoader:
    """A GEPA data loader over checked examples, by the ids `example_loaders` gives them."""

    def __init__(self, ids: list[int], items: list[dict[str, Any]]):
        self._by_id = dict(zip(ids, items, strict=True))

    def all_ids(self) -> list[int]:
        return list(self._by_id)

    def fetch(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        return [self._by_id[data_id] for data_id in ids]

    def __len__(self) -> int:
        return len(self._by_id)


def example_loaders(train: list[dict[str, Any]], val: list[dict[str, Any]]) -> tuple[ExampleLoader, ExampleLoader]:
    """(train, val) loaders whose ids never name two different examples.

    GEPA's evaluation cache is keyed by (candidate, example id), and gepa 0.1.4 numbers a separate valset
    from 0 like the trainset, so a valset score could be read from an unrelated training example's
    evaluation (gepa-ai/gepa#424). Here the valset keeps its positions as ids, a training example equal to
    a valset one shares its id (one evaluation serves both), and the others are numbered after the valset.
    """
    first_in_val: dict[str | None, int] = {}
    for position, item in enumerate(val):
        first_in_val.setdefault(_content_key(item), position)
    first_in_val.pop(None, None)  # an example that is not plain data shares no id
    train_ids = []
    for position, item in enumerate(train):
        same = first_in_val.pop(_content_key(item), None)  # popped: one training example shares it, no second
        train_ids.append(len(val) + position if same is None else same)
    return ExampleLoader(train_ids, train), ExampleLoader(list(range(len(val))), val)


def _content_key(item: dict[str, Any]) -> str | None:
    """The example's content as text, or None when it is not plain data (such an example shares no id)."""
    try:
        return json.dumps(item, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
