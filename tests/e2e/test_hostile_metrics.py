"""A metric that loops, hangs, crashes, exits, forks or tampers never stalls or kills the run (docs/contract.md#limits).

Every hostile behaviour runs through dspy.Evaluate(num_threads=8), dspy.GEPA(num_threads=4) and
`skynet-dspy check`, with timeout=1, in the default isolation (worker processes). For each: the run
finishes in about (calls x timeout) plus a few seconds, later calls score normally, this process's
CPU goes back to idle, and no worker process is left once the run's process exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import dspy
import pytest

import skynet_dspy
from skynet_dspy import Failure
from skynet_dspy._core.isolation.process import START_VARIABLE

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, params=["template", "fresh"])
def start_mode(request, monkeypatch) -> str:
    """Every test here runs twice: workers forked from the template, and fresh-interpreter workers."""
    monkeypatch.setenv(START_VARIABLE, request.param)
    return request.param


# case -> the failure kind its call must end in (None: it scores normally)
HOSTILE = {
    "spin": Failure.TIMEOUT,  # a pure-Python loop
    "c_loop": Failure.TIMEOUT,  # a long C-level call holding the GIL
    "bare_except": Failure.TIMEOUT,  # a retry loop that swallows everything
    "sleep": Failure.TIMEOUT,
    "float_sleeps": Failure.TIMEOUT,  # a returned number whose __float__ hangs
    "float_exits": Failure.CRASHED,  # ... or ends the process
    "float_sys_exit": Failure.INVALID,  # ... or raises SystemExit
    "str_sleeps": Failure.TIMEOUT,  # an exception whose __str__ hangs
    "str_exits": Failure.CRASHED,
    "keyboard_interrupt": Failure.EXCEPTION,
    "os_exit": Failure.CRASHED,
    "fork": Failure.CRASHED,
    "signal_mask": Failure.TIMEOUT,  # blocks every signal, then hangs
    "recursion_limit": None,  # sys.setrecursionlimit(40), then returns normally
    "stuck_pool": None,  # leaves a thread pool stuck in the background, then returns normally
}

METRIC = textwrap.dedent('''
    import concurrent.futures, os, re, signal, sys, time

    class SlowFloat(float):
        def __float__(self):
            time.sleep(10**6)

    class ExitingFloat(float):
        def __float__(self):
            os._exit(4)

    class SysExitFloat(float):
        def __float__(self):
            sys.exit(5)

    class SlowStr(Exception):
        def __str__(self):
            time.sleep(10**6)

    class ExitingStr(Exception):
        def __str__(self):
            os._exit(6)

    def score(input, output, expected=None):
        case = input["case"]
        if case == "spin":
            while True:
                pass
        if case == "c_loop":
            sum(range(3 * 10**9))
        if case == "bare_except":
            while True:
                try:
                    time.sleep(10)
                except:  # noqa: E722
                    pass
        if case == "sleep":
            time.sleep(10**6)
        if case == "float_sleeps":
            return SlowFloat(1.0), {"feedback": "x"}
        if case == "float_exits":
            return ExitingFloat(1.0), {"feedback": "x"}
        if case == "float_sys_exit":
            return SysExitFloat(1.0), {"feedback": "x"}
        if case == "str_sleeps":
            raise SlowStr()
        if case == "str_exits":
            raise ExitingStr()
        if case == "keyboard_interrupt":
            raise KeyboardInterrupt
        if case == "os_exit":
            os._exit(3)
        if case == "fork":
            if os.fork() == 0:
                time.sleep(10**6)
        if case == "signal_mask":
            signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals))
            time.sleep(10**6)
        if case == "recursion_limit":
            sys.setrecursionlimit(40)
        if case == "stuck_pool":
            concurrent.futures.ThreadPoolExecutor(2).submit(time.sleep, 10**6)
        right = output == expected["label"]
        return (1.0 if right else 0.0), {"feedback": "right" if right else "wrong"}
''')


class Echo(dspy.Module):
    """A program with no model: it answers the label it is told to (so scores are known in advance)."""

    def forward(self, case: str, answer: str) -> dspy.Prediction:
        return dspy.Prediction(label=answer)


def _examples(cases: list[str]) -> list[dspy.Example]:
    return [dspy.Example(case=case, answer="yes", label="yes").with_inputs("case", "answer") for case in cases]


def _idle_cpu(seconds: float = 1.0) -> float:
    """CPU seconds this process used while doing nothing for `seconds` (a stuck thread would show here)."""
    start = time.process_time()
    time.sleep(seconds)
    return time.process_time() - start


@pytest.fixture
def hostile_metric(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.py"
    path.write_text(METRIC, encoding="utf-8")
    return path


def test_every_hostile_call_is_contained_under_evaluate_with_8_threads(hostile_metric):
    cases = [*HOSTILE, "good", "good", "good"]
    metric = skynet_dspy.load_metric(hostile_metric, timeout=1)
    try:
        started = time.monotonic()
        result = dspy.Evaluate(devset=_examples(cases), metric=metric, num_threads=8, display_progress=False)(Echo())
        elapsed = time.monotonic() - started
        by_case = {row[0].case: row[2] for row in result.results}
        for case, kind in HOSTILE.items():
            assert by_case[case].result.failure == kind, (case, by_case[case].result)
            if kind is not None:
                assert float(by_case[case]) == 0.0
        assert all(float(by_case[case]) == 1.0 for case in ("good", "recursion_limit", "stuck_pool"))
        stuck = sum(kind in (Failure.TIMEOUT,) for kind in HOSTILE.values())
        assert elapsed < stuck * 1.0 + 15, elapsed
        # the same metric object scores good calls normally afterwards, on healthy workers
        again = dspy.Evaluate(devset=_examples(["good"] * 8), metric=metric, num_threads=8)(Echo())
        assert again.score == 100.0
        assert metric.stats["timeout"] >= stuck and metric.stats["crashed"] >= 4
        assert _idle_cpu() < 0.3
        assert _zombie_children() == []  # every killed or exited worker was reaped
        workers = metric.scorer.executor.worker_pids
        assert workers
    finally:
        metric.close()
    assert not set(workers) & set(_children_running_workers())


def test_hostile_calls_never_stop_a_gepa_run_with_4_threads(hostile_metric, server):
    server.responder = lambda request: "[[ ## new_instruction ## ]]\nAnswer yes.\n\n[[ ## completed ## ]]"
    reflection = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local", cache=False)
    metric = skynet_dspy.load_metric(hostile_metric, timeout=1)
    program = dspy.Predict("case, answer -> label")
    program.forward = lambda case, answer: dspy.Prediction(label=answer)  # no task model needed
    cases = ["spin", "os_exit", "fork", "good", "good", "float_exits"]
    try:
        started = time.monotonic()
        optimizer = dspy.GEPA(metric=metric, reflection_lm=reflection, max_metric_calls=24, num_threads=4,
                              reflection_minibatch_size=3, seed=0)
        optimizer.compile(program, trainset=_examples(cases), valset=_examples(cases))
        elapsed = time.monotonic() - started
        assert elapsed < 24 * 1.0 + 15
        assert metric.stats["timeout"] >= 1 and metric.stats["crashed"] >= 1
        good = metric.score({"case": "good", "answer": "yes"}, "yes", {"label": "yes"})
        assert good.ok and good.score == 1.0
        assert _idle_cpu() < 0.3
    finally:
        metric.close()


def _cases_file(case: str, folder: Path) -> Path:
    data = folder / f"{case}.jsonl"
    case_line = {"input": {"case": case, "answer": "yes"}, "output": "yes", "expected": {"label": "yes"}}
    data.write_text(json.dumps(case_line))
    return data


def _check(metric: Path, case: str, folder: Path) -> subprocess.Popen:
    data = _cases_file(case, folder)
    return subprocess.Popen(
        [sys.executable, "-m", "skynet_dspy", "check", str(metric), "--data", str(data), "--timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


# Cases whose check also runs as its own `skynet-dspy` process, to see that process exit: the others run the
# same command line in this process (a fresh interpreter per case costs seconds of CPU).
IN_A_PROCESS_OF_THEIR_OWN = ("fork", "stuck_pool", "os_exit", "signal_mask", "good")


def test_the_command_line_check_reports_every_hostile_metric_and_exits(hostile_metric, tmp_path, capsys):
    from skynet_dspy._cli import main

    started = time.monotonic()
    running = {case: _check(hostile_metric, case, tmp_path) for case in IN_A_PROCESS_OF_THEIR_OWN}
    for case in HOSTILE:
        if case in running:
            continue
        _cases_file(case, tmp_path)
        code = main(["check", str(hostile_metric), "--data", str(tmp_path / f"{case}.jsonl"), "--timeout", "1"])
        out = capsys.readouterr().out
        kind = HOSTILE[case]
        assert code == (0 if kind is None else 1), (case, out)
        assert out.count("Contract check of") == 1 and (kind is None or str(kind) in out), (case, out)
    for case, process in running.items():
        out, err = process.communicate(timeout=120)
        kind = HOSTILE.get(case)
        assert process.returncode == (0 if kind is None else 1), (case, out, err)
        assert out.count("Contract check of") == 1, (case, out)  # one report, even after a fork
        if kind is not None:
            assert str(kind) in out, (case, out)
    assert time.monotonic() - started < 120


def test_a_module_that_hangs_at_import_fails_to_load_within_the_timeout(tmp_path):
    path = tmp_path / "slow_import.py"
    path.write_text("import time\ntime.sleep(10**6)\ndef score(input, output):\n    return 1.0, {'feedback': ''}\n")
    started = time.monotonic()
    with pytest.raises(skynet_dspy.MetricLoadError, match="did not finish within the 1 s timeout"):
        skynet_dspy.load_metric(path, timeout=1)
    assert time.monotonic() - started < 10
    report = skynet_dspy.check_contract(path, [{"input": {}, "output": 1}], timeout=1)
    assert not report.ok and report.item("Metric loads").status == "failed"


def test_no_worker_process_is_left_after_the_run_ends(hostile_metric, tmp_path):
    tag = uuid.uuid4().hex
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f'''
        import dspy, skynet_dspy, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_hostile_metrics import Echo, _examples, HOSTILE
        metric = skynet_dspy.load_metric({str(hostile_metric)!r}, timeout=1)
        dspy.Evaluate(devset=_examples([*HOSTILE, "good"]), metric=metric, num_threads=8)(Echo())
        print("pids", metric.scorer.executor.worker_pids)
        # no close(): the interpreter's exit must stop the workers
    '''))
    env = {**os.environ, "SKYNET_TEST_TAG": tag}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pids [" in done.stdout
    time.sleep(0.5)
    assert _tagged_processes(tag) == []


def _proc_stats() -> list[tuple[int, str, int]]:
    """(pid, state, parent pid) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            fields = text[text.rfind(")") + 2:].split()
            found.append((int(entry.name), fields[0], int(fields[1])))
    return found


def _zombie_children() -> list[int]:
    return [pid for pid, state, parent in _proc_stats() if parent == os.getpid() and state == "Z"]


def _children_running_workers() -> list[int]:
    """This process's children that are metric workers (none once every metric is closed)."""
    found = []
    for pid, _, parent in _proc_stats():
        if parent == os.getpid():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"skynet_dspy._core.isolation." in cmdline:
                found.append(pid)
    return found


def _tagged_processes(tag: str) -> list[str]:
    """Processes (zombies included) whose environment holds the tag: the run's workers and what they forked."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if f"SKYNET_TEST_TAG={tag}".encode() in environ:
            state = next((line for line in status.splitlines() if line.startswith("State:")), "")
            found.append(f"{entry.name} {state}")
    return found
