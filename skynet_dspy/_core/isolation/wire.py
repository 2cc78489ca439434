"""What crosses between the user's process and a metric worker, and how.

To a worker: anything the metric is given, pickled with cloudpickle (a class or function defined in the
user's script or notebook travels by value, so the worker never has to import the user's script).
From a worker: plain values only (None, bool, int, float, str, bytes, and lists, tuples, dicts, sets of
them), read back by an unpickler that refuses every class: nothing a metric returns can run code in the
user's process. A value that is not plain arrives as its repr.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from ..types import Failure, MetricInfo, Outcome, Result
from ..values import shorten

PROTOCOL = 5
MAX_DEPTH = 20
MAX_ITEMS = 100_000
MAX_REPR = 10_000
_SCALARS = (type(None), bool, int, float, str, bytes)


def to_worker(message: Any) -> bytes:
    """A message for a worker; user values are pickled by value where pickle would need the user's script."""
    import cloudpickle

    return cloudpickle.dumps(message, protocol=PROTOCOL)


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
    """`value` made of plain values only, each container rebuilt; anything else becomes its repr (bounded)."""
    budget = [MAX_ITEMS]
    return _plain(value, 0, budget)


def _plain(value: Any, depth: int, budget: list[int]) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    budget[0] -= 1
    if depth >= MAX_DEPTH or budget[0] < 0:
        return shorten(value, MAX_REPR)
    if kind is list:
        return [_plain(item, depth + 1, budget) for item in value]
    if kind is tuple:
        return tuple(_plain(item, depth + 1, budget) for item in value)
    if kind is dict:
        return {_key(key): _plain(item, depth + 1, budget) for key, item in dict.items(value)}
    if kind in (set, frozenset):
        items = [_plain(item, depth + 1, budget) for item in value]
        try:
            return kind(items)
        except TypeError:  # an item became unhashable (a repr is a str, so this is rare)
            return items
    for base in (bool, int, float, str, bytes):  # a subclass travels as its base value (np.float64 is a float)
        if isinstance(value, base):
            try:
                return base(value)
            except Exception:
                break
    if kind.__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        try:
            return _plain(value.item(), depth + 1, budget)
        except Exception:
            pass
    return shorten(value, MAX_REPR)


def _key(key: Any) -> Any:
    if type(key) in _SCALARS:
        return key
    if type(key) is tuple and all(type(item) in _SCALARS for item in key):
        return key
    return shorten(key, 200)


# -- outcomes and facts, as plain dicts -------------------------------------------------------------


def outcome_to_plain(outcome: Outcome) -> dict[str, Any]:
    result = outcome.result
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
    }


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def outcome_from_plain(data: Any) -> Outcome:
    """An Outcome from a worker's plain dict, every field type-checked (a worker is not trusted)."""
    if not isinstance(data, dict):
        return Outcome(failure=Failure.CRASHED, detail="the metric's worker sent a malformed reply")
    raw = data.get("result")
    result = None
    if isinstance(raw, dict):
        scores = raw.get("scores")
        extra = raw.get("extra")
        try:
            result = Result(
                score=float(raw["score"]),
                feedback=str(raw["feedback"]) if isinstance(raw.get("feedback"), str) else "",
                scores={str(k): float(v) for k, v in scores.items()} if isinstance(scores, dict) else None,
                extra=extra if isinstance(extra, dict) else {},
            )
        except (KeyError, TypeError, ValueError):
            return Outcome(failure=Failure.CRASHED, detail="the metric's worker sent a malformed result")
    failure = _failure(data.get("failure"))
    if result is None and failure is None:
        return Outcome(failure=Failure.CRASHED, detail="the metric's worker sent neither a result nor a failure")
    return Outcome(
        result=result if failure is None else None,
        failure=failure,
        detail=_text(data.get("detail")),
        rule=_text(data.get("rule")),
        error_type=_text(data.get("error_type")),
        judge_problem=_failure(data.get("judge_problem")),
        judge_detail=_text(data.get("judge_detail")),
    )


def _failure(value: Any) -> Failure | None:
    try:
        return Failure(value) if isinstance(value, str) else None
    except ValueError:
        return Failure.CRASHED


def info_to_plain(info: MetricInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "label": info.label,
        "takes_expected": info.takes_expected,
        "reward_spec": to_plain(info.reward_spec),
        "uses_measurement": info.uses_measurement,
        "file": info.file,
        "hint": info.hint,
    }


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
    )
