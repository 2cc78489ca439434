"""`skynet-dspy check METRIC.py --data CASES.jsonl [--timeout S]`: report, exit codes, start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import returning, write_metric

from skynet_dspy._cli import main

CASES = [
    {"input": {"ticket": "I was charged twice."}, "expected": {"label": "billing"}},
    {"input": {"ticket": "The app crashes."}, "output": "billing", "expected": {"label": "bug"}},
    {"input": {"ticket": "How do I export?"}, "output": "how-to", "expected": {"label": "how-to"}},
]
# LiteLLM's own log lines read "... - LiteLLM:WARNING: ..."; messages of ours may name LiteLLM in prose.
NETWORK_NOISE = ("LiteLLM:", "cost map", "ConnectError", "Traceback")


def write_cases(folder: Path, cases: list, name: str = "cases.jsonl") -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    return path




def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def command() -> list[str]:
    """The installed console script, or `python -m skynet_dspy` where it is not installed."""
    script = Path(sys.executable).with_name("skynet-dspy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "skynet_dspy"]


def offline_env() -> dict[str, str]:
    """The environment a user has: without the bundled-price-list switch the test session sets."""
    env = {key: value for key, value in os.environ.items() if key != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


# -- exit codes through main() --------------------------------------------------------------------

VERDICTS = [
    ('(0.8, {"feedback": "Close. Missing the date."})', 0),
    ('[1.0, {"feedback": "OK", "scores": {"format": 1.0}}]', 0),
    ("0.8", 1),
    ('(0.8, "Close.")', 1),
    ("(0.8, {})", 1),
    ('("0.8", {"feedback": "OK"})', 1),
    ('(0.8, {"feedback": "OK", "scores": {"a": "high"}})', 1),
    ('(math.nan, {"feedback": "x"})', 1),
    ('(-math.inf, {"feedback": "x"})', 1),
    ('(False, {"feedback": "x"})', 1),  # every output scores 0: a metric that never rewards
    ('(np.float64(0.5), {"feedback": "x"})', 0),
    ('(np.int32(1), {"feedback": "x"})', 0),
    ('(1.0, {"feedback": "x"}, None)', 1),
    ("None", 1),
    ('(x for x in (1.0, {"feedback": "x"}))', 1),
]


@pytest.mark.parametrize(("value", "code"), VERDICTS)
def test_exit_code_follows_the_verdict(tmp_path, capsys, value, code):
    data = write_cases(tmp_path, CASES)
    exit_code, out, err = run_main(capsys, "check", returning(tmp_path, value), "--data", data)
    assert exit_code == code, out
    assert "Metric return value" in out
    assert out.rstrip().splitlines()[-1].startswith("The contract holds" if code == 0 else "The contract is broken")
    assert err == ""


@pytest.mark.parametrize(("params", "code"), [("input", 1), ("a, b, c, d", 1), ("*args", 0), ("input, output", 0)])
def test_exit_code_follows_the_signature(tmp_path, capsys, params, code):
    data = write_cases(tmp_path, CASES)
    exit_code, out, _ = run_main(capsys, "check", returning(tmp_path, '(1.0, {"feedback": "x"})', params), "--data",
                                 data)
    assert exit_code == code
    assert ("[FAIL] Metric signature" in out) == (code == 1)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("def score(input, output):\n    return (1.0,\n", "line 2: syntax error"),
        ("raise RuntimeError('no config')\n", "line 1 (`raise RuntimeError('no config')`): importing the file raised"),
        ("def scorer(input, output):\n    pass\n", "defines no function named `score`"),
        ("score = None\n", "defines no function named `score`"),
        ("score = [1]\n", "`score` is a list, not a function"),
    ],
)
def test_load_errors_exit_1_with_the_report(tmp_path, capsys, body, words):
    metric = tmp_path / "metric.py"
    metric.write_text(body)
    exit_code, out, err = run_main(capsys, "check", metric, "--data", write_cases(tmp_path, CASES))
    assert exit_code == 1
    assert "[FAIL] Metric loads" in out and words in " ".join(out.split())
    assert "Traceback" not in out + err


def test_a_good_metric_prints_the_report_and_exits_0(metrics_dir, tmp_path, capsys):
    exit_code, out, err = run_main(capsys, "check", metrics_dir / "exact_match.py", "--data",
                                   write_cases(tmp_path, CASES))
    assert exit_code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"Contract check of {metrics_dir / 'exact_match.py'} on 3 cases"
    assert lines[-1] == "The contract holds."
    assert "[ ok ] Perfect output scores highest" in out
    assert "case 2, given output" in out and "Expected 'bug', got 'billing'." in out


def test_the_timeout_option_reaches_the_check(metrics_dir, tmp_path, capsys):
    _, out, _ = run_main(capsys, "check", metrics_dir / "exact_match.py", "--data", write_cases(tmp_path, CASES),
                         "--timeout", "2.5")
    assert "within the 2.5 s timeout" in out


def test_a_hanging_metric_exits_1_at_metric_timeout(tmp_path, capsys):
    metric = write_metric(tmp_path, """
        import time

        def score(input, output, expected=None):
            time.sleep(30)
            return 1.0, {"feedback": "late"}
        """)
    exit_code, out, _ = run_main(capsys, "check", metric, "--data", write_cases(tmp_path, CASES), "--timeout", "0.5")
    assert exit_code == 1
    assert "[FAIL] Metric timeout" in out and "did not return within 0.5 s" in out


# -- exit code 2: bad arguments and unreadable files ------------------------------------------------


def usage_error(capsys, *argv: str) -> str:
    exit_code, out, err = run_main(capsys, *argv)
    assert exit_code == 2, out + err
    assert out == ""
    assert "Traceback" not in err
    return err


def test_missing_metric_file(tmp_path, capsys):
    err = usage_error(capsys, "check", tmp_path / "nope.py", "--data", write_cases(tmp_path, CASES))
    assert err.strip() == f"skynet-dspy: error: metric file not found: {tmp_path / 'nope.py'}"


def test_metric_path_is_a_folder(tmp_path, capsys):
    err = usage_error(capsys, "check", tmp_path, "--data", write_cases(tmp_path, CASES))
    assert "is a folder" in err


def test_missing_data_file(metrics_dir, tmp_path, capsys):
    err = usage_error(capsys, "check", metrics_dir / "exact_match.py", "--data", tmp_path / "none.jsonl")
    assert err.strip() == f"skynet-dspy: error: data file not found: {tmp_path / 'none.jsonl'}"


def test_data_file_is_a_folder(metrics_dir, tmp_path, capsys):
    err = usage_error(capsys, "check", metrics_dir / "exact_match.py", "--data", tmp_path)
    assert "is a folder; give the path of a .jsonl file" in err


def test_data_file_that_is_not_utf8(metrics_dir, tmp_path, capsys):
    data = tmp_path / "cases.jsonl"
    data.write_bytes(b'{"input": {"t": "\xff"}, "output": "x"}\n')
    err = usage_error(capsys, "check", metrics_dir / "exact_match.py", "--data", data)
    assert "is not UTF-8 text" in err


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"input": {"t": 1}, "output": "x"}\n{"input": {"t": 2}, "output": \n', "line 2: not valid JSON"),
        ('["input", "output"]\n', "line 1: each case must be a dspy.Example or a dict"),
        ('{"input": {"t": 1}, "expectd": {"label": "x"}, "output": "x"}\n',
         "line 1: a case has unknown key(s) 'expectd'"),
        ('{"input": {"t": 1}}\n', "line 1: a case needs an 'output' to score, or 'expected' values"),
        ('{"input": {"t": 1}, "output": "x", "expected": "x"}\n', "line 1: a case's 'expected' must be a dict"),
        ("\n\n", "holds no cases"),
        ("", "holds no cases"),
    ],
)
def test_invalid_data_file(metrics_dir, tmp_path, capsys, content, words):
    data = tmp_path / "cases.jsonl"
    data.write_text(content, encoding="utf-8")
    err = usage_error(capsys, "check", metrics_dir / "exact_match.py", "--data", data)
    assert words in err and str(data) in err


@pytest.mark.parametrize("timeout", ["0", "-1", "600.5", "nan", "inf", "soon"])
def test_bad_timeout(metrics_dir, tmp_path, capsys, timeout):
    err = usage_error(capsys, "check", metrics_dir / "exact_match.py", "--data", write_cases(tmp_path, CASES),
                      "--timeout", timeout)
    assert f"argument --timeout: '{timeout}' is not a number of seconds in (0, 600]" in err


def test_missing_arguments(metrics_dir, capsys):
    assert "the following arguments are required: --data" in usage_error(capsys, "check", "metric.py")
    assert "the following arguments are required: COMMAND" in usage_error(capsys)
    assert "invalid choice: 'chek'" in usage_error(capsys, "chek")


def test_data_with_a_bom_and_blank_lines_is_read(metrics_dir, tmp_path, capsys):
    data = tmp_path / "cases.jsonl"
    data.write_text("\ufeff" + json.dumps(CASES[0]) + "\n\n" + json.dumps(CASES[2]) + "\n", encoding="utf-8")
    exit_code, out, _ = run_main(capsys, "check", metrics_dir / "exact_match.py", "--data", data)
    assert exit_code == 0 and "on 2 cases" in out


# -- as a user runs it: a separate process, no network ------------------------------------------------


def run_cli(*argv: object, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*command(), *map(str, argv)], capture_output=True, text=True, timeout=timeout,
                          env=offline_env())


def test_the_command_runs_offline_without_network_warnings(metrics_dir, tmp_path):
    done = run_cli("check", metrics_dir / "exact_match.py", "--data", write_cases(tmp_path, CASES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "The contract holds." in done.stdout
    assert done.stderr == ""
    for noise in NETWORK_NOISE:
        assert noise not in done.stdout + done.stderr


def test_the_judge_example_reports_llm_not_configured_offline(metrics_dir, tmp_path):
    data = write_cases(tmp_path, [{"input": {"question": "2+2?"}, "output": "4"}])
    done = run_cli("check", metrics_dir / "judge.py", "--data", data)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[FAIL] Metric return value" in done.stdout
    flat = " ".join(done.stdout.split())
    assert "ModelNotConfigured" in flat and ("metric_lm" in flat or "reflection_lm" in flat)
    assert "expected=None" not in flat  # the hint about missing expected values is for None errors only
    assert done.stderr == ""
    for noise in NETWORK_NOISE:
        assert noise not in done.stdout + done.stderr


def test_bad_arguments_in_a_process_exit_2_without_a_traceback(metrics_dir, tmp_path):
    done = run_cli("check", metrics_dir / "exact_match.py", "--data", tmp_path / "missing.jsonl")
    assert done.returncode == 2
    assert done.stdout == "" and "skynet-dspy: error: data file not found" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_hanging_metric_does_not_hold_the_process(tmp_path):
    metric = write_metric(tmp_path, """
        import time

        def score(input, output, expected=None):
            time.sleep(30)
            return 1.0, {"feedback": "late"}
        """)
    done = run_cli("check", metric, "--data", write_cases(tmp_path, CASES), "--timeout", "0.5", timeout=25)
    assert done.returncode == 1 and "[FAIL] Metric timeout" in done.stdout


def test_python_dash_m_and_version():
    done = subprocess.run([sys.executable, "-m", "skynet_dspy", "--version"], capture_output=True, text=True,
                          timeout=120, env=offline_env())
    assert done.returncode == 0 and done.stdout.startswith("skynet-dspy ")


def test_import_does_not_load_litellm_and_later_litellm_use_is_offline():
    code = (
        "import sys\n"
        "import skynet_dspy\n"
        "print('litellm loaded by import:', 'litellm' in sys.modules)\n"
        "import litellm\n"  # what llm() and dspy.LM do later: must not fetch the price list
        "print('priced:', 'gpt-4o-mini' in litellm.model_cost)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=offline_env())
    assert done.returncode == 0, done.stderr
    assert "litellm loaded by import: False" in done.stdout
    assert "priced: True" in done.stdout
    assert "LiteLLM" not in done.stderr
    for noise in NETWORK_NOISE:
        assert noise not in done.stdout + done.stderr


def test_output_fields_option(metrics_dir, tmp_path, capsys):
    cases = [{"input": {"t": 1}, "expected": {"label": "a", "id": 7}}, {"input": {"t": 2}, "expected": {"label": "b",
                                                                                                        "id": 8}}]
    data = write_cases(tmp_path, cases)
    _, out, _ = run_main(capsys, "check", metrics_dir / "exact_match.py", "--data", data)
    assert "[warn] Perfect output scores highest" in out and "output_fields" in out
    exit_code, out, _ = run_main(capsys, "check", metrics_dir / "exact_match.py", "--data", data,
                                 "--output-fields", "label")
    assert exit_code == 0 and "[ ok ] Perfect output scores highest" in out
    assert "not a comma-separated list" in usage_error(capsys, "check", metrics_dir / "exact_match.py", "--data",
                                                       data, "--output-fields", "label,,id")
    # issue 15 item 4: a field without expected values is unlabelled, not an error; the probe is skipped, saying why
    exit_code, out, err = run_main(capsys, "check", metrics_dir / "exact_match.py", "--data", data,
                                   "--output-fields", "lable")
    flat = " ".join(out.split())
    assert "[ -- ] Perfect output scores highest skipped:" in flat and "output fields lable" in flat
    assert "no perfect output to try" in flat
    # nothing could be scored at all: the contract is not shown to hold, and the typo is named
    assert exit_code == 1 and err == "", out
    assert "[FAIL] Metric return value no call could be made" in flat and "did you mean 'label'?" in flat


def test_output_fields_with_an_unlabelled_field(tmp_path, capsys):
    """A program with an answer and a confidence, only the answer labelled: given outputs are used as given."""
    metric = write_metric(tmp_path, """
        def score(input, output, expected=None):
            right = output["answer"] == expected["answer"]
            return float(right), {"feedback": f"right={right} confidence={output.get('confidence')}"}
        """)
    cases = [{"input": {"q": "2+2?"}, "output": {"answer": "4", "confidence": 0.9}, "expected": {"answer": "4"}},
             {"input": {"q": "3+3?"}, "output": {"answer": "7", "confidence": 0.2}, "expected": {"answer": "6"}}]
    exit_code, out, _ = run_main(capsys, "check", metric, "--data", write_cases(tmp_path, cases),
                                 "--output-fields", "answer,confidence")
    assert exit_code == 0, out
    assert "[ ok ] Perfect output scores highest" in out
    assert "right=True confidence=0.9" in out and "right=False confidence=0.2" in out
    assert "right=True confidence=None" in out  # the probe fills only the labelled field


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_what_the_metric_prints_never_goes_into_the_report(tmp_path, capfd, isolation):
    # capfd, not capsys: fd-level. A worker process's output is captured per call (docs/isolation.md), a thread's
    # goes to stderr
    metric = tmp_path / "noisy.py"
    metric.write_text(
        "def score(input, output, expected=None):\n"
        "    print('NOISE FROM THE METRIC')\n"
        "    return 1.0, {'feedback': 'ok'}\n"
    )
    data = write_cases(tmp_path, [{"input": {"t": 1}, "output": "a", "expected": {"label": "a"}}])
    exit_code, out, err = run_main(capfd, "check", metric, "--data", data, "--isolation", isolation)
    assert exit_code == 0 and "Contract check of" in out
    assert "NOISE FROM THE METRIC" not in out and ("NOISE FROM THE METRIC" in err) == (isolation == "thread")


INVERTED_METRIC = '''
def score(input, output, expected=None):
    right = output != expected["label"]   # the bug: an inverted comparison
    return float(right), {"feedback": "right" if right else "wrong"}
'''


def test_an_inverted_metric_fails_the_check_with_exit_1_in_text_and_json(tmp_path, capsys):
    cases = [{"input": {"t": n}, "expected": {"label": label}} for n, label in enumerate(["a", "b", "c"])]
    data = write_cases(tmp_path, cases)
    metric = tmp_path / "inverted.py"
    metric.write_text(INVERTED_METRIC, encoding="utf-8")
    exit_code, out, _ = run_main(capsys, "check", metric, "--data", data)
    assert exit_code == 1
    assert "[FAIL] Perfect output scores highest" in out
    assert out.rstrip().splitlines()[-1].startswith("The contract is broken")
    assert "inverted comparison" in out.rstrip().splitlines()[-1]
    exit_code, out, _ = run_main(capsys, "check", metric, "--data", data, "--json")
    report = json.loads(out)
    assert exit_code == 1 and report["ok"] is False
    item = next(item for item in report["items"] if item["name"] == "Perfect output scores highest")
    assert item["status"] == "failed" and "no higher than the failure score" in item["message"]
    assert "inverted comparison" in report["verdict"]
