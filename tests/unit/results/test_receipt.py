"""The cost receipt's dollar figures: read at LLM scale (the formatter the reward explanation uses too), unknown
never shown as $0."""

from __future__ import annotations

import skynet_dspy
from skynet_dspy._core.types import JudgeUsage, ProgramUsage
from skynet_dspy._dspy.record import ReflectionUsage, RunRecord


def _record() -> RunRecord:
    return RunRecord(
        metric="m", started_at=0.0, seconds=1.0,
        judge=JudgeUsage(calls=2, cache_hits=0, prompt_tokens=10, completion_tokens=5, cost_usd=0.0, seconds=0.1),
        program=ProgramUsage(runs=3, model_calls=3, prompt_tokens=30, completion_tokens=9, cost_usd=0.00027,
                             unpriced=0, run_ms=12.0, unmeasured=0),
        reflection=ReflectionUsage(1, 0, 100, 20, None, "no price known for model m"),
    )


def test_receipt_dollars_read_at_llm_scale():
    lines = dict(skynet_dspy.CostReceipt.from_record(_record()).lines())
    assert lines["program"].split(", ")[3] == "$0.00027"
    assert lines["judge"].split(", ")[3] == "$0"
    assert lines["reflection"].endswith("cost unknown")
    assert lines["total"] == "at least $0.00027 (some costs unknown)"


def test_token_counts_are_read_one_way_from_any_usage_record():
    from types import SimpleNamespace

    from skynet_dspy._core.values import COMPLETION_TOKENS, PROMPT_TOKENS, token_count

    assert token_count({"prompt_tokens": None, "input_tokens": 12}, PROMPT_TOKENS) == 12
    assert token_count(SimpleNamespace(completion_tokens="n/a", output_tokens=7.0), COMPLETION_TOKENS) == 7
    assert token_count({"prompt_tokens": -3}, PROMPT_TOKENS) == 0 and token_count(None, PROMPT_TOKENS) == 0
    assert token_count({"prompt_tokens": True}, PROMPT_TOKENS) == 0


def test_one_usage_type_adds_up_the_program_the_judge_and_the_reflection_model():
    from skynet_dspy._core.types import Observation, Usage

    receipt = skynet_dspy.CostReceipt.from_record(_record())
    total = receipt.total
    assert total == Usage(calls=2 + 3 + 1, prompt_tokens=10 + 30 + 100, completion_tokens=5 + 9 + 20, cost_usd=None,
                          seconds=0.1 + 12.0 / 1000)
    judge = receipt.judge
    assert judge + judge - judge == judge and (judge + judge).cache_hits == 2 * judge.cache_hits
    assert (Usage(cost_usd=0.5) + Usage(cost_usd=None)).cost_usd is None  # an unknown price stays unknown
    run = Observation(run_ms=250.0, cost_usd=0.01, model_calls=2, prompt_tokens=7, completion_tokens=3)
    assert run.usage == Usage(2, 7, 3, 0.01, 0.25)
    try:
        Usage() + judge
    except TypeError as exc:
        assert "JudgeUsage" in str(exc)
    else:
        raise AssertionError("a Usage and a JudgeUsage added without a word")
