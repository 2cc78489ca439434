"""Metric faults (issue 9): a metric that raises, hangs, exits, returns a generator or mutates its
arguments is contained — reported in feedback and metric.stats — and the next example is scored
normally, on unmodified data.

The faults run in worker processes (the default isolation) and, where the in-process runner is what is
tested, with isolation="thread". The failure feedback an optimizer reads is a neutral sentence; the
full message (the exception's text, the offending value) is on Result.detail and in the log."""

from __future__ import annotations

import copy
import os
import textwrap
import threading
import time
from pathlib import Path

import dspy
import pytest

import skynet_dspy

TIMEOUT = 0.5
ISOLATIONS = ["process", "thread"]

# A metric file, so a worker process imports only it (not this test module and its dspy import, which
# would not finish within the 0.5 s the worker has to import the metric).
FAULTY = """
    import os
    import sys
    import time

    RELEASE = __RELEASE__  # created at teardown: lets the deliberately stuck calls finish (isolation="thread")


    class _Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("this exception cannot be printed")


    def _yielding():
        yield 1.0
        yield {"feedback": "yielded"}


    def score(input, output, expected=None):
        \"\"\"Misbehaves as the example's `mode` says; otherwise an exact-match metric.\"\"\"
        mode = input.get("mode")
        if mode == "raise":
            raise ValueError(f"cannot score question {input['question']!r}")
        if mode == "hang":
            deadline = time.monotonic() + 60
            while not os.path.exists(RELEASE) and time.monotonic() < deadline:
                time.sleep(0.02)
            return 1.0, {"feedback": "finished far too late"}
        if mode == "exit":
            sys.exit(3)
        if mode == "os_exit":
            os._exit(3)
        if mode == "pid":
            return 1.0, {"feedback": str(os.getpid())}
        if mode == "generator":
            return (part for part in (1.0, {"feedback": "a generator"}))
        if mode == "generator_function":
            return _yielding()
        if mode == "unprintable":
            raise _Unprintable()
        if mode == "huge_message":
            raise RuntimeError("x" * 1_000_000)
        if mode == "mutate":
            input.clear()
            input["question"] = "HACKED"
            if isinstance(output, list):
                output.append("HACKED")
            if expected is not None:
                expected["answer"] = "HACKED"
                expected["injected"] = True
            return 0.5, {"feedback": "mutated everything it was given"}
        want = expected["answer"] if expected else None
        right = output == want
        feedback = f"saw question={input['question']!r}, answer={output!r}, want={want!r}"
        return (1.0 if right else 0.0), {"feedback": feedback}
"""


@pytest.fixture
def faulty(tmp_path) -> Path:
    """The faulty metric file; at teardown its stuck calls are released and every metric loaded is closed."""
    release = tmp_path / "release"
    path = tmp_path / "metric.py"
    path.write_text(textwrap.dedent(FAULTY).replace("__RELEASE__", repr(str(release))), encoding="utf-8")
    yield path
    release.touch()
    for metric in _loaded:
        metric.close()
    _loaded.clear()


_loaded: list[skynet_dspy.Metric] = []


def _metric(path: Path, **options) -> skynet_dspy.Metric:
    metric = skynet_dspy.load_metric(path, **{"timeout": TIMEOUT, **options})
    _loaded.append(metric)
    return metric


def _release(path: Path) -> None:
    (path.parent / "release").touch()


def _example(question: str, answer: str, mode: str | None = None) -> dspy.Example:
    fields = {"question": question, "answer": answer}
    if mode is not None:
        fields["mode"] = mode
    return dspy.Example(**fields).with_inputs(*(["question", "mode"] if mode is not None else ["question"]))


FAULTS = {
    # mode: (failure kind, words the feedback must hold, words the detail must hold)
    "raise": ("exception", ["ValueError"], ["ValueError: cannot score question 'What is 2+2?'", "metric.py, line"]),
    "hang": ("timeout", ["timed out", f"after {TIMEOUT:g} s"], [f"did not return within {TIMEOUT:g} s"]),
    "exit": ("exception", ["SystemExit"], ["SystemExit: exit code 3"]),
    "generator": ("invalid", ["breaks the metric contract (not a pair)"], ["generator"]),
    "generator_function": ("invalid", ["breaks the metric contract (not a pair)"], ["generator"]),
    "unprintable": ("exception", ["_Unprintable"], ["_Unprintable", "could not be read"]),
    "huge_message": ("exception", ["RuntimeError"], ["RuntimeError: xxxx"]),
}
# Only a worker process can take these: in the user's process they would end it.
PROCESS_FAULTS = {
    "os_exit": ("crashed", ["the metric's process stopped"], ["exited with code 3"]),
}
CASES = [("process", mode) for mode in sorted({**FAULTS, **PROCESS_FAULTS})] + [
    ("thread", mode) for mode in sorted(FAULTS)]


@pytest.mark.parametrize(("isolation", "mode"), CASES)
def test_fault_is_contained_and_the_next_example_scores_normally(faulty, isolation, mode):
    metric = _metric(faulty, isolation=isolation)
    kind, words, details = {**FAULTS, **PROCESS_FAULTS}[mode]
    gold = _example("What is 2+2?", "4", mode)
    snapshot = copy.deepcopy(gold.toDict())

    result = metric(gold, dspy.Prediction(answer="4"))

    assert float(result) == 0.0 and not result
    assert result.result.failure == kind
    assert isinstance(result.feedback, str) and len(result.feedback) <= 20_000
    assert result.feedback.startswith("Not scored: ")
    for word in words:
        assert word in result.feedback, f"feedback {result.feedback[:300]!r} does not mention {word!r}"
    # nothing the metric chose reaches the optimizer: no message, no value it was given
    assert "cannot score" not in result.feedback and "2+2" not in result.feedback and "xxx" not in result.feedback
    for word in details:
        assert word in result.result.detail, f"detail {result.result.detail[:300]!r} does not mention {word!r}"
    assert metric.stats[kind] == 1 and metric.stats["calls"] == 1

    after = metric(_example("What is 3+3?", "6"), dspy.Prediction(answer="6"))
    assert after.result.failure is None
    assert float(after) == 1.0
    assert after.feedback == "saw question='What is 3+3?', answer='6', want='6'"
    assert metric.stats[kind] == 1 and metric.stats["calls"] == 2
    assert gold.toDict() == snapshot, "the faulty call left the example unchanged"


def test_the_failure_score_is_configurable_and_a_fault_never_counts_as_success(faulty):
    metric = _metric(faulty, failure_score=-1.0)
    result = metric(_example("q", "a", "raise"), dspy.Prediction(answer="a"))
    assert float(result) == -1.0
    assert not result
    assert not result >= -1.0, "a failed call is never at or above a threshold (BootstrapFewShot)"


def test_a_fault_logs_one_warning_per_kind(faulty, caplog):
    metric = _metric(faulty)
    with caplog.at_level("WARNING", logger="skynet_dspy"):
        for index in range(3):
            metric(_example(f"q{index}", "a", "raise"), dspy.Prediction(answer="a"))
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "ValueError" in message
    assert "cannot score question 'q0'" in message and "metric.py, line" in message  # the full story is logged
    assert metric.stats["exception"] == 3


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_mutating_input_output_and_expected_changes_nothing_outside(faulty, isolation):
    metric = _metric(faulty, isolation=isolation)
    gold = _example("What is 2+2?", "4", "mutate")
    prediction = dspy.Prediction(answer=["4", "four"])
    gold_before, prediction_before = copy.deepcopy(gold.toDict()), copy.deepcopy(prediction.toDict())

    result = metric(gold, prediction)

    assert result.result.failure is None and float(result) == 0.5
    assert gold.toDict() == gold_before
    assert prediction.toDict() == prediction_before
    assert set(gold.inputs().keys()) == {"question", "mode"}

    # Plain values through metric.score: the caller's dicts and lists stay as they were.
    inputs, output, expected = {"question": "q", "mode": "mutate"}, ["x"], {"answer": "x"}
    assert metric.score(inputs, output, expected).score == 0.5
    assert inputs == {"question": "q", "mode": "mutate"} and output == ["x"] and expected == {"answer": "x"}

    # The same example scored again (a fresh prediction) sees the original values.
    clean = _metric(faulty, isolation=isolation)
    gold.mode = None
    again = clean(gold, dspy.Prediction(answer="4"))
    assert again.feedback == "saw question='What is 2+2?', answer='4', want='4'"


class _Echo(dspy.Module):
    """A program with no model: answers with the question's number, except where told to be wrong."""

    def forward(self, question, mode=None):
        return dspy.Prediction(answer=question.split()[-1])


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_evaluate_runs_through_every_fault_and_leaves_the_dataset_unchanged(faulty, isolation):
    modes = [None, "raise", None, "hang", None, "exit", None, "generator", "mutate", None, "unprintable", None]
    devset = [_example(f"echo {index}", str(index), mode) for index, mode in enumerate(modes)]
    before = [copy.deepcopy(example.toDict()) for example in devset]
    metric = _metric(faulty, isolation=isolation)

    evaluation = dspy.Evaluate(devset=devset, metric=metric, num_threads=4, display_progress=False,
                               provide_traceback=False)(_Echo())

    assert [example.toDict() for example in devset] == before, "no metric fault changed the dataset"
    by_question = {example.question: score for example, _prediction, score in evaluation.results}
    assert len(by_question) == len(devset)
    for index, mode in enumerate(modes):
        score = by_question[f"echo {index}"]
        assert isinstance(score, skynet_dspy.Score), f"example {index} ({mode}): the metric call crashed inside DSPy"
        if mode is None:
            assert float(score) == 1.0, f"example {index} was not scored normally: {score!r}"
            assert score.feedback == f"saw question='echo {index}', answer='{index}', want='{index}'"
        elif mode == "mutate":
            assert float(score) == 0.5
        else:
            assert float(score) == 0.0 and score.result.failure == FAULTS[mode][0]
    stats = metric.stats
    assert stats["exception"] == 3 and stats["timeout"] == 1 and stats["invalid"] == 1
    assert stats["calls"] == len(devset)
    assert evaluation.score == pytest.approx(100 * (6 + 0.5) / len(devset), abs=0.01)


def test_repeated_hangs_do_not_pile_up_threads_and_the_metric_recovers(faulty):
    """The thread runner: stuck calls cannot be stopped, so after a bound they are refused (overloaded)."""
    metric = _metric(faulty, timeout=0.1, isolation="thread")
    threads_before = threading.active_count()
    results = [metric.score({"question": f"q{index}", "mode": "hang"}, "a", {"answer": "a"}) for index in range(24)]

    kinds = {result.failure for result in results}
    assert kinds <= {"timeout", "overloaded"} and "timeout" in kinds
    assert all(result.score == 0.0 and result.feedback for result in results)
    overloaded = [result for result in results if result.failure == "overloaded"]
    assert all("stuck" in result.feedback for result in overloaded)
    assert threading.active_count() - threads_before <= 20, "stuck calls are bounded, not one thread each"
    assert metric.stats["timeout"] + metric.stats["overloaded"] == 24

    _release(faulty)  # the stuck calls finish; their workers return to the pool
    deadline = time.monotonic() + 10
    while True:
        result = metric.score({"question": "q"}, "a", {"answer": "a"})
        if result.failure != "overloaded" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert result.ok and result.score == 1.0


def test_repeated_hangs_in_worker_processes_are_each_stopped_and_leave_nothing_behind(faulty):
    """Worker processes: every stuck call is killed at its timeout, so none is refused and none piles up."""
    metric = _metric(faulty)
    threads_before = threading.active_count()
    killed, results = [], []
    for index in range(6):
        ran_in = metric.score({"question": "q", "mode": "pid"}, "a", None)
        assert ran_in.ok, ran_in.detail
        killed.append(int(ran_in.feedback))
        results.append(metric.score({"question": f"q{index}", "mode": "hang"}, "a", {"answer": "a"}))
        assert metric.scorer.executor.worker_pids == [], "a stuck worker is killed, not kept beside a new one"

    assert [result.failure for result in results] == ["timeout"] * 6
    assert all(result.score == 0.0 and "timed out" in result.feedback for result in results)
    assert all("its worker process was killed" in result.detail for result in results)
    assert metric.stats["timeout"] == 6 and metric.stats["overloaded"] == 0
    assert threading.active_count() - threads_before <= 2
    assert len(set(killed)) == 6, "each stuck call took its worker with it; the next call had a fresh one"
    for pid in killed:  # killed and reaped: not running, not a zombie
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    result = metric.score({"question": "q"}, "a", {"answer": "a"})  # no release needed: the next call is fresh
    assert result.ok and result.score == 1.0
