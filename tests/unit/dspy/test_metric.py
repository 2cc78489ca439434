"""The adapter DSPy calls: the Score it returns, the memo, failures, timeouts, threads.

The rules: docs/contract.md (what the metric sees, what the optimizer sees, limits).
"""

from __future__ import annotations

import copy
import csv
import inspect
import json
import logging
import os
import pickle
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Score
from skynet_dspy.devserver import dspy_reply

pytestmark = pytest.mark.timeout(120)

SECRET_LABEL = "EXPECTED-SENTINEL-7f3a"
SECRET_EXTRA = "EXTRA-SENTINEL-91bc"


class Echo(dspy.Module):
    """A program with no model call: it answers with the question's last word."""

    def forward(self, question: str) -> dspy.Prediction:
        return dspy.Prediction(answer=question.split()[-1].rstrip("?"))


def gold(question: str = "What is the capital of France?", answer: str = "Paris", **labels) -> dspy.Example:
    return dspy.Example(question=question, answer=answer, **labels).with_inputs("question")


def exact(input, output, expected=None):
    ok = output == expected["answer"]
    return (1.0 if ok else 0.0), {"feedback": "Correct." if ok else f"Expected {expected['answer']!r}."}


class Counting:
    """A score function that records each call (what it was given) as a line of a file.

    The metric runs in worker processes by default, where a counter in this process would never move:
    appending to a file counts the calls wherever they run (each line is one small O_APPEND write).
    """

    def __init__(self, folder: Path, fn=exact):
        self.path = Path(folder) / f"calls-{uuid.uuid4().hex}.jsonl"
        self.path.touch()
        self.fn = fn

    def __call__(self, input, output, expected=None):
        with open(self.path, "a", encoding="utf-8") as log:
            log.write(json.dumps([input, output, expected]) + "\n")
        return self.fn(input, output, expected)

    @property
    def seen(self) -> list[tuple]:
        return [tuple(json.loads(line)) for line in self.path.read_text(encoding="utf-8").splitlines()]

    @property
    def total(self) -> int:
        return len(self.seen)


@pytest.fixture
def counting(tmp_path):
    """Counting(fn) for this test: counting() counts calls of `exact`."""
    return lambda fn=exact: Counting(tmp_path, fn)


@pytest.fixture(params=["process", "thread"])
def isolation(request) -> str:
    return request.param


# -- the Score ------------------------------------------------------------------------------


def test_the_score_is_a_number_wherever_dspy_wants_one():
    metric = skynet_dspy.load_metric(lambda i, o, e: (0.75, {"feedback": "close"}))
    score = metric(gold(), dspy.Prediction(answer="Paris"))
    assert isinstance(score, Score) and isinstance(score, dspy.Prediction) and isinstance(score, float)
    assert float(score) == 0.75 and score == 0.75 and score != 0.5 and hash(score) == hash(0.75)
    assert score + 1 == 1.75 and 1 + score == 1.75 and score * 2 == 1.5 and score / 3 == 0.25
    assert sum([score, score, score]) == 2.25
    assert score >= 0.75 and score > 0.5 and score < 1 and score <= 0.75
    assert f"{score:.1f}" == "0.8" and round(score, 1) == 0.8
    assert json.loads(json.dumps({"m": score})) == {"m": 0.75}
    assert repr(score) == str(score) == "0.75"  # written as a number by csv files and Evaluate's table
    assert score.score == 0.75 and score.feedback == "close"


def test_a_zero_negative_or_failed_score_is_not_a_success():
    assert bool(skynet_dspy.load_metric(lambda i, o, e: (1, {"feedback": ""}))(gold(), dspy.Prediction(answer="x")))
    assert bool(skynet_dspy.load_metric(lambda i, o, e: (0.01, {"feedback": ""}))(gold(), dspy.Prediction(answer="x")))
    assert not skynet_dspy.load_metric(lambda i, o, e: (0.0, {"feedback": ""}))(gold(), dspy.Prediction(answer="x"))
    assert not skynet_dspy.load_metric(lambda i, o, e: (-1, {"feedback": ""}))(gold(), dspy.Prediction(answer="x"))

    def broken(i, o, e):
        raise RuntimeError("boom")

    failed = skynet_dspy.load_metric(broken, failure_score=0.5)(gold(), dspy.Prediction(answer="x"))
    assert float(failed) == 0.5 and not failed  # a failed call is never a good demo...
    # ...not even past a metric_threshold: a failed Score is never >= or > anything (BootstrapFewShot)
    assert not failed >= 0.4 and not failed > 0.4 and not failed >= 0.5
    assert float(failed) >= 0.4 and failed <= 0.5 and failed < 0.6  # the number itself is unchanged
    passed = skynet_dspy.load_metric(lambda i, o, e: (0.5, {"feedback": ""}))(gold(), dspy.Prediction(answer="x"))
    assert passed >= 0.4 and passed > 0.4 and passed >= 0.5  # a successful call compares as its number


def test_dspy_reads_only_score_feedback_and_named_scores():
    def rich(input, output, expected):
        return 0.5, {
            "feedback": "Half right.",
            "scores": {"format": 1.0, "accuracy": 0},
            "debug": SECRET_EXTRA,
            "expected": expected,
        }

    score = skynet_dspy.load_metric(rich)(gold(rubric=SECRET_LABEL), dspy.Prediction(answer="Lyon"))
    assert dict(score.items()) == {
        "score": 0.5,
        "feedback": "Half right.",
        "objective_scores": {"format": 1.0, "accuracy": 0.0},
    }
    shown = " ".join([repr(score), str(score), json.dumps(score.toDict()), json.dumps(score)])
    assert SECRET_EXTRA not in shown and SECRET_LABEL not in shown
    assert score.result.extra == {"debug": SECRET_EXTRA, "expected": {"answer": "Paris", "rubric": SECRET_LABEL}}
    assert score.result.scores == {"format": 1.0, "accuracy": 0.0}


def test_objective_scores_are_absent_when_the_metric_names_none():
    score = skynet_dspy.load_metric(exact)(gold(), dspy.Prediction(answer="Paris"))
    assert "objective_scores" not in score and score.get("objective_scores") is None
    assert set(score.keys()) == {"score", "feedback"}


def test_a_score_survives_pickle_copy_and_prediction_copy():
    def rich(input, output, expected):
        return 0.25, {"feedback": "f", "scores": {"a": 1}, "debug": "kept"}

    score = skynet_dspy.load_metric(rich)(gold(), dspy.Prediction(answer="x"))
    unread = pickle.loads(pickle.dumps(score))  # before .result was first read
    assert score.result.extra == {"debug": "kept"}
    for twin in (unread, pickle.loads(pickle.dumps(score)), copy.deepcopy(score), copy.copy(score)):
        assert type(twin) is Score and twin == score and float(twin) == 0.25
        assert twin.feedback == "f" and twin.objective_scores == {"a": 1.0} and twin.result.extra == {"debug": "kept"}
    changed = score.copy(feedback="other")
    assert type(changed) is Score and changed.feedback == "other" and float(changed) == 0.25
    assert changed.result.extra == {"debug": "kept"}


# -- GEPA's calling convention -----------------------------------------------------------------


def test_gepa_signature_check_and_both_call_forms():
    def named(input, output, expected):
        return 1.0, {"feedback": "ok", "scores": {"exact": 1.0}}

    metric = skynet_dspy.load_metric(named)
    inspect.signature(metric).bind(None, None, None, None, None)  # what dspy.GEPA checks
    dspy.GEPA(metric=metric, max_metric_calls=10, reflection_lm=dspy.LM("openai/unused", api_key="x"))
    example, pred = gold(), dspy.Prediction(answer="Paris")
    first = metric(example, pred, [("predictor", {}, pred)])
    second = metric(example, pred, [], "predict", [("predictor", {}, pred)])
    third = metric(example, pred, None, None, None, program_trace=[("predictor", {}, pred)])
    for returned in (first, second, third):
        assert isinstance(returned, dspy.Prediction)
        assert (returned.score, returned.feedback, returned.objective_scores) == (1.0, "ok", {"exact": 1.0})


# -- the memo ----------------------------------------------------------------------------------


def test_the_second_call_for_the_same_example_and_prediction_does_not_score_again(counting, isolation):
    score = counting()
    metric = skynet_dspy.load_metric(score, isolation=isolation)
    example, pred = gold(), dspy.Prediction(answer="Lyon")
    first = metric(example, pred, [])
    second = metric(example, pred, [], "predict", [("p", {}, pred)])
    assert score.total == 1
    assert (second.score, second.feedback) == (first.score, first.feedback) == (0.0, "Expected 'Paris'.")
    assert metric.stats["calls"] == 1 and metric.stats["memo_hits"] == 1
    second["feedback"] = "changed by a caller"  # DSPy may write into what it gets back...
    assert metric(example, pred).feedback == "Expected 'Paris'."  # ...the memo is not changed by it


def test_another_prediction_or_a_changed_one_is_scored_again(counting):
    score = counting()
    metric = skynet_dspy.load_metric(score)
    example, pred = gold(), dspy.Prediction(answer="Lyon")
    assert metric(example, pred) == 0.0
    assert metric(example, dspy.Prediction(answer="Paris")) == 1.0
    pred.answer = "Paris"  # changed in place since it was scored
    assert metric(example, pred) == 1.0
    assert score.total == 3


def test_failures_are_remembered_too(counting):
    def broken(input, output, expected):
        raise ValueError("bad input")

    score = counting(broken)
    metric = skynet_dspy.load_metric(score)
    example, pred = gold(), dspy.Prediction(answer="x")
    first, second = metric(example, pred), metric(example, pred, [], "predict", [])
    assert first.result.failure == second.result.failure == "exception"
    assert first.feedback == second.feedback and first.result.detail == second.result.detail
    assert score.total == 1
    assert metric.stats["exception"] == 1 and metric.stats["memo_hits"] == 1


def test_the_memo_is_bounded(counting):
    score = counting()
    metric = skynet_dspy.load_metric(score, memo_size=3)
    example = gold()
    preds = [dspy.Prediction(answer=f"city {i}") for i in range(4)]
    for pred in preds:
        metric(example, pred)
    for pred in preds[1:]:
        metric(example, pred)  # still remembered
    assert score.total == 4
    metric(example, preds[0])  # the oldest entry was dropped
    assert score.total == 5
    assert len(metric._memo) <= 3


def test_memo_size_zero_scores_every_call(counting):
    score = counting()
    metric = skynet_dspy.load_metric(score, memo_size=0)
    example, pred = gold(), dspy.Prediction(answer="Paris")
    metric(example, pred)
    metric(example, pred, [], "predict", [])
    assert score.total == 2 and metric.stats["memo_hits"] == 0


def test_the_memo_is_safe_under_threads(counting):
    score = counting()
    metric = skynet_dspy.load_metric(score)
    pairs = [(gold(f"Q{i}?", f"A{i}"), dspy.Prediction(answer=f"A{i}" if i % 2 else "no")) for i in range(40)]
    for example, pred in pairs:  # first calls, one thread: each pair scored once
        metric(example, pred)
    barrier = threading.Barrier(8)
    results: list[list[float]] = []

    def hammer():
        barrier.wait()
        results.append([float(metric(example, pred, [], "predict", [])) for example, pred in pairs * 5])

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [1.0 if i % 2 else 0.0 for i in range(40)] * 5
    assert results == [expected] * 8
    assert score.total == 40
    assert metric.stats["memo_hits"] == 8 * 200


# -- what the metric is given --------------------------------------------------------------------


def test_the_metric_gets_plain_values_and_cannot_change_the_dataset_or_prediction(isolation):
    def vandal(input, output, expected):
        assert type(input) is dict and type(output) is dict and type(expected) is dict
        for value in (*input.values(), *output.values(), *expected.values()):
            assert not isinstance(value, dspy.Example)
        input["question"] = "HACKED"
        input["docs"].append("HACKED")
        output["answer"].append("HACKED")
        output["meta"]["k"] = "HACKED"
        expected["answer"] = "HACKED"
        expected.clear()
        return 1.0, {"feedback": "vandalised"}

    example = dspy.Example(question="Q?", docs=["d1"], answer="A", rubric="r").with_inputs("question", "docs")
    pred = dspy.Prediction(reasoning="r", answer=["A"], meta={"k": "v"})
    before = (copy.deepcopy(example.toDict()), copy.deepcopy(pred.toDict()))
    score = skynet_dspy.load_metric(vandal, isolation=isolation)(example, pred)
    assert score.result.failure is None, score.result.detail
    assert score.feedback == "vandalised"
    assert (example.toDict(), pred.toDict()) == before


def test_two_parameter_score_is_called_without_expected():
    def two(input, output):  # a third argument would make this call raise TypeError
        return 1.0, {"feedback": "ok", "given": [input, output]}

    score = skynet_dspy.load_metric(two)(gold(), dspy.Prediction(answer="Paris"))
    assert score.result.failure is None, score.result.detail
    assert score.result.extra["given"] == [{"question": "What is the capital of France?"}, "Paris"]


def test_by_default_score_runs_in_a_worker_process_and_only_plain_data_comes_back(isolation):
    def where(input, output, expected):
        return 1.0, {"feedback": "ok", "pid": os.getpid(), "amount": Decimal("1.5"), "pair": (1, [2.5, "x"])}

    metric = skynet_dspy.load_metric(where, isolation=isolation)
    assert metric.isolation == isolation
    extra = metric(gold(), dspy.Prediction(answer="Paris")).result.extra
    assert extra["pair"] == (1, [2.5, "x"])
    if isolation == "process":
        assert extra["pid"] != os.getpid()
        assert extra["amount"] == "Decimal('1.5')"  # not a plain builtin: it arrives as its repr
    else:
        assert extra["pid"] == os.getpid() and extra["amount"] == Decimal("1.5")
    metric.close()


# -- failures never stop a run ------------------------------------------------------------------


def test_an_exception_scores_the_failure_score_with_its_type_and_message_on_the_result(isolation):
    def broken(input, output, expected):
        raise KeyError(expected["answer"])

    metric = skynet_dspy.load_metric(broken, failure_score=-1, isolation=isolation)
    score = metric(gold(answer=SECRET_LABEL), dspy.Prediction(answer="x"))
    assert float(score) == -1.0 and not score
    # what an optimizer reads: the exception's type, never its message (it may hold expected values)
    assert score.feedback == "Not scored: the metric raised KeyError while scoring this output."
    assert SECRET_LABEL not in score.feedback
    assert f"KeyError: '{SECRET_LABEL}'" in score.result.detail  # the full message is the user's
    line = broken.__code__.co_firstlineno + 1
    assert f"line {line}: " in score.result.detail  # where it was raised
    if isolation == "thread":  # (a function sent to a worker by value keeps its lines, not its file name)
        assert f"test_metric.py, line {line}: `raise KeyError(expected[\"answer\"])`" in score.result.detail
    assert score.result.failure == "exception" and metric.stats["exception"] == 1


def test_an_invalid_return_names_the_broken_rule_but_not_the_value():
    def leaky(input, output, expected):
        return expected["rubric"], {"feedback": "text"}  # a string score, and an expected value

    metric = skynet_dspy.load_metric(leaky)
    score = metric(gold(rubric=SECRET_LABEL), dspy.Prediction(answer="x"))
    assert float(score) == 0.0 and score.result.failure == "invalid"
    assert "(score is a string)" in score.feedback
    assert SECRET_LABEL not in score.feedback and SECRET_LABEL not in json.dumps(score.toDict())
    assert SECRET_LABEL in score.result.detail  # kept for the user, off what DSPy reads
    assert score.result.extra == {}
    assert metric.stats["invalid"] == 1


@pytest.mark.parametrize(
    ("returned", "rule"),
    [
        (0.8, "no side information"),
        ((0.8, "Close."), "side information is not a dict"),
        ((0.8, {}), "no feedback string"),
        (("0.8", {"feedback": "OK"}), "score is a string"),
        ((0.8, {"feedback": "OK", "scores": {"a": "high"}}), "named score is not a number"),
        ((float("nan"), {"feedback": "OK"}), "score is NaN"),
        ((0.8, {"feedback": "OK", "scores": {f"s{i}": 1.0 for i in range(33)}}), "too many named scores"),
        ((0.8, {"feedback": "OK", "scores": {"n" * 65: 1.0}}), "named score name is too long"),
    ],
)
def test_each_broken_contract_rule_is_a_failure_with_its_rule(returned, rule):
    metric = skynet_dspy.load_metric(lambda i, o, e: returned)
    score = metric(gold(), dspy.Prediction(answer="x"))
    assert score.result.failure == "invalid" and float(score) == 0.0
    assert score.feedback == (
        f"Not scored: the metric returned a value that breaks the metric contract ({rule}); "
        "this is a fault of the metric, not of the output."
    )
    assert score.result.detail.startswith(f"{rule}: ")


def _returning(value):
    def score(input, output, expected):
        return value

    return score


def test_valid_returns_of_every_allowed_shape_score_normally():
    import numpy as np

    for returned, number in [
        ((0.8, {"feedback": "a"}), 0.8),
        ([1, {"feedback": "b", "scores": {"format": True}}], 1.0),
        ((np.float32(0.5), {"feedback": "c"}), 0.5),
        ((True, {"feedback": "d"}), 1.0),
        ((3, {"feedback": "e", "extra": 1}), 3.0),
    ]:
        score = skynet_dspy.load_metric(_returning(returned))(gold(), dspy.Prediction(answer="x"))
        assert score.result.failure is None and float(score) == number and type(score.score) is float


def test_a_missing_named_output_field_is_a_failure_naming_it_and_the_fields_present(counting):
    score = counting()
    metric = skynet_dspy.load_metric(score, output_fields=["label"])
    result = metric(gold(), dspy.Prediction(reasoning="r", answer="Paris"))
    assert result.result.failure == "missing_field" and float(result) == 0.0
    assert result.feedback == (
        "Not scored: the program's output lacks the field(s) label (fields present: reasoning, answer)."
    )
    assert "'label'" in result.result.detail
    assert score.total == 0 and metric.stats["missing_field"] == 1


def test_labels_the_program_does_not_produce_stay_in_expected_only(counting):
    score = counting()
    metric = skynet_dspy.load_metric(score)
    metric(gold(id=7, rubric="be brief"), dspy.Prediction(reasoning="r", answer="Paris"))
    assert score.seen == [
        ({"question": "What is the capital of France?"}, "Paris", {"answer": "Paris", "id": 7, "rubric": "be brief"})
    ]


def test_to_output_maps_the_prediction_and_its_errors_are_failures(counting):
    score = counting(lambda i, o, e: (1.0 if o["city"] == e["answer"] else 0.0, {"feedback": str(o)}))
    metric = skynet_dspy.load_metric(score, to_output=lambda p: {"city": p.answer.strip()})
    assert metric(gold(), dspy.Prediction(answer=" Paris ")) == 1.0
    broken = skynet_dspy.load_metric(score, to_output=lambda p: p.missing_field)
    result = broken(gold(), dspy.Prediction(answer="Paris"))
    assert result.result.failure == "exception"
    assert result.feedback == "Not scored: the program's output could not be read (AttributeError)."
    assert result.result.detail.startswith("to_output raised AttributeError")
    assert score.total == 1  # score was not called for the output that could not be read


def test_a_timeout_scores_the_failure_score_and_says_so():
    release = threading.Event()

    def stuck(input, output, expected):
        release.wait(30)
        return 1.0, {"feedback": "too late"}

    metric = skynet_dspy.load_metric(stuck, timeout=0.2, isolation="thread")
    try:
        score = metric(gold(), dspy.Prediction(answer="x"))
        assert not release.is_set()
        assert float(score) == 0.0 and score.result.failure == "timeout"
        assert score.feedback == "Not scored: the metric timed out after 0.2 s on this output."
        assert metric.stats["timeout"] == 1
    finally:
        release.set()


STUCK_METRIC = """
import time

def score(input, output, expected=None):
    if "stuck" in input["question"]:
        time.sleep(60)
    ok = output == expected["answer"]
    return (1.0 if ok else 0.0), {"feedback": "Correct." if ok else "Wrong."}
"""


def test_a_timeout_in_a_worker_process_kills_it_and_the_next_call_gets_a_fresh_one(tmp_path):
    metric = skynet_dspy.load_metric(write_metric(tmp_path, STUCK_METRIC), timeout=0.5)
    started = time.monotonic()
    score = metric(gold("Does this get stuck?", "x"), dspy.Prediction(answer="x"))
    assert time.monotonic() - started < 30  # a 60 s sleep, cut at the timeout (generous: a loaded machine)
    assert float(score) == 0.0 and score.result.failure == "timeout"
    assert score.feedback == "Not scored: the metric timed out after 0.5 s on this output."
    assert metric(gold(), dspy.Prediction(answer="Paris")) == 1.0  # the run goes on
    assert metric.stats["timeout"] == 1 and metric.stats["calls"] == 2
    metric.close()


def test_a_worker_that_exits_is_crashed_and_sys_exit_is_an_exception(tmp_path):
    path = write_metric(tmp_path, """
        import os
        import sys

        def score(input, output, expected=None):
            if output == "exit":
                os._exit(3)
            if output == "sys.exit":
                sys.exit(2)
            return 1.0, {"feedback": "fine"}
        """)
    metric = skynet_dspy.load_metric(path)
    crashed = metric(gold(), dspy.Prediction(answer="exit"))
    assert crashed.result.failure == skynet_dspy.Failure.CRASHED and float(crashed) == 0.0
    assert "process stopped" in crashed.feedback and "exited with code 3" in crashed.result.detail
    exited = metric(gold(), dspy.Prediction(answer="sys.exit"))
    assert exited.result.failure == "exception"
    assert exited.feedback == "Not scored: the metric raised SystemExit while scoring this output."
    assert metric(gold(), dspy.Prediction(answer="ok")) == 1.0  # a fresh worker took the next call
    assert (metric.stats["crashed"], metric.stats["exception"], metric.stats["calls"]) == (1, 1, 3)
    metric.close()


def test_a_warning_is_logged_once_per_kind_of_failure(caplog):
    def flaky(input, output, expected):
        if output == "raise":
            raise ValueError("nope")
        return "bad", {"feedback": "x"}

    metric = skynet_dspy.load_metric(flaky)
    example = gold()
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        for answer in ["raise", "raise", "bad", "raise", "bad"]:
            metric(example, dspy.Prediction(answer=answer))
    warnings = [record.getMessage() for record in caplog.records if record.name == "skynet_dspy"]
    assert len(warnings) == 2
    assert sum("exception" in text and "ValueError: nope" in text for text in warnings) == 1
    assert sum("invalid" in text and "string" in text for text in warnings) == 1
    stats = metric.stats
    assert (stats["exception"], stats["invalid"], stats["calls"]) == (3, 2, 5)


def test_a_metric_that_fails_every_call_is_reported_loudly_after_ten(caplog):
    def broken(input, output, expected):
        raise NameError("name 'expcted' is not defined")

    metric = skynet_dspy.load_metric(broken)
    example = gold()
    with caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        for index in range(9):
            metric(example, dspy.Prediction(answer=f"a{index}"))
        assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
        metric(example, dspy.Prediction(answer="a9"))
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "last 10 calls all failed" in errors[0] and "expcted" in errors[0] and "check_contract" in errors[0]


def test_a_success_resets_the_run_of_failures(caplog):
    def sometimes(input, output, expected):
        if output == "ok":
            return 1.0, {"feedback": "fine"}
        raise ValueError("nope")

    metric = skynet_dspy.load_metric(sometimes)
    example = gold()
    with caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        for answer in ["x"] * 9 + ["ok"] + ["x"] * 9:
            metric(example, dspy.Prediction(answer=answer))
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_stats_list_every_kind_from_the_start():
    stats = skynet_dspy.load_metric(exact).stats
    assert stats == {
        "calls": 0,
        "memo_hits": 0,
        "exception": 0,
        "timeout": 0,
        "invalid": 0,
        "missing_field": 0,
        "crashed": 0,
        "load": 0,
        "memory": 0,
        "overloaded": 0,
        "judge_not_configured": 0,
        "judge_error": 0,
        "judge_unreachable": 0,
        "spend_cap": 0,
        "run_exception": 0,
    }
    assert set(stats) == {"calls", "memo_hits"} | {str(kind) for kind in skynet_dspy.Failure}


def test_a_key_in_the_feedback_is_masked(monkeypatch):
    monkeypatch.setenv("SOME_PROVIDER_API_KEY", "sk-test-0123456789abcdef")
    metric = skynet_dspy.load_metric(lambda i, o, e: (1.0, {"feedback": "used sk-test-0123456789abcdef here"}))
    assert metric(gold(), dspy.Prediction(answer="x")).feedback == "used *** here"
    raising = skynet_dspy.load_metric(lambda i, o, e: (_ for _ in ()).throw(RuntimeError("sk-test-0123456789abcdef")))
    failed = raising(gold(), dspy.Prediction(answer="x"))
    assert failed.result.failure == "exception"
    assert "sk-test" not in failed.feedback and "sk-test" not in failed.result.detail
    assert "RuntimeError" in failed.result.detail


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 601}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"failure_score": float("nan")}, "failure_score"),
        ({"failure_score": "0"}, "failure_score"),
        ({"memo_size": -1}, "memo_size"),
        ({"output_fields": []}, "output_fields"),
        ({"to_output": "answer"}, "to_output"),
        ({"isolation": "fork"}, "isolation"),
        ({"workers": 0}, "workers"),
        ({"measure": "yes"}, "measure"),
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        skynet_dspy.load_metric(exact, **options)


def test_defaults_and_a_metric_passed_through():
    metric = skynet_dspy.load_metric(exact)
    assert metric.timeout == 60 and metric.failure_score == 0.0 and metric.isolation == "process"
    assert skynet_dspy.load_metric(metric) is metric
    with pytest.raises(TypeError, match="already"):
        skynet_dspy.load_metric(metric, timeout=5)


# -- dspy.Evaluate -------------------------------------------------------------------------------


def _devset() -> list[dspy.Example]:
    return [gold(f"What is the capital of {country}?", city) for country, city in
            [("Paris", "Paris"), ("France", "Paris"), ("Rome", "Rome"), ("Peru", "Lima")]]


def test_evaluate_averages_per_example_scores(tmp_path):
    path = tmp_path / "results.json"
    result = dspy.Evaluate(devset=_devset(), metric=skynet_dspy.load_metric(exact), num_threads=1,
                           save_as_json=str(path))(Echo())
    assert result.score == 50.0
    scores = [score for _example, _prediction, score in result.results]
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert all(isinstance(score, Score) for score in scores)
    assert [score.feedback for score in scores] == ["Correct.", "Expected 'Paris'.", "Correct.", "Expected 'Lima'."]
    saved = json.loads(path.read_text())
    assert [row["exact"] for row in saved] == [1.0, 0.0, 1.0, 0.0]  # numbers, in a column named after the metric


def test_evaluate_with_eight_threads_gives_the_same_scores_as_one(counting):
    devset = [gold(f"Question {i} ends in {'yes' if i % 3 else 'no'}?", "yes") for i in range(40)]
    runs = []
    for threads in (1, 8):
        score = counting()
        result = dspy.Evaluate(devset=devset, metric=skynet_dspy.load_metric(score), num_threads=threads)(Echo())
        runs.append((result.score, [(float(s), s.feedback) for _e, _p, s in result.results]))
        assert score.total == 40
    assert runs[0] == runs[1]


@pytest.mark.parametrize("threads", [1, 4], ids=["inline-on-the-main-thread", "on-worker-threads"])
def test_evaluate_finishes_past_a_stuck_metric_and_says_it_timed_out(threads):
    release = threading.Event()

    def sometimes_stuck(input, output, expected):
        if "stuck" in input["question"]:
            release.wait(60)
        return exact(input, output, expected)

    devset = [gold("Is this Paris?", "Paris"), gold("This one gets stuck?", "stuck"), gold("And Rome?", "Rome")]
    metric = skynet_dspy.load_metric(sometimes_stuck, timeout=0.5, isolation="thread")
    try:
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads)(Echo())
        assert not release.is_set()  # the run ended while the stuck call was still stuck
        scores = [score for _e, _p, score in result.results]
        assert [float(score) for score in scores] == [1.0, 0.0, 1.0]
        assert scores[1].feedback == "Not scored: the metric timed out after 0.5 s on this output."
        assert metric.stats["timeout"] == 1
    finally:
        release.set()


@pytest.mark.parametrize("threads", [1, 4], ids=["one-thread", "four-threads"])
def test_evaluate_finishes_past_a_metric_stuck_in_its_worker_process(tmp_path, threads):
    devset = [gold("Is this Paris?", "Paris"), gold("This one gets stuck?", "stuck"), gold("And Rome?", "Rome")]
    with skynet_dspy.load_metric(write_metric(tmp_path, STUCK_METRIC), timeout=0.5) as metric:
        started = time.monotonic()
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads)(Echo())
        assert time.monotonic() - started < 30  # not the 60 s the stuck call sleeps
        scores = [score for _e, _p, score in result.results]
        assert [float(score) for score in scores] == [1.0, 0.0, 1.0]
        assert scores[1].result.failure == "timeout"
        assert scores[1].feedback == "Not scored: the metric timed out after 0.5 s on this output."
        assert metric.stats["timeout"] == 1


def test_a_misspelt_option_names_the_closest_one():
    with pytest.raises(TypeError, match=r"unknown option 'output_field' \(did you mean 'output_fields'\?\)"):
        skynet_dspy.load_metric(exact, output_field="answer")


# -- guarantees of the redesign ------------------------------------------------------------------


def test_changing_a_returned_result_never_changes_a_later_memo_hit(isolation):
    def rich(input, output, expected):
        return 0.5, {
            "feedback": "Half right.",
            "scores": {"format": 1.0, "accuracy": 0.0},
            "debug": {"steps": [1, 2]},
            "note": "kept",
        }

    metric = skynet_dspy.load_metric(rich, isolation=isolation)
    example, pred = gold(), dspy.Prediction(answer="Lyon")
    extra = {"debug": {"steps": [1, 2]}, "note": "kept"}
    scores = {"format": 1.0, "accuracy": 0.0}

    first = metric(example, pred)
    assert first.result.extra == extra and first.result.scores == scores
    first.result.extra["debug"]["steps"].append("changed")  # a nested value...
    first.result.extra["note"] = "changed"  # ...a key...
    first.result.extra["added"] = True  # ...and a new one
    first.result.scores["format"] = -1.0
    first.result.scores["added"] = 2.0
    first["objective_scores"]["accuracy"] = 9.0  # what GEPA reads, too

    second = metric(example, pred, [], "predict", [])  # GEPA's second call: a memo hit
    assert metric.stats["memo_hits"] == 1 and metric.stats["calls"] == 1
    assert second.result.extra == extra
    assert second.result.scores == scores and second.objective_scores == scores

    second.result.extra.clear()  # a change to a memo hit does not reach the next hit either
    second.result.scores.clear()
    third = metric(example, pred, [], "predict", [])
    assert metric.stats["memo_hits"] == 2 and metric.stats["calls"] == 1
    assert third.result.extra == extra and third.result.scores == scores
    metric.close()


def test_a_metric_file_gives_a_class_named_metric_and_a_csv_column_of_plain_numbers(tmp_path):
    path = write_metric(tmp_path, """
        def score(input, output, expected=None):
            ok = output == expected["answer"]
            return (1.0 if ok else 0.25), {"feedback": "Correct." if ok else "Wrong city.", "note": [output]}
        """)
    with skynet_dspy.load_metric(str(path)) as metric:
        assert metric.__class__.__name__ == "metric"  # dspy.Evaluate names its column after `__class__.__name__`
        assert isinstance(metric, skynet_dspy.Metric) and metric.name == "metric"
        csv_path, json_path = tmp_path / "results.csv", tmp_path / "results.json"
        result = dspy.Evaluate(devset=_devset(), metric=metric, num_threads=1, save_as_csv=str(csv_path),
                               save_as_json=str(json_path))(Echo())
    assert result.score == 62.5
    with csv_path.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert "metric" in rows[0]
    assert [row["metric"] for row in rows] == ["1.0", "0.25", "1.0", "0.25"]  # plain numbers, not Prediction(...)
    assert [float(row["metric"]) for row in rows] == [1.0, 0.25, 1.0, 0.25]
    assert [row["metric"] for row in json.loads(json_path.read_text())] == [1.0, 0.25, 1.0, 0.25]



# -- success_threshold (issue 24): the Skynet form of DSPy's `if trace is not None: return score >= 1.0` --------


def _partial_credit(input, output, expected=None):
    return (0.8 if input["question"] == "partial" else 1.0), {"feedback": "graded"}


@pytest.mark.parametrize(("threshold", "bootstrapped"), [(None, {"partial", "perfect"}), (1.0, {"perfect"})])
def test_success_threshold_keeps_a_partly_right_call_out_of_bootstrapfewshots_demos(server, lm, threshold,
                                                                                    bootstrapped):
    server.responder = lambda request: dspy_reply(answer="yes")
    metric = skynet_dspy.load_metric(_partial_credit, isolation="thread", output_fields="answer",
                                     success_threshold=threshold)
    trainset = [dspy.Example(question=q, answer="yes").with_inputs("question") for q in ("partial", "perfect")]
    optimizer = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=4, max_labeled_demos=0)
    with metric, dspy.context(lm=lm):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset)
        score = metric(trainset[0], dspy.Prediction(answer="yes"))
    assert {demo.question for demo in compiled.predictors()[0].demos} == bootstrapped
    assert float(score) == 0.8  # the number is unchanged; only what counts as a success is
    assert bool(score) is (threshold is None)
    assert bool(copy.deepcopy(score)) is bool(score) and bool(pickle.loads(pickle.dumps(score))) is bool(score)


@pytest.mark.parametrize("bad", ["1.0", float("nan"), float("inf"), True])
def test_success_threshold_must_be_a_finite_number(bad):
    with pytest.raises(TypeError, match="success_threshold must be a finite number"):
        skynet_dspy.load_metric(_partial_credit, isolation="thread", success_threshold=bad)
