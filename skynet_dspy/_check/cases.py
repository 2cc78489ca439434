"""The cases a contract check runs the metric on: dspy.Examples, {"input", "output", "expected"} dicts, or flat
rows whose input fields are named (`inputs=`), from a list or a JSONL file.
"""

from __future__ import annotations

import itertools
import json
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.errors import DataError
from .._core.values import shorten

CASES_CHECKED = 3
CASE_KEYS = ("input", "output", "expected")
MAX_DATA_BYTES = 512 * 2**20  # a data file larger than this is refused (an endless file, a device)
MAX_DEPTH = 100  # levels of lists and dicts a case may nest: deeper data would overflow Python's stack later


@dataclass(frozen=True)
class Case:
    """One case, checked: its input, expected values (or None) and output (when it gives one)."""

    input: dict[str, Any]
    expected: dict[str, Any] | None
    output: Any
    has_output: bool


def parse_case(example: Any, inputs: Sequence[str] | None = None) -> Case:
    """A dspy.Example, a case dict, or (with `inputs`) a flat row, checked; a DataError saying what is wrong."""
    import dspy

    from .._dspy.translate import split_example

    if isinstance(example, dspy.Example):
        input_values, expected = split_example(example)
        return Case(input_values, expected, None, False)
    if not isinstance(example, dict):
        raise DataError(
            "each case must be a dspy.Example or a dict {'input': {...}, 'output': ..., 'expected': {...}}; "
            f"got {shorten(example)}"
        )
    if nested_deeper_than(example, MAX_DEPTH):
        raise DataError(
            f"the case nests lists or dicts more than {MAX_DEPTH} levels deep; the metric's input, output and "
            "expected values must be flatter than that"
        )
    if inputs is not None:
        return _flat_row(example, inputs)
    unknown = [str(key) for key in example if key not in CASE_KEYS]
    if unknown:
        raise DataError(
            f"a case has unknown key(s) {', '.join(map(repr, unknown))}; a case holds 'input', and 'output' and/or "
            "'expected' (for flat rows such as {\"ticket\": ..., \"label\": ...}, name the input fields: "
            "--inputs ticket, or inputs=['ticket'])"
        )
    if "input" not in example:
        raise DataError(f"a case has no 'input' (a dict of the example's input fields); got {shorten(example)}")
    if not isinstance(example["input"], dict):
        raise DataError(f"a case's 'input' must be a dict of input fields, got {shorten(example['input'])}")
    expected = example.get("expected")
    if expected is not None and not isinstance(expected, dict):
        raise DataError(f"a case's 'expected' must be a dict keyed by output column, or null; got {shorten(expected)}")
    if "output" not in example and not expected:
        raise DataError(
            f"a case needs an 'output' to score, or 'expected' values to use as the output; got {shorten(example)}"
        )
    return Case(example["input"], expected or None, example.get("output"), "output" in example)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests lists, tuples or dicts more than `limit` levels deep; iterative, so any depth is read."""
    stack = [(value, 1)]
    seen: set[int] = set()  # a value shared (or a cycle) is looked at once
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple)) or id(item) in seen:
            continue
        if depth > limit:
            return True
        seen.add(id(item))
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False


def _flat_row(row: dict[str, Any], inputs: Sequence[str]) -> Case:
    missing = [name for name in inputs if name not in row]
    if missing:
        raise DataError(
            f"the row has no input field {', '.join(map(repr, missing))} (fields present: "
            f"{', '.join(map(repr, row)) or 'none'})"
        )
    expected = {key: value for key, value in row.items() if key not in inputs}
    if not expected:
        raise DataError("the row holds only input fields: nothing to use as the expected values or the output")
    return Case({name: row[name] for name in inputs}, expected, None, False)


def cases(
    examples: Iterable[Any], limit: int | None = CASES_CHECKED, inputs: Sequence[str] | None = None
) -> list[Case]:
    """The first `limit` examples (all of them with None) as checked Cases."""
    if isinstance(examples, (str, bytes, dict)) or not isinstance(examples, Iterable):
        raise TypeError(
            "check_contract() takes a list of cases (dspy.Examples or dicts with 'input', 'output', 'expected'); "
            f"got {type(examples).__name__}"
        )
    chosen = examples if limit is None else itertools.islice(examples, limit)
    found = [parse_case(example, inputs) for example in chosen]
    if not found:
        raise DataError("check_contract() needs at least one case to run the metric on; it got none")
    return found


def read_jsonl(path: Path, inputs: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a JSONL file, each checked as a case; a DataError naming the file and line otherwise."""
    rows = []
    for number, row in read_json_lines(path):
        try:
            parse_case(row, inputs)
        except DataError as exc:
            raise DataError(f"{path}, line {number}: {exc}") from None
        rows.append(row)
    if not rows:
        raise DataError(f"the data file {path} holds no cases; write one JSON object per line")
    return rows


def read_json_lines(
    path: Path, what: str = "data file", like: str = '{"input": {...}, "expected": {...}}'
) -> list[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSONL file (the `what`); a DataError naming the file and
    line otherwise, showing a line `like` this. Lines end at '\\n' only; a FIFO, a device or an endless file is
    refused."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise DataError(f"the {what} {path} is a folder; give the path of a .jsonl file")
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"the {what} {path} is not a regular file (a pipe or a device); save it to a file")
        if info.st_size > MAX_DATA_BYTES:
            raise DataError(f"the {what} {path} is over {MAX_DATA_BYTES // 2**20} MB; split it")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_DATA_BYTES + 1)
    except FileNotFoundError:
        raise DataError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise DataError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_DATA_BYTES:
        raise DataError(f"the {what} {path} grew past {MAX_DATA_BYTES // 2**20} MB while it was read")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"the {what} {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path}, line {number}: not valid JSON ({exc.msg}, column {exc.colno}); write one JSON object per "
                f"line, like {like}"
            ) from None
        except RecursionError:
            raise DataError(f"{path}, line {number}: the JSON is nested too deeply to read") from None
    return rows
