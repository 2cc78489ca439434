"""`skynet-dspy check --repeat N` and `--human FILE`: stability and agreement from the command line."""

from __future__ import annotations

import json

import pytest
from support import write_metric

from skynet_dspy._cli import main

INVERTED = """
    def score(input, output, expected=None):
        right = output != expected["label"]  # the bug: != where == was meant
        return float(right), {"feedback": "Right." if right else f"Expected {expected['label']!r}, got {output!r}."}
"""
ROWS = [("a", "x", "x"), ("b", "x", "y"), ("c", "y", "y"), ("d", "y", "x"), ("e", "z", "z"), ("f", "z", "x")]


def write_lines(path, values) -> str:
    path.write_text("".join(json.dumps(value) + "\n" for value in values), encoding="utf-8")
    return str(path)


@pytest.fixture
def files(tmp_path):
    data = write_lines(tmp_path / "cases.jsonl", [
        {"input": {"ticket": ticket}, "output": given, "expected": {"label": right}} for ticket, right, given in ROWS
    ])
    human = write_lines(tmp_path / "human.jsonl", [{"score": float(right == given)} for _, right, given in ROWS])
    return tmp_path, data, human


def test_human_labels_every_case_and_warns_an_inverted_metric(files, capsys):
    folder, data, human = files
    code = main(["check", str(write_metric(folder, INVERTED)), "--data", data, "--human", human, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1  # the inverted comparison also fails "Perfect output scores highest"
    assert report["cases_run"] == len(ROWS)  # --human checks every case unless --cases says otherwise
    item = next(item for item in report["items"] if item["name"] == "Agrees with people")
    assert item["status"] == "warning" and "inverted" in item["message"]
    (figures,) = report["agreement"]["figures"]
    assert figures["spearman"] == pytest.approx(-1.0) and figures["kappa"] == pytest.approx(-1.0)


def test_repeat_reports_stability_and_shows_its_cost_first(files, capsys):
    folder, data, _ = files
    metric = write_metric(folder, """
        def score(input, output, expected=None):
            return 1.0, {"feedback": "ok"}
    """)
    code = main(["check", str(metric), "--data", data, "--repeat", "3", "--cases", "2", "--max-spread", "0.2"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Scores are stable" in out and "within 0.2 over 3 runs per case" in out
    assert "Stability (3 runs per case" in out
    assert "repeating each case's call: 4 more call(s)" in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--repeat", "0"], "not a number of runs"),
    (["--max-spread", "-0.5"], "not a spread of scores"),
    (["--min-agreement", "3"], "not an agreement from -1 to 1"),
    (["--max-judge-cost-usd", "0"], "not an amount of US dollars"),
])
def test_bad_trust_flags_exit_2(files, capsys, flags, message):
    folder, data, _ = files
    code = main(["check", str(write_metric(folder, INVERTED)), "--data", data, *flags])
    assert code == 2 and message in capsys.readouterr().err


def test_a_human_file_of_the_wrong_length_exits_2(files, capsys):
    folder, data, _ = files
    short = write_lines(folder / "short.jsonl", [1, 0])
    code = main(["check", str(write_metric(folder, INVERTED)), "--data", data, "--human", short])
    assert code == 2 and "human= holds 2 label(s) for 6 cases" in capsys.readouterr().err
