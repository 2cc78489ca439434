"""Type-checked, never run: a user's code on the public API, which `make test`'s mypy checks with --strict.

Each annotation below is what a user's type checker must infer from skynet_dspy's signatures: a public name
that lost its types (an Any leaking out, a missing annotation) makes mypy fail here.
"""

from __future__ import annotations

from typing import Any, assert_type

import skynet_dspy
from skynet_dspy.skynet import llm, observation, reward, service_cost


def score(input: dict[str, str], output: str, expected: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    verdict = llm("Answer PASS or FAIL, then one sentence.", input=f"{input['ticket']} -> {output}", temperature=0.0)
    assert_type(verdict, str)
    assert_type(service_cost(), float | None)
    assert_type(observation(), skynet_dspy.Observation)
    spec = {"weights": {"accuracy": 1, "speed": 0, "cost": 0}}
    total, side = reward(spec, float(verdict.startswith("PASS")), verdict)
    assert_type(total, float)
    return total, side


def use_the_api() -> None:
    metric = skynet_dspy.load_metric("examples/metric.py", output_fields="label")
    assert_type(metric, skynet_dspy.Metric)
    result = metric.score({"ticket": "I was charged twice"}, "billing", {"label": "billing"})
    assert_type(result, skynet_dspy.Result)
    assert_type(result.score, float)
    assert_type(result.feedback, str)
    assert_type(result.failure, skynet_dspy.Failure | None)
    assert_type(metric.judge_usage, skynet_dspy.JudgeUsage)
    assert_type(metric.judge_usage.requests, int)
    assert_type(metric.program_usage, skynet_dspy.ProgramUsage)
    assert_type(skynet_dspy.validate_return((1.0, {"feedback": "OK"})), skynet_dspy.Result)
    report = skynet_dspy.check_contract(metric, [{"input": {"ticket": "x"}, "output": "bug"}])
    assert_type(report, skynet_dspy.ContractReport)
    assert_type(report.ok, bool)
    assert_type(skynet_dspy.load_metric(score, isolation="thread"), skynet_dspy.Metric)
    assert_type(skynet_dspy.split_row({"q": "x", "a": "y"}, inputs=["q"], outputs=["a"]), dict[str, Any])
    assert_type(metric.info, skynet_dspy.MetricInfo)
    assert_type(metric.models, skynet_dspy.Judge)
    assert_type(metric.models.metric_lm, skynet_dspy.Endpoint | None)
    assert_type(skynet_dspy.configure_llm("openai/gpt-4o-mini", max_concurrency=2, rpm=60), skynet_dspy.Judge)
    options: skynet_dspy.MetricOptions = {"timeout": 5.0, "isolation": "thread", "output_fields": "label"}
    assert_type(skynet_dspy.load_metric("examples/metric.py", **options), skynet_dspy.Metric)
    with skynet_dspy.make_evaluator(lambda artifact, input: artifact, "examples/metric.py", timeout=5.0) as evaluator:
        assert_type(evaluator, skynet_dspy.Evaluator)
    try:
        skynet_dspy.load_metric("missing.py")
    except skynet_dspy.MetricLoadError as error:
        assert_type(error, skynet_dspy.MetricLoadError)
    metric.close()
