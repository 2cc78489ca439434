"""What crosses between the user's process and a metric worker: to a worker, anything the metric is given
(cloudpickle: what the user's script defines travels by value); from a worker, plain values only (None, bool,
int, float, str, bytes, and lists, tuples, dicts, sets of them), read back by an unpickler that refuses every
class, so nothing a metric returns can run code in the user's process. A value that is not plain arrives as its
repr."""

from __future__ import annotations

import io
import math
import pickle
import re
from contextlib import suppress
from dataclasses import dataclass, fields, replace
from typing import Any

from ..contract import CUT_MARGIN, check_return
from ..errors import ContractViolation
from ..types import Failure, MetricInfo, Outcome, Result
from ..values import shorten

PROTOCOL = 5
MAX_DEPTH = 20
MAX_ITEMS = 100_000  # values in one message (containers and scalars alike); past it a container is cut with a note
MAX_CHARS = 16_000_000  # characters of str and bytes values in one message; past it a text is cut with a note
MAX_REPR = 10_000
MAX_MESSAGE = 64 * 2**20  # bytes of one message from a worker: its own stay well below it (the bounds above)
CUT_KEY = "[not sent]"  # the key a dict cut short by MAX_ITEMS holds, saying how many items were left out
_SCALARS = (type(None), bool, int, float, str, bytes)


def to_worker(message: Any) -> bytes:
    """A message for a worker; user values are pickled by value where pickle would need the user's script.

    Plain pickle first (a third of cloudpickle's time for a call's plain values); cloudpickle for what it cannot
    send, or sends by a reference to `__main__` (a notebook's or script's class), which the worker cannot follow.
    """
    with suppress(Exception):  # a lambda, a local class: cloudpickle sends them by value
        data = pickle.dumps(message, protocol=PROTOCOL)
        if b"__main__" not in data:
            return data
    import cloudpickle

    by_value: bytes = cloudpickle.dumps(message, protocol=PROTOCOL)
    return by_value


def to_parent(message: Any) -> bytes:
    """A message from a worker: plain values only (see to_plain)."""
    return pickle.dumps(message, protocol=PROTOCOL)


def from_parent(data: bytes) -> Any:
    """A message read from the user's process (trusted: it is where the metric was loaded from)."""
    return pickle.loads(data)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a metric worker sent {module}.{name}; only plain values are accepted")


def from_worker(data: bytes) -> Any:
    """A message read from a worker, refusing anything but plain values."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def to_plain(value: Any) -> Any:
    """`value` made of plain values only, each container rebuilt, anything else its repr: at most MAX_ITEMS values
    and MAX_CHARS characters however it shares its parts (a million references to one string)."""
    return _plain(value, 0, _Budget())


@dataclass(slots=True)
class _Budget:
    items: int = MAX_ITEMS
    chars: int = MAX_CHARS


def _plain(value: Any, depth: int, budget: _Budget) -> Any:
    kind = type(value)
    budget.items -= 1
    if kind is str or kind is bytes:
        return _cut_text(value, budget)
    if kind in _SCALARS:
        return value
    if depth >= MAX_DEPTH or budget.items < 0:
        if kind in (list, tuple, dict, set, frozenset):  # a note, not a repr: a repr walks what sharing hides
            why = f"nested more than {MAX_DEPTH} levels deep" if depth >= MAX_DEPTH else "not sent"
            return f"[a {kind.__name__} of {len(value)} items, {why}]"
        return _cut_text(shorten(value, MAX_REPR), budget)
    if kind in (list, tuple, dict, set, frozenset):
        return _container(value, kind, depth, budget)
    return _scalar_like(value, kind, depth, budget)


def _container(value: Any, kind: type, depth: int, budget: _Budget) -> Any:
    """A list, tuple, dict or set rebuilt of plain values."""
    if kind is dict:
        plain: dict[Any, Any] = {}
        for key, item in dict.items(value):
            if budget.items <= 0:
                plain[CUT_KEY] = f"{dict.__len__(value) - len(plain)} more items"
                break
            plain[_key(key)] = _plain(item, depth + 1, budget)
        return plain
    items = _items(value, depth, budget)
    if kind is list:
        return items
    try:
        return kind(items)
    except TypeError:  # a set's item became unhashable (a repr is a str, so this is rare)
        return items


def _scalar_like(value: Any, kind: type, depth: int, budget: _Budget) -> Any:
    """A subclass of a plain type as its base value (np.float64 is a float), a numpy scalar as its item, anything
    else as its repr."""
    for base in (bool, int, float, str, bytes):
        if isinstance(value, base):
            try:
                converted = base(value)  # type: ignore[arg-type]  # value is an instance of base
            except Exception:
                break
            return _cut_text(converted, budget) if base in (str, bytes) else converted
    if kind.__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        with suppress(Exception):
            return _plain(value.item(), depth + 1, budget)
    return _cut_text(shorten(value, MAX_REPR), budget)


def _items(values: Any, depth: int, budget: _Budget) -> list[Any]:
    """The items of a list, tuple or set, made plain; cut with a note once the budget is spent."""
    plain: list[Any] = []
    for item in values:
        if budget.items <= 0:
            plain.append(f"[{len(values) - len(plain)} more items not sent]")
            break
        plain.append(_plain(item, depth + 1, budget))
    return plain


def _cut_text(text: Any, budget: _Budget) -> Any:
    """`text` (a str or bytes), cut with a note when the message's characters are spent."""
    size = len(text)
    if size <= budget.chars:
        budget.chars -= size
        return text
    keep, budget.chars = budget.chars, 0
    note = f"[cut: it had {size:,} characters]"
    return text[:keep] + (note if isinstance(text, str) else note.encode())


def _key(key: Any) -> Any:
    if type(key) in _SCALARS or (type(key) is tuple and all(type(item) in _SCALARS for item in key)):
        return key
    return shorten(key, 200)


# -- outcomes and facts, as plain dicts -------------------------------------------------------------


def outcome_to_plain(outcome: Outcome) -> Any:
    """The outcome as plain values: a bare result (a score and its feedback, as most calls return) as the pair
    (score, feedback), anything else as a dict of every field."""
    result = outcome.result
    if result is not None and result.scores is None and not result.extra and outcome == Outcome(result=result):
        return result.score, result.feedback
    return {
        "result": None if result is None else {
            "score": float(result.score),
            "feedback": str(result.feedback),
            "scores": None if result.scores is None else {str(k): float(v) for k, v in result.scores.items()},
            "extra": to_plain(result.extra),
        },
        "failure": None if outcome.failure is None else str(outcome.failure),
        "detail": outcome.detail,
        "rule": outcome.rule,
        "error_type": outcome.error_type,
        "judge_problem": None if outcome.judge_problem is None else str(outcome.judge_problem),
        "judge_detail": outcome.judge_detail,
        "output": outcome.output,
    }


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_RULE = re.compile(r"[A-Za-z0-9 ]{1,64}")  # the shape of every rule in contract.py
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # an exception class name (or "fork")


def _name(value: Any, shape: re.Pattern[str]) -> str | None:
    """`value` when it is a str of the given shape, else None (a metric may write its own replies)."""
    return value if isinstance(value, str) and shape.fullmatch(value) else None


def outcome_from_plain(data: Any, feedback_limit: int) -> Outcome:
    """An Outcome from a worker's plain dict, every field type-checked and its result checked against the contract
    again, here (a metric may write its own replies; a Ray node's outcome is checked by its node and again here)."""
    if type(data) is tuple and len(data) == 2:  # a bare result (outcome_to_plain)
        data = {"result": {"score": data[0], "feedback": data[1]}}
    if not isinstance(data, dict):
        return Outcome(failure=Failure.CRASHED, detail="the metric's worker sent a malformed reply")
    failure, output, result = _failure(data.get("failure")), _text(data.get("output")), None
    if failure is None:
        raw = data.get("result")
        if not isinstance(raw, dict):
            return Outcome(failure=Failure.CRASHED, detail="the metric's worker sent neither a result nor a failure")
        try:
            result = _result(raw, feedback_limit + CUT_MARGIN)
        except ContractViolation as violation:
            return Outcome(failure=Failure.INVALID, rule=violation.rule, detail=str(violation))
        if output is not None:
            result = replace(result, output=output)
    return Outcome(
        result=result,
        failure=failure,
        detail=_text(data.get("detail")),
        rule=_name(data.get("rule"), _RULE),  # both reach the optimizer in the neutral feedback: shape-checked
        error_type=_name(data.get("error_type"), _TYPE_NAME),
        judge_problem=_failure(data.get("judge_problem")),
        judge_detail=_text(data.get("judge_detail")),
        output=output,
    )


def _result(raw: dict[str, Any], limit: int) -> Result:
    score, feedback, scores, extra = raw.get("score"), raw.get("feedback"), raw.get("scores"), raw.get("extra")
    if type(score) is float and math.isfinite(score) and type(feedback) is str and len(feedback) <= limit and (
        scores is None and not extra
    ):  # a bare (score, {"feedback": ...}): nothing could fail (saves ~10 µs a call, `make bench` row 6)
        return Result(score=score, feedback=feedback)
    info = {**to_plain(extra), "feedback": feedback} if isinstance(extra, dict) else {"feedback": feedback}
    if scores is not None:
        info["scores"] = scores
    return check_return((score, info), limit)  # extra made plain again above: sharing may hide bulk


def _failure(value: Any) -> Failure | None:
    try:
        return Failure(value) if isinstance(value, str) else None
    except ValueError:
        return Failure.CRASHED


def info_to_plain(info: MetricInfo) -> dict[str, Any]:
    return {field.name: to_plain(getattr(info, field.name)) for field in fields(info)}


def info_from_plain(data: dict[str, Any]) -> MetricInfo:
    spec = data.get("reward_spec")
    return MetricInfo(
        name=str(data.get("name") or "metric"),
        label=str(data.get("label") or data.get("name") or "metric"),
        takes_expected=bool(data.get("takes_expected")),
        reward_spec=spec if isinstance(spec, dict) else None,
        uses_measurement=bool(data.get("uses_measurement")),
        file=_text(data.get("file")),
        hint=_text(data.get("hint")),
        is_async=data.get("is_async") is True,
    )
