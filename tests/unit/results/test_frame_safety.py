"""results_frame() of a run whose feedback, outputs, inputs and named-score names hold markup, control sequences,
formulas, lone surrogates and a megabyte of text: its HTML holds no live tag, its CSV no cell a spreadsheet
evaluates (numbers stay numbers), and it always renders."""

from __future__ import annotations

import csv
import io
import re

import dspy
import pandas as pd
import pytest
from support import write_metric

import skynet_dspy

MARKUP = ["<img src=x onerror=alert(1)>", "<script>alert(2)</script>", "<svg onload=alert(3)>"]
FORMULAS = ['=HYPERLINK("http://evil.example","click")', "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]

METRIC = '''
def score(input, output, expected=None):
    question = input["question"]
    return 0.5, {
        "feedback": question + " | " + str(output),
        "scores": {"<img src=x onerror=alert(4)>": 1.0, "=HYPERLINK(1)": -0.25, "cost in $\\\\usd$": 0.5},
    }
'''


csv.field_size_limit(10_000_000)  # the megabyte cell


class Echo(dspy.Module):
    def forward(self, question, **fields):
        return dspy.Prediction(answer=question, note="<b onmouseover=alert(5)>x</b>")


@pytest.fixture
def frame(tmp_path):
    questions = [*MARKUP, *FORMULAS, "half an emoji \ud83d", "\x1b]52;c;cm0gLXJm\x07", "a\rb\nc",
                 "<i>" * 250_000]  # a megabyte of markup
    devset = [dspy.Example(question=q, **{"<th>weird field": "<u>x</u>"}).with_inputs("question", "<th>weird field")
              for q in questions]
    with skynet_dspy.load_metric(write_metric(tmp_path, METRIC)) as metric:
        evaluation = dspy.Evaluate(devset=devset, metric=metric, num_threads=1, display_progress=False)(Echo())
    return skynet_dspy.results_frame(evaluation)


def _live_tags(html: str) -> list[str]:
    """Tags in `html` that are not the Styler's own table markup."""
    own = {"style", "/style", "table", "/table", "thead", "/thead", "tbody", "/tbody", "tr", "/tr", "th", "/th",
           "td", "/td", "caption", "/caption"}
    return [tag for tag in re.findall(r"<\s*(/?[a-zA-Z][^\s>/]*)", html) if tag.lower() not in own]


def test_the_html_holds_no_live_markup_from_cells_headers_or_score_names(frame):
    assert frame["question"][0] == MARKUP[0]  # the frame keeps the values as scored
    assert type(frame) is pd.DataFrame
    assert set(_live_tags(frame._repr_html_())) <= {"div", "/div"}  # pandas' own view escapes too
    html = skynet_dspy.results_style(frame).to_html()
    assert _live_tags(html) == []
    assert "onerror" in html and "&lt;img src=x onerror=alert(1)&gt;" in html  # shown, as text
    assert "&lt;img src=x onerror=alert(4)&gt;" in html  # the named score's column header
    assert "&lt;th&gt;weird field" in html  # an input field's column header
    html.encode("utf-8")  # the lone surrogate is a visible escape
    assert "\\ud83d" in html
    assert "more characters)" in html and len(html) < 500_000  # the megabyte cell is cut in the view only


def test_slices_and_frames_without_failures_render_escaped_too(frame):
    assert _live_tags(skynet_dspy.results_style(frame.head(3)).to_html()) == []
    assert _live_tags(skynet_dspy.results_style(frame[["question", "feedback"]]).to_html()) == []


def test_the_csv_has_no_cell_a_spreadsheet_evaluates_and_numbers_stay_numbers(frame):
    text = skynet_dspy.results_csv(frame, index=False)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert len(rows) == len(frame) + 1  # a line break inside a field never starts a row
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell[:40]
            assert not cell.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", cell), cell[:40]
    header = rows[0]
    assert "'=HYPERLINK(1)" in header and "cost in $\\usd$" in header
    back = pd.read_csv(io.StringIO(text))
    assert back["score"].tolist() == [0.5] * len(frame)
    assert back["'=HYPERLINK(1)"].tolist() == [-0.25] * len(frame)  # a negative number is still a number
    questions = back["question"].tolist()
    assert questions[len(MARKUP)] == "'" + FORMULAS[0] and questions[len(MARKUP) + 5] == "'\r=1+1"
    assert "a\rb\nc" in questions


def test_the_csv_written_to_a_file_reads_back_the_same(frame, tmp_path):
    path = tmp_path / "results.csv"
    assert skynet_dspy.results_csv(frame, path, index=False) is None
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(frame) and rows[-1]["question"].startswith("<i><i>")
