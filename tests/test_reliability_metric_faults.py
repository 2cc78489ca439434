"""Metric faults (issue 9): a metric that raises, hangs, exits, returns a generator or mutates its
arguments is contained — reported in feedback and metric.stats — and the next example is scored
normally, on unmodified data."""

from __future__ import annotations

import copy
import sys
import threading
import time

import dspy
import pytest

import skynet_dspy

TIMEOUT = 0.5
_release = threading.Event()  # set at teardown: lets the deliberately stuck metric calls finish


@pytest.fixture(autouse=True)
def _free_stuck_calls():
    _release.clear()
    yield
    _release.set()


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot be printed")


def faulty_score(input, output, expected=None):
    """Misbehaves as the example's `mode` says; otherwise an exact-match metric."""
    mode = input.get("mode")
    if mode == "raise":
        raise ValueError(f"cannot score question {input['question']!r}")
    if mode == "hang":
        _release.wait(60)
        return 1.0, {"feedback": "finished far too late"}
    if mode == "exit":
        sys.exit(3)
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


def _yielding():
    yield 1.0
    yield {"feedback": "yielded"}


def _metric(**options) -> skynet_dspy.Metric:
    return skynet_dspy.load_metric(faulty_score, timeout=TIMEOUT, **options)


def _example(question: str, answer: str, mode: str | None = None) -> dspy.Example:
    fields = {"question": question, "answer": answer}
    if mode is not None:
        fields["mode"] = mode
    return dspy.Example(**fields).with_inputs(*(["question", "mode"] if mode is not None else ["question"]))


FAULTS = {
    # mode: (failure kind, words the feedback must hold)
    "raise": ("exception", ["ValueError", "cannot score question"]),
    "hang": ("timeout", ["timed out", f"{TIMEOUT:g} s"]),
    "exit": ("exception", ["SystemExit", "3"]),
    "generator": ("invalid", ["generator"]),
    "generator_function": ("invalid", ["generator"]),
    "unprintable": ("exception", ["_Unprintable"]),
    "huge_message": ("exception", ["RuntimeError"]),
}


@pytest.mark.parametrize("mode", sorted(FAULTS))
def test_fault_is_contained_and_the_next_example_scores_normally(mode):
    metric = _metric()
    kind, words = FAULTS[mode]
    gold = _example("What is 2+2?", "4", mode)
    snapshot = copy.deepcopy(gold.toDict())

    result = metric(gold, dspy.Prediction(answer="4"))

    assert float(result) == 0.0 and not result
    assert result.result.failure == kind
    assert isinstance(result.feedback, str) and len(result.feedback) <= 20_000
    for word in words:
        assert word in result.feedback, f"feedback {result.feedback[:300]!r} does not mention {word!r}"
    assert metric.stats[kind] == 1 and metric.stats["calls"] == 1

    after = metric(_example("What is 3+3?", "6"), dspy.Prediction(answer="6"))
    assert after.result.failure is None
    assert float(after) == 1.0
    assert after.feedback == "saw question='What is 3+3?', answer='6', want='6'"
    assert metric.stats[kind] == 1 and metric.stats["calls"] == 2
    assert gold.toDict() == snapshot, "the faulty call left the example unchanged"


def test_the_failure_score_is_configurable_and_a_fault_never_counts_as_success():
    metric = _metric(failure_score=-1.0)
    result = metric(_example("q", "a", "raise"), dspy.Prediction(answer="a"))
    assert float(result) == -1.0
    assert not result


def test_a_fault_logs_one_warning_per_kind(caplog):
    metric = _metric()
    with caplog.at_level("WARNING", logger="skynet_dspy"):
        for index in range(3):
            metric(_example(f"q{index}", "a", "raise"), dspy.Prediction(answer="a"))
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "ValueError" in warnings[0].getMessage()
    assert metric.stats["exception"] == 3


def test_mutating_input_output_and_expected_changes_nothing_outside():
    metric = _metric()
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
    metric.score(inputs, output, expected)
    assert inputs == {"question": "q", "mode": "mutate"} and output == ["x"] and expected == {"answer": "x"}

    # The same example scored again (a fresh prediction) sees the original values.
    clean = _metric()
    gold.mode = None
    again = clean(gold, dspy.Prediction(answer="4"))
    assert again.feedback == "saw question='What is 2+2?', answer='4', want='4'"


class _Echo(dspy.Module):
    """A program with no model: answers with the question's number, except where told to be wrong."""

    def forward(self, question, mode=None):
        return dspy.Prediction(answer=question.split()[-1])


def test_evaluate_runs_through_every_fault_and_leaves_the_dataset_unchanged():
    modes = [None, "raise", None, "hang", None, "exit", None, "generator", "mutate", None, "unprintable", None]
    devset = [_example(f"echo {index}", str(index), mode) for index, mode in enumerate(modes)]
    before = [copy.deepcopy(example.toDict()) for example in devset]
    metric = _metric()

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


def test_repeated_hangs_do_not_pile_up_threads_and_the_metric_recovers():
    metric = skynet_dspy.load_metric(faulty_score, timeout=0.1)
    threads_before = threading.active_count()
    results = [metric.score({"question": f"q{index}", "mode": "hang"}, "a", {"answer": "a"}) for index in range(24)]

    kinds = {result.failure for result in results}
    assert kinds <= {"timeout", "overloaded"} and "timeout" in kinds
    assert all(result.score == 0.0 and result.feedback for result in results)
    overloaded = [result for result in results if result.failure == "overloaded"]
    assert all("stuck" in result.feedback for result in overloaded)
    assert threading.active_count() - threads_before <= 20, "stuck calls are bounded, not one thread each"
    assert metric.stats["timeout"] + metric.stats["overloaded"] == 24

    _release.set()  # the stuck calls finish; their workers return to the pool
    deadline = time.monotonic() + 10
    while True:
        result = metric.score({"question": "q"}, "a", {"answer": "a"})
        if result.failure != "overloaded" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert result.ok and result.score == 1.0
