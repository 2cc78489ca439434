"""The adapter DSPy calls: the Score it returns, the memo, failures, timeouts, threads (SPEC §3, §4, §6)."""

from __future__ import annotations

import copy
import inspect
import json
import logging
import pickle
import threading
from collections import Counter

import dspy
import pytest

import skynet_dspy
from skynet_dspy import Score

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
    """A score function that counts its calls (per output) and records what it was given."""

    def __init__(self, fn=exact):
        self.fn = fn
        self.calls: Counter = Counter()
        self.seen: list[tuple] = []
        self.lock = threading.Lock()

    def __call__(self, input, output, expected=None):
        with self.lock:
            self.calls[repr(output)] += 1
            self.seen.append((input, output, expected))
        return self.fn(input, output, expected)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


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
    assert failed >= 0.4  # ...but a metric_threshold compares the number, as DSPy documents


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


def test_the_second_call_for_the_same_example_and_prediction_does_not_score_again():
    score = Counting()
    metric = skynet_dspy.load_metric(score)
    example, pred = gold(), dspy.Prediction(answer="Lyon")
    first = metric(example, pred, [])
    second = metric(example, pred, [], "predict", [("p", {}, pred)])
    assert score.total == 1
    assert (second.score, second.feedback) == (first.score, first.feedback) == (0.0, "Expected 'Paris'.")
    assert metric.stats["calls"] == 1 and metric.stats["memo_hits"] == 1
    second["feedback"] = "changed by a caller"  # DSPy may write into what it gets back...
    assert metric(example, pred).feedback == "Expected 'Paris'."  # ...the memo is not changed by it


def test_another_prediction_or_a_changed_one_is_scored_again():
    score = Counting()
    metric = skynet_dspy.load_metric(score)
    example, pred = gold(), dspy.Prediction(answer="Lyon")
    assert metric(example, pred) == 0.0
    assert metric(example, dspy.Prediction(answer="Paris")) == 1.0
    pred.answer = "Paris"  # changed in place since it was scored
    assert metric(example, pred) == 1.0
    assert score.total == 3


def test_failures_are_remembered_too():
    calls = []

    def broken(input, output, expected):
        calls.append(1)
        raise ValueError("bad input")

    metric = skynet_dspy.load_metric(broken)
    example, pred = gold(), dspy.Prediction(answer="x")
    assert metric(example, pred).feedback == metric(example, pred, [], "predict", []).feedback
    assert len(calls) == 1


def test_the_memo_is_bounded():
    score = Counting()
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


def test_memo_size_zero_scores_every_call():
    score = Counting()
    metric = skynet_dspy.load_metric(score, memo_size=0)
    example, pred = gold(), dspy.Prediction(answer="Paris")
    metric(example, pred)
    metric(example, pred, [], "predict", [])
    assert score.total == 2 and metric.stats["memo_hits"] == 0


def test_the_memo_is_safe_under_threads():
    score = Counting()
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


def test_the_metric_gets_plain_values_and_cannot_change_the_dataset_or_prediction():
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
    assert skynet_dspy.load_metric(vandal)(example, pred).feedback == "vandalised"
    assert (example.toDict(), pred.toDict()) == before


def test_two_parameter_score_is_called_without_expected():
    seen = []

    def two(input, output):
        seen.append((input, output))
        return 1.0, {"feedback": "ok"}

    skynet_dspy.load_metric(two)(gold(), dspy.Prediction(answer="Paris"))
    assert seen == [({"question": "What is the capital of France?"}, "Paris")]


# -- failures never stop a run ------------------------------------------------------------------


def test_an_exception_scores_the_failure_score_with_its_type_and_message():
    def broken(input, output, expected):
        raise KeyError("label")

    metric = skynet_dspy.load_metric(broken, failure_score=-1)
    score = metric(gold(), dspy.Prediction(answer="x"))
    assert float(score) == -1.0 and not score
    assert score.feedback == "The metric raised KeyError: 'label'"
    assert score.result.failure == "exception" and metric.stats["exception"] == 1


def test_an_invalid_return_names_the_broken_rule_but_not_the_value():
    def leaky(input, output, expected):
        return expected["rubric"], {"feedback": "text"}  # a string score, and an expected value

    metric = skynet_dspy.load_metric(leaky)
    score = metric(gold(rubric=SECRET_LABEL), dspy.Prediction(answer="x"))
    assert float(score) == 0.0 and score.result.failure == "invalid"
    assert "the score is a string" in score.feedback
    assert SECRET_LABEL not in score.feedback
    assert SECRET_LABEL in score.result.extra["detail"]  # kept for the user, off what DSPy reads
    assert metric.stats["invalid"] == 1


@pytest.mark.parametrize(
    ("returned", "rule"),
    [
        (0.8, "no side information"),
        ((0.8, "Close."), "side information is not a dict"),
        ((0.8, {}), "no feedback string"),
        (("0.8", {"feedback": "OK"}), "the score is a string"),
        ((0.8, {"feedback": "OK", "scores": {"a": "high"}}), "a named score is not a number"),
        ((float("nan"), {"feedback": "OK"}), "NaN"),
    ],
)
def test_each_broken_contract_rule_is_a_failure_with_its_rule(returned, rule):
    metric = skynet_dspy.load_metric(lambda i, o, e: returned)
    score = metric(gold(), dspy.Prediction(answer="x"))
    assert score.result.failure == "invalid" and rule in score.feedback and float(score) == 0.0


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


def test_a_missing_named_output_field_is_a_failure_naming_it_and_the_fields_present():
    score = Counting()
    metric = skynet_dspy.load_metric(score, output_fields=["label"])
    result = metric(gold(), dspy.Prediction(reasoning="r", answer="Paris"))
    assert result.result.failure == "missing_field" and float(result) == 0.0
    assert "'label'" in result.feedback and "fields present: reasoning, answer" in result.feedback
    assert score.total == 0 and metric.stats["missing_field"] == 1


def test_labels_the_program_does_not_produce_stay_in_expected_only():
    score = Counting()
    metric = skynet_dspy.load_metric(score)
    metric(gold(id=7, rubric="be brief"), dspy.Prediction(reasoning="r", answer="Paris"))
    assert score.seen == [
        ({"question": "What is the capital of France?"}, "Paris", {"answer": "Paris", "id": 7, "rubric": "be brief"})
    ]


def test_to_output_maps_the_prediction_and_its_errors_are_failures():
    score = Counting(lambda i, o, e: (1.0 if o["city"] == e["answer"] else 0.0, {"feedback": str(o)}))
    metric = skynet_dspy.load_metric(score, to_output=lambda p: {"city": p.answer.strip()})
    assert metric(gold(), dspy.Prediction(answer=" Paris ")) == 1.0
    broken = skynet_dspy.load_metric(score, to_output=lambda p: p.missing_field)
    result = broken(gold(), dspy.Prediction(answer="Paris"))
    assert result.result.failure == "exception" and "to_output raised AttributeError" in result.feedback


def test_a_timeout_scores_the_failure_score_and_says_so():
    release = threading.Event()

    def stuck(input, output, expected):
        release.wait(30)
        return 1.0, {"feedback": "too late"}

    metric = skynet_dspy.load_metric(stuck, timeout=0.2)
    try:
        score = metric(gold(), dspy.Prediction(answer="x"))
        assert not release.is_set()
        assert float(score) == 0.0 and score.result.failure == "timeout"
        assert "timed out after 0.2 s" in score.feedback
        assert metric.stats["timeout"] == 1
    finally:
        release.set()


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
        "overloaded": 0,
    }


def test_a_key_in_the_feedback_is_masked(monkeypatch):
    monkeypatch.setenv("SOME_PROVIDER_API_KEY", "sk-test-0123456789abcdef")
    metric = skynet_dspy.load_metric(lambda i, o, e: (1.0, {"feedback": "used sk-test-0123456789abcdef here"}))
    assert metric(gold(), dspy.Prediction(answer="x")).feedback == "used *** here"
    raising = skynet_dspy.load_metric(lambda i, o, e: (_ for _ in ()).throw(RuntimeError("sk-test-0123456789abcdef")))
    assert "sk-test" not in raising(gold(), dspy.Prediction(answer="x")).feedback


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
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        skynet_dspy.load_metric(exact, **options)


def test_defaults_and_a_metric_passed_through():
    metric = skynet_dspy.load_metric(exact)
    assert metric.timeout == 60 and metric.failure_score == 0.0
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
    assert [row["Metric"] for row in saved] == [1.0, 0.0, 1.0, 0.0]  # numbers, not objects


def test_evaluate_with_eight_threads_gives_the_same_scores_as_one():
    devset = [gold(f"Question {i} ends in {'yes' if i % 3 else 'no'}?", "yes") for i in range(40)]
    runs = []
    for threads in (1, 8):
        score = Counting()
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
    metric = skynet_dspy.load_metric(sometimes_stuck, timeout=0.5)
    try:
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads)(Echo())
        assert not release.is_set()  # the run ended while the stuck call was still stuck
        scores = [score for _e, _p, score in result.results]
        assert [float(score) for score in scores] == [1.0, 0.0, 1.0]
        assert "timed out after 0.5 s" in scores[1].feedback
        assert metric.stats["timeout"] == 1
    finally:
        release.set()


def test_a_misspelt_option_names_the_closest_one():
    with pytest.raises(TypeError, match=r"unknown option 'output_field' \(did you mean 'output_fields'\?\)"):
        skynet_dspy.load_metric(exact, output_field="answer")
