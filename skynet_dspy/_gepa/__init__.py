"""Plain GEPA (`gepa.optimize_anything`) driven by the same metric.py: any text artifact, run(artifact, input),
scored through evaluator.py (what the reflection model sees: docs/contract.md#what-the-optimizer-sees)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

from .._core.options import MetricSource, ModelSpec, OptimizeAnythingOptions, ScoringOptions, names
from .._core.values import shorten, unknown_option
from .._dspy import record
from .._dspy.budget import check_budget
from .._dspy.metric import Metric, stop_callbacks_with_caps
from .evaluator import Evaluator, load_run, make_evaluator
from .examples import ExampleLoader, checked_examples, example_loaders, split_row
from .reflection import reflection_callable

if TYPE_CHECKING:
    from gepa.core.result import GEPAResult

__all__ = ["Evaluator", "ExampleLoader", "example_loaders", "load_run", "make_evaluator", "optimize_anything",
           "reflection_callable", "split_row"]

_REFUSED = {
    "capture_stdio": "it would show everything the metric and run print (expected values included) "
    "to the reflection model; write what it should see into the feedback instead",
    "seed_candidate": "pass the starting artifact as seed=",
    "evaluator": "optimize_anything builds the evaluator from run= and metric=; "
    "use make_evaluator() with gepa.optimize_anything to supply your own",
    "dataset": "pass the examples as trainset=",
    "config": "pass GEPA settings as keyword arguments (max_metric_calls=..., frontier_type=..., ...)",
}


def optimize_anything(
    seed: str | dict[str, str],
    run: Callable[[Any, Any], Any] | str | Path,
    metric: MetricSource,
    trainset: Sequence[Any],
    valset: Sequence[Any] | None = None,
    *,
    reflection_lm: ModelSpec | Callable[[Any], str],
    metric_lm: ModelSpec = None,
    objective: str | None = None,
    background: str | None = None,
    max_metric_calls: int | None = None,
    rng_seed: int = 0,
    run_isolation: Literal["thread", "process", "sandbox"] = "thread",
    run_timeout: float | None = None,
    **config: Unpack[OptimizeAnythingOptions],
) -> GEPAResult:
    """Optimize a text artifact with plain GEPA, scored by the same metric.py that serves DSPy.

    The reflection model sees each example's input fields, what run() returned, the feedback text and the named
    scores (higher is better), each bounded by feedback_limit; never the expected values. Every worker process
    the call started (run()'s, and the metric's when it loaded the metric) is stopped when it returns; a Metric
    passed in stays open, its owner's to close.

    Args:
        seed: The starting artifact, a str (run gets a str) or a dict of named texts (run gets the dict).
        run: run(artifact, input) -> output, or a path to run.py defining it; its return value is the metric's
            `output`.
        metric: A path to metric.py, a module, a score function, or a Metric.
        trainset: Examples, each {"input": {...}, "expected": {...} | None} (see split_row) or a dspy.Example.
        valset: Examples to validate on; without it, GEPA validates on trainset.
        reflection_lm: The model that proposes new versions: a LiteLLM model string, a dict of LiteLLM settings,
            a dspy.LM, or a callable(prompt) -> str. llm() in the metric uses metric_lm, else this model (unless
            it is a bare callable).
        metric_lm: The model llm() in the metric calls.
        objective: The goal in plain language, shown to the reflection model.
        background: Constraints and context, shown to the reflection model.
        max_metric_calls: GEPA's budget of (candidate, example) evaluations, checked before the run. GEPA's
            evaluation cache is on (cache_evaluation=True), so a repeated (candidate, example) costs nothing.
        rng_seed: GEPA's random seed.
        run_isolation: "thread" calls run in this process; "process" in worker processes, each call in a new one
            under run_timeout seconds, so a candidate that loops, exits, crashes or forks scores the failure
            score; "sandbox" runs those workers inside bubblewrap: for model-written code (docs/sandbox.md).
        run_timeout: Seconds each run() call may take in a worker (default: the metric's timeout).
        **config: `OptimizeAnythingOptions`: the metric's `ScoringOptions` (timeout, failure_score,
            feedback_limit, judge_cache, max_judge_cost_usd, max_program_cost_usd: GEPA stops once a spending
            cap is reached, ...) and plain GEPA's settings (frontier_type, parallel, max_workers,
            reflection_minibatch_size, logger, run_dir, merge=True or a MergeConfig, refiner, callbacks,
            stop_callbacks, ...).

    Returns:
        GEPA's GEPAResult: `.best_candidate` (a str for a str seed), `.val_aggregate_scores`, ...

    Raises:
        ValueError: No seed, no reflection model, no budget, or a bad example.
        TypeError: An unknown or refused option, or a seed that is not text.
    """
    from gepa import optimize_anything as oa

    _check_seed(seed, reflection_lm)
    groups = _split_config(dict(config))
    metric_options = groups.pop("metric")
    _check_budget_given(max_metric_calls, groups)

    train = checked_examples(trainset, "trainset")
    val = checked_examples(valset, "valset") if valset is not None else None
    if max_metric_calls is not None:
        check_budget("skynet_dspy.optimize_anything()", max_metric_calls, len(val or train),
                     groups["reflection"].get("reflection_minibatch_size") or 3)
    evaluator = make_evaluator(run, metric, metric_lm=metric_lm, reflection_lm=reflection_lm,
                               run_isolation=run_isolation, run_timeout=run_timeout, **metric_options)

    reflection = groups["reflection"]
    lm_overrides = reflection.pop("reflection_lm_kwargs", None) or {}
    reflection["reflection_lm"] = reflection_callable(reflection_lm, **lm_overrides)
    gepa_config = _gepa_config(groups, evaluator.metric, rng_seed, max_metric_calls)
    # ids that never name two different examples, for GEPA's evaluation cache (see example_loaders)
    dataset, validation = (train, None) if val is None else example_loaders(train, val)
    try:
        with record.Recorder(evaluator.metric, reflection["reflection_lm"]) as recorder:  # for skynet_dspy.report()
            result = oa.optimize_anything(
                seed_candidate=dict(seed) if isinstance(seed, dict) else seed,
                evaluator=evaluator,
                dataset=dataset,
                valset=validation,
                objective=objective,
                background=background,
                config=gepa_config,
            )
    finally:
        evaluator.close()  # run()'s worker processes (run_isolation="process"); a Metric given stays the caller's
    return record.attach(result, recorder.record)


def _check_seed(seed: Any, reflection_lm: Any) -> None:
    """A seed that is text (a str, or a dict of named texts), and a reflection model: a clear error otherwise."""
    if seed is None:
        raise ValueError(
            "seed is required: GEPA's seedless mode shows dataset examples, expected values included, "
            "to the reflection model. Give a first version of the artifact, even a rough one"
        )
    if not isinstance(seed, (str, dict)) or (
        isinstance(seed, dict) and not all(isinstance(k, str) and isinstance(v, str) for k, v in seed.items())
    ):
        raise TypeError(f"seed must be a str or a dict of str names to str texts, got {shorten(seed)}")
    if reflection_lm is None:
        raise ValueError("reflection_lm is required: the model that proposes new versions of the artifact")


def _check_budget_given(max_metric_calls: int | None, groups: dict[str, dict[str, Any]]) -> None:
    """GEPA is given some budget that ends the run: a clear error before anything starts otherwise."""
    if max_metric_calls is None and not any(
        groups["engine"].get(name) is not None for name in ("max_candidate_proposals", "max_reflection_cost")
    ) and groups["top"].get("stop_callbacks") is None:
        raise ValueError("give GEPA a budget: max_metric_calls=... (or max_candidate_proposals=, stop_callbacks=)")


def _gepa_config(
    groups: dict[str, dict[str, Any]], metric: Metric, rng_seed: int, max_metric_calls: int | None
) -> Any:
    """GEPA's GEPAConfig from the sorted keyword arguments (the reflection model already in groups["reflection"])."""
    from gepa import optimize_anything as oa

    engine = {"seed": rng_seed, "cache_evaluation": True, **groups["engine"]}
    if max_metric_calls is not None:
        engine["max_metric_calls"] = max_metric_calls
    top = groups["top"]  # with a spending cap, GEPA stops once it is reached, keeping the best candidate so far
    top["stop_callbacks"] = stop_callbacks_with_caps(top.get("stop_callbacks"), metric)
    if isinstance(top.get("merge"), bool):
        top["merge"] = oa.MergeConfig() if top["merge"] else None
    # GEPAConfig builds its EngineConfig, ReflectionConfig and TrackingConfig from dicts
    return oa.GEPAConfig(engine=engine, reflection=groups["reflection"], tracking=groups["tracking"], **top)


def _split_config(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Sort optimize_anything()'s keyword arguments into load_metric options and GEPA's config groups
    (OptimizeAnythingOptions declares every one of GEPA's fields: tests/unit/test_typing.py)."""
    from gepa import optimize_anything as oa

    refused = [name for name in config if name in _REFUSED]
    if refused:
        raise TypeError(f"optimize_anything() does not take {refused[0]}=: {_REFUSED[refused[0]]}")
    unknown = [name for name in config if name not in names(OptimizeAnythingOptions)]
    if unknown:
        known = names(OptimizeAnythingOptions) | {"max_metric_calls", "objective", "background"}
        raise unknown_option("optimize_anything()", unknown[0], known)
    fields = {
        group: {field.name for field in dataclasses.fields(config_class)}
        for group, config_class in (("engine", oa.EngineConfig), ("reflection", oa.ReflectionConfig),
                                    ("tracking", oa.TrackingConfig))
    }
    fields |= {"top": {"merge", "refiner", "callbacks", "stop_callbacks"}, "metric": set(names(ScoringOptions))}
    return {group: {name: config[name] for name in config if name in members} for group, members in fields.items()}
