"""The contract check on programs with unlabelled outputs, and on return values of every shape (issue 15, item 4).

A program may give an `answer` and a `confidence` with only `answer` labelled: cases that give the whole output
are scored as given, and the perfect-output probe fills only the labelled fields (or is skipped with a note).
Whatever score returns, the check reports it, and never raises: side information keyed by None, ints, tuples,
bytes or a mix of them included.
"""

from __future__ import annotations

import json

import pytest
from support import write_metric

from skynet_dspy import check_contract, load_metric
from skynet_dspy._cli import main

CONFIDENT = """
    def score(input, output, expected=None):
        right = output["answer"] == expected["answer"]
        return (1.0 if right else 0.0), {"feedback": f"answer {'right' if right else 'wrong'}; "
                                                     f"confidence {output.get('confidence')!r}"}
    """
CASES = [
    {"input": {"question": "Capital of France?"}, "expected": {"answer": "Paris"}},
    {"input": {"question": "Capital of Peru?"}, "output": {"answer": "Lima", "confidence": "high"},
     "expected": {"answer": "Lima"}},
    {"input": {"question": "Capital of Japan?"}, "expected": {"answer": "Tokyo"}},
]


def test_unlabelled_output_fields_through_a_loaded_metric(tmp_path):
    metric = load_metric(write_metric(tmp_path, CONFIDENT), output_fields=["answer", "confidence"])
    report = check_contract(metric, CASES)
    assert report.ok, str(report)
    outputs = {(call.case, call.role): call.output for call in report.calls}
    assert outputs[(2, "given")] == {"answer": "Lima", "confidence": "high"}  # used as given
    assert outputs[(1, "perfect")] == {"answer": "Paris"}  # only the labelled field is filled
    assert next(call for call in report.calls if (call.case, call.role) == (2, "given")).result.feedback == (
        "answer right; confidence 'high'")
    assert metric.stats["calls"] == len(report.calls) and not metric.stats["exception"]
    metric.close()


def test_unlabelled_output_fields_on_the_command_line(tmp_path, capsys):
    data = tmp_path / "cases.jsonl"
    data.write_text("\n".join(json.dumps(case) for case in CASES), encoding="utf-8")
    code = main(["check", str(write_metric(tmp_path, CONFIDENT)), "--data", str(data),
                 "--output-fields", "answer,confidence"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "answer right; confidence 'high'" in out and out.splitlines()[-1] == "The contract holds."


def test_the_perfect_output_probe_is_skipped_with_a_note_when_no_named_field_is_labelled(tmp_path):
    report = check_contract(write_metric(tmp_path, CONFIDENT), [CASES[1]], output_fields=["confidence"])
    item = report.item("Perfect output scores highest")
    assert item.status == "not run" and "confidence" in item.message
    assert [call.role for call in report.calls] == ["given"]


SIDE_INFORMATION = {
    "an int key beside feedback": "(1, {1: 'x', 'feedback': 'y'})",
    "None key": "(1, {None: 'x', 'feedback': 'y'})",
    "tuple key": "(1, {(1, 2): 'x', 'feedback': 'y'})",
    "bytes key": "(1, {b'k': 'x', 'feedback': 'y'})",
    "mixed keys": "(1, {1: 'a', None: 'b', (1, 2): 'c', b'k': 'd', 2.5: 'e', 'z': 'f', 'feedback': 'y'})",
    "no string key at all": "(1, {1: 'x', 2: 'y'})",
    "bytes feedback key": "(1, {b'feedback': 'x'})",
    "int score name": "(1, {'feedback': 'y', 'scores': {1: 1.0}})",
    "mixed score names": "(1, {'feedback': 'y', 'scores': {None: 1.0, 'a': 2.0, b'x': 3.0}})",
    "None": "None",
    "a tuple of one": "(1,)",
    "bytes": "b'0.5'",
    "a set": "{1, 2}",
}
VALID = {"an int key beside feedback", "None key", "tuple key", "bytes key", "mixed keys"}


@pytest.mark.parametrize("shape", sorted(SIDE_INFORMATION))
@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_any_return_value_is_reported_never_raised(tmp_path, capsys, shape, isolation):
    path = write_metric(tmp_path, f"def score(input, output, expected=None):\n    return {SIDE_INFORMATION[shape]}\n")
    report = check_contract(path, CASES[1:2], isolation=isolation)
    item = report.item("Metric return value")
    if shape in VALID:  # extra keys of any type are kept for the user, and named in the report
        assert report.ok and item.status == "passed" and "extra keys kept for you" in item.message
    else:
        assert not report.ok and item.status == "failed" and "broke the contract" in item.message
    assert json.loads(report.to_json())["ok"] == report.ok  # every form of the report renders
    assert report.verdict in str(report) and report.verdict in report._repr_html_()

    data = tmp_path / "cases.jsonl"
    data.write_text(json.dumps(CASES[1]), encoding="utf-8")
    code = main(["check", str(path), "--data", str(data), "--json", "--isolation", isolation])
    out, err = capsys.readouterr()
    assert code == (0 if shape in VALID else 1), err
    assert "Traceback" not in err and json.loads(out)["ok"] is (shape in VALID)
