"""The metric contract of SPEC §2: what `score` must return, and the result it becomes."""

from __future__ import annotations

import inspect
import math
import numbers
import reprlib
from dataclasses import dataclass, field
from typing import Any

from . import _secrets

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 600.0
DEFAULT_FEEDBACK_LIMIT = 20_000
MIN_FEEDBACK_LIMIT = 100
FEEDBACK_CUT_MARK = "[feedback cut:"

# Kinds of failure a metric call can end in; `None` on a Result means it scored normally.
EXCEPTION, TIMEOUT, INVALID, MISSING_FIELD, OVERLOADED = (
    "exception",
    "timeout",
    "invalid",
    "missing_field",
    "overloaded",
)

_PAIR = "(score, {'feedback': '...'})"


class ContractViolation(ValueError):
    """A metric's return value broke a rule of SPEC §2; `rule` names it, the message shows the value.

    `rule` never holds the value itself (it may reach an optimizer as feedback, and the value may hold
    expected values); the message adds the value, shortened, with known API keys masked.
    """

    def __init__(self, rule: str, value: Any):
        self.rule = rule
        self.value = value
        super().__init__(f"{rule}; score returned {shorten(value)}")


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


class _Repr(reprlib.Repr):
    """reprlib that masks API keys in strings before shortening them, so no fragment of a key survives a cut."""

    def repr_str(self, x: str, level: int) -> str:
        return super().repr_str(_secrets.redact(str.__str__(x)), level)


_repr = _Repr()
_repr.maxstring = 120
_repr.maxother = 120
_repr.maxlong = 60
_repr.maxdict = 8
_repr.maxlist = 8
_repr.maxtuple = 8


def shorten(value: Any, limit: int = 200) -> str:
    """A repr of `value` fit for an error message: bounded in length, and never raising."""
    try:
        text = _repr.repr(value)
    except Exception as exc:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
    text = _secrets.redact(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def a_type(value: Any) -> str:
    """'a str', 'an int', 'None': the type of `value` as an English noun phrase."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def as_number(value: Any) -> float | None:
    """`value` as a float when it is a real number per SPEC §2 (int, float, bool, NumPy real), else None.

    An integer too large for a float becomes ±inf, so it is rejected as infinite rather than as "not a number".
    Never raises, whatever the object's methods do.
    """
    try:
        if isinstance(value, (str, bytes)):
            return None
        if isinstance(value, numbers.Real):
            try:
                return float(value)
            except OverflowError:
                if isinstance(value, numbers.Integral):
                    return math.inf if value > 0 else -math.inf
                return None
        dtype = getattr(value, "dtype", None)  # NumPy bool_ and 0-d arrays are not registered as numbers.Real
        if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and dtype is not None:
            if dtype.kind in "biuf":
                return float(value)
    except Exception:
        return None
    return None


def _finite(number: float, what: str, value: Any) -> float:
    if math.isnan(number):
        raise ContractViolation(f"{what} is NaN: return a finite number (NaN breaks every comparison)", value)
    if math.isinf(number):
        raise ContractViolation(f"{what} is infinite ({number}): return a finite number", value)
    return number


def _not_a_pair(value: Any) -> ContractViolation:
    if as_number(value) is not None:
        return ContractViolation(f"no side information: return a pair {_PAIR}, not a bare score", value)
    if value is None:
        return ContractViolation(
            f"the return value is None, not a pair {_PAIR}: does every path through score() end in a return?",
            value,
        )
    if inspect.isgenerator(value) or inspect.iscoroutine(value):
        try:
            value.close()  # never run to the end: closing it spares the user a "never awaited" warning
        except Exception:
            pass
        if inspect.iscoroutine(value):
            return ContractViolation(
                f"the return value is a coroutine, not a pair {_PAIR}: define score with `def`, not `async def`",
                value,
            )
        return ContractViolation(
            f"the return value is a generator, not a pair {_PAIR}: return a tuple, "
            "not `yield` or a generator expression",
            value,
        )
    return ContractViolation(f"the return value is {a_type(value)}, not a pair {_PAIR}", value)


def validate_return(value: Any, *, feedback_limit: int = DEFAULT_FEEDBACK_LIMIT) -> Result:
    """Check one return value of `score` against SPEC §2 and turn it into a Result.

    Raises ContractViolation naming the broken rule, and nothing else: a value whose own methods
    raise is a violation too. Feedback longer than `feedback_limit` is cut, with a note saying so.
    The Result holds plain values (float, str, dict of str -> float) whatever subclasses came in.
    """
    try:
        return _validate(value, feedback_limit)
    except ContractViolation:
        raise
    except Exception as exc:
        raise ContractViolation(
            f"the return value could not be read: {type(exc).__name__} was raised while looking at it", value
        ) from None


def _validate(value: Any, feedback_limit: int) -> Result:
    # Reads go through the base classes' own methods (tuple.__len__, dict.__getitem__, str.__str__...), so
    # subclasses that override them cannot change what is checked.
    if isinstance(value, tuple):
        size, item = tuple.__len__(value), tuple.__getitem__
    elif isinstance(value, list):
        size, item = list.__len__(value), list.__getitem__
    else:
        raise _not_a_pair(value)
    if size != 2:
        raise ContractViolation(f"the return value has {size} items, not 2: return exactly {_PAIR}", value)
    raw_score, info = item(value, 0), item(value, 1)
    if isinstance(raw_score, str):
        raise ContractViolation("the score is a string: return a number such as 0.8, not the text '0.8'", value)
    number = as_number(raw_score)
    if number is None:
        raise ContractViolation(f"the score is not a number (it is {a_type(raw_score)})", value)
    number = _finite(number, "the score", value)
    if not isinstance(info, dict):
        raise ContractViolation(
            f"side information is not a dict (it is {a_type(info)}): the second item must be {{'feedback': '...'}}",
            value,
        )
    if not dict.__contains__(info, "feedback"):
        raise ContractViolation("no feedback string: the dict has no 'feedback' key; add 'feedback': '...'", value)
    feedback = dict.__getitem__(info, "feedback")
    if not isinstance(feedback, str):
        raise ContractViolation(f"no feedback string: 'feedback' is {a_type(feedback)}, not a str", value)
    has_scores = dict.__contains__(info, "scores")
    scores = _validate_named_scores(dict.__getitem__(info, "scores"), value) if has_scores else None
    extra = {key: entry for key, entry in dict.items(info) if not (_is(key, "feedback") or _is(key, "scores"))}
    # Keys are masked before the cut, which could otherwise leave part of a key that redact() no longer sees.
    text = _secrets.redact(str.__str__(feedback))
    return Result(number, cut_feedback(text, feedback_limit), scores, extra)


def _is(key: Any, name: str) -> bool:
    """`key == name` for dict keys, asked of str itself so a key object's own __eq__ is never run."""
    return isinstance(key, str) and str.__eq__(key, name) is True


def _validate_named_scores(scores: Any, value: Any) -> dict[str, float] | None:
    if scores is None:
        return None
    if not isinstance(scores, dict):
        raise ContractViolation(
            f"'scores' is not a dict (it is {a_type(scores)}): map names to numbers, e.g. {{'format': 1.0}}", value
        )
    checked: dict[str, float] = {}
    for name, entry in dict.items(scores):
        if not isinstance(name, str):
            raise ContractViolation(f"a named score's name is not a string (it is {a_type(name)})", value)
        name = str.__str__(name)
        number = as_number(entry)
        if number is None:
            raise ContractViolation(
                f"a named score is not a number: scores[{shorten(name, 60)}] is {a_type(entry)}", value
            )
        checked[name] = _finite(number, f"the named score {name!r}", value)
    return checked


def cut_feedback(text: str, limit: int = DEFAULT_FEEDBACK_LIMIT) -> str:
    """`text`, cut to at most `limit` characters with a note saying so, when it is longer."""
    if len(text) <= limit:
        return text
    note = f"\n{FEEDBACK_CUT_MARK} it had {len(text):,} characters, over the limit of {limit:,}]"
    return text[: max(0, limit - len(note))] + note[:limit]


def was_cut(feedback: str) -> bool:
    """True when cut_feedback shortened this feedback."""
    return FEEDBACK_CUT_MARK in feedback[-120:]


def check_timeout(timeout: Any) -> float:
    """The timeout in seconds, when it lies in (0, 600]; a clear ValueError otherwise."""
    number = None if isinstance(timeout, bool) else as_number(timeout)
    if number is None or not (0 < number <= MAX_TIMEOUT):
        raise ValueError(
            f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {shorten(timeout)}; "
            f"the default is {DEFAULT_TIMEOUT:g}"
        )
    return number


def check_feedback_limit(limit: Any) -> int:
    """The feedback limit in characters, when it is an int of at least 100; a clear ValueError otherwise."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < MIN_FEEDBACK_LIMIT:
        raise ValueError(
            f"feedback_limit must be a whole number of characters, at least {MIN_FEEDBACK_LIMIT}, "
            f"got {shorten(limit)}; the default is {DEFAULT_FEEDBACK_LIMIT:,}"
        )
    return limit
