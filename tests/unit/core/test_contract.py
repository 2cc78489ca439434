"""The return-value rules (docs/contract.md#return-value), through validate_return / Result / ContractViolation."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import skynet_dspy
from skynet_dspy import ContractViolation, Result, validate_return
from skynet_dspy._core.contract import (
    DEFAULT_FEEDBACK_LIMIT,
    DEFAULT_TIMEOUT,
    MAX_NAMED_SCORES,
    MAX_SCORE_NAME_LENGTH,
    MAX_TIMEOUT,
    check_feedback_limit,
    check_timeout,
    cut_feedback,
)
from skynet_dspy._core.values import shorten

# The normative table of docs/contract.md#return-value: (return value, valid?, the reason the contract gives).
SPEC_TABLE = [
    ((0.8, {"feedback": "Close. Missing the date."}), True, None),
    ([1.0, {"feedback": "OK", "scores": {"format": 1.0}}], True, None),
    (0.8, False, "no side information"),
    ((0.8, "Close."), False, "side information is not a dict"),
    ((0.8, {}), False, "no feedback string"),
    (("0.8", {"feedback": "OK"}), False, "the score is a string"),
    ((0.8, {"feedback": "OK", "scores": {"a": "high"}}), False, "a named score is not a number"),
]


@pytest.mark.parametrize(("value", "valid", "rule"), SPEC_TABLE)
def test_spec_table_rows_give_the_stated_verdict(value, valid, rule):
    if valid:
        result = validate_return(value)
        assert isinstance(result, Result) and result.ok
        assert result.score == float(value[0])
        assert result.feedback == value[1]["feedback"]
        assert result.scores == value[1].get("scores")
        return
    with pytest.raises(ContractViolation) as caught:
        validate_return(value)
    message = str(caught.value)
    # `rule` is the contract's reason as a short name ("the score is a string" -> "score is a string"), and the
    # message leads with it, then gives advice and the value returned.
    short = rule.removeprefix("the ").removeprefix("a ")
    assert caught.value.rule == short
    assert message.startswith(f"{short}: ")
    assert f"score returned {value!r}" in message  # shows the value returned
    assert caught.value.value == value


def test_a_contract_violation_is_a_value_error_exported_at_top_level():
    assert issubclass(skynet_dspy.ContractViolation, ValueError)
    assert skynet_dspy.validate_return is validate_return


@pytest.mark.parametrize(
    ("value", "rule", "words"),
    [
        ((math.nan, {"feedback": "x"}), "score is NaN", "return a finite number"),
        ((math.inf, {"feedback": "x"}), "score is infinite", "return a finite number"),
        ((-math.inf, {"feedback": "x"}), "score is infinite", "return a finite number"),
        ((np.float64("nan"), {"feedback": "x"}), "score is NaN", "return a finite number"),
        ((10**400, {"feedback": "x"}), "score is infinite", "return a finite number"),
        ((1.0, {"feedback": "x", "scores": {"a": math.nan}}), "named score is NaN", "(the score 'a')"),
        ((1.0, {"feedback": "x", "scores": {"a": math.inf}}), "named score is infinite", "(the score 'a')"),
        ((1.0, {"feedback": "x"}, "extra"), "not exactly 2 items", "(3 items)"),
        ((1.0,), "not exactly 2 items", "(1 items)"),
        (None, "no return value", "does every path end in a return?"),
        ({"score": 1.0, "feedback": "x"}, "not a pair", "the return value is a dict, not a pair"),
        ("0.8", "not a pair", "the return value is a str, not a pair"),
        ((None, {"feedback": "x"}), "score is not a number", "the score is None"),
        (([1.0], {"feedback": "x"}), "score is not a number", "the score is a list"),
        ((1 + 2j, {"feedback": "x"}), "score is not a number", "the score is a complex"),
        ((np.complex128(1), {"feedback": "x"}), "score is not a number", "the score is a complex128"),
        ((1.0, {"feedback": 3}), "no feedback string", "'feedback' is an int, not a str"),
        ((1.0, {"feedback": None}), "no feedback string", "'feedback' is None"),
        ((1.0, {"feedback": "x", "scores": [1.0]}), "scores is not a dict", "'scores' is a list"),
        ((1.0, {"feedback": "x", "scores": {1: 1.0}}), "named score name is not a string", "in 'scores' is an int"),
    ],
)
def test_decided_points_are_rejected_with_the_rule(value, rule, words):
    with pytest.raises(ContractViolation) as caught:
        validate_return(value)
    message = str(caught.value)
    assert caught.value.rule == rule
    assert message.startswith(f"{rule}: ")
    assert words in message
    assert "score returned" in message


def test_named_scores_are_bounded_in_number_and_name_length():
    assert MAX_NAMED_SCORES == 32 and MAX_SCORE_NAME_LENGTH == 64
    most = {f"s{i}": 1.0 for i in range(MAX_NAMED_SCORES)}
    assert validate_return((1.0, {"feedback": "x", "scores": most})).scores == most
    longest = {"n" * MAX_SCORE_NAME_LENGTH: 0.5}
    assert validate_return((1.0, {"feedback": "x", "scores": longest})).scores == longest

    with pytest.raises(ContractViolation) as caught:
        validate_return((1.0, {"feedback": "x", "scores": {**most, "one_more": 1.0}}))
    assert caught.value.rule == "too many named scores"
    assert f"{MAX_NAMED_SCORES + 1} names" in str(caught.value)

    with pytest.raises(ContractViolation) as caught:
        validate_return((1.0, {"feedback": "x", "scores": {"n" * (MAX_SCORE_NAME_LENGTH + 1): 0.5}}))
    assert caught.value.rule == "named score name is too long"
    assert f"a name of {MAX_SCORE_NAME_LENGTH + 1} characters" in str(caught.value)


def test_a_rule_never_holds_what_the_metric_chose():
    # the rule may reach an optimizer: no value, no score name, no class name the metric defined
    class SecretLabel:
        pass

    for value in [
        (1.0, {"feedback": "x", "scores": {"expected-answer-42": "high"}}),
        (1.0, {"feedback": "x", "scores": {"expected-answer-42": math.nan}}),
        ("expected-answer-42", {"feedback": "x"}),
        (SecretLabel(), {"feedback": "x"}),
        SecretLabel(),
    ]:
        with pytest.raises(ContractViolation) as caught:
            validate_return(value)
        assert "expected-answer-42" not in caught.value.rule and "SecretLabel" not in caught.value.rule


def test_a_generator_is_rejected_and_closed():
    def pair():
        yield 1.0
        yield {"feedback": "x"}

    generator = pair()
    with pytest.raises(ContractViolation, match="score returned a generator") as caught:
        validate_return(generator)
    assert caught.value.rule == "not a pair"
    assert "yield" in str(caught.value)
    assert generator.gi_frame is None  # closed, not left suspended


def test_a_coroutine_is_rejected_with_a_hint_about_async_def(recwarn):
    async def score():
        return 1.0, {"feedback": "x"}

    with pytest.raises(ContractViolation, match="async def"):
        validate_return(score())
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
    asyncio.run(asyncio.sleep(0))  # the event loop machinery is untouched


@pytest.mark.parametrize(
    ("raw", "number"),
    [
        (True, 1.0),
        (False, 0.0),
        (np.float32(0.5), 0.5),
        (np.float64(0.25), 0.25),
        (np.int64(1), 1.0),
        (np.int8(-3), -3.0),
        (np.uint16(7), 7.0),
        (np.bool_(True), 1.0),
        (np.array(0.75), 0.75),
        (3, 3.0),
    ],
)
def test_bool_and_numpy_numbers_are_valid_scores(raw, number):
    result = validate_return((raw, {"feedback": "ok", "scores": {"part": raw}}))
    assert result.score == number and type(result.score) is float
    assert result.scores == {"part": number} and type(result.scores["part"]) is float


def test_a_numpy_array_of_several_values_is_not_a_score():
    with pytest.raises(ContractViolation, match="score is not a number") as caught:
        validate_return((np.array([1.0, 2.0]), {"feedback": "x"}))
    assert caught.value.rule == "score is not a number"


def test_extra_keys_are_allowed_and_kept_apart():
    result = validate_return((0.5, {"feedback": "fine", "scores": {"a": 1}, "trace": [1, 2], "debug": "x"}))
    assert result.extra == {"trace": [1, 2], "debug": "x"}
    assert result.scores == {"a": 1.0}
    assert result.feedback == "fine"


def test_scores_none_means_no_named_scores():
    assert validate_return((0.5, {"feedback": "x", "scores": None})).scores is None


def test_empty_feedback_is_valid():
    result = validate_return((1.0, {"feedback": ""}))
    assert result.ok and result.feedback == ""


def test_a_huge_value_is_shortened_in_the_message():
    huge = "x" * 1_000_000
    with pytest.raises(ContractViolation) as caught:
        validate_return((huge, {"feedback": "ok"}))
    message = str(caught.value)
    assert caught.value.rule == "score is a string"
    assert len(message) < 600
    assert "<a str of 1,000,000 characters>" in message  # one long word is never cut in two (a key could be)


def test_a_deeply_nested_or_wide_value_is_shortened_too():
    wide = (1.0, {"feedback": 1, **{f"key{i}": list(range(1000)) for i in range(1000)}})
    with pytest.raises(ContractViolation) as caught:
        validate_return(wide)
    assert len(str(caught.value)) < 600


def test_shorten_survives_a_repr_that_raises():
    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert shorten(Broken()).startswith("<Broken ")
    # the advice names no class the metric defined; the value shown to the user still does
    advice = "the return value is an object of a class of its own, not a pair"
    with pytest.raises(ContractViolation, match=advice) as caught:
        validate_return(Broken())
    assert caught.value.rule == "not a pair"
    assert "score returned <Broken " in str(caught.value)


def test_feedback_over_the_limit_is_cut_with_a_note():
    text = "abc " * 10_000  # 40,000 characters
    result = validate_return((1.0, {"feedback": text}))
    assert len(result.feedback) <= DEFAULT_FEEDBACK_LIMIT
    assert result.feedback.startswith("abc abc")
    assert "feedback cut" in result.feedback and "40,000" in result.feedback and "20,000" in result.feedback

    small = validate_return((1.0, {"feedback": text}), feedback_limit=150)
    assert len(small.feedback) <= 150 and "feedback cut" in small.feedback


def test_feedback_at_the_limit_is_left_alone():
    text = "y" * DEFAULT_FEEDBACK_LIMIT
    assert validate_return((1.0, {"feedback": text})).feedback == text


@given(text=st.text(min_size=0, max_size=3000), limit=st.integers(min_value=100, max_value=2500))
def test_cut_feedback_never_exceeds_the_limit_and_keeps_the_start(text, limit):
    cut = cut_feedback(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    else:
        kept = cut.split("\n[feedback cut:")[0]
        assert text.startswith(kept) and len(kept) > 0


def test_timeout_bounds():
    assert DEFAULT_TIMEOUT == 60 and MAX_TIMEOUT == 600
    assert check_timeout(60) == 60.0
    assert check_timeout(600) == 600.0
    assert check_timeout(0.5) == 0.5
    assert check_timeout(np.float64(2)) == 2.0


@pytest.mark.parametrize("bad", [0, -1, 600.001, 601, math.nan, math.inf, "60", None, True])
def test_timeout_outside_the_range_is_a_clear_value_error(bad):
    with pytest.raises(ValueError) as caught:
        check_timeout(bad)
    message = str(caught.value)
    assert "timeout must be a number of seconds in (0, 600]" in message
    assert "default is 60" in message


@pytest.mark.parametrize("bad", [99, 0, -5, 1.5e4, "20000", True, None])
def test_feedback_limit_must_be_a_whole_number_of_at_least_100(bad):
    with pytest.raises(ValueError, match="feedback_limit must be a whole number of characters, at least 100"):
        check_feedback_limit(bad)
    assert check_feedback_limit(100) == 100
