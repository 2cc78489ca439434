"""Plain GEPA's evaluator: run(artifact, input) loaded and run, its output scored by the metric, and GEPA's
(score, side_info) holding only what the reflection model may see (docs/contract.md#what-the-optimizer-sees)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Unpack, cast

from .._core import loading, secrets
from .._core.call import CallRequest
from .._core.contract import MIN_FEEDBACK_LIMIT, check_timeout, cut_feedback
from .._core.errors import MetricLoadError, SpendCapReached
from .._core.isolation.process import ProcessExecutor
from .._core.options import MetricSource, ModelSpec, ScoringOptions, check_names
from .._core.types import Failure, Outcome, Result
from .._core.values import exception_text, shorten
from .._dspy import hooks, measure, translate
from .._dspy.metric import Metric, load_metric, reject_options_for_loaded
from .._dspy.score import _NO_OUTPUT
from .._judge import is_lm
from . import run_workers
from .examples import as_example


def load_run(source: Any) -> Callable[[Any, Any], Any]:
    """`run` itself, or the function `run` defined in a run.py at the given path (loaded as metric files are)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"run file not found: {path}")
        try:
            source = getattr(loading.load_file(path), "run", None)
        except MetricLoadError as exc:
            raise ImportError(str(exc)) from None
        if not callable(source):
            raise ImportError(f"{path} defines no function named `run`; add `def run(artifact, input):`")
    if not callable(source):
        raise TypeError(f"run must be a function run(artifact, input) or a path to run.py, got {shorten(source)}")
    try:
        inspect.signature(source).bind(None, None)
    except TypeError:
        shown = getattr(source, "__qualname__", type(source).__name__)
        raise TypeError(
            f"{shown}{inspect.signature(source)} cannot be called as run(artifact, input); "
            "define `def run(artifact, input):`"
        ) from None
    except ValueError:  # a builtin without a readable signature: take it on trust
        pass
    return cast(Callable[[Any, Any], Any], source)


# -- the evaluator ------------------------------------------------------------------------


class Evaluator:
    """GEPA's evaluator around run(artifact, input) and a Skynet metric: (score, {feedback, scores}).

    Built by `make_evaluator()`. Every call runs and scores: repeats are GEPA's to skip, with its own evaluation
    cache (optimize_anything() turns on cache_evaluation), so a repeated (candidate, example) costs neither a run
    nor budget. `close()` (or a `with` block) stops every worker process it started.

    Attributes:
        run: run(artifact, input), the program.
        metric: The Metric scoring it (read `.stats` and `.judge_usage` on it after a run).
    """

    def __init__(
        self, run: Callable[[Any, Any], Any], metric: Metric, workers: ProcessExecutor | None = None, *,
        owns_metric: bool = False,
    ):
        self.run = run
        self.metric = metric
        self.workers = workers  # run_isolation="process": run() goes to these worker processes
        self._owns_metric = owns_metric  # loaded by make_evaluator(): its workers are this evaluator's to stop

    def close(self) -> None:
        """Stop run()'s worker processes (run_isolation="process") and the metric's, when make_evaluator() loaded
        it (a Metric passed in stays its owner's to close)."""
        if self.workers is not None:
            self.workers.close()
        if self._owns_metric:
            self.metric.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, candidate: str | dict[str, str], example: Any = None) -> tuple[float, dict[str, Any]]:
        """Score `candidate` on `example`; side_info holds the input fields ("Inputs"), what run() returned
        ("Generated Outputs"), "feedback" and (when given) "scores", each bounded by the feedback limit."""
        input_values, expected = _split(example)
        result, output = self._evaluate(candidate, input_values, expected)
        return _side_info(result, input_values, output, self.metric.feedback_limit)

    def evaluate(self, candidate: str | dict[str, str], example: Any = None) -> Result:
        """The full Result (extra side-information keys included) of `candidate` on `example`."""
        return self._evaluate(candidate, *_split(example))[0]

    def _evaluate(
        self, candidate: Any, input_values: dict[str, Any], expected: dict[str, Any] | None
    ) -> tuple[Result, Any]:
        """(the Result, what run() returned; _NO_OUTPUT when run() returned nothing to show)."""
        artifact = dict(candidate) if isinstance(candidate, dict) else candidate
        cap, scorer = self.metric.program_cap, self.metric.scorer
        observation, unmeasured = None, None
        try:
            if cap is not None:
                cap.check()  # the program's spending cap is reached: run() is not even started
            if self.workers is not None:  # in a worker: what run() does cannot stall or end this process
                request = CallRequest(input=translate.detach(input_values), output=artifact, expected=None)
                ran = run_workers.ran(self.workers.run(request, None), self.workers.timeout)
                if ran.failed is not None:
                    return scorer.failed(ran.failed, feedback=ran.feedback), _NO_OUTPUT
                output = ran.output
                unmeasured = "run() ran in a worker process (run_isolation='process'), where it is not measured"
            elif self.metric.measuring:
                with self.metric.capping():  # the cap governs this run() call's model calls, no others
                    output, observation = measure.measure(self.run, artifact, translate.detach(input_values))
            else:
                output = self.run(artifact, translate.detach(input_values))
        except SpendCapReached as exc:  # a model call run() made was refused: no more is spent
            return scorer.failed(Outcome(failure=Failure.SPEND_CAP, detail=str(exc))), _NO_OUTPUT
        except Exception as exc:
            # run() is the program, not the metric: its error (never holding expected values, which run() is not
            # given) helps the reflection model fix the artifact, so the feedback keeps it
            text = f"run(artifact, input) raised {exception_text(exc)}"
            outcome = Outcome(failure=Failure.RUN_EXCEPTION, error_type=type(exc).__name__, detail=text)
            return scorer.failed(outcome, feedback=text), _NO_OUTPUT
        result = self.metric.score(input_values, output, expected, observation=observation,
                                   unmeasured_reason=unmeasured)
        return result, output

    @property
    def stats(self) -> dict[str, int]:
        """The metric's counts (calls, failures by kind: run_exception, spend_cap, ...)."""
        return self.metric.stats

    def __repr__(self) -> str:
        name = getattr(self.run, "__qualname__", type(self.run).__name__)
        return f"<skynet_dspy evaluator run={name} metric={self.metric.info.label}>"


# Failures that say nothing of the candidate (the metric was not run, or a spending cap refused the calls):
# GEPA's evaluation cache must not keep them, and this side_info key is how its adapter is told so.
_NOT_KEPT = frozenset({Failure.OVERLOADED, Failure.SPEND_CAP, Failure.LOAD, Failure.JUDGE_UNREACHABLE})


# The side-info keys of the input fields and of run()'s return value: DSPy GEPA's reflective dataset's words.
INPUTS_KEY = "Inputs"
OUTPUT_KEY = "Generated Outputs"


def _split(example: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    if example is None:
        raise ValueError(
            "the evaluator needs an example {'input': ..., 'expected': ...}; give GEPA a dataset "
            "(single-task search without examples has no input for run())"
        )
    return as_example(example)


def _bounded(value: Any, limit: int) -> Any:
    """`value` as the reflection model may read it: plain scalars as they are, anything else as text, redacted
    and at most `limit` characters (cut with a note, like feedback)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(translate.detach(value), ensure_ascii=False, default=str)
        except Exception:  # a value JSON cannot write (a cycle, an object whose str raises): its bounded repr
            text = shorten(value, limit)
    return cut_feedback(secrets.redact(text), limit)


def _side_info(
    result: Result, input_values: Mapping[str, Any], output: Any, limit: int
) -> tuple[float, dict[str, Any]]:
    side_info: dict[str, Any] = {}
    if input_values:  # each field gets its share of the limit, so many fields cannot add up past it
        share = max(MIN_FEEDBACK_LIMIT, limit // len(input_values))
        side_info[INPUTS_KEY] = {str(name): _bounded(value, share) for name, value in input_values.items()}
    if output is not _NO_OUTPUT:
        side_info[OUTPUT_KEY] = _bounded(output, limit)
    side_info["feedback"] = result.feedback
    if result.scores:
        side_info["scores"] = dict(result.scores)
    if result.failure in _NOT_KEPT:
        side_info = hooks.keep_out_of_gepas_cache(side_info)
    return result.score, side_info


def make_evaluator(
    run: Callable[[Any, Any], Any] | str | Path,
    metric: MetricSource,
    *,
    metric_lm: ModelSpec = None,
    reflection_lm: ModelSpec = None,
    run_isolation: Literal["thread", "process", "sandbox"] = "thread",
    run_timeout: float | None = None,
    **metric_options: Unpack[ScoringOptions],
) -> Evaluator:
    """Build a `gepa.optimize_anything` evaluator from `run(artifact, input)` and a Skynet metric.

    Close it (`evaluator.close()`, or `with make_evaluator(...) as evaluator:`) to stop the worker processes it
    started: run()'s, and the metric's when it loaded the metric.

    Args:
        run: A function run(artifact, input) -> output, or a path to run.py defining `run`.
        metric: What load_metric() takes (a path to metric.py, a module, a score function), or a Metric already
            loaded (then used as is, with its own models and options, and left open on close()).
        metric_lm: The model llm() in the metric calls.
        reflection_lm: The model llm() calls when no metric_lm is given (a bare callable is GEPA's alone).
        run_isolation: "thread" calls run in this process; "process" calls it in worker processes, each call in a
            new one, so a candidate that loops, exits, crashes or forks scores the failure score and the run goes
            on; "sandbox" does so inside bubblewrap (docs/sandbox.md), for model-written code. With sandbox=True
            run()'s workers are sandboxed as well.
        run_timeout: Seconds each run() call may take in a worker (needs run_isolation="process" or "sandbox";
            default: the metric's timeout).
        **metric_options: `ScoringOptions` for load_metric (timeout, failure_score, feedback_limit, sandbox, ...).

    Returns:
        The Evaluator: callable as GEPA's evaluator, (score, side_info).

    Raises:
        ValueError: A bad run_isolation, or run_timeout without worker processes.
        TypeError: An unknown option, or options beside a Metric already loaded.
    """
    check_names("make_evaluator()", metric_options, ScoringOptions)
    if run_isolation not in ("thread", "process", "sandbox"):
        raise ValueError(
            f"run_isolation must be 'thread' (the default), 'process' or 'sandbox', got {run_isolation!r}"
        )
    if run_timeout is not None and run_isolation == "thread":
        raise ValueError(
            "run_timeout= bounds run() in a worker process; it needs run_isolation='process' or 'sandbox'"
        )
    run_fn = load_run(run)
    if isinstance(metric, Metric):
        given = {**metric_options, **({"metric_lm": metric_lm} if metric_lm is not None else {})}
        reject_options_for_loaded("make_evaluator()", metric, given)
        loaded = metric
    else:
        # llm() can call a string, a dict or a dspy.LM; a bare callable reflection model is GEPA's alone
        judge_fallback = reflection_lm if isinstance(reflection_lm, (str, Mapping)) or is_lm(reflection_lm) else None
        loaded = load_metric(metric, metric_lm=metric_lm, reflection_lm=judge_fallback, **metric_options)
    owns = loaded is not metric
    try:
        workers = None if run_isolation == "thread" else run_workers.start(
            run_fn, check_timeout(run_timeout) if run_timeout is not None else loaded.timeout,
            path=str(run) if isinstance(run, (str, Path)) else None, sandbox=loaded.scorer.sandbox,
            sandboxed=run_isolation == "sandbox")
    except BaseException:
        if owns:  # loaded here: its workers are not left behind
            loaded.close()
        raise
    return Evaluator(run_fn, loaded, workers, owns_metric=owns)

