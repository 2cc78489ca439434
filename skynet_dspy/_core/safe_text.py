"""Making text a model or a dataset wrote safe for each place it is shown or written, one function per medium:
valid UTF-8, a terminal (no control characters), HTML, a CSV cell (no formula), a plot label, JSON.

Hand-written: no maintained library covers these media together (markupsafe escapes HTML only). This module
imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from typing import Any

# C0 controls but newline and tab, DEL, C1 controls (0x9b is CSI and 0x9d OSC on some terminals), and the
# bidirectional overrides and isolates that make text read otherwise than it is stored ("Trojan source"); the
# plain direction marks (U+200E, U+200F) of right-to-left text are kept.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# What a spreadsheet evaluates at the start of a cell (OWASP CSV injection): formulas, DDE, and the tab and
# carriage return that some spreadsheets skip before reading one.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
PLOT_TEXT_LIMIT = 80  # characters of a label a plot shows


def valid_utf8(text: str) -> str:
    """`text` that encodes to UTF-8: a lone surrogate becomes its visible escape (`\\ud83d`)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# One str.translate table (C speed on a megabyte of escapes) for the characters _TERMINAL_UNSAFE matches: each as
# Python's repr escapes it (none is printable), `\r`, `\x1b`, `\u202e`.
_TERMINAL_TABLE = {code: repr(chr(code))[1:-1] for code in range(0x2070) if _TERMINAL_UNSAFE.match(chr(code))}


def for_terminal(text: str) -> str:
    """`text` safe to print: every control character but newline and tab shown as a visible escape (`\\x1b`),
    and valid UTF-8."""
    text = valid_utf8(text)
    if text.isascii() and text.isprintable():
        return text
    return text.translate(_TERMINAL_TABLE) if _TERMINAL_UNSAFE.search(text) else text


def for_html(value: object) -> str:
    """`value` as HTML text: escaped (quotes too, so it is safe in an attribute), valid UTF-8."""
    return html.escape(valid_utf8(value if isinstance(value, str) else str(value)), quote=True)


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: numbers (and None) as they are; text valid UTF-8, and with a leading `'` when a
    spreadsheet would evaluate it (it starts with = + - @, a tab or a carriage return and is not a number)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = valid_utf8(value if isinstance(value, str) else str(value))
    if text.startswith(_FORMULA_START) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def for_plot(text: object, limit: int = PLOT_TEXT_LIMIT) -> str:
    """A label for a plot: one line, at most `limit` characters, control characters shown as escapes.
    Draw it with `literal_text` on, so `$` and `\\` are drawn as they are."""
    shown = for_terminal(" ".join(str(text).split()))
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def literal_text(figure: Any) -> Any:
    """Every Text of a matplotlib `figure` (titles, labels, legend entries, annotations) drawn as it is: no
    mathtext (`$...$`, which raises on `$$` or deep braces) and no TeX, whatever rcParams say. Returns it."""
    from matplotlib.text import Text

    for text in figure.findobj(Text):
        text.set_parse_math(False)
        text.set_usetex(False)
    return figure


def json_safe(value: Any) -> Any:
    """`value` with every string in it (keys too) valid UTF-8: lists, tuples (as lists) and dicts walked."""
    return map_strings(value, valid_utf8, list)


def map_strings(value: Any, change: Callable[[str], str], as_tuple: Callable[[list[Any]], Any] = tuple) -> Any:
    """`value` with `change` applied to every string in it (keys too): lists, tuples (made by `as_tuple`) and dicts
    walked."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {map_strings(key, change, as_tuple): map_strings(item, change, as_tuple) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [map_strings(item, change, as_tuple) for item in value]
        return as_tuple(items) if isinstance(value, tuple) else items
    return value


_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_JSON_TABLE = {code: f"\\u{code:04x}" for code in range(0x2070) if _JSON_UNSAFE.match(chr(code))}


def json_text(value: Any, **options: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, **options)`, valid UTF-8, with DEL, C1 controls, line separators
    and bidi overrides written as `\\uXXXX` escapes (json escapes the C0 controls itself), so it prints safely."""
    text = json.dumps(json_safe(value), ensure_ascii=False, **options)
    return text.translate(_JSON_TABLE) if _JSON_UNSAFE.search(text) else text
