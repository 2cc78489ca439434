"""skynet_dspy.gepa(): dspy.GEPA built around a Skynet metric, one reflection model wired to both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dspy

from ._adapter import Metric, load_metric
from ._models import split_model


def gepa(
    metric: Any,
    reflection_lm: Any,
    metric_lm: Any = None,
    metric_options: Mapping[str, Any] | None = None,
    **gepa_kwargs: Any,
) -> dspy.GEPA:
    """Build `dspy.GEPA` whose metric is the Skynet metric and whose reflection model also answers llm().

    `metric` is a path to metric.py, a module, a `score` callable or a loaded Metric. `reflection_lm`
    (a LiteLLM model string, a settings dict or a dspy.LM) writes new instructions and, unless
    `metric_lm` is given, judges in llm(). `metric_options` go to load_metric(); `gepa_kwargs` to
    dspy.GEPA (e.g. auto="light" or max_metric_calls=...). The metric is on `.skynet_metric`.
    """
    if reflection_lm is None:
        raise ValueError(
            "skynet_dspy.gepa() needs reflection_lm=: the model that writes new instructions, e.g. "
            "'openai/gpt-4o' or dspy.LM('openai/gpt-4o', api_key=...)"
        )
    if "metric" in gepa_kwargs or "reflection_lm" in gepa_kwargs:
        raise TypeError("pass metric and reflection_lm once, as gepa()'s own arguments")
    reflection = as_dspy_lm(reflection_lm)
    if isinstance(metric, Metric):
        if metric_options:
            raise TypeError(
                "metric_options apply when gepa() loads the metric; this Metric is already loaded — "
                "pass the metric file or function instead, or set the options on load_metric()"
            )
        models = metric.models
        if metric_lm is not None:
            if models.metric_lm is not None:
                raise ValueError(
                    f"this Metric already has a metric model ({models.metric_lm.describe()}); "
                    "leave metric_lm out of gepa() or load the metric again without one"
                )
            models.metric_lm = metric_lm
        if models.reflection_lm is None:
            models.reflection_lm = reflection
        loaded = metric
    else:
        loaded = load_metric(metric, metric_lm=metric_lm, reflection_lm=reflection, **dict(metric_options or {}))
    optimizer = dspy.GEPA(metric=loaded, reflection_lm=reflection, **gepa_kwargs)
    optimizer.skynet_metric = loaded
    return optimizer


def as_dspy_lm(spec: Any) -> dspy.BaseLM:
    """A dspy.LM for a model given as a dspy.LM, a LiteLLM model string or a settings dict."""
    if isinstance(spec, dspy.BaseLM):
        return spec
    if isinstance(spec, (str, Mapping)):
        model, settings = split_model(spec, "reflection_lm")
        return dspy.LM(model, **settings)
    raise TypeError(
        "reflection_lm must be a dspy.LM, a LiteLLM model string ('openai/gpt-4o') or a dict "
        f"{{'model': ..., 'api_base': ..., 'api_key': ...}}; got {type(spec).__name__}"
    )
