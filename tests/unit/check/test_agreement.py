"""check_contract(..., human=...): the metric's scores beside a person's (docs/trustworthy.md)."""

from __future__ import annotations

import json

import pytest
from support import write_metric

from skynet_dspy import DataError, check_contract

# Eight tickets with a label given by the program; the person marked each right (1) or wrong (0).
TICKETS = [
    ("I was charged twice.", "billing", "billing"),
    ("The app crashes.", "bug", "billing"),
    ("How do I export?", "how-to", "how-to"),
    ("I am locked out.", "account", "bug"),
    ("Refund please.", "billing", "billing"),
    ("Blank page on login.", "bug", "how-to"),
    ("Dark mode?", "how-to", "how-to"),
    ("Change my username.", "account", "other"),
]
CASES = [{"input": {"ticket": ticket}, "output": given, "expected": {"label": right}}
         for ticket, right, given in TICKETS]
PERSON = [1.0 if right == given else 0.0 for _, right, given in TICKETS]

AGREEING = """
    def score(input, output, expected=None):
        right = output == expected["label"]
        return float(right), {"feedback": "Right." if right else f"Expected {expected['label']!r}, got {output!r}."}
"""
INVERTED = """
    def score(input, output, expected=None):
        right = output != expected["label"]  # the bug: != where == was meant
        return float(right), {"feedback": "Right." if right else f"Expected {expected['label']!r}, got {output!r}."}
"""


def test_a_metric_that_agrees_with_the_person_scores_near_one(tmp_path):
    report = check_contract(write_metric(tmp_path, AGREEING), CASES, max_cases=None, human=PERSON)
    item = report.item("Agrees with people")
    assert item.status == "passed", item
    (figures,) = report.agreement.figures
    assert figures.name == "score" and figures.cases == len(CASES)
    assert figures.spearman == pytest.approx(1.0) and figures.kappa == pytest.approx(1.0)
    assert figures.mean_abs_diff == 0
    assert report.agreement.disagreements == []
    assert report.to_dict()["agreement"]["figures"][0]["kappa"] == pytest.approx(1.0)


def test_an_inverted_metric_scores_near_minus_one_and_is_warned(tmp_path):
    report = check_contract(write_metric(tmp_path, INVERTED), CASES, max_cases=None, human=PERSON)
    item = report.item("Agrees with people")
    assert item.status == "warning"
    assert "inverted" in item.message
    (figures,) = report.agreement.figures
    assert figures.spearman == pytest.approx(-1.0) and figures.kappa == pytest.approx(-1.0)
    assert figures.mean_abs_diff == 1
    # the cases to read: the metric's feedback beside the person's score
    shown = report.agreement.disagreements
    assert len(shown) == 5 and all(d.difference == 1 for d in shown)
    assert {d.feedback for d in shown if d.person == 1.0} == {"Expected 'billing', got 'billing'.",
                                                               "Expected 'how-to', got 'how-to'."}
    text = str(report)
    assert "Agreement with people (8 labelled case(s)" in text and "where they differ most" in text
    assert report.to_dict()["agreement"]["disagreements"][0]["feedback"]


def test_named_scores_are_compared_and_ties_get_average_ranks(tmp_path):
    metric = write_metric(tmp_path, """
        def score(input, output, expected=None):
            return 1.0, {"feedback": "ok", "scores": {"order": input["n"], "fixed": 1.0}}
    """)
    cases = [{"input": {"n": n}, "output": "x"} for n in range(1, 9)]
    person = [{"scores": {"order": (n + 1) // 2, "fixed": 1.0}} for n in range(1, 9)]  # 1, 1, 2, 2, ... 4, 4
    report = check_contract(metric, cases, max_cases=None, human=person)
    by_name = {figures.name: figures for figures in report.agreement.figures}
    assert set(by_name) == {"order", "fixed"}
    # ranks 1..8 against 1.5, 1.5, 3.5, 3.5, ...: Pearson's r of the ranks is 40 / sqrt(42 * 40)
    assert by_name["order"].spearman == pytest.approx(40 / (42 * 40) ** 0.5)
    assert by_name["order"].kappa is None  # more than a few levels: no kappa
    assert by_name["fixed"].spearman is None and by_name["fixed"].kappa is None  # every case the same: undefined
    item = report.item("Agrees with people")
    assert item.status == "warning" and "fixed cannot be measured" in item.message


def test_kappa_counts_agreement_beyond_chance(tmp_path):
    metric = write_metric(tmp_path, """
        def score(input, output, expected=None):
            return float(input["metric"]), {"feedback": "ok"}
    """)
    metric_says, person_says = [1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1, 1, 0]
    cases = [{"input": {"metric": value}, "output": "x"} for value in metric_says]
    report = check_contract(metric, cases, max_cases=None, human=person_says)
    (figures,) = report.agreement.figures
    # 6 of 8 agree (0.75); by chance 0.5 * 0.5 + 0.5 * 0.5 = 0.5: kappa (0.75 - 0.5) / (1 - 0.5)
    assert figures.kappa == pytest.approx(0.5)
    assert figures.mean_abs_diff == pytest.approx(0.25)
    assert report.item("Agrees with people").status == "warning"  # below min_agreement 0.6
    assert check_contract(metric, cases, max_cases=None, human=person_says,
                          min_agreement=0.5).item("Agrees with people").status == "passed"


def test_a_labels_file_is_read_and_checked_against_the_cases(tmp_path):
    metric = write_metric(tmp_path, AGREEING)
    labels = tmp_path / "human.jsonl"
    lines = [json.dumps({"input": case["input"], "score": score}) for case, score in zip(CASES, PERSON, strict=True)]
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = check_contract(metric, CASES, max_cases=None, human=labels)
    assert report.item("Agrees with people").status == "passed"

    labels.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="human label 1 is for another case"):
        check_contract(metric, CASES, max_cases=None, human=labels)
    with pytest.raises(DataError, match="human= holds 7 label"):
        check_contract(metric, CASES, max_cases=None, human=PERSON[:7])
    with pytest.raises(DataError, match="the person's score must be a finite number"):
        check_contract(metric, CASES, max_cases=None, human=["yes", *PERSON[1:]])
    with pytest.raises(TypeError, match="human= takes a JSONL file's path or a list"):
        check_contract(metric, CASES, human={"score": 1})


def test_unlabelled_cases_are_left_out_and_few_cases_warn(tmp_path):
    report = check_contract(write_metric(tmp_path, AGREEING), CASES, max_cases=None,
                            human=[*PERSON[:3], *[None] * 5])
    assert report.agreement.labelled == 3
    item = report.item("Agrees with people")
    assert item.status == "warning" and "Only 3 case(s) compared" in item.message


def test_min_agreement_is_checked(tmp_path):
    with pytest.raises(ValueError, match="min_agreement must be from -1 to 1"):
        check_contract(write_metric(tmp_path, AGREEING), CASES, human=PERSON, min_agreement=2)


def test_results_frame_shows_repeats_and_human_scores_per_case(tmp_path):
    from skynet_dspy import results_frame

    report = check_contract(write_metric(tmp_path, AGREEING), CASES, max_cases=None,
                            human=[*PERSON[:7], None], repeat=2)
    frame = results_frame(report)
    assert len(frame) == len(CASES)
    assert list(frame["score"]) == PERSON
    assert list(frame["runs"]) == [2] * len(CASES) and list(frame["spread"]) == [0.0] * len(CASES)
    assert not frame["verdict_changed"].any()
    assert list(frame["human_score"])[:7] == PERSON[:7] and frame["human_score"].isna().iloc[7]
    assert list(frame["ticket"]) == [ticket for ticket, _, _ in TICKETS]
    assert "human_score" in frame._repr_html_()
