"""The metric contract of docs/contract.md#return-value: what `score` must return, and the plain Result it becomes.
A broken rule is a ContractViolation: `rule` a fixed sentence (safe for an optimizer), the message adds the value."""

from __future__ import annotations

import contextlib
import inspect
import math
import re
from dataclasses import replace
from typing import Any

from . import secrets
from .errors import ContractViolation
from .types import Result
from .values import a_type, as_number, seconds, shorten, whole_number

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 600.0
DEFAULT_FEEDBACK_LIMIT = 20_000
MIN_FEEDBACK_LIMIT = 100
MAX_NAMED_SCORES = 32
MAX_SCORE_NAME_LENGTH = 64
FEEDBACK_CUT_MARK = "[feedback cut:"
# Feedback crossing from a worker is cut this far past the limit: the final cut comes after redaction,
# so a key straddling the cut is still masked whole.
CUT_MARGIN = 2_000
_CUT_LENGTH = re.compile(r"it had ([\d,]+) characters")

_PAIR = "(score, {'feedback': '...'})"


def _type_of(value: Any) -> str:
    """The type of `value` in words, naming only builtin and NumPy types (a class the metric defined may
    carry a name it chose, which must not reach an optimizer)."""
    module = type(value).__module__
    return a_type(value) if module in ("builtins", "numpy") else "an object of a class of its own"


def _violation(rule: str, advice: str, value: Any, note: str = "") -> ContractViolation:
    return ContractViolation(rule, value, f"{rule}: {advice}; score returned {shorten(value)}{note}")


def _not_a_pair(value: Any) -> ContractViolation:
    if as_number(value) is not None:
        return _violation("no side information", f"return a pair {_PAIR}, not a bare score", value)
    if value is None:
        return _violation(
            "no return value", f"score returned None, not a pair {_PAIR}: does every path end in a return?", value
        )
    if inspect.isgenerator(value) or inspect.iscoroutine(value):
        with contextlib.suppress(Exception):  # never run to the end: closing it spares a "never awaited" warning
            value.close()
        if inspect.iscoroutine(value):
            return _violation("not a pair", "score returned a coroutine: define it with `def`, not `async def`", value)
        return _violation(
            "not a pair", "score returned a generator: return a tuple, not `yield` or a generator expression", value
        )
    return _violation("not a pair", f"the return value is {_type_of(value)}, not a pair {_PAIR}", value)


def check_return(value: Any, feedback_limit: int = DEFAULT_FEEDBACK_LIMIT) -> Result:
    """One return value of `score` as a Result of plain values (feedback cut to `feedback_limit`, not redacted);
    a ContractViolation, and nothing else, for a value that breaks a rule or whose own methods raise."""
    try:
        return _check(value, feedback_limit)
    except ContractViolation:
        raise
    except Exception as exc:
        raise _violation(
            "unreadable return value", f"{type(exc).__name__} was raised while reading the return value", value
        ) from None


def validate_return(value: Any, *, feedback_limit: int = DEFAULT_FEEDBACK_LIMIT) -> Result:
    """Check a return value of `score` against the contract and give the Result it makes.

    The rules: docs/contract.md#return-value.

    Args:
        value: What `score` returned, e.g. (0.5, {"feedback": "...", "scores": {...}}).
        feedback_limit: Characters of feedback kept: longer is cut, with a note saying so (it is redacted too).

    Returns:
        The Result the return value makes.

    Raises:
        ContractViolation: A ValueError naming the broken rule.
    """
    feedback_limit = check_feedback_limit(feedback_limit)
    result = check_return(value, feedback_limit + CUT_MARGIN)
    return finish_feedback(result, feedback_limit)


def finish_feedback(result: Result, feedback_limit: int) -> Result:
    """`result` with its feedback redacted, then cut to the limit (in that order, so no part of a key survives)."""
    text = cut_feedback(secrets.redact(result.feedback), feedback_limit)
    return result if text == result.feedback else replace(result, feedback=text)


def _check(value: Any, feedback_limit: int) -> Result:
    # Reads go through the base classes' own methods (tuple.__len__, dict.__getitem__, str.__str__...), so
    # subclasses that override them cannot change what is checked.
    if not isinstance(value, (tuple, list)):
        raise _not_a_pair(value)
    pair = tuple(tuple.__iter__(value) if isinstance(value, tuple) else list.__iter__(value))
    if len(pair) != 2:
        raise _violation("not exactly 2 items", f"return exactly {_PAIR}", value, f" ({len(pair)} items)")
    raw_score, info = pair
    if isinstance(raw_score, str):
        raise _violation("score is a string", "return a number such as 0.8, not the text '0.8'", value)
    number = as_number(raw_score)
    if number is None:
        raise _violation("score is not a number", f"the score is {_type_of(raw_score)}", value)
    number = _finite(number, "score", value)
    if not isinstance(info, dict):
        raise _violation(
            "side information is not a dict",
            f"the second item is {_type_of(info)}; it must be {{'feedback': '...'}}",
            value,
        )
    if not dict.__contains__(info, "feedback"):
        raise _violation("no feedback string", "the dict has no 'feedback' key; add 'feedback': '...'", value)
    feedback = dict.__getitem__(info, "feedback")
    if not isinstance(feedback, str):
        raise _violation("no feedback string", f"'feedback' is {_type_of(feedback)}, not a str", value)
    scores = _named_scores(dict.__getitem__(info, "scores"), value) if dict.__contains__(info, "scores") else None
    extra = {key: entry for key, entry in dict.items(info) if not (_is(key, "feedback") or _is(key, "scores"))}
    return Result(number, cut_feedback(str.__str__(feedback), feedback_limit), scores, extra)


def _finite(number: float, what: str, value: Any, name: str | None = None) -> float:
    if math.isfinite(number):
        return number
    where = f" (the score {shorten(name, 70)})" if name is not None else ""
    if math.isnan(number):
        raise _violation(f"{what} is NaN", "return a finite number (NaN breaks every comparison)", value, where)
    raise _violation(f"{what} is infinite", "return a finite number", value, where)


def _is(key: Any, name: str) -> bool:
    return isinstance(key, str) and str.__eq__(key, name) is True


def _named_scores(scores: Any, value: Any) -> dict[str, float] | None:
    if scores is None:
        return None
    if not isinstance(scores, dict):
        raise _violation(
            "scores is not a dict", f"'scores' is {_type_of(scores)}; map names to numbers, e.g. {{'format': 1.0}}",
            value,
        )
    if dict.__len__(scores) > MAX_NAMED_SCORES:
        raise _violation(
            "too many named scores",
            f"'scores' may hold at most {MAX_NAMED_SCORES} names (they reach the optimizer): keep the few that matter",
            value,
            f" ({dict.__len__(scores)} names)",
        )
    checked: dict[str, float] = {}
    for name, entry in dict.items(scores):
        if not isinstance(name, str):
            raise _violation("named score name is not a string", f"a name in 'scores' is {_type_of(name)}", value)
        name = str.__str__(name)
        if len(name) > MAX_SCORE_NAME_LENGTH:
            raise _violation(
                "named score name is too long",
                f"names in 'scores' may have at most {MAX_SCORE_NAME_LENGTH} characters (they reach the optimizer)",
                value,
                f" (a name of {len(name)} characters)",
            )
        number = as_number(entry)
        if number is None:
            raise _violation(
                "named score is not a number",
                f"scores[{shorten(name, 70)}] is {_type_of(entry)}; give a number such as 0.5",
                value,
            )
        checked[name] = _finite(number, "named score", value, name)
    return checked


def cut_feedback(text: str, limit: int = DEFAULT_FEEDBACK_LIMIT) -> str:
    """`text`, cut to at most `limit` characters with a note saying so, when it is longer."""
    if len(text) <= limit:
        return text
    original = len(text)
    if was_cut(text):  # cut once already (in a worker, with a margin): keep the length it gave
        at = text.rfind("\n" + FEEDBACK_CUT_MARK)
        found = _CUT_LENGTH.search(text, at)
        if found:
            original = int(found[1].replace(",", ""))
        text = text[:at]
    note = f"\n{FEEDBACK_CUT_MARK} it had {original:,} characters, over the limit of {limit:,}]"
    return text[: max(0, limit - len(note))] + note[:limit]


def was_cut(feedback: str) -> bool:
    return FEEDBACK_CUT_MARK in feedback[-120:]


def check_timeout(timeout: Any) -> float:
    """The metric timeout in seconds, when it lies in (0, 600]; a clear ValueError otherwise."""
    return seconds("timeout", timeout, maximum=MAX_TIMEOUT, default=DEFAULT_TIMEOUT)


def check_feedback_limit(limit: Any) -> int:
    """The feedback limit in characters, an int of at least 100; a clear ValueError otherwise."""
    return whole_number("feedback_limit", limit, minimum=MIN_FEEDBACK_LIMIT, unit="characters")
