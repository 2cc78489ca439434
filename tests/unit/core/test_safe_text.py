"""_core/safe_text.py: one function per medium, each against hostile text (markup, control sequences, formulas,
lone surrogates, 1 MB strings)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from skynet_dspy._core import safe_text

ESC_SEQUENCES = [
    "\x1b[2K\x1b[1A",  # erase the line, move up
    "\x1b]0;pwned\x07",  # set the window title (OSC 0)
    "\x1b]52;c;cm0gLXJmIH4=\x07",  # write the clipboard (OSC 52)
    "\x9b31m",  # C1 CSI
    "\x9d8;;http://evil\x9c",  # C1 OSC hyperlink
    "a\rThe contract holds.",  # carriage return: overprint the line
    "\u202eevil\u202c",  # right-to-left override
]


@pytest.mark.parametrize("hostile", ESC_SEQUENCES)
def test_terminal_text_holds_no_control_character_but_newline_and_tab(hostile):
    shown = safe_text.for_terminal(f"before\t{hostile}\nafter")
    assert not any(
        (ord(char) < 0x20 and char not in "\n\t") or 0x7f <= ord(char) <= 0x9f or char in "\u202e\u202c"
        for char in shown
    ), repr(shown)
    assert "before\t" in shown and "\nafter" in shown


def test_terminal_escapes_are_visible():
    assert safe_text.for_terminal("\x1b]52;c;x\x07") == "\\x1b]52;c;x\\x07"
    assert safe_text.for_terminal("a\rb") == "a\\rb"
    assert safe_text.for_terminal("\u202e") == "\\u202e"
    assert safe_text.for_terminal("plain text, é and 🎉") == "plain text, é and 🎉"


def test_lone_surrogates_become_visible_escapes_in_every_medium():
    text = "half an emoji: \ud83d!"
    for shown in (safe_text.valid_utf8(text), safe_text.for_terminal(text), safe_text.csv_cell(text),
                  safe_text.for_plot(text)):
        shown.encode("utf-8")  # never raises
        assert "\\ud83d" in shown
    assert "\\ud83d" in safe_text.for_html(text)
    assert json.loads(safe_text.json_text({"k\udc00": [text]})) == {"k\\udc00": ["half an emoji: \\ud83d!"]}
    safe_text.json_text({"k": text}).encode("utf-8")


def test_html_is_escaped_including_attributes():
    shown = safe_text.for_html("<img src=x onerror=alert(1)> \"q\" 'a' & <script>")
    assert "<" not in shown and ">" not in shown and '"' not in shown and "'" not in shown
    assert safe_text.for_html({"a": "<b>"}) == "{&#x27;a&#x27;: &#x27;&lt;b&gt;&#x27;}"


@pytest.mark.parametrize("formula", [
    "=HYPERLINK(\"http://evil\",\"click\")", "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd",
    "\t=1+1", "\r=1+1",
])
def test_csv_cells_a_spreadsheet_would_evaluate_get_a_leading_quote(formula):
    assert safe_text.csv_cell(formula) == "'" + formula


@pytest.mark.parametrize("number", ["-1", "+2.5", "-0.25", "1e-3", "-.5", "3"])
def test_numbers_stay_numbers_in_csv(number):
    assert safe_text.csv_cell(number) == number
    assert safe_text.csv_cell(-1.5) == -1.5 and safe_text.csv_cell(3) == 3 and safe_text.csv_cell(None) is None


def test_a_csv_field_with_a_line_break_is_quoted_so_no_row_starts_inside_it():
    stream = io.StringIO()
    csv.writer(stream).writerow([safe_text.csv_cell("a\r=HYPERLINK(1)"), safe_text.csv_cell("b\n@x"), 1.5])
    rows = list(csv.reader(io.StringIO(stream.getvalue(), newline="")))
    assert rows == [["a\r=HYPERLINK(1)", "b\n@x", "1.5"]]


def test_plot_text_is_one_bounded_line():
    shown = safe_text.for_plot("cost\nin $\\usd$ \x1b[2K" + "x" * 1_000_000)
    assert "\n" not in shown and "\x1b" not in shown and len(shown) == safe_text.PLOT_TEXT_LIMIT
    assert shown.startswith("cost in $\\usd$ \\x1b[2K")


def test_json_text_escapes_what_json_leaves_raw():
    text = safe_text.json_text({"feedback": "\x1b[2K \x9b31m \u2028 \u202e"})
    assert all(ord(char) >= 0x20 and not 0x7f <= ord(char) <= 0x9f for char in text)
    assert "\u2028" not in text and "\u202e" not in text
    assert json.loads(text) == {"feedback": "\x1b[2K \x9b31m \u2028 \u202e"}  # the same text, escaped


def test_a_megabyte_of_hostile_text_is_handled_in_every_medium():
    big = ("<script>\x1b]52;c;x\x07=HYPERLINK(1)\ud83d" * 40_000)[:1_000_000]
    assert "<script>" not in safe_text.for_html(big)
    assert "\x1b" not in safe_text.for_terminal(big)
    assert safe_text.csv_cell("=" + big).startswith("'=")
    safe_text.json_text(big).encode("utf-8")


def test_the_package_log_records_show_control_characters_visibly(caplog):
    import logging

    from skynet_dspy._core.logs import logger

    caplog.set_level(logging.WARNING, logger="skynet_dspy")
    logger.warning("the metric said %s", "\x1b]52;c;eA==\x07\x1b[2K\rfake line\nnext")
    message = caplog.records[-1].getMessage()
    assert "\x1b" not in message and "\r" not in message and "\x07" not in message
    assert message == "the metric said \\x1b]52;c;eA==\\x07\\x1b[2K\\rfake line\nnext"
