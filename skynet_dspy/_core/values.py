"""Reading values that may be hostile (never raising, texts shortened and redacted), and checking option values."""

from __future__ import annotations

import builtins
import difflib
import keyword
import math
import numbers
import re
import reprlib
from collections.abc import Iterable
from typing import Any

from . import secrets


def as_number(value: Any) -> float | None:
    """`value` as a float when it is a real number (docs/contract.md#return-value), else None; never raises.
    An integer too large for a float becomes ±inf (rejected as infinite, not as "not a number")."""
    if type(value) is float:  # the common case, without the numbers.Real check
        return value
    try:
        if isinstance(value, numbers.Real):
            try:
                return float(value)
            except OverflowError:
                if isinstance(value, numbers.Integral):
                    return math.inf if int(value) > 0 else -math.inf
                return None
        # NumPy bool_ and 0-d arrays are not registered as numbers.Real (a missing attribute is caught below)
        if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and value.dtype.kind in "biuf":
            return float(value)
    except Exception:
        return None
    return None


def a_type(value: Any) -> str:
    """'a str', 'an int', 'None': the type of `value` as an English noun phrase."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


_PARTIAL_END = re.compile(r"\S+\Z")


def _head(text: str, size: int) -> str:
    """The first `size` characters of `text`, less the word the cut falls in: a key cut in two is a key redaction
    no longer knows (a worker process knows no env key at all)."""
    head = text[:size]
    if head and size < len(text) and not head[-1].isspace() and not text[size].isspace():
        head = _PARTIAL_END.sub("", head)
    return head


def _cut_middle(text: str, limit: int) -> str:
    """`text` as its head, '...' and its tail, `limit` characters at most, never keeping part of a word."""
    if len(text) <= limit:
        return text
    i = max(0, (limit - 3) // 2)
    j = max(0, limit - 3 - i)
    tail = _head(text[::-1], j)[::-1] if j else ""
    return _head(text, i) + "..." + tail


def clip_words(text: str, limit: int) -> str:
    """`text` cut to `limit` characters ending in '...', dropping the word the cut falls in."""
    return text if len(text) <= limit else _head(text, max(0, limit - 3)) + "..."


class _Repr(reprlib.Repr):
    """reprlib that masks credentials before shortening, and cuts only between words."""

    def repr_str(self, x: str, level: int) -> str:
        text = secrets.redact(str.__str__(x))
        shown = _cut_middle(builtins.repr(text), self.maxstring)
        return shown if shown.strip(" .") else f"<a str of {len(text):,} characters>"  # one long word, dropped

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = builtins.repr(x)
        except Exception:
            return f"<{x.__class__.__name__} instance at {id(x):#x}>"
        return _cut_middle(secrets.redact(text), self.maxother)


_repr = _Repr()
_repr.maxstring = _repr.maxother = 120
_repr.maxlong = 60
_repr.maxdict = _repr.maxlist = _repr.maxtuple = 8


def shorten(value: Any, limit: int = 200) -> str:
    """A repr of `value` fit for a message: bounded in length, redacted, and never raising."""
    try:
        text = _repr.repr(value)
    except Exception as exc:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
    return clip_words(secrets.redact(text), limit)


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, ending in '...' when cut."""
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def exception_text(exc: BaseException) -> str:
    """'ValueError: message' for the user; never raises, even for an exception whose str() does."""
    name = type(exc).__name__
    try:
        message = f"exit code {exc.code!r}" if isinstance(exc, SystemExit) else str(exc)
    except BaseException as inner:  # noqa: BLE001 - a __str__ may even raise SystemExit
        message = f"<its message could not be read: str() raised {type(inner).__name__}>"
    return secrets.redact(f"{name}: {message}" if message else name)


def identifier(text: str) -> str:
    """`text` as a Python identifier: 'my-metric' -> 'my_metric', '2024' -> 'metric_2024' (metric and column names)."""
    name = "".join(char if char.isalnum() or char == "_" else "_" for char in str(text)) or "metric"
    if name[0].isdigit() or keyword.iskeyword(name):
        name = f"metric_{name}"
    return name


def content_text(content: Any) -> str:
    """The text of a chat message's content: a str, or a list of content parts ({"type": "text", "text": ...})."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


# What metric code may set on one llm() request: how the model answers. Where the request goes and what it
# carries (model, api_base, api_key, headers, timeouts, retries) stay with the user's model spec: a metric must
# not be able to send the user's key to an endpoint of its choosing.
LLM_SETTINGS = frozenset({
    "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop", "seed", "presence_penalty",
    "frequency_penalty", "response_format", "logit_bias", "reasoning_effort", "thinking", "logprobs", "top_logprobs",
})


def check_llm_arguments(instructions: Any, input: Any, settings: dict[str, Any]) -> None:
    """The TypeError for llm() called with something it cannot send (in the metric, and again in the judge)."""
    if not isinstance(instructions, str):
        raise TypeError(f"llm() instructions must be a str, got {type(instructions).__name__}")
    if input is not None and not isinstance(input, str):
        raise TypeError(
            f"llm() input must be a str or None, got {type(input).__name__}; format it first, e.g. json.dumps(...)"
        )
    texts = {"instructions": instructions, "input": input or ""} | {str(key): val for key, val in settings.items()}
    for name, value in texts.items():
        _check_encodable(name, value)
    refused = sorted({"messages", "stream"} & settings.keys())
    if refused:
        raise TypeError(f"llm() does not take {', '.join(refused)}: it sends one request and returns its text")
    unknown = sorted(str(name) for name in settings.keys() - LLM_SETTINGS)
    if unknown:
        raise TypeError(
            f"llm() does not take {', '.join(unknown)}: metric code chooses how the model answers, never which "
            "model, endpoint, key or timeout a request uses (those are yours: metric_lm=... when loading the "
            f"metric). It takes {', '.join(sorted(LLM_SETTINGS))}"
        )


def _check_encodable(name: str, value: Any) -> None:
    """The metric's ValueError for text no provider can take (a lone surrogate, half an emoji): named, never sent."""
    for text in [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else ():  # stop=[]
        if not isinstance(text, str):
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"llm() {name} holds text that cannot be sent (a lone surrogate {text[exc.start]!r} at position "
                f"{exc.start}, e.g. half an emoji cut off); clean it first, e.g. "
                "text.encode('utf-8', 'replace').decode()"
            ) from None


PROMPT_TOKENS = ("prompt_tokens", "input_tokens")  # the names a model's usage record gives its prompt tokens
COMPLETION_TOKENS = ("completion_tokens", "output_tokens")  # ... and its completion tokens


def token_count(usage: Any, names: Iterable[str]) -> int:
    """A token count from a model's usage record (a dict or an object): the first of `names` holding a whole
    number, at least 0; 0 when none does. Never raises."""
    for name in names:
        try:
            value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
            if value is None or isinstance(value, bool):
                continue
            return max(0, int(value))
        except Exception:  # not a number (or an object whose attribute raises): the next name
            pass
    return 0


def usd(amount: float | None) -> str:
    """A dollar amount readable at LLM scale, 4 significant digits: $0.01235, $0.00027, $3.2e-08, $12.35;
    None is "cost unknown"."""
    if amount is None:
        return "cost unknown"
    if not math.isfinite(amount):
        return f"${amount}"
    sign, amount = ("-" if amount < 0 else ""), abs(amount)
    if amount == 0:
        return "$0"
    if amount >= 1:
        return f"{sign}${amount:,.2f}"
    if amount < 1e-6:
        return f"{sign}${amount:.1e}"
    decimals = 3 - math.floor(math.log10(amount))
    return f"{sign}${amount:.{decimals}f}".rstrip("0").rstrip(".")


def seconds(name: str, value: Any, *, maximum: float | None = None, default: float | None = None) -> float:
    """A positive number of seconds (at most `maximum`), or a ValueError naming the option."""
    number = None if isinstance(value, bool) else as_number(value)
    if number is None or not (0 < number < math.inf) or (maximum is not None and number > maximum):
        bound = f"in (0, {maximum:g}]" if maximum is not None else "above 0"
        usual = f"; the default is {default:g}" if default is not None else ""
        raise ValueError(f"{name} must be a number of seconds {bound}, got {shorten(value)}{usual}")
    return number


def whole_number(name: str, value: Any, *, minimum: int = 0, unit: str = "") -> int:
    """An int (not a bool) of at least `minimum`, or a ValueError naming the option."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = f" of {unit}" if unit else ""
        raise ValueError(f"{name} must be a whole number{what}, at least {minimum}, got {shorten(value)}")
    return value


def finite_number(name: str, value: Any, *, default: float | None = None) -> float:
    """A finite number (not a bool), or a ValueError naming the option."""
    number = None if isinstance(value, bool) else as_number(value)
    if number is None or not math.isfinite(number):
        usual = f"; the default is {default:g}" if default is not None else ""
        raise ValueError(f"{name} must be a finite number, got {shorten(value)}{usual}")
    return number


def unknown_option(where: str, name: str, known: Iterable[str]) -> TypeError:
    """The TypeError for a misspelt option: it names the closest known one, and lists them all."""
    names = sorted(set(known))
    close = closest(name, names)
    hint = f" (did you mean {close!r}?)" if close else ""
    return TypeError(f"{where} got an unknown option {name!r}{hint}. Options: {', '.join(names)}")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to `name` (a likely typo), or None."""
    found = difflib.get_close_matches(name, list(known), n=1)
    return found[0] if found else None
