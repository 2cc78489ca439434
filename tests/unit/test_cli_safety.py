"""`skynet-dspy check` and `skynet-dspy score` with hostile text: what they print holds no raw ESC or OSC byte,
the CSV no cell a spreadsheet evaluates, a lone surrogate in a case still gives the full report and every row,
an interrupted `score` keeps the rows scored so far, and a short password never shows."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import write_metric

from skynet_dspy._cli import main

REPO = Path(__file__).resolve().parents[2]
HOSTILE = [
    "\x1b[2K\x1b[1A\rThe contract holds.",  # erase the line above, print a fake verdict
    "\x1b]0;pwned\x07",  # set the window title
    "\x1b]52;c;cm0gLXJmIH4=\x07",  # write the clipboard (OSC 52)
    "\x9b2J\x9d0;t\x9c",  # C1 CSI and OSC
    '=HYPERLINK("http://evil.example","click")',
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
    "<img src=x onerror=alert(1)>",
]
ECHO = '''
def score(input, output, expected=None):
    text = input["text"]
    return 0.5, {"feedback": text, "scores": {text[:40] or "empty": -0.5}}
'''


def _raw_controls(text: str) -> list[str]:
    return sorted({f"{ord(c):#x}" for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f})


def _cases(folder: Path, texts: list[str]) -> Path:
    path = folder / "cases.jsonl"
    rows = [{"input": {"text": text}, "output": "x", "expected": {"label": "x"}} for text in texts]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")  # \ud83d stays escaped
    return path


def _run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_prints_no_raw_control_byte(tmp_path, capsys):
    metric, data = write_metric(tmp_path, ECHO), _cases(tmp_path, HOSTILE)
    code, out, err = _run(capsys, "check", metric, "--data", data, "--all")
    assert code in (0, 1)
    assert _raw_controls(out) == [] and _raw_controls(err) == []
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in out  # shown, visibly
    assert out.rstrip().splitlines()[-1].startswith("The contract")  # the real verdict is the last line
    code, out, err = _run(capsys, "check", metric, "--data", data, "--all", "--json")
    assert _raw_controls(out) == [] and _raw_controls(err) == []
    assert any(call["feedback"] == HOSTILE[2] for call in json.loads(out)["calls"])  # the same text, escaped


def test_score_writes_no_cell_a_spreadsheet_evaluates_and_numbers_stay_numbers(tmp_path, capsys):
    metric, data = write_metric(tmp_path, ECHO), _cases(tmp_path, [*HOSTILE, "line\rbreak\nhere"])
    out = tmp_path / "results.csv"
    code, stdout, stderr = _run(capsys, "score", metric, "--data", data, "--out", out, "--threads", 2)
    assert code == 0, stderr
    assert _raw_controls(stderr) == []
    with out.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert len(rows) == len(HOSTILE) + 2  # the header, and one row per case: no line break started a row
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell
            assert not cell.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", cell), cell
    header, *body = rows
    assert [row[0] for row in body] == [str(n) for n in range(1, len(HOSTILE) + 2)]
    assert all(row[1] == "0.5" for row in body)
    assert header[header.index("'" + HOSTILE[4][:40])] and body[4][header.index("'" + HOSTILE[4][:40])] == "-0.5"
    feedback = header.index("feedback")
    assert body[4][feedback] == "'" + HOSTILE[4] and body[-1][feedback] == "line\rbreak\nhere"


def test_score_jsonl_on_stdout_holds_no_raw_control_byte(tmp_path, capsys):
    metric, data = write_metric(tmp_path, ECHO), _cases(tmp_path, HOSTILE)
    code, stdout, stderr = _run(capsys, "score", metric, "--data", data)
    assert code == 0
    assert _raw_controls(stdout) == [] and _raw_controls(stderr) == []
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert sorted(row["feedback"] for row in rows) == sorted(HOSTILE)


def test_a_lone_surrogate_in_a_case_still_gives_the_full_report_and_every_row(tmp_path, capsys):
    """examples/metric.py echoes the case's cue in its feedback; half an emoji must not lose the report."""
    data = tmp_path / "cases.jsonl"
    cases = [{"input": {"ticket": f"ticket {n}"}, "output": "billing",
              "expected": {"label": "billing", "cue": "refund \ud83d" if n == 1 else "refund", "gold_id": f"G{n}"}}
             for n in range(3)]
    data.write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    metric = REPO / "examples" / "metric.py"
    code, out, err = _run(capsys, "check", metric, "--data", data, "--all")
    assert code in (0, 1), err
    assert "\\ud83d" in out and "The contract" in out.rstrip().splitlines()[-1]
    code, out, err = _run(capsys, "check", metric, "--data", data, "--all", "--json")
    assert code in (0, 1), err
    assert json.loads(out)["cases_run"] == 3
    out_file = tmp_path / "results.csv"
    code, _, err = _run(capsys, "score", metric, "--data", data, "--out", out_file)
    assert code == 0, err
    with out_file.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["case"] for row in rows] == ["1", "2", "3"] and "\\ud83d" in rows[1]["feedback"]
    jsonl = tmp_path / "results.jsonl"
    assert _run(capsys, "score", metric, "--data", data, "--out", jsonl)[0] == 0
    assert len(jsonl.read_text(encoding="utf-8").splitlines()) == 3


SLOW_AFTER = '''
import time

def score(input, output, expected=None):
    if input["n"] >= 12:
        time.sleep(60)
    return 1.0, {"feedback": "ok " + str(input["n"])}
'''


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "threads"), [("csv", 2), ("jsonl", 1)])
def test_sigint_keeps_the_rows_scored_so_far_and_says_interrupted(tmp_path, kind, threads):
    metric = write_metric(tmp_path, SLOW_AFTER)
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps({"input": {"n": n}, "output": "x", "expected": {"label": "x"}}) + "\n"
                            for n in range(40)), encoding="utf-8")
    out = tmp_path / f"results.{kind}"
    command = [sys.executable, "-m", "skynet_dspy._cli", "score", str(metric), "--data", str(data), "--out", str(out),
               "--threads", str(threads), "--timeout", "120"]
    # its own process group, so the jsonl run can get SIGINT as a terminal's Ctrl-C sends it: to the whole group
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the rows appear in the file while the run goes on
        if out.exists() and len(out.read_text(encoding="utf-8").splitlines()) >= (13 if kind == "csv" else 12):
            break
        time.sleep(0.2)
    else:
        process.kill()
        pytest.fail("the rows were not written as the calls finished")
    time.sleep(1)  # the slow calls are running
    assert process.poll() is None
    if kind == "csv":
        process.send_signal(signal.SIGINT)
    else:
        os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted: 12 of 40 case(s) scored" in stderr and str(out) in stderr
    assert "crashed" not in stderr and "a signal in score" not in stderr  # not blamed on the metric
    if kind == "csv":
        with out.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        assert sorted(int(row["case"]) for row in rows) == list(range(1, 13))
        assert all(row["score"] == "1.0" and row["failure"] == "" for row in rows)
    else:
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert [row["case"] for row in rows] == list(range(1, 13))


PASSWORD = "hunt3r"  # six characters
CANARY = '''
import os

def score(input, output, expected=None):
    if input["n"] == 2:
        raise ValueError("login failed with " + input["text"])
    in_worker = "MY_SERVICE_PASSWORD" in os.environ or "hunt3r" in repr(dict(os.environ))
    return 0.5, {"feedback": f"echo {input['text']} worker-env={in_worker}", "scores": {input["text"]: 1.0}}
'''


@pytest.mark.slow
def test_a_six_character_password_never_shows_in_cli_output_files_or_worker_environments(tmp_path):
    metric = write_metric(tmp_path, CANARY)
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps({"input": {"n": n, "text": f"pw {PASSWORD}"}, "output": "x",
                                        "expected": {"label": "x"}}) + "\n" for n in range(4)), encoding="utf-8")
    environment = {**os.environ, "MY_SERVICE_PASSWORD": PASSWORD}
    seen = []
    for argv in (["check", str(metric), "--data", str(data), "--all"],
                 ["check", str(metric), "--data", str(data), "--all", "--json"],
                 ["score", str(metric), "--data", str(data)],
                 ["score", str(metric), "--data", str(data), "--out", str(tmp_path / "rows.csv")],
                 ["score", str(metric), "--data", str(data), "--out", str(tmp_path / "rows.jsonl")],
                 ["score", str(metric), "--data", str(data), "--isolation", "thread"]):
        done = subprocess.run([sys.executable, "-m", "skynet_dspy._cli", *argv], capture_output=True, text=True,
                              env=environment, timeout=120)
        assert done.returncode in (0, 1), done.stderr[-2000:]
        assert PASSWORD not in done.stdout + done.stderr, argv
        if "thread" not in argv and "--out" not in argv:  # worker processes: no password in their environment
            assert "worker-env=True" not in done.stdout and "worker-env=False" in done.stdout, argv
        seen += [done.stdout, done.stderr]
    files = [(tmp_path / "rows.csv").read_text(encoding="utf-8"), (tmp_path / "rows.jsonl").read_text("utf-8")]
    assert all(PASSWORD not in text and "worker-env=False" in text for text in files)
    everything = "\n".join(seen + files)
    assert "pw ***" in everything and "login failed with pw ***" in everything


def test_a_megabyte_of_hostile_text_is_scored_and_written_safely(tmp_path, capsys):
    big = "=HYPERLINK(1)" + "<script>\x1b]52;c;eA==\x07\ud83d" * 40_000
    metric, data = write_metric(tmp_path, ECHO), _cases(tmp_path, [big, "short"])
    out = tmp_path / "results.csv"
    code, _, stderr = _run(capsys, "score", metric, "--data", data, "--out", out, "--threads", 2)
    assert code == 0, stderr[-2000:]
    csv.field_size_limit(10_000_000)
    with out.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and rows[0]["feedback"].startswith("'=HYPERLINK(1)<script>")
    assert "\x1b" in rows[0]["feedback"]  # a file keeps the text (a spreadsheet shows it inert); the terminal never
    code, out_text, err = _run(capsys, "check", metric, "--data", data, "--all")
    assert code in (0, 1) and _raw_controls(out_text) == [] and _raw_controls(err) == []
