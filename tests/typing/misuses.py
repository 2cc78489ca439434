"""Type-checked, never run: misused options that mypy must reject (tests/unit/test_typing.py runs it).

Each line ending in `# E: <code>` must be an error of that code on that line, and no other line an error.
"""

from __future__ import annotations

import skynet_dspy


def misspelt_and_mistyped_options() -> None:
    skynet_dspy.load_metric("metric.py", timout=5)  # E: call-arg
    skynet_dspy.load_metric("metric.py", timeout="5")  # E: arg-type
    skynet_dspy.load_metric("metric.py", isolation="proces")  # E: arg-type
    skynet_dspy.load_metric("metric.py", workers=2.5)  # E: arg-type
    skynet_dspy.gepa("metric.py", "openai/gpt-4o-mini", max_metric_call=40)  # E: call-arg
    skynet_dspy.gepa("metric.py", "openai/gpt-4o-mini", auto="quick")  # E: arg-type
    skynet_dspy.make_evaluator(lambda artifact, input: artifact, "metric.py", sandbox="yes")  # E: arg-type
    skynet_dspy.make_evaluator(lambda artifact, input: artifact, "metric.py", output_fields="a")  # E: call-arg
    skynet_dspy.optimize_anything(  # E: call-arg
        "seed", lambda artifact, input: artifact, "metric.py", [], reflection_lm="openai/gpt-4o-mini",
        max_metric_calls=10, frontier="hybrid",
    )
    skynet_dspy.check_contract("metric.py", [], feedback_limt=100)  # E: call-arg
    skynet_dspy.configure_llm("openai/gpt-4o-mini", max_concurency=2)  # E: call-arg
    skynet_dspy.configure_llm("openai/gpt-4o-mini", rpm="60")  # E: arg-type
