"""_gepa/run_workers.py through the public API: make_evaluator(run_isolation="process") runs run(artifact, input)
in workers."""

from __future__ import annotations

import os

import pytest

import skynet_dspy
from skynet_dspy import Failure

EXAMPLE = {"input": {"x": 3}, "expected": {"y": 6}}


def score(input, output, expected=None):
    return float(output == expected["y"]), {"feedback": f"got {output!r}"}


@pytest.mark.parametrize("options, message", [
    ({"run_isolation": "subprocess"}, "run_isolation must be 'thread' .*, 'process' or 'sandbox'"),
    ({"run_timeout": 5}, "run_timeout= bounds run.* needs run_isolation='process'"),
    ({"run_isolation": "process", "run_timeout": 0}, "timeout"),
])
def test_run_options_that_cannot_hold_are_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        skynet_dspy.make_evaluator(lambda artifact, input: artifact, score, **options)


def test_run_happens_in_another_process_and_its_plain_output_reaches_the_metric():
    here = os.getpid()

    def run(artifact, input):
        import os

        return input["x"] * 2 if os.getpid() != here else "ran in the user's process"

    with skynet_dspy.make_evaluator(run, score, run_isolation="process") as evaluator:
        assert evaluator("any", EXAMPLE) == (1.0, {"Inputs": {"x": 3}, "Generated Outputs": 6, "feedback": "got 6"})
        assert evaluator.workers.worker_pids == []  # each call's worker is gone once it answered
        assert evaluator("any", EXAMPLE)[0] == 1.0  # the next call: a new worker, forked from the template
    evaluator.metric.close()


@pytest.mark.parametrize("given", ["function", "path"])
def test_a_run_worker_imports_neither_dspy_nor_the_gepa_adapter(tmp_path, given):
    """run() is dressed as a score in the GEPA adapter, and sent by value: its workers import the core only."""
    run_file = tmp_path / "run.py"
    run_file.write_text("import sys\n\ndef run(artifact, input):\n"
                        "    return sorted(m for m in sys.modules if m.split('.')[0] in ('dspy', 'litellm', 'gepa')\n"
                        "                  or m.startswith('skynet_dspy._gepa'))\n")
    run = str(run_file) if given == "path" else _run_of(run_file)
    with skynet_dspy.make_evaluator(run, score, run_isolation="process") as evaluator:
        assert evaluator("any", EXAMPLE)[1]["Generated Outputs"] == "[]"
    evaluator.metric.close()


def _run_of(path):
    """`run` as a function defined in this process (a notebook's), not loaded from a file."""
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["run"]


def test_an_output_that_is_not_plain_data_arrives_as_its_repr():
    class Answer:
        def __repr__(self):
            return "Answer(6)"

    with skynet_dspy.make_evaluator(lambda artifact, input: Answer(), score, run_isolation="process") as evaluator:
        assert evaluator("any", EXAMPLE) == (
            0.0, {"Inputs": {"x": 3}, "Generated Outputs": "Answer(6)", "feedback": "got 'Answer(6)'"}
        )
    evaluator.metric.close()


def test_a_run_that_cannot_be_sent_to_a_worker_is_a_clear_error_naming_run_isolation_thread():
    import threading

    lock = threading.Lock()

    def run(artifact, input):
        with lock:  # a lock cannot be pickled
            return artifact

    with pytest.raises(skynet_dspy.MetricLoadError,
                       match="run cannot be sent to a worker process.*run_isolation='thread'"):
        skynet_dspy.make_evaluator(run, score, run_isolation="process")


def test_a_hanging_run_costs_its_timeout_and_the_next_evaluation_scores():
    def run(artifact, input):
        import time

        if artifact == "hang":
            time.sleep(10**6)
        return input["x"] * 2

    with skynet_dspy.make_evaluator(run, score, run_isolation="process", run_timeout=0.5) as evaluator:
        hung = evaluator.evaluate("hang", EXAMPLE)
        assert hung.failure is Failure.RUN_EXCEPTION and "did not return within 0.5 s" in hung.feedback
        assert evaluator("fine", EXAMPLE) == (1.0, {"Inputs": {"x": 3}, "Generated Outputs": 6, "feedback": "got 6"})
        assert evaluator.stats["run_exception"] == 1
    evaluator.metric.close()
