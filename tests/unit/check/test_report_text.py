"""The contract report as a person reads it: multi-line feedback as lines under aligned column headers, and the
same readable text wherever plain text is shown (print, a terminal's repr, VS Code, Jupyter's text/plain)."""

from __future__ import annotations

import html

from support import write_metric

from skynet_dspy import check_contract

MULTI_LINE = """
    def score(input, output, expected=None):
        right = output == expected["label"]
        lines = ["Correct." if right else f"Expected {expected['label']!r}.", "accuracy 1.00" if right else
                 "accuracy 0.00", "speed 0.50 (2000 ms vs reference 2000 ms)"]
        return (1.0 if right else 0.0), {"feedback": "\\n".join(lines)}
    """
CASES = [
    {"input": {"ticket": "refund please"}, "output": "other", "expected": {"label": "billing"}},
    {"input": {"ticket": "it crashes"}, "expected": {"label": "bug"}},
]


def _calls_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("Calls:")
    end = lines.index("", start)
    return lines[start + 1:end]


def test_multi_line_feedback_is_shown_line_by_line_under_the_feedback_header(tmp_path):
    report = check_contract(write_metric(tmp_path, MULTI_LINE), CASES)
    header, *rows = _calls_section(str(report))
    assert header.split() == ["call", "score", "feedback"]
    score_at, feedback_at = header.index("score"), header.index("feedback")
    first = rows[0]
    assert first.startswith("  case 1, given output") and first[score_at:].startswith("0 ")
    assert first[feedback_at:] == "Expected 'billing'."
    assert rows[1] == " " * feedback_at + "accuracy 0.00"  # each feedback line stands under the column
    assert rows[2] == " " * feedback_at + "speed 0.50 (2000 ms vs reference 2000 ms)"
    starts = [row for row in rows if not row[:feedback_at].isspace()]
    assert len(starts) == len(report.calls)  # one row per call, its feedback lines below it
    for row in starts:
        assert row[score_at - 2:score_at] == "  " and row[feedback_at - 2:feedback_at] == "  "


def test_long_feedback_is_wrapped_in_its_column_and_capped(tmp_path):
    words = " ".join(f"word{number}" for number in range(400))
    path = write_metric(tmp_path, f"""
        def score(input, output, expected=None):
            return 1.0, {{"feedback": {words!r}}}
        """)
    text = str(check_contract(path, CASES[:1]))
    header, *rows = _calls_section(text)
    feedback_at = header.index("feedback")
    assert max(len(line) for line in (header, *rows)) <= 120  # (the heading holds the path, of any length)
    assert rows[0][feedback_at:].startswith("word0 word1 ")
    assert all(row[:feedback_at].isspace() for row in rows[1:len(rows) // 2])
    assert any("more lines)" in row for row in rows)


def test_the_plain_text_repr_is_the_readable_report(tmp_path):
    report = check_contract(write_metric(tmp_path, MULTI_LINE), CASES)
    assert repr(report) == str(report)
    assert repr(report).startswith("Contract check of ") and "ContractReport(" not in repr(report)
    assert repr(report).splitlines()[-1] == report.verdict


def test_the_html_table_keeps_feedback_lines_and_names_its_columns(tmp_path):
    page = check_contract(write_metric(tmp_path, MULTI_LINE), CASES)._repr_html_()
    assert html.escape("Expected 'billing'.\naccuracy 0.00") in page  # shown as lines: the cell is pre-wrap
    assert "white-space:pre-wrap" in page
    assert "<th style='text-align:left'>call</th><th style='text-align:left'>score</th>" in page
