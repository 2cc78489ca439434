"""The options of the public API and the types of what users hand it, typed once: a misspelt or mistyped option is
a type checker's error. Their defaults are `Metric`'s parameters; a test holds the two, and the table in
docs/dspy.md, to the same names and types.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict

from .values import unknown_option

if TYPE_CHECKING:  # imported on first use (skynet_dspy.RayCluster): `import skynet_dspy` stays light
    from .isolation.ray_cluster import RayCluster

__all__ = [  # the public option types (skynet_dspy exports them)
    "DspyGEPAOptions", "GEPAConfigOptions", "GEPAOptions", "JudgeOptions", "MetricOptions", "ModelOptions",
    "OptimizeAnythingOptions", "OutputOptions", "ScoringOptions",
]

MetricSource: TypeAlias = str | os.PathLike[str] | ModuleType | Callable[..., Any]
"""A metric: a path to metric.py, an imported module defining `score`, a `score` function, or a loaded Metric."""

ModelSpec: TypeAlias = Any
"""A model: a LiteLLM model string ("openai/gpt-4o-mini"), a dict of LiteLLM settings ({"model", "api_base",
"api_key", ...}) or a dspy.LM."""

Isolation: TypeAlias = 'Literal["process", "thread", "ray"] | RayCluster'
"""Where `score` runs: "process" (worker processes), "thread" (this process), "ray" or a RayCluster."""

JudgeCache: TypeAlias = bool | str | os.PathLike[str]
"""The judge cache: True (in memory), a folder (on disk), a redis:// URL, or False."""


class ScoringOptions(TypedDict, total=False):
    """How a metric is called and bounded: the options every entry point takes (each described, with its
    default, under `Metric`)."""

    timeout: float
    failure_score: float
    success_threshold: float | None
    judge_cache: JudgeCache
    judge_cache_size: int | None
    judge_max_concurrency: int | None
    judge_rpm: int | None
    feedback_limit: int
    memo_size: int
    isolation: Isolation
    workers: int | None
    worker_max_calls: int | None
    worker_max_memory: int | None
    sandbox: bool
    sandbox_network: bool
    measure: bool | None
    max_judge_cost_usd: float | None
    max_program_cost_usd: float | None


class OutputOptions(TypedDict, total=False):
    """How a DSPy prediction becomes the metric's `output` (described under `Metric`)."""

    output_fields: Sequence[str] | str | None
    to_output: Callable[[Any], Any] | None


class ModelOptions(TypedDict, total=False):
    """The models llm() calls (described under `Metric`)."""

    metric_lm: ModelSpec
    reflection_lm: ModelSpec


class JudgeOptions(TypedDict, total=False):
    """`configure_llm()`'s options beside the models and the cache: how its llm() requests are sent (each
    described, with its default, under `Judge`)."""

    cache_size: int | None
    timeout: float
    max_retries: int
    retry_base_delay: float
    max_cost_usd: float | None
    max_concurrency: int | None
    rpm: int | None


class MetricOptions(ScoringOptions, OutputOptions, ModelOptions, total=False):
    """Every option of `load_metric()`: `ScoringOptions`, the output fields and the models (defaults: `Metric`)."""


class DspyGEPAOptions(TypedDict, total=False):
    """dspy.GEPA's own options, passed to it unchanged (defaults as dspy.GEPA has them, but track_stats=True);
    dspy.GEPA's documentation describes each."""

    auto: Literal["light", "medium", "heavy"] | None
    max_full_evals: int | None
    max_metric_calls: int | None
    reflection_minibatch_size: int
    candidate_selection_strategy: Literal["pareto", "current_best"]
    skip_perfect_score: bool
    add_format_failure_as_feedback: bool
    instruction_proposer: Any
    code_proposer: Any
    component_selector: Any
    use_merge: bool
    max_merge_invocations: int | None
    num_threads: int | None
    failure_score: float
    perfect_score: float
    log_dir: str | None
    track_stats: bool
    use_wandb: bool
    wandb_api_key: str | None
    wandb_init_kwargs: dict[str, Any] | None
    track_best_outputs: bool
    warn_on_score_mismatch: bool
    use_mlflow: bool
    seed: int | None
    gepa_kwargs: dict[str, Any] | None


class GEPAOptions(ScoringOptions, OutputOptions, DspyGEPAOptions, total=False):
    """`skynet_dspy.gepa()`'s options: the metric's (but the models, gepa()'s own arguments) and dspy.GEPA's."""


class GEPAConfigOptions(TypedDict, total=False):
    """Plain GEPA's settings (gepa.optimize_anything's EngineConfig, ReflectionConfig, TrackingConfig and
    GEPAConfig fields), passed on unchanged; GEPA's documentation describes each."""

    # EngineConfig
    run_dir: str | None
    display_progress_bar: bool
    raise_on_exception: bool
    use_cloudpickle: bool
    track_best_outputs: bool
    max_candidate_proposals: int | None
    max_reflection_cost: float | None
    val_evaluation_policy: Any
    candidate_selection_strategy: Any
    frontier_type: Literal["instance", "objective", "hybrid", "cartesian"]
    acceptance_criterion: Any
    parallel: bool
    max_workers: int | None
    cache_evaluation: bool
    cache_evaluation_storage: Literal["memory", "disk", "auto"]
    best_example_evals_k: int
    sampling_strategy: Any
    selection_strategy: Any
    # ReflectionConfig
    skip_perfect_score: bool
    perfect_score: float | None
    reflection_strategy: Any
    batch_sampler: Any
    reflection_minibatch_size: int | None
    module_selector: Any
    reflection_lm_kwargs: dict[str, Any] | None
    reflection_prompt_template: str | dict[str, str] | None
    custom_candidate_proposer: Any
    # TrackingConfig
    logger: Any
    use_wandb: bool
    wandb_api_key: str | None
    wandb_init_kwargs: dict[str, Any] | None
    wandb_attach_existing: bool
    wandb_step_metric: str | None
    use_mlflow: bool
    mlflow_tracking_uri: str | None
    mlflow_experiment_name: str | None
    mlflow_attach_existing: bool
    key_prefix: str
    # GEPAConfig
    merge: Any
    refiner: Any
    callbacks: Any
    stop_callbacks: Any


class OptimizeAnythingOptions(ScoringOptions, GEPAConfigOptions, total=False):
    """`optimize_anything()`'s keyword options: the metric's `ScoringOptions` and plain GEPA's settings."""


def names(options: type[Mapping[str, Any]]) -> frozenset[str]:
    """The option names a TypedDict declares (its own and its bases')."""
    return frozenset(options.__optional_keys__ | options.__required_keys__)  # type: ignore[attr-defined]


def check_names(where: str, given: Mapping[str, Any], options: type[Mapping[str, Any]]) -> None:
    """A TypeError naming the closest option for the first name in `given` that `options` does not declare."""
    known = names(options)
    for name in given:
        if name not in known:
            raise unknown_option(where, name, known)

