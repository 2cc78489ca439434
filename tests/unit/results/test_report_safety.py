"""report() of a GEPA run whose named-score names and candidate texts are hostile: `$`-laden names (mathtext),
deeply nested braces, markup, control sequences, lone surrogates. The text, the HTML and the plot all come out,
and each is safe for its medium."""

from __future__ import annotations

import re

import pytest
from gepa.core.result import GEPAResult

import skynet_dspy

NAMES = ["$$", "cost in $\\usd$", "$" + "{" * 600 + "x" + "}" * 600 + "$", "<img src=x onerror=alert(1)>",
         "\x1b]52;c;cm0gLXJm\x07", "half \ud83d", "$\\frac{a}{b}$ and $x^{2}$", "x" * 1_000_000]


def _result() -> GEPAResult:
    """What optimize_anything returns, for a run of three candidates whose named scores have hostile names."""
    subscores = [{name: value for name in NAMES} for value in (0.25, 0.5, 0.75)]
    return GEPAResult(
        candidates=[{"prompt": "Answer <b>briefly</b>."}, {"prompt": "Answer \x1b[2K$$ briefly."},
                    {"prompt": "=HYPERLINK(1) \ud83d <script>alert(2)</script>"}],
        parents=[[None], [0], [1]],
        val_aggregate_scores=[0.25, 0.5, 0.75],
        val_subscores=[{0: 0.25}, {0: 0.5}, {0: 0.75}],
        per_val_instance_best_candidates={0: {2}},
        discovery_eval_counts=[3, 9, 15],
        val_aggregate_subscores=subscores,
        total_metric_calls=20,
    )


def test_the_plot_draws_dollar_laden_names_literally(tmp_path):
    report = skynet_dspy.report(_result())
    figure = report.plot(tmp_path / "run.png")
    assert (tmp_path / "run.png").stat().st_size > 1000
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert "$$ (mean)" in labels and "cost in $\\usd$ (mean)" in labels
    assert all(len(label) <= 90 and "\x1b" not in label for label in labels)


def test_the_plot_stays_literal_when_rcparams_ask_for_tex(tmp_path):
    import matplotlib

    with matplotlib.rc_context({"text.usetex": True}):
        skynet_dspy.report(_result()).plot(tmp_path / "tex.png")  # no LaTeX run on a metric's names


def test_the_html_renders_with_its_plot_and_holds_no_live_markup():
    html = skynet_dspy.report(_result())._repr_html_()
    assert "data:image/png;base64," in html
    tags = {tag.lower() for tag in re.findall(r"<\s*([a-zA-Z]+)", html)}
    assert tags <= {"div", "b", "table", "tr", "th", "td", "p", "pre", "span", "img"}, tags
    assert "<img src=x" not in html and "<script" not in html and "&lt;script&gt;" in html
    html.encode("utf-8")
    assert "\\ud83d" in html


def test_the_text_shows_control_sequences_and_surrogates_as_escapes():
    text = str(skynet_dspy.report(_result()))
    text.encode("utf-8")
    assert "\x1b" not in text and "\\x1b]52" in text and "\\ud83d" in text
    assert all(ord(char) >= 0x20 or char in "\n\t" for char in text)


def test_to_dict_is_valid_utf8():
    import json

    json.dumps(skynet_dspy.report(_result()).to_dict(), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("name", ["$$", "$\\undefinedcommand$", "$" + "{" * 2000 + "$"])
def test_each_name_that_crashed_mathtext_alone(name, tmp_path):
    result = _result()
    named = GEPAResult(**{**{field: getattr(result, field) for field in (
        "candidates", "parents", "val_aggregate_scores", "val_subscores", "per_val_instance_best_candidates",
        "discovery_eval_counts", "total_metric_calls")}, "val_aggregate_subscores": [{name: 0.5}] * 3})
    report = skynet_dspy.report(named)
    report.plot(tmp_path / "one.png")
    assert "data:image/png" in report._repr_html_()
