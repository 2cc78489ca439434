"""`skynet-dspy check` on judge metrics and real data (issue 15, item 5).

--metric-lm / --api-base reach a judge (the key from the environment, as LiteLLM reads it); flat rows with
--inputs; --cases N / --all, the header saying how many cases were not run; --json for CI; JSONL split on
'\\n' only; a FIFO, a device, a folder and deeply nested JSON end with exit 2 and one line, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from support import write_metric

from skynet_dspy._cli import main
from skynet_dspy.devserver import requests_by_role, scripted_server

EXAMPLES = ROOT / "examples"
JUDGE = EXAMPLES / "judge_metric.py"
EXACT = """
    def score(input, output, expected=None):
        right = output == expected["label"]
        return (1.0 if right else 0.0), {"feedback": "Correct." if right else f"Expected {expected['label']!r}."}
    """


def run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def cases_file(folder: Path, rows: list[dict], name: str = "cases.jsonl") -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def test_metric_lm_and_api_base_let_the_check_run_a_judge_with_the_key_from_the_environment(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment-1234")
    data = cases_file(tmp_path, [{"input": {"ticket": "The app crashes at start."}, "output": "bug"},
                                 {"input": {"ticket": "Where is my invoice?"}, "output": "bug"}])
    with scripted_server() as server:
        code, out, err = run(capsys, "check", JUDGE, "--data", data, "--metric-lm", "openai/gpt-4o-mini",
                             "--api-base", server.url)
        judged = requests_by_role(server.requests, "judge")
    assert code == 0, out + err
    assert "PASS. The ticket mentions 'crash'" in out and "FAIL. Expected 'billing', got 'bug'" in out
    assert len(judged) == 2
    sent = [{name.lower(): value for name, value in request.headers.items()} for request in judged]
    assert all(headers.get("authorization") == "Bearer sk-from-the-environment-1234" for headers in sent)
    assert "sk-from-the-environment-1234" not in out + err


def test_without_metric_lm_the_judge_check_fails_with_advice_for_the_command_line(tmp_path, capsys):
    data = cases_file(tmp_path, [{"input": {"ticket": "The app crashes."}, "output": "bug"}])
    code, out, _ = run(capsys, "check", JUDGE, "--data", data)
    assert code == 1 and "no model to call" in out
    assert "metric_lm= in Python, or --metric-lm MODEL (and --api-base URL) on the command line" in " ".join(
        out.split())  # advice for Python and for the command line


def test_api_base_alone_is_a_usage_error(tmp_path, capsys):
    data = cases_file(tmp_path, [{"input": {"ticket": "x"}, "output": "bug"}])
    code, _, err = run(capsys, "check", JUDGE, "--data", data, "--api-base", "http://127.0.0.1:9/v1")
    assert code == 2 and "--api-base needs --metric-lm" in err


def test_flat_rows_with_inputs_and_how_many_cases_run(tmp_path, capsys):
    metric = write_metric(tmp_path, EXACT)
    train = EXAMPLES / "train.jsonl"
    rows = sum(1 for line in train.read_text(encoding="utf-8").splitlines() if line.strip())
    code, out, err = run(capsys, "check", metric, "--data", train, "--inputs", "ticket")
    assert code == 0, out + err
    every_case = "--all runs every case"  # the command line's words, not Python's max_cases=None
    assert out.splitlines()[0].endswith(f"on 3 cases ({rows - 3} more cases not run; {every_case})")
    _, two, _ = run(capsys, "check", metric, "--data", train, "--inputs", "ticket", "--cases", "2")
    assert two.splitlines()[0].endswith(f"on 2 cases ({rows - 2} more cases not run; {every_case})")
    _, every, _ = run(capsys, "check", metric, "--data", train, "--inputs", "ticket", "--all")
    assert every.splitlines()[0].endswith(f"on {rows} cases")
    code, _, err = run(capsys, "check", metric, "--data", train, "--inputs", "ticket", "--cases", "2", "--all")
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run(capsys, "check", metric, "--data", train, "--inputs", "tickt")
    assert code == 2 and "line 1: the row has no input field 'tickt'" in err


def test_json_report_for_ci(tmp_path, capsys):
    code, out, _ = run(capsys, "check", write_metric(tmp_path, EXACT), "--data", EXAMPLES / "train.jsonl",
                       "--inputs", "ticket", "--cases", "4", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True
    assert report["cases_run"] == 4 and report["cases_not_run"] > 0
    assert {item["name"] for item in report["items"]} >= {"Metric loads", "Metric return value"}
    assert all({"call", "score", "failure", "feedback", "seconds"} <= set(call) for call in report["calls"])


def test_a_string_holding_line_separators_is_one_line_of_jsonl(tmp_path, capsys):
    ticket = "Refund\u2028please\u2029now\x85\x0c\x1c"  # line breaks to str.splitlines(), not to JSONL
    data = cases_file(tmp_path, [{"input": {"ticket": ticket}, "output": "billing", "expected": {"label": "billing"}}])
    assert len(data.read_text(encoding="utf-8").split("\n")) == 2
    code, out, err = run(capsys, "check", write_metric(tmp_path, EXACT), "--data", data)
    assert code == 0, out + err
    assert "on 1 case" in out.splitlines()[0]


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_fifo_a_device_or_a_folder_is_exit_2_with_a_message(tmp_path, kind):
    if kind == "fifo":
        target = tmp_path / "cases.fifo"
        os.mkfifo(target)  # nothing ever writes to it: reading it would wait for ever
    else:
        target = Path("/dev/zero") if kind == "device" else tmp_path
    done = subprocess.run(
        [sys.executable, "-m", "skynet_dspy", "check", str(write_metric(tmp_path, EXACT)), "--data", str(target)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("skynet-dspy: error: the data file") and "Traceback" not in done.stderr
    assert ("folder" if kind == "folder" else "not a regular file") in done.stderr


@pytest.mark.parametrize("depth", [150, 990, 5000, 100_000])
def test_deeply_nested_json_is_exit_2_not_a_traceback(tmp_path, capsys, depth):
    nested = "[" * depth + "]" * depth
    data = tmp_path / "deep.jsonl"
    data.write_text('{"input": {"ticket": "x"}, "output": ' + nested + ', "expected": {"label": "bug"}}\n',
                    encoding="utf-8")
    code, out, err = run(capsys, "check", write_metric(tmp_path, EXACT), "--data", data)
    assert code == 2 and out == ""
    assert err.startswith("skynet-dspy: error: ") and "line 1" in err and "nest" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_nesting_within_the_limit_is_checked(tmp_path, capsys, isolation):
    nested = "[" * 98 + '"bug"' + "]" * 98  # with the case and its "output" key: 100 levels
    data = tmp_path / "deep.jsonl"
    data.write_text('{"input": {"ticket": "x"}, "output": ' + nested + ', "expected": {"label": "bug"}}\n',
                    encoding="utf-8")
    code, out, err = run(capsys, "check", write_metric(tmp_path, EXACT), "--data", data, "--isolation", isolation)
    assert code == 0, out + err
    assert "Expected 'bug'." in out
