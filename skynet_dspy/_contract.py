"""The metric contract of SPEC §2: what `score` must return, and the result it becomes."""

from __future__ import annotations

import math
import numbers
import reprlib
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 600.0
DEFAULT_FEEDBACK_LIMIT = 20_000

# Kinds of failure a metric call can end in; `None` on a Result means it scored normally.
EXCEPTION, TIMEOUT, INVALID, MISSING_FIELD, OVERLOADED = (
    "exception",
    "timeout",
    "invalid",
    "missing_field",
    "overloaded",
)


class ContractViolation(ValueError):
    """A metric's return value broke a rule of SPEC §2; `rule` names it, the message shows the value."""

    def __init__(self, rule: str, value: Any):
        self.rule = rule
        super().__init__(f"{rule}; the metric returned {shorten(value)}")


@dataclass(frozen=True, slots=True)
class Result:
    """One metric call, validated: what the optimizer may see (score, feedback, scores) and the rest.

    `extra` holds side-information keys other than feedback/scores: kept for the user, never
    shown to an optimizer. `failure` is the kind of failure (see the constants above) or None.
    """

    score: float
    feedback: str
    scores: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


_repr = reprlib.Repr()
_repr.maxstring = 120
_repr.maxother = 120
_repr.maxlong = 60


def shorten(value: Any, limit: int = 200) -> str:
    """A repr of `value` fit for an error message: bounded in length, and never raising."""
    try:
        text = _repr.repr(value)
    except Exception as exc:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_number(value: Any) -> float | None:
    """`value` as a float when it is a real number per SPEC §2 (int, float, bool, NumPy real), else None."""
    if isinstance(value, (str, bytes)):
        return None
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except Exception:
            return None
    dtype = getattr(value, "dtype", None)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and dtype is not None:
        if dtype.kind in "biuf":
            return float(value)
    return None


def _finite(number: float, what: str, value: Any) -> float:
    if math.isnan(number):
        raise ContractViolation(f"{what} is NaN (not a number); return a finite number", value)
    if math.isinf(number):
        raise ContractViolation(f"{what} is infinite; return a finite number", value)
    return number


def validate_return(value: Any, *, feedback_limit: int = DEFAULT_FEEDBACK_LIMIT) -> Result:
    """Check one return value of `score` against SPEC §2 and turn it into a Result.

    Raises ContractViolation naming the broken rule. Feedback longer than `feedback_limit`
    is cut, with a note saying so.
    """
    if not isinstance(value, (tuple, list)):
        if as_number(value) is not None:
            raise ContractViolation(
                "no side information: return a pair (score, {'feedback': '...'}), not a bare score", value
            )
        raise ContractViolation("the return value is not a (score, {'feedback': ...}) pair", value)
    if len(value) != 2:
        raise ContractViolation(
            f"the return value has {len(value)} items; return exactly two: (score, {{'feedback': '...'}})",
            value,
        )
    raw_score, info = value
    if isinstance(raw_score, str):
        raise ContractViolation("the score is a string; return a number such as 0.8, not '0.8'", value)
    number = as_number(raw_score)
    if number is None:
        raise ContractViolation(f"the score is not a number (it is a {type(raw_score).__name__})", value)
    number = _finite(number, "the score", value)
    if not isinstance(info, dict):
        raise ContractViolation(
            f"side information is not a dict (it is a {type(info).__name__}); "
            "return {'feedback': '...'} as the second item",
            value,
        )
    if "feedback" not in info or not isinstance(info["feedback"], str):
        found = "missing" if "feedback" not in info else f"a {type(info['feedback']).__name__}"
        raise ContractViolation(f"no feedback string: side information needs 'feedback' as a str ({found})", value)
    scores = _validate_named_scores(info.get("scores"), value) if "scores" in info else None
    extra = {key: item for key, item in info.items() if key not in ("feedback", "scores")}
    return Result(number, cut_feedback(info["feedback"], feedback_limit), scores, extra)


def _validate_named_scores(scores: Any, value: Any) -> dict[str, float] | None:
    if scores is None:
        return None
    if not isinstance(scores, dict):
        raise ContractViolation(
            f"'scores' is not a dict (it is a {type(scores).__name__}); map names to numbers", value
        )
    checked: dict[str, float] = {}
    for name, item in scores.items():
        if not isinstance(name, str):
            raise ContractViolation(f"a named score's name is not a string ({shorten(name, 40)})", value)
        number = as_number(item)
        if number is None:
            raise ContractViolation(
                f"a named score is not a number: scores[{name!r}] is {shorten(item, 60)}", value
            )
        checked[name] = _finite(number, f"the named score {name!r}", value)
    return checked


def cut_feedback(text: str, limit: int = DEFAULT_FEEDBACK_LIMIT) -> str:
    """`text`, cut to at most `limit` characters with a note saying so, when it is longer."""
    if len(text) <= limit:
        return text
    note = f"\n[feedback cut: {len(text)} characters, over the limit of {limit}]"
    return text[: max(0, limit - len(note))] + note[: limit]


def check_timeout(timeout: float) -> float:
    """The timeout in seconds, when it lies in (0, 600]; a clear ValueError otherwise."""
    number = as_number(timeout)
    if number is None or not (0 < number <= MAX_TIMEOUT):
        raise ValueError(
            f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {shorten(timeout)}; "
            f"the default is {DEFAULT_TIMEOUT:g}"
        )
    return number


def check_feedback_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 100:
        raise ValueError(f"feedback_limit must be an int of at least 100 characters, got {shorten(limit)}")
    return limit
