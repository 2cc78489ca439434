"""sandbox=True end to end, with real bubblewrap: what a sandboxed metric cannot reach, what still works, and
plain GEPA's run() in (sandboxed) workers under an optimizer.

The same-user holes of the unsandboxed default (the user's environment, memory, signals, an escaping daemon)
are in test_attacks.py, run both ways.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure

REACHES = '''
import json, os, socket

def score(input, output, expected=None):
    seen = {}
    try:  # a port on the host's loopback, opened by the test
        socket.create_connection(("127.0.0.1", input["port"]), timeout=2).close()
        seen["connected"] = True
    except OSError as exc:
        seen["connected"] = type(exc).__name__
    for name, path in input["writes"].items():
        try:
            with open(path, "w") as file:
                file.write("escaped")
            seen[name] = "written"
        except OSError as exc:
            seen[name] = type(exc).__name__
    with open("/tmp/private.txt", "w") as file:  # its own temporary folder works
        file.write("mine")
    seen["tmp"] = open("/tmp/private.txt").read()
    seen["home"] = sorted(os.listdir(os.path.expanduser("~")))
    home = input["user_home"]
    seen["user_home"] = sorted(os.listdir(home)) if os.path.isdir(home) and home != "/" else []
    return 1.0, {"feedback": json.dumps(seen)}
'''


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    return server


@pytest.mark.parametrize("network", [False, True])
def test_a_sandboxed_metric_reaches_no_port_and_writes_nowhere_outside_its_own_tmp(tmp_path, network):
    import json

    listener = _listener()
    accepted = []

    def accept() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not accepted:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    token = uuid.uuid4().hex
    outside = tmp_path.parent / f"escape-{token}.txt"  # beside the metric's folder, on the host's /tmp
    writes = {
        "metric_folder": str(tmp_path / f"planted-{token}.py"),
        "beside": str(outside),
        "host_tmp": f"/tmp/escape-{token}.txt",
        "cwd": str(Path.cwd() / f"escape-{token}.txt"),
        "usr": f"/usr/escape-{token}.txt",
    }
    path = write_metric(tmp_path, REACHES)
    home = os.path.expanduser("~")
    with skynet_dspy.load_metric(str(path), sandbox=True, sandbox_network=network, timeout=20) as metric:
        result = metric.score({"port": listener.getsockname()[1], "writes": writes, "user_home": home}, "x")
    waiter.join(20)
    listener.close()
    for found in accepted:
        found.close()
    assert result.failure is None, result.detail
    seen = json.loads(result.feedback)
    if network:  # sandbox_network=True: the host's network, loopback included
        assert seen["connected"] is True and accepted
    else:
        assert seen["connected"] != True and not accepted, seen  # noqa: E712 - True, or the exception's name
    for name, where in writes.items():
        assert not Path(where).exists(), f"the sandboxed metric wrote {name} on the host: {where}"
    assert seen["metric_folder"] != "written" and seen["usr"] != "written", seen  # read-only where it is bound
    assert seen["tmp"] == "mine" and not Path("/tmp/private.txt").exists()
    assert "private.txt" in seen["home"] and not set(seen["home"]) & set(os.listdir(home))  # HOME: its own /tmp
    needed = {Path(entry).resolve() for entry in [sys.prefix, sys.base_prefix, *sys.path] if entry}
    allowed = {entry.relative_to(home).parts[0] for entry in needed
               if entry.is_relative_to(home) and entry != Path(home)}
    assert set(seen["user_home"]) <= allowed, "the user's home shows more than the interpreter and import path"
    assert len(os.listdir(home)) > len(seen["user_home"]) or not os.listdir(home)


JUDGED = '''
import skynet

def score(input, output, expected=None):
    verdict = skynet.llm("Answer PASS or FAIL.", input=str(output))
    right = float(output == expected["answer"])
    return right, {"feedback": f"{verdict} / {output}", "scores": {"exact": right, "length": len(str(output))}}
'''


def test_llm_works_and_scores_match_the_unsandboxed_run(tmp_path, server):
    server.responder = lambda request: "PASS"
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    path = write_metric(tmp_path, JUDGED)
    cases = [({"q": str(n)}, str(n * 2), {"answer": str(n * 2 if n % 2 else n)}) for n in range(6)]
    results = {}
    for sandbox in (False, True):
        with skynet_dspy.load_metric(str(path), metric_lm=lm, judge_cache=False, sandbox=sandbox) as metric:
            results[sandbox] = [metric.score(*case) for case in cases]
    assert all(result.failure is None for result in results[True]), [r.detail for r in results[True]]
    assert [(r.score, r.feedback, r.scores) for r in results[True]] == [
        (r.score, r.feedback, r.scores) for r in results[False]]
    assert results[True][0].feedback.startswith("PASS")
    assert {r.score for r in results[True]} == {0.0, 1.0}


def test_a_metric_given_by_value_from_this_process_runs_sandboxed():
    def score(input, output, expected=None):
        import os

        return float(os.getpid() == 2), {"feedback": f"pid {os.getpid()} under {os.getppid()}"}

    with skynet_dspy.load_metric(score, sandbox=True) as metric:
        result = metric.score({}, "x")
    assert result.score == 1.0 and result.feedback == "pid 2 under 1", result  # its own PID namespace


# -- plain GEPA: run() in sandboxed workers ----------------------------------------------------------------

RUN = '''
def run(artifact, input):
    namespace = {}
    exec(artifact, namespace)
    return namespace["solve"](input["x"])
'''
METRIC = '''
def score(input, output, expected=None):
    right = output == expected["y"]
    return float(right), {"feedback": "right" if right else f"expected another value than {output!r}"}
'''
CANDIDATES = {
    "loops": "def solve(x):\n    while True:\n        pass",
    "exits": "import os\ndef solve(x):\n    os._exit(3)",
    "forks": "import os\ndef solve(x):\n    os.fork()\n    return x * 2",
    "sleeps_in_c": "import time\ndef solve(x):\n    time.sleep(10**6)",
    "good": "def solve(x):\n    return x * 2",
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sandbox", [False, True])
def test_plain_gepa_with_run_in_workers_goes_through_loops_exits_and_forks_within_its_budget(tmp_path, sandbox):
    """GEPA proposes candidates that loop, exit, fork and sleep: each scores the failure score, the run goes on,
    and the good one wins."""
    run_path = write_metric(tmp_path, RUN, "run.py")
    metric_path = write_metric(tmp_path, METRIC)
    order = ["loops", "exits", "forks", "sleeps_in_c", "good"]
    proposed = []

    def reflect(prompt: str) -> str:
        name = order[min(len(proposed), len(order) - 1)]
        proposed.append(name)
        return f"```\n{CANDIDATES[name]}\n```"

    data = [{"input": {"x": n}, "expected": {"y": n * 2}} for n in (1, 2)]
    start = time.monotonic()
    result = skynet_dspy.optimize_anything(
        "def solve(x):\n    return x", str(run_path), str(metric_path), trainset=data, reflection_lm=reflect,
        max_metric_calls=24, reflection_minibatch_size=2, run_isolation="process", run_timeout=1.0,
        sandbox=sandbox, timeout=10, parallel=False, merge=False, frontier_type="instance",
    )
    seconds = time.monotonic() - start
    assert set(order[:4]) <= set(proposed), proposed
    assert result.best_candidate == CANDIDATES["good"]
    assert max(result.val_aggregate_scores) == 1.0
    assert seconds < 240, f"the run took {seconds:.0f} s"
    assert run_path.exists() and metric_path.exists()


def test_make_evaluator_scores_each_way_a_run_can_fail_and_then_a_good_one(tmp_path):
    run_path = write_metric(tmp_path, RUN, "run.py")
    metric_path = write_metric(tmp_path, METRIC)
    example = {"input": {"x": 3}, "expected": {"y": 6}}
    with skynet_dspy.make_evaluator(str(run_path), str(metric_path), run_isolation="process", run_timeout=1.0,
                                    sandbox=True, failure_score=-1.0) as evaluator:
        results = {name: evaluator.evaluate(code, example) for name, code in CANDIDATES.items()}
        deletes = f"import os\ndef solve(x):\n    os.remove({str(run_path)!r})\n    return x * 2"
        results["deletes"] = evaluator.evaluate(deletes, example)
        score, side_info = evaluator(CANDIDATES["good"], example)
    for name in ("loops", "exits", "forks", "sleeps_in_c"):
        assert results[name].failure is Failure.RUN_EXCEPTION and results[name].score == -1.0, (name, results[name])
    assert "did not return within 1 s" in results["loops"].feedback
    assert "os.fork()" in results["forks"].feedback
    assert "ended its process" in results["exits"].feedback
    assert results["deletes"].failure is Failure.RUN_EXCEPTION and run_path.exists()  # a read-only view
    assert "OSError" in results["deletes"].feedback
    assert (score, side_info) == (1.0, {"Inputs": {"x": 3}, "Generated Outputs": 6, "feedback": "right"})
    assert evaluator.workers.executor.worker_pids == []  # closed with the evaluator


def test_run_raising_in_a_worker_gives_the_same_feedback_as_in_this_process(tmp_path):
    metric_path = write_metric(tmp_path, METRIC)

    def run(artifact, input):
        raise ValueError(f"no solve in {artifact!r}")

    example = {"input": {"x": 3}, "expected": {"y": 6}}
    feedbacks = []
    for isolation in ("thread", "process"):
        with skynet_dspy.make_evaluator(run, str(metric_path), run_isolation=isolation) as evaluator:
            feedbacks.append(evaluator("abc", example))
    expected = (0.0, {"Inputs": {"x": 3}, "feedback": "run(artifact, input) raised ValueError: no solve in 'abc'"})
    assert feedbacks[0] == feedbacks[1] == expected
