"""docs/contract.md#what-the-metric-sees: dspy.Example / dspy.Prediction → plain input, output, expected."""

from __future__ import annotations

import copy

import dspy
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skynet_dspy._dspy import translate as _translate
from skynet_dspy._dspy.translate import MissingOutputField, perfect_output, prediction_output, split_example


def _no_dspy_objects(value) -> bool:
    if isinstance(value, dspy.Example):
        return False
    if isinstance(value, dict):
        return all(_no_dspy_objects(item) for item in value.values())
    if isinstance(value, list | tuple):
        return all(_no_dspy_objects(item) for item in value)
    return True


def test_input_and_expected_are_plain_dicts_of_the_split():
    gold = dspy.Example(question="Q?", context=["a", "b"], answer="A", note="n", dspy_uuid="x").with_inputs(
        "question", "context"
    )
    input_values, expected = split_example(gold)
    assert input_values == {"question": "Q?", "context": ["a", "b"]}
    assert expected == {"answer": "A", "note": "n"}  # DSPy's own dspy_* keys are left out
    assert type(input_values) is dict and type(expected) is dict


def test_an_example_without_labels_has_expected_none():
    assert split_example(dspy.Example(question="Q?").with_inputs("question")) == ({"question": "Q?"}, None)


def test_an_example_without_marked_inputs_is_a_clear_error():
    with pytest.raises(ValueError, match=r"with_inputs"):
        split_example(dspy.Example(question="Q?", answer="A"))


def test_changing_what_the_metric_got_leaves_the_example_alone():
    gold = dspy.Example(question="Q?", context=["a", {"k": [1]}], answer={"text": "A", "ids": [1, 2]}).with_inputs(
        "question", "context"
    )
    before = copy.deepcopy(gold.toDict())
    input_values, expected = split_example(gold)
    input_values["context"].append("x")
    input_values["context"][1]["k"].append(2)
    expected["answer"]["ids"].clear()
    expected["answer"]["text"] = "changed"
    input_values["question"] = "changed"
    assert gold.toDict() == before


def test_one_output_column_is_the_bare_value():
    assert prediction_output(dspy.Prediction(answer="Paris")) == "Paris"


def test_several_columns_are_a_dict_without_bookkeeping_fields():
    pred = dspy.Prediction(reasoning="because", answer="Paris", confidence="high", trajectory={"step": 1})
    assert prediction_output(pred) == {"answer": "Paris", "confidence": "high"}


def test_chain_of_thought_reasoning_is_not_an_output_column():
    assert prediction_output(dspy.Prediction(reasoning="because", answer="Paris")) == "Paris"


def test_named_output_columns_override_and_shape_the_output():
    pred = dspy.Prediction(answer="Paris", confidence="high", extra="x")
    assert prediction_output(pred, ["answer"]) == "Paris"
    assert prediction_output(pred, ["confidence", "answer"]) == {"confidence": "high", "answer": "Paris"}
    assert prediction_output(dspy.Prediction(reasoning="r", answer="A"), ["reasoning", "answer"]) == {
        "reasoning": "r",
        "answer": "A",
    }


def test_a_missing_named_column_names_the_field_and_the_fields_present():
    with pytest.raises(MissingOutputField) as caught:
        prediction_output(dspy.Prediction(reasoning="r", answer="A"), ["answer", "label"])
    message = str(caught.value)
    assert "'label'" in message
    assert "fields present: reasoning, answer" in message


def test_a_custom_mapping_decides_the_output():
    pred = dspy.Prediction(answer="Paris", confidence="0.9")
    assert prediction_output(pred, to_output=lambda p: {"city": p.answer, "p": float(p.confidence)}) == {
        "city": "Paris",
        "p": 0.9,
    }
    # what the mapping returns is detached too, even when it hands back the prediction's own values
    items = ["a"]
    pred = dspy.Prediction(answer=items)
    out = prediction_output(pred, to_output=lambda p: p.answer)
    out.append("b")
    assert pred.answer == ["a"]


def test_a_mapping_that_returns_the_prediction_gives_a_plain_dict():
    out = prediction_output(dspy.Prediction(answer="A", dspy_uuid="u"), to_output=lambda p: p)
    assert out == {"answer": "A"} and type(out) is dict


def test_changing_the_output_leaves_the_prediction_alone():
    pred = dspy.Prediction(answer=["Paris"], details={"population": [2]})
    before = copy.deepcopy(pred.toDict())
    out = prediction_output(pred)
    out["answer"].append("Lyon")
    out["details"]["population"].append(3)
    assert pred.toDict() == before


def test_nested_dspy_objects_become_dicts():
    inner = dspy.Example(a=1, dspy_split="train")
    out = prediction_output(dspy.Prediction(answer=inner, items=[dspy.Prediction(b=2)]))
    assert out == {"answer": {"a": 1}, "items": [{"b": 2}]}
    assert _no_dspy_objects(out)


def test_perfect_output_is_shaped_like_a_real_output():
    assert perfect_output({"answer": "A"}) == "A"
    assert perfect_output({"answer": "A", "id": 3}, ["answer"]) == "A"
    assert perfect_output({"answer": "A", "conf": "h"}) == {"answer": "A", "conf": "h"}
    assert perfect_output(None) is None


_names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6).filter(lambda n: not n.startswith("dspy_"))
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(_names, _values, min_size=1, max_size=5),
    st.dictionaries(st.sampled_from(sorted(_translate.BOOKKEEPING_FIELDS)), _values, max_size=2),
)
def test_output_columns_hold_every_field_but_bookkeeping_and_are_detached(fields, bookkeeping):
    fields = {**bookkeeping, **fields}
    pred = dspy.Prediction(**fields)
    before = copy.deepcopy(pred.toDict())
    out = prediction_output(pred)
    columns = {k: v for k, v in fields.items() if k not in _translate.BOOKKEEPING_FIELDS}
    if len(columns) == 1:
        assert out == next(iter(columns.values()))
    else:
        assert out == columns
    assert _no_dspy_objects(out)
    _scramble(out)
    assert pred.toDict() == before


def _scramble(value):
    if isinstance(value, dict):
        for item in list(value.values()):
            _scramble(item)
        value["scrambled"] = True
    elif isinstance(value, list):
        for item in value:
            _scramble(item)
        value.append("scrambled")


class _Answer(pydantic.BaseModel):
    city: str
    confidence: float


@pytest.mark.parametrize(
    "returned",
    ["Paris", ["Paris", "Lyon"], ("Paris", 0.9), _Answer(city="Paris", confidence=0.9)],
    ids=["str", "list", "tuple", "pydantic"],
)
def test_a_program_returning_a_plain_value_gives_that_value_as_output(returned):
    before = copy.deepcopy(returned)
    out = prediction_output(returned)
    assert out == returned and type(out) is type(returned)
    if isinstance(out, list):
        out.append("changed")  # a copy: the program's own value is left alone
    assert returned == before


def test_a_mapping_returned_by_the_program_is_read_like_a_prediction():
    assert prediction_output({"reasoning": "r", "answer": "Paris"}) == "Paris"
    assert prediction_output({"answer": "Paris", "confidence": 0.9}) == {"answer": "Paris", "confidence": 0.9}


def test_the_metric_gets_a_plain_value_the_program_returned_unchanged():
    import skynet_dspy

    def score(input, output, expected):
        return float(output == [expected["answer"]]), {"feedback": f"{type(output).__name__} {output!r}"}

    with skynet_dspy.load_metric(score) as metric:
        example = dspy.Example(question="Capital of France?", answer="Paris").with_inputs("question")
        result = metric(example, ["Paris"])
        assert result.result.failure is None, result.result.detail
        assert float(result) == 1.0 and result.feedback == "list ['Paris']"
        assert metric(example, "Paris").feedback == "str 'Paris'"
