"""`skynet-dspy score METRIC.py --data OUTPUTS.jsonl [--out results.csv|.jsonl] [--threads N]`: every case scored
in worker processes from a pool of threads, one row each, and exit codes 0 (every call worked), 1, 2."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from support import write_metric

from skynet_dspy._cli import main

METRIC = '''
import os
import time

def score(input, output, expected=None):
    n = input["n"]
    if n == 17:
        raise ValueError("no 17 here: " + expected["label"])
    if n == 400:
        time.sleep(30)
    if n == 901:
        return 0.5, "not a dict"
    right = output == expected["label"]
    return float(right), {"feedback": f"pid {os.getpid()}", "scores": {"exact": float(right), "length": len(output)}}
'''
GOOD = '''
def score(input, output, expected=None):
    right = output == expected["label"]
    return float(right), {"feedback": "Right." if right else "Wrong.", "scores": {"exact": float(right)}}
'''


def write_cases(folder: Path, count: int = 1000) -> Path:
    path = folder / "outputs.jsonl"
    rows = [{"input": {"n": n}, "output": "yes" if n % 4 else "no", "expected": {"label": "yes"}} for n in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def run_main(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_thousand_cases_with_failures_exit_1_and_say_how_many_of_which_kind(tmp_path, capsys):
    metric = write_metric(tmp_path, METRIC)
    out = tmp_path / "results.csv"
    code, stdout, stderr = run_main(capsys, "score", metric, "--data", write_cases(tmp_path), "--out", out,
                                    "--threads", 4, "--timeout", 2)
    assert code == 1
    assert stdout == ""
    assert "scored 1000 case(s)" in stderr
    assert "3 of 1000 call(s) failed: 1 exception, 1 timeout, 1 invalid" in stderr
    with out.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["case", "score", "exact", "length", "feedback", "failure", "detail"]
    assert [row["case"] for row in rows] == [str(n) for n in range(1, 1001)]  # in file order
    by_case = {int(row["case"]) - 1: row for row in rows}
    assert (by_case[17]["failure"], by_case[400]["failure"], by_case[901]["failure"]) == (
        "exception", "timeout", "invalid")
    assert "no 17 here" in by_case[17]["detail"] and "no 17 here" not in by_case[17]["feedback"]
    assert (by_case[1]["score"], by_case[1]["exact"], by_case[1]["length"]) == ("1.0", "1.0", "3.0")
    assert (by_case[4]["score"], by_case[4]["exact"]) == ("0.0", "0.0")
    assert by_case[17]["exact"] == "" and by_case[1]["failure"] == ""
    # every call ran in a worker process, never in this one, and no more workers than threads were used
    pids = {row["feedback"] for row in rows if row["feedback"].startswith("pid ")}
    assert pids and f"pid {os.getpid()}" not in pids and len(pids) <= 4 + 1  # +1: the worker replaced at the timeout


def test_every_call_working_exits_0_and_rows_go_to_stdout_as_jsonl(tmp_path, capsys):
    metric = write_metric(tmp_path, GOOD)
    code, stdout, stderr = run_main(capsys, "score", metric, "--data", write_cases(tmp_path, 200), "--threads", 2)
    assert code == 0
    rows = [json.loads(line) for line in stdout.splitlines()]  # in the order the calls finished
    assert sorted(row["case"] for row in rows) == list(range(1, 201))
    rows.sort(key=lambda row: row["case"])
    assert rows[0] == {"case": 1, "score": 0.0, "scores": {"exact": 0.0}, "feedback": "Wrong.", "failure": None,
                       "detail": None}
    assert rows[1]["score"] == 1.0
    assert "every call worked" in stderr and "mean score 0.75" in stderr and "exact 0.75" in stderr


def test_jsonl_out_and_cases_without_output_score_their_expected_values(tmp_path, capsys):
    metric = write_metric(tmp_path, GOOD)
    data = tmp_path / "cases.jsonl"
    data.write_text('{"input": {"n": 1}, "expected": {"label": "yes"}}\n'
                    '{"input": {"n": 2}, "output": "no", "expected": {"label": "yes"}}\n', encoding="utf-8")
    out = tmp_path / "rows.jsonl"
    code, _, stderr = run_main(capsys, "score", metric, "--data", data, "--out", out, "--threads", 1)
    assert code == 0, stderr
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["score"] for row in rows] == [1.0, 0.0]
    assert f"rows in {out}" in stderr


@pytest.mark.parametrize("argv, message", [
    (["--out", "results.txt"], "a .csv or a .jsonl file"),
    (["--out", "no/such/folder/results.csv"], "no such folder"),
    (["--threads", "0"], "not a number of threads"),
    (["--timeout", "0"], "not a number of seconds"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    metric = write_metric(tmp_path, GOOD)
    code, stdout, stderr = run_main(capsys, "score", metric, "--data", write_cases(tmp_path, 3), *argv)
    assert code == 2
    assert message in stderr and stdout == ""
    assert not (tmp_path / "results.txt").exists()


def test_unreadable_files_exit_2_and_a_metric_that_does_not_load_exits_1(tmp_path, capsys):
    metric = write_metric(tmp_path, GOOD)
    code, _, stderr = run_main(capsys, "score", metric, "--data", tmp_path / "missing.jsonl")
    assert code == 2 and "data file not found" in stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"input": {"n": 1}, "output": "yes"}\nnot json\n', encoding="utf-8")
    code, _, stderr = run_main(capsys, "score", metric, "--data", broken)
    assert code == 2 and "line 2" in stderr
    code, _, stderr = run_main(capsys, "score", tmp_path / "nope.py", "--data", write_cases(tmp_path, 3))
    assert code == 2 and "metric file not found" in stderr
    syntax = write_metric(tmp_path, "def score(input, output:\n", name="syntax.py")
    code, stdout, stderr = run_main(capsys, "score", syntax, "--data", write_cases(tmp_path, 3))
    assert code == 1 and stdout == ""
    assert "the metric does not load, nothing was scored" in stderr


def _on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the installed command with stderr on a real pseudo-terminal; (exit code, stdout, what the terminal got)."""
    import pty
    import subprocess
    import sys

    script = Path(sys.executable).with_name("skynet-dspy")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "skynet_dspy"]
    leader, follower = pty.openpty()
    process = subprocess.Popen([*base, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    stdout = process.stdout.read()
    code = process.wait(timeout=60)
    os.close(leader)
    return code, stdout, b"".join(chunks).decode("utf-8", "replace")


SLOW = '''
import time

def score(input, output, expected=None):
    time.sleep(0.45)
    return 1.0, {"feedback": "ok"}
'''


@pytest.mark.slow
def test_long_runs_show_a_progress_bar_on_a_terminal_and_clear_it(tmp_path):
    metric = write_metric(tmp_path, SLOW)
    data = write_cases(tmp_path, 4)
    code, stdout, terminal = _on_a_terminal(["score", str(metric), "--data", str(data), "--threads", "1"], tmp_path)
    assert code == 0, terminal
    assert "skynet-dspy score: " in terminal and "/4 [" in terminal and "cases/s" in terminal
    assert terminal.rstrip().splitlines()[-1].strip().startswith("skynet-dspy score: scored 4 case(s)")
    assert len(stdout.splitlines()) == 4  # the rows, untouched by the bar
    code, stdout, terminal = _on_a_terminal(["check", str(metric), "--data", str(data), "--cases", "2"], tmp_path)
    assert code == 0, terminal
    assert "skynet-dspy check: " in terminal and "calls/s" in terminal
    assert stdout.startswith("Contract check of")  # the report starts on a clean line


NAMED_SCORE = '''
def score(input, output, expected=None):
    return 1.0, {"feedback": "ok", "scores": {"score": 0.25, "exact": 0.5}}
'''


def test_a_named_score_called_score_never_stands_in_for_the_mean_score(tmp_path, capsys):
    code, _, stderr = run_main(capsys, "score", write_metric(tmp_path, NAMED_SCORE), "--data", write_cases(tmp_path, 3))
    assert code == 0
    assert "mean score 1 (score 0.25, exact 0.5)" in stderr, stderr


SLEEPY = '''
import os, time

def score(input, output, expected=None):
    open(os.path.join(os.path.dirname(__file__), "inside"), "a").close()  # the test waits for it
    time.sleep(30)
    return 1.0, {"feedback": "late"}
'''


@pytest.mark.parametrize("threads", [1, 4])
def test_ctrl_c_stops_at_once_with_exit_130(tmp_path, threads):
    """The calls in progress are not waited for: closing the metric kills their workers."""
    import signal
    import subprocess
    import sys
    import time

    metric = write_metric(tmp_path, SLEEPY)
    command = [sys.executable, "-m", "skynet_dspy._cli", "score", str(metric), "--data", str(write_cases(tmp_path, 8)),
               "--threads", str(threads), "--timeout", "60"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    inside = metric.parent / "inside"
    for _ in range(1200):  # a call is inside score (a loaded machine may take long to get there)
        if inside.exists() or process.poll() is not None:
            break
        time.sleep(0.1)
    assert inside.exists(), process.communicate(timeout=30)[1][-2000:]
    interrupted = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    # each call sleeps 30 s: ending well before that, the command did not wait for the calls in progress
    assert time.monotonic() - interrupted < 20, "the command waited for the calls in progress"
