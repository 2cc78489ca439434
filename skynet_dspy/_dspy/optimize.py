"""skynet_dspy.gepa(): dspy.GEPA built around a Skynet metric, one reflection model wired to both.

The reflection model writes new instructions for GEPA and, unless a metric model is given, answers the
metric's llm() calls too, as the Skynet page promises. Metric options and GEPA's own options are taken
side by side; `failure_score` goes to both, so a failed metric call scores the same for each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import dspy

from .._core import secrets
from .._core.options import DspyGEPAOptions, GEPAOptions, MetricOptions, MetricSource, ModelSpec, names
from .._core.values import unknown_option
from .._judge import endpoint
from .budget import check_budget
from .metric import OPTIONS, Metric, load_metric, reject_options_for_loaded, stop_callbacks_with_caps
from .record import Recorder, RunRecord, attach, program_models

_GEPA_OPTIONS = names(DspyGEPAOptions)


class SkynetGEPA(dspy.GEPA):
    """dspy.GEPA as skynet_dspy.gepa() builds it: compile() first checks that the budget buys the valset evaluation
    and a few proposals, then runs dspy.GEPA unchanged under the metric's program cap, recording what it used
    (on `.skynet_run` and the program it returns, for skynet_dspy.report())."""

    skynet_metric: Metric
    skynet_run: RunRecord | None = None
    skynet_program: Any = None

    def compile(self, student: Any, *, trainset: Any, teacher: Any = None, valset: Any = None) -> Any:
        calls = None
        if self.max_metric_calls is not None and self.auto is None:
            calls = self.max_metric_calls
        elif self.max_full_evals is not None and trainset:
            calls = self.max_full_evals * (len(trainset) + (len(valset) if valset is not None else 0))
        if calls is not None and trainset:
            check_budget("skynet_dspy.gepa()", calls, len(valset or trainset), self.reflection_minibatch_size or 3)
        recorder = Recorder(self.skynet_metric, self.reflection_lm, program_models(student))
        self.skynet_program = None
        try:
            with recorder, self.skynet_metric.capping():
                program = super().compile(student, trainset=trainset, teacher=teacher, valset=valset)
        finally:
            self.skynet_run = recorder.record
        self.skynet_program = program
        return attach(program, recorder.record)


def gepa(
    metric: MetricSource,
    reflection_lm: ModelSpec,
    metric_lm: ModelSpec = None,
    metric_options: MetricOptions | None = None,
    **options: Unpack[GEPAOptions],
) -> dspy.GEPA:
    """Build `dspy.GEPA` whose metric is the Skynet metric and whose reflection model also answers llm().

    compile() warns before the run when the budget cannot buy the valset evaluation and a few proposals; with
    max_judge_cost_usd= / max_program_cost_usd=, GEPA stops once a cap is reached.

    Args:
        metric: A path to metric.py, an imported module, a `score` function, or a Metric already loaded (then
            its own options stand: metric options beside it are a TypeError).
        reflection_lm: The model that writes new instructions (a dspy.LM, a LiteLLM model string or a dict of
            LiteLLM settings); it also answers the metric's llm() calls unless `metric_lm` is given.
        metric_lm: The model llm() calls instead.
        metric_options: `load_metric()` options as a dict (the same as giving them as keywords).
        **options: `GEPAOptions`: load_metric()'s options and dspy.GEPA's (exactly one budget: auto,
            max_metric_calls or max_full_evals), side by side; failure_score goes to both. A misspelt name is a
            TypeError naming the closest option of either kind.

    Returns:
        A dspy.GEPA; the Metric it built is on `.skynet_metric`, each compile's record on `.skynet_run`.

    Raises:
        ValueError: No reflection model, or not exactly one budget.
        TypeError: An unknown option.
    """
    if reflection_lm is None:
        raise ValueError(
            "skynet_dspy.gepa() needs reflection_lm=: the model that writes new instructions, e.g. "
            "'openai/gpt-4o' or dspy.LM('openai/gpt-4o', api_key=...)"
        )
    metric_settings, gepa_settings = _sorted_options(metric_options, options)
    _check_budget_given(gepa_settings)
    reflection = as_dspy_lm(reflection_lm)
    if isinstance(metric, Metric):
        loaded = _with_loaded(metric, metric_settings, gepa_settings, metric_lm, reflection)
    else:
        loaded = load_metric(metric, metric_lm=metric_lm, reflection_lm=reflection, **metric_settings)
        gepa_settings.setdefault("failure_score", loaded.failure_score)
    gepa_settings.setdefault("track_stats", True)  # skynet_dspy.report() reads the candidates' scores
    if loaded.spend:  # a spending cap: GEPA stops once it is reached, keeping the best candidate so far
        extra = dict(gepa_settings.get("gepa_kwargs") or {})
        extra["stop_callbacks"] = stop_callbacks_with_caps(extra.get("stop_callbacks"), loaded)
        gepa_settings["gepa_kwargs"] = extra
    optimizer = SkynetGEPA(metric=loaded, reflection_lm=_own_history(reflection), **gepa_settings)
    optimizer.skynet_metric = loaded
    return optimizer


def _sorted_options(
    metric_options: MetricOptions | None, options: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(load_metric()'s settings, dspy.GEPA's settings) from gepa()'s keywords; failure_score goes to both."""
    for name in options:
        if name not in OPTIONS and name not in _GEPA_OPTIONS:
            raise unknown_option("skynet_dspy.gepa()", name, (*OPTIONS, *_GEPA_OPTIONS))
    metric_settings = {**(metric_options or {}), **{k: v for k, v in options.items() if k in OPTIONS}}
    return metric_settings, {name: value for name, value in options.items() if name in _GEPA_OPTIONS}


def _with_loaded(
    metric: Metric, metric_settings: Mapping[str, Any], gepa_settings: dict[str, Any], metric_lm: ModelSpec,
    reflection: dspy.BaseLM,
) -> Metric:
    """A Metric already loaded, as gepa() uses it: its own options stand (others beside it are refused), GEPA
    gets its failure_score, and its llm() gets metric_lm and the reflection model where it has none of its own."""
    reject_options_for_loaded("skynet_dspy.gepa()", metric, {k: v for k, v in metric_settings.items()
                                                            if k != "failure_score"})
    if "failure_score" in gepa_settings and gepa_settings["failure_score"] != metric.failure_score:
        raise ValueError(
            f"failure_score={gepa_settings['failure_score']!r} differs from the loaded Metric's "
            f"{metric.failure_score!r}; leave it out, or load the metric with that failure_score"
        )
    gepa_settings["failure_score"] = metric.failure_score
    judge = metric.judge
    if metric_lm is not None:
        if judge.metric_lm is not None:
            raise ValueError(
                f"this Metric already has a metric model ({judge.metric_lm.describe()}); leave metric_lm out "
                "of gepa() or load the metric again without one"
            )
        judge.metric_lm = metric_lm
    # llm() follows the reflection model of the latest gepa(), unless the metric was loaded with its own
    if judge.reflection_lm is None or metric.reflection_from_gepa:
        judge.reflection_lm = reflection
        metric.reflection_from_gepa = True
    return metric


_BUDGETS = ("auto", "max_metric_calls", "max_full_evals")


def _check_budget_given(settings: Mapping[str, Any]) -> None:
    """dspy.GEPA takes exactly one budget, and says so with a bare AssertionError: say it in words first."""
    given = [name for name in _BUDGETS if settings.get(name) is not None]
    if len(given) == 1:
        return
    if not given:
        raise ValueError(
            "skynet_dspy.gepa() needs a budget: give exactly one of auto='light' (or 'medium', 'heavy'), "
            "max_metric_calls=N (metric calls in all) or max_full_evals=N (full evaluations of the data)"
        )
    raise ValueError(
        f"skynet_dspy.gepa() got {len(given)} budgets ({', '.join(f'{name}=' for name in given)}); give exactly one "
        "of auto, max_metric_calls and max_full_evals"
    )


def _own_history(lm: dspy.BaseLM) -> dspy.BaseLM:
    """The reflection model GEPA is given: a copy of `lm` (dspy.BaseLM.copy: same settings and client, its own
    history), so the receipt counts the reflection calls even when the same dspy.LM also runs the program
    (the common single-`lm` setup), where its history would mix both."""
    try:
        copied = lm.copy()
    except Exception:  # a custom LM that cannot be copied: its shared history is told apart as before
        return lm
    if isinstance(getattr(lm, "kwargs", None), secrets.RedactedDict):  # copy() makes a plain dict of it
        copied.kwargs = secrets.RedactedDict(copied.kwargs)
    return copied


def as_dspy_lm(spec: Any) -> dspy.BaseLM:
    """A dspy.LM for a model given as a dspy.LM, a LiteLLM model string or a settings dict."""
    if isinstance(spec, dspy.BaseLM):
        return spec
    if isinstance(spec, (str, Mapping)):
        found = endpoint(spec, "reflection model")
        assert found is not None
        lm = dspy.LM(**found.litellm_kwargs())
        lm.kwargs = secrets.RedactedDict(lm.kwargs)  # the model we built: its kwargs' repr shows no key
        return lm
    raise TypeError(
        "reflection_lm must be a dspy.LM, a LiteLLM model string ('openai/gpt-4o') or a dict "
        f"{{'model': ..., 'api_base': ..., 'api_key': ...}}; got {type(spec).__name__}"
    )
