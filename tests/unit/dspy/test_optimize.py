"""skynet_dspy.gepa(): dspy.GEPA around a Skynet metric, with one reflection model wired to both."""

from __future__ import annotations

import json

import dspy
import pytest

import skynet_dspy
from skynet_dspy.devserver import dspy_reply

JUDGE_INSTRUCTIONS = "Answer PASS or FAIL, then give one sentence of reasons."
BETTER = "Reply with the capital city's name only."
CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome"}


def scripted(request):
    """The reflection model proposes BETTER; the judge checks capitals; the program is right only under BETTER."""
    if "new_instruction" in request.text:  # dspy.GEPA's InstructionProposer asks through a JSONAdapter
        return json.dumps({"new_instruction": BETTER})
    if request.system == JUDGE_INSTRUCTIONS:
        for country, capital in CAPITALS.items():
            if country in request.user:
                return f"PASS: {capital}." if request.user.endswith(f"Answer: {capital}") else "FAIL: name the capital."
        return "FAIL: unknown country."
    for country, capital in CAPITALS.items():
        if f"capital of {country}" in request.user:
            return dspy_reply(answer=capital if BETTER in request.system else f"Somewhere in {country}, I think.")
    return dspy_reply(answer="I do not know.")


def examples():
    return [
        dspy.Example(question=f"What is the capital of {country}?", answer=capital).with_inputs("question")
        for country, capital in CAPITALS.items()
    ]


def test_gepa_compiles_a_program_with_the_reflection_model_judging(server, lm, metrics_dir):
    server.responder = scripted
    reflection = dspy.LM("openai/reflector", api_base=server.url, api_key="reflection-key-123", cache=False)
    optimizer = skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=reflection, max_metric_calls=12)

    assert isinstance(optimizer, dspy.GEPA)
    # a copy of the model with its own history (so a receipt counts reflection calls even when one lm runs both)
    assert optimizer.reflection_lm is not reflection and optimizer.reflection_lm.model == reflection.model
    assert optimizer.reflection_lm.kwargs == reflection.kwargs
    metric = optimizer.skynet_metric
    assert isinstance(metric, skynet_dspy.Metric) and optimizer.metric_fn is metric

    program = dspy.Predict("question -> answer")
    with dspy.context(lm=lm):
        before = [metric(example, program(**example.inputs())).score for example in examples()]
        optimized = optimizer.compile(program, trainset=examples(), valset=examples())
        after = [metric(example, optimized(**example.inputs())).score for example in examples()]

    assert before == [0.0, 0.0, 0.0]
    assert after == [1.0, 1.0, 1.0]
    assert optimized.predictors()[0].signature.instructions == BETTER

    judged = [request for request in server.requests if request.system == JUDGE_INSTRUCTIONS]
    proposals = [request for request in server.requests if "new_instruction" in request.text]
    assert judged and proposals
    assert {request.body["model"] for request in judged} == {"reflector"}  # llm() fell back to reflection_lm
    assert {request.body["model"] for request in proposals} == {"reflector"}
    assert metric.judge_usage.requests == len(judged)
    assert metric.stats["exception"] == 0


def test_metric_lm_takes_the_judge_calls_and_metric_options_apply(server, metrics_dir):
    optimizer = skynet_dspy.gepa(
        metrics_dir / "judge.py",
        reflection_lm={"model": "openai/reflector", "base_url": server.url, "api_key": "reflection-key-123"},
        metric_lm={"model": "openai/judge", "api_base": server.url, "api_key": "judge-key-4567"},
        metric_options={"timeout": 5},
        auto="light",
    )
    metric = optimizer.skynet_metric
    assert metric.timeout == 5
    assert metric.models.metric_lm.model == "openai/judge"
    assert metric.models.reflection_lm.model == "openai/reflector"
    assert optimizer.reflection_lm.model == "openai/reflector"
    assert optimizer.reflection_lm.kwargs["api_base"] == server.url
    assert optimizer.auto == "light"

    server.responder = scripted
    assert metric.score({"question": "capital of Spain?"}, "Madrid").score == 1.0
    assert [request.body["model"] for request in server.requests] == ["judge"]


def test_a_loaded_metric_gets_the_reflection_model_when_it_has_none(metrics_dir):
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py")
    optimizer = skynet_dspy.gepa(metric, reflection_lm="openai/gpt-4o", max_metric_calls=10)
    assert optimizer.skynet_metric is metric
    assert isinstance(optimizer.reflection_lm, dspy.LM) and optimizer.reflection_lm.model == "openai/gpt-4o"
    assert metric.models.reflection_lm.model == "openai/gpt-4o"
    # a later gepa() with another reflection model takes llm() with it
    again = skynet_dspy.gepa(metric, reflection_lm="openai/model-b", max_metric_calls=10)
    assert again.reflection_lm.model == metric.models.reflection_lm.model == "openai/model-b"


def test_a_loaded_metric_keeps_its_own_models(metrics_dir):
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py", reflection_lm="openai/mine", metric_lm="openai/judge")
    skynet_dspy.gepa(metric, reflection_lm="openai/gpt-4o", max_metric_calls=10)
    assert metric.models.reflection_lm.model == "openai/mine"
    assert metric.models.metric_lm.model == "openai/judge"
    with pytest.raises(ValueError, match="already has a metric model"):
        skynet_dspy.gepa(metric, reflection_lm="openai/gpt-4o", metric_lm="openai/other", max_metric_calls=10)
    # metric options cannot change a Metric already loaded, whether given in metric_options or beside GEPA's
    for given in ({"metric_options": {"timeout": 3}}, {"timeout": 3}):
        with pytest.raises(TypeError, match=r"got a Metric already loaded, and options \(timeout\) that cannot"):
            skynet_dspy.gepa(metric, reflection_lm="openai/gpt-4o", max_metric_calls=10, **given)
    assert metric.timeout == 60


def test_metric_options_and_gepa_options_mix_and_failure_score_goes_to_both(metrics_dir):
    optimizer = skynet_dspy.gepa(
        metrics_dir / "judge.py", reflection_lm="openai/gpt-4o",
        timeout=7, output_fields=["answer"], failure_score=-1.0, max_metric_calls=10, num_threads=2,
    )
    metric = optimizer.skynet_metric
    assert metric.timeout == 7 and metric.output_fields == ["answer"] and metric.failure_score == -1.0
    assert (optimizer.failure_score, optimizer.max_metric_calls, optimizer.num_threads) == (-1.0, 10, 2)

    loaded = skynet_dspy.load_metric(metrics_dir / "judge.py", failure_score=-1.0)
    assert skynet_dspy.gepa(loaded, reflection_lm="openai/gpt-4o", max_metric_calls=10).failure_score == -1.0
    with pytest.raises(ValueError, match="failure_score=0.5 differs from the loaded Metric's -1.0"):
        skynet_dspy.gepa(loaded, reflection_lm="openai/gpt-4o", failure_score=0.5, max_metric_calls=10)


def test_a_misspelt_option_names_the_closest_one(metrics_dir):
    with pytest.raises(TypeError, match=r"unknown option 'max_metric_call' \(did you mean 'max_metric_calls'\?\)"):
        skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm="openai/gpt-4o", max_metric_call=10)
    with pytest.raises(TypeError, match=r"unknown option 'timout' \(did you mean 'timeout'\?\)"):
        skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm="openai/gpt-4o", timout=5, max_metric_calls=10)


def test_gepa_needs_a_reflection_model(metrics_dir):
    with pytest.raises(ValueError, match="reflection_lm"):
        skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=None, max_metric_calls=10)
    with pytest.raises(TypeError, match="reflection_lm must be"):
        skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=3.5, max_metric_calls=10)


def test_gepa_without_a_budget_names_the_three_ways_to_give_one():
    score = lambda input, output: (1.0, {"feedback": "ok"})  # noqa: E731
    with pytest.raises(ValueError) as raised:
        skynet_dspy.gepa(score, "openai/gpt-4o-mini", isolation="thread")
    message = str(raised.value)
    assert "needs a budget" in message
    assert all(name in message for name in ("auto=", "max_metric_calls=", "max_full_evals="))
    with pytest.raises(ValueError, match=r"got 2 budgets \(auto=, max_metric_calls=\); give exactly one"):
        skynet_dspy.gepa(score, "openai/gpt-4o-mini", auto="light", max_metric_calls=5, isolation="thread")


def test_gepa_takes_success_threshold_as_a_metric_option():
    optimizer = skynet_dspy.gepa(lambda input, output: (0.5, {"feedback": "ok"}), "openai/gpt-4o-mini",
                                 max_metric_calls=10, isolation="thread", success_threshold=0.9)
    assert optimizer.skynet_metric.success_threshold == 0.9
