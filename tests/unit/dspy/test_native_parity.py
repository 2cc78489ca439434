"""What a new user hits in a first hour (issue 15), through the public API: plain return values, failure
messages that point at the code, and skynet_dspy.gepa()'s options.

A metric gets what the program returned unchanged when it is not a Prediction; the warning of a failing metric
names the file and the line; a bare-value output, a DSPy-style signature and a misspelt output field each get
a hint saying what to change.
"""

from __future__ import annotations

import json
import logging

import dspy
import pydantic
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy._dspy.metric import OPTIONS
from skynet_dspy._dspy.optimize import _GEPA_OPTIONS
from skynet_dspy.devserver import dspy_reply

pytestmark = pytest.mark.timeout(120)

TYPE_AND_VALUE = """
    def score(input, output, expected=None):
        return 1.0, {"feedback": f"{type(output).__name__} {output!r}"}
    """


class Entity(pydantic.BaseModel):
    name: str
    start: int


@pytest.fixture(params=["process", "thread"])
def isolation(request) -> str:
    return request.param


def example() -> dspy.Example:
    return dspy.Example(text="United flies to Lima.", entities=[("United", 0)]).with_inputs("text")


# -- 1. programs that return a plain value --------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "seen"),
    [
        ([("United", 6)], "list [('United', 6)]"),  # was 6: a list of pairs read as fields
        (["ab", "cd"], "list ['ab', 'cd']"),  # was {'a': 'b', 'c': 'd'}
        ("Paris", "str 'Paris'"),  # was scored as an exception
        (7, "int 7"),
        (("Paris", 0.9), "tuple ('Paris', 0.9)"),
        (Entity(name="United", start=6), "Entity Entity(name='United', start=6)"),
    ],
    ids=["pairs", "strings", "str", "int", "tuple", "pydantic"],
)
def test_a_value_the_program_returned_reaches_the_metric_unchanged(tmp_path, isolation, returned, seen):
    with skynet_dspy.load_metric(write_metric(tmp_path, TYPE_AND_VALUE), isolation=isolation) as metric:
        score = metric(example(), returned)
    assert score.result.failure is None, score.result.detail
    assert score.feedback == seen


def test_only_a_mapping_or_a_prediction_is_read_field_by_field(tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, TYPE_AND_VALUE)) as metric:
        assert metric(example(), {"entities": ["x"]}).feedback == "list ['x']"  # one field: its bare value
        assert metric(example(), dspy.Prediction(entities=["x"], n=1)).feedback == "dict {'entities': ['x'], 'n': 1}"


def test_evaluate_scores_a_program_returning_a_field_of_its_prediction_as_a_native_metric_does(server, lm, tmp_path):
    """The issue's case: `lambda text: predict(text=text).entities` scored 100.0 natively, 0.0 through the adapter."""
    server.responder = lambda request: dspy_reply(entities=json.dumps([["United", 0]]))
    predict = dspy.Predict("text -> entities: list[tuple[str, int]]")
    program = lambda text: predict(text=text).entities  # noqa: E731 - as a user would write it

    def native(gold, pred, trace=None):
        return float(pred == gold.entities)

    path = write_metric(tmp_path, """
        def score(input, output, expected=None):
            right = [tuple(item) for item in output] == [tuple(item) for item in expected["entities"]]
            return float(right), {"feedback": "Right." if right else f"Got {output!r}."}
        """)
    devset = [example(), example()]
    with dspy.context(lm=lm), skynet_dspy.load_metric(path) as metric:
        assert dspy.Evaluate(devset=devset, metric=native, display_progress=False)(program).score == 100.0
        result = dspy.Evaluate(devset=devset, metric=metric, display_progress=False)(program)
    assert result.score == 100.0, [score.result.detail or score.feedback for _, _, score in result.results]


# -- 10. runtime failures point at the code ---------------------------------------------------


def test_the_warning_for_a_failing_metric_names_the_file_and_the_line(tmp_path, caplog, isolation):
    path = write_metric(tmp_path, """
        def score(input, output, expected=None):
            ratio = len(output) / 0
            return ratio, {"feedback": "never"}
        """, name="ratio_metric.py")
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"), skynet_dspy.load_metric(path,
                                                                                         isolation=isolation) as metric:
        score = metric(example(), dspy.Prediction(entities=["x"]))
    assert "ratio_metric.py, line 3: `ratio = len(output) / 0`: ZeroDivisionError" in score.result.detail
    warnings = [record.getMessage() for record in caplog.records if record.name == "skynet_dspy"]
    assert len(warnings) == 1 and "ratio_metric.py, line 3" in warnings[0] and str(path) in warnings[0]
    assert "line 3" not in score.feedback and "ZeroDivisionError" in score.feedback  # the optimizer gets neither


def test_subscripting_a_bare_value_gets_the_hint_that_one_field_arrives_bare(tmp_path):
    path = write_metric(tmp_path, """
        def score(input, output, expected=None):
            return float(output["answer"] == expected["answer"]), {"feedback": "x"}
        """)
    with skynet_dspy.load_metric(path) as metric:
        score = metric(dspy.Example(q="?", answer="Paris").with_inputs("q"), dspy.Prediction(answer="Paris"))
    detail = score.result.detail
    assert "line 3" in detail and "TypeError" in detail
    assert "one output field, `output` is that field's bare value" in detail
    assert "output_fields=" in detail and "to_output=" in detail
    assert "bare value" not in score.feedback


def test_a_dspy_style_signature_gets_a_hint_showing_the_skynet_signature(tmp_path):
    path = write_metric(tmp_path, """
        def score(example, pred, trace=None):
            return float(pred.answer == example.answer), {"feedback": "x"}
        """)
    with skynet_dspy.load_metric(path) as metric:
        assert "looks like a DSPy metric" in metric.info.hint
        score = metric(dspy.Example(q="?", answer="Paris").with_inputs("q"), dspy.Prediction(answer="Paris"))
    assert "AttributeError" in score.result.detail
    assert "def score(input, output, expected=None):" in score.result.detail
    report = skynet_dspy.check_contract(path, [{"input": {"q": "?"}, "expected": {"answer": "Paris"}}])
    assert "def score(input, output, expected=None):" in report.item("Metric signature").message


def test_a_misspelt_output_field_is_reported_with_the_closest_field_at_the_first_prediction(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"), skynet_dspy.load_metric(
        write_metric(tmp_path, TYPE_AND_VALUE), output_fields=["answr", "confidence"]
    ) as metric:
        score = metric(example(), dspy.Prediction(answer="Paris", confidence="high"))
    assert score.result.failure == "missing_field"
    assert "no field 'answr' (did you mean 'answer'?)" in score.result.detail
    assert "fields present: answer, confidence" in score.result.detail
    assert any("did you mean 'answer'?" in record.getMessage() for record in caplog.records)


# -- 7. skynet_dspy.gepa() takes metric options next to GEPA's --------------------------------


def test_gepa_takes_every_metric_option_and_every_gepa_option_by_name(tmp_path):
    path = write_metric(tmp_path, TYPE_AND_VALUE)
    metric_values = {"timeout": 7, "failure_score": -1.0, "output_fields": ["answer"], "to_output": None,
                     "metric_lm": "openai/judge", "judge_cache": False, "judge_cache_size": None,
                     "feedback_limit": 500, "memo_size": 10, "isolation": "thread", "workers": 1, "measure": False,
                     "worker_max_calls": None, "worker_max_memory": None, "sandbox": False, "sandbox_network": False,
                     "judge_max_concurrency": 3, "judge_rpm": 90, "success_threshold": 0.5}
    assert set(metric_values) | {"reflection_lm"} >= set(OPTIONS) - {"max_judge_cost_usd", "max_program_cost_usd"}
    optimizer = skynet_dspy.gepa(path, reflection_lm="openai/gpt-4o", max_metric_calls=10, num_threads=2,
                                 **{name: value for name, value in metric_values.items() if name in OPTIONS})
    metric = optimizer.skynet_metric
    assert (metric.timeout, metric.failure_score, metric.output_fields) == (7, -1.0, ["answer"])
    assert (metric.feedback_limit, metric.isolation, metric.measuring) == (500, "thread", False)
    assert metric.success_threshold == 0.5
    assert metric.judge.metric_lm.model == "openai/judge" and metric.judge.reflection_lm.model == "openai/gpt-4o"
    assert (optimizer.max_metric_calls, optimizer.num_threads, optimizer.failure_score) == (10, 2, -1.0)
    for name in ("auto", "reflection_minibatch_size", "candidate_selection_strategy", "use_merge", "track_stats",
                 "seed", "perfect_score", "skip_perfect_score", "log_dir", "gepa_kwargs"):
        assert name in _GEPA_OPTIONS
    metric.close()


@pytest.mark.parametrize(("typo", "meant"), [("output_field", "output_fields"), ("timout", "timeout"),
                                             ("failure_scor", "failure_score"), ("max_metric_call", "max_metric_calls"),
                                             ("reflection_minibatch", "reflection_minibatch_size")])
def test_a_misspelt_gepa_or_metric_option_gets_the_closest_name(tmp_path, typo, meant):
    with pytest.raises(TypeError, match=rf"unknown option '{typo}' \(did you mean '{meant}'\?\)"):
        skynet_dspy.gepa(write_metric(tmp_path, TYPE_AND_VALUE), reflection_lm="openai/gpt-4o", max_metric_calls=10,
                         **{typo: 1})
