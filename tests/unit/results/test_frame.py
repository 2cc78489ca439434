"""results_frame(): one row per example of a real dspy.Evaluate, with named scores, failures and measured runs."""

from __future__ import annotations

import copy
import io
import pickle
import sys

import dspy
import pandas as pd
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy.errors import MissingExtra

SECRET = "LABEL-SENTINEL-77"  # an expected value no output or feedback ever holds

METRIC = '''
def score(input, output, expected=None):
    question = input["question"]
    if question == "boom":
        raise ValueError("the metric broke on " + expected["answer"])
    if question == "bad":
        return "0.5", {"feedback": "a string score"}
    right = output == expected["answer"]
    return (0.9 if right else 0.1), {
        "feedback": "Right." if right else "Wrong.",
        "scores": {"accuracy": float(right), "brevity": 1.0 / len(output)},
        "note": "kept for the user",
    }
'''


class Shout(dspy.Module):
    """A program with no model: the question in capitals; it raises on "crash"."""

    def forward(self, question):
        if question == "crash":
            raise RuntimeError("the program broke")
        return dspy.Prediction(answer=question.upper())


def _devset():
    pairs = [("ab", "AB"), ("cd", SECRET), ("boom", "BOOM"), ("bad", "BAD"), ("crash", "CRASH")]
    return [dspy.Example(question=q, answer=a).with_inputs("question") for q, a in pairs]


@pytest.fixture
def evaluation(tmp_path):
    metric = skynet_dspy.load_metric(write_metric(tmp_path, METRIC), measure=True)
    try:
        yield dspy.Evaluate(devset=_devset(), metric=metric, num_threads=1, display_progress=False,
                            max_errors=100)(Shout())
    finally:
        metric.close()


def test_the_table_has_inputs_output_scores_named_scores_failures_and_the_measured_run(evaluation):
    frame = skynet_dspy.results_frame(evaluation)
    assert list(frame.columns) == ["question", "output", "score", "accuracy", "brevity", "feedback", "failure",
                                   "run_ms", "cost_usd", "model_calls"]
    assert list(frame["question"]) == ["ab", "cd", "boom", "bad", "crash"]
    assert list(frame["output"][:4]) == ["AB", "CD", "BOOM", "BAD"]
    assert list(frame["failure"]) == ["", "", "exception", "invalid", "program_error"]
    assert list(frame["score"]) == [0.9, 0.1, 0.0, 0.0, 0.0]
    assert frame["accuracy"].tolist()[:2] == [1.0, 0.0] and frame["accuracy"][2:].isna().all()
    assert frame["brevity"].tolist()[:2] == [0.5, 0.5]
    assert list(frame["feedback"][:2]) == ["Right.", "Wrong."]
    assert "raised ValueError" in frame["feedback"][2] and "broke" not in frame["feedback"][2]
    # the program ran (and was timed) for every example the metric scored; the one that raised was never scored
    assert (frame["run_ms"][:4] > 0).all() and pd.isna(frame["run_ms"][4])
    assert frame["cost_usd"][:4].tolist() == [0.0] * 4 and frame["model_calls"][:4].tolist() == [0] * 4
    assert frame["score"].dtype == "float64" and frame["run_ms"].dtype == "float64"


def test_expected_values_appear_only_when_asked_for(evaluation):
    plain = skynet_dspy.results_frame(evaluation)
    assert not any(column.startswith("expected") for column in plain.columns)
    assert SECRET not in plain.to_csv()
    shown = skynet_dspy.results_frame(evaluation, include_expected=True)
    assert shown.columns[2] == "expected.answer"
    assert shown["expected.answer"][1] == SECRET
    with pytest.raises(TypeError, match="include_expected"):
        skynet_dspy.results_frame(evaluation, include_expected="yes")


def test_to_csv_reads_back_with_numeric_columns(evaluation):
    frame = skynet_dspy.results_frame(evaluation)
    back = pd.read_csv(io.StringIO(frame.to_csv(index=False)))
    for column in ("score", "accuracy", "brevity", "run_ms", "cost_usd", "model_calls"):
        assert pd.api.types.is_numeric_dtype(back[column]), column
    assert back["score"].tolist() == [0.9, 0.1, 0.0, 0.0, 0.0]
    assert back["failure"].fillna("").tolist() == ["", "", "exception", "invalid", "program_error"]


def test_in_jupyter_failed_rows_and_low_scores_stand_out(evaluation):
    frame = skynet_dspy.results_frame(evaluation)
    assert type(frame) is pd.DataFrame  # a plain DataFrame; results_style() colours it
    html = skynet_dspy.results_style(frame).to_html()
    assert "5 example(s), 3 failed" in html
    assert html.count("background-color: #ffebe9") >= 1  # failed rows tinted
    assert "rgb(248, 215, 218)" in html  # the lowest score shaded red
    failed = frame[frame["failure"] != ""]
    assert "3 example(s), 3 failed" in skynet_dspy.results_style(failed).to_html()  # slices render the same way


def test_a_name_already_taken_gets_its_group_prefix(tmp_path):
    metric = skynet_dspy.load_metric(write_metric(tmp_path, '''
        def score(input, output, expected=None):
            return 1.0, {"feedback": "ok", "scores": {"feedback": 0.5, "score": 0.25}}
    '''), isolation="thread")
    example = dspy.Example(score="an input named score", output="and one named output").with_inputs(
        "score", "output")
    prediction = dspy.Prediction(answer="x")
    frame = skynet_dspy.results_frame([(example, prediction, metric(example, prediction))])
    assert list(frame.columns) == ["input.score", "input.output", "output", "score", "scores.feedback",
                                   "scores.score", "feedback", "failure"]
    assert frame.loc[0, "input.score"] == "an input named score"
    assert (frame.loc[0, "score"], frame.loc[0, "scores.feedback"], frame.loc[0, "scores.score"]) == (1.0, 0.5, 0.25)


def test_several_output_fields_get_a_column_each_and_other_metrics_give_the_score_alone():
    example = dspy.Example(question="q").with_inputs("question")
    prediction = dspy.Prediction(answer="a", confidence="high", reasoning="not the answer")
    frame = skynet_dspy.results_frame([(example, prediction, 0.75)])
    assert list(frame.columns) == ["question", "output.answer", "output.confidence", "score", "feedback", "failure"]
    assert (frame.loc[0, "score"], frame.loc[0, "feedback"], frame.loc[0, "failure"]) == (0.75, "", "")


def test_what_is_not_an_evaluation_is_refused_clearly():
    with pytest.raises(TypeError, match="EvaluationResult"):
        skynet_dspy.results_frame("results.csv")
    with pytest.raises(TypeError, match="triple"):
        skynet_dspy.results_frame([("just", "a pair")])


def test_without_pandas_the_error_names_the_extra(monkeypatch, evaluation):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingExtra, match=r"pandas.*skynet-dspy\[report\]") as raised:
        skynet_dspy.results_frame(evaluation)
    assert isinstance(raised.value, ImportError)


class Reasoned(dspy.Module):
    """A program with no model whose prediction has a field the metric is not shown."""

    def forward(self, question):
        return dspy.Prediction(answer=question.upper(), reasoning_notes=f"thought about {question}")


def test_the_output_column_is_what_the_metric_was_given_by_output_fields_and_to_output():
    devset = [dspy.Example(question=q, answer=q.upper()).with_inputs("question") for q in ("ab", "cd")]
    exact = lambda input, output, expected: (float(output == expected["answer"]), {"feedback": "compared"})  # noqa: E731
    with skynet_dspy.load_metric(exact, output_fields="answer", isolation="thread") as metric:
        evaluation = dspy.Evaluate(devset=devset, metric=metric, display_progress=False)(Reasoned())
        example, prediction, score = evaluation.results[0]
        again = metric(example, prediction)  # answered from the memo
    assert skynet_dspy.results_frame(evaluation)["output"].tolist() == ["AB", "CD"]  # not the {answer, notes} dict
    assert score.output == again.output == copy.copy(score).output == pickle.loads(pickle.dumps(score)).output == "AB"
    assert "output" not in score.keys() and metric.stats["memo_hits"] == 1  # never a field DSPy reads
    with pytest.raises(AttributeError):
        score.output = "changed"
    shown = lambda prediction: {"upper": prediction.answer, "length": len(prediction.answer)}  # noqa: E731
    with skynet_dspy.load_metric(lambda input, output: (1.0, {"feedback": "ok"}), to_output=shown) as metric:
        evaluation = dspy.Evaluate(devset=devset, metric=metric, display_progress=False)(Reasoned())
    frame = skynet_dspy.results_frame(evaluation)
    assert frame["output.upper"].tolist() == ["AB", "CD"] and frame["output.length"].tolist() == [2, 2]
    assert "output.reasoning_notes" not in frame.columns
