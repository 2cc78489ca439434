"""Plain GEPA (`gepa.optimize_anything`) driven by the same metric.py: any text artifact, run(artifact, input).

The evaluator runs the user's `run(candidate, input)`, hands its return value to the metric as
`output`, and gives GEPA `(score, side_info)` where side_info holds only what the reflection model may see
(docs/contract.md#what-the-optimizer-sees): the example's input fields, what run() returned, the feedback text
and the named "scores" (GEPA's objective frontier), as DSPy GEPA's reflective dataset does; never expected values.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack, cast

from dspy.primitives.example import Example

from ._core import loading, secrets
from ._core.contract import DEFAULT_FEEDBACK_LIMIT, MIN_FEEDBACK_LIMIT, check_timeout, cut_feedback
from ._core.errors import MetricLoadError, SpendCapReached
from ._core.isolation.runner import RunWorkers
from ._core.isolation.sandbox import folders_of, sandbox_for
from ._core.logs import logger as logger
from ._core.options import ModelSpec, OptimizeAnythingOptions, ScoringOptions, check_names, names
from ._core.specs import MetricSource
from ._core.types import Failure, Outcome, Result
from ._core.values import exception_text, shorten, unknown_option
from ._dspy import hooks, measure, record, translate
from ._dspy.budget import check_budget
from ._dspy.metric import Metric, load_metric, reject_options_for_loaded, stop_callbacks_with_caps
from ._judge import endpoint, is_lm
from ._judge.litellm_private import no_banner

if TYPE_CHECKING:
    from gepa.core.result import GEPAResult

# load_metric() options optimize_anything() accepts among its keyword arguments (a program's output
# is run()'s return value here, so output_fields / to_output do not apply; the models are its own arguments).
METRIC_OPTIONS = names(ScoringOptions)
# Arguments optimize_anything() refuses, and why.
_REFUSED = {
    "capture_stdio": "it would show everything the metric and run print (expected values included) "
    "to the reflection model; write what it should see into the feedback instead",
    "seed_candidate": "pass the starting artifact as seed=",
    "evaluator": "optimize_anything builds the evaluator from run= and metric=; "
    "use make_evaluator() with gepa.optimize_anything to supply your own",
    "dataset": "pass the examples as trainset=",
    "config": "pass GEPA settings as keyword arguments (max_metric_calls=..., frontier_type=..., ...)",
}


# -- examples -----------------------------------------------------------------------------


def split_row(
    row: Mapping[str, Any], inputs: Sequence[str] | str, outputs: Sequence[str] | str | None = None
) -> dict[str, Any]:
    """Split a flat row into an example by column roles: {"input": {...}, "expected": {...} | None}.

    Args:
        row: The row, a dict of columns.
        inputs: The columns `run` gets (one name or a list).
        outputs: The label columns the metric gets as `expected` (None: `expected` is None).

    Returns:
        The example, {"input": {...}, "expected": {...} | None}, its values copied.

    Raises:
        ValueError: A column named but absent from the row, or named in both roles.
        TypeError: The row is not a dict.
    """
    if not isinstance(row, Mapping):
        raise TypeError(f"split_row() takes a row as a dict of columns, got {type(row).__name__}")
    input_names = _column_names(inputs, "inputs")
    output_names = _column_names(outputs, "outputs") if outputs is not None else []
    if not input_names:
        raise ValueError("split_row() needs at least one input column: inputs=['question', ...]")
    both = [name for name in input_names if name in output_names]
    if both:
        raise ValueError(f"column(s) {', '.join(map(repr, both))} are named in both inputs and outputs; pick one role")
    missing = [name for name in [*input_names, *output_names] if name not in row]
    if missing:
        present = ", ".join(map(repr, row)) or "none"
        raise ValueError(
            f"the row has no column {', '.join(map(repr, missing))} (columns present: {present}); "
            "fix inputs=/outputs= or the data"
        )
    expected = {name: translate.detach(row[name]) for name in output_names}
    return {"input": {name: translate.detach(row[name]) for name in input_names}, "expected": expected or None}


def _column_names(names: Sequence[str] | str, role: str) -> list[str]:
    if isinstance(names, str):
        return [names]
    if not isinstance(names, Sequence) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"{role}= takes a list of column names, got {shorten(names)}")
    return list(names)


def as_example(item: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(input, expected) of one example: a split dict {"input", "expected"} or a dspy.Example."""
    if isinstance(item, Example):
        return translate.split_example(item)
    if isinstance(item, Mapping):
        if "input" not in item:
            raise ValueError(
                f"an example dict needs an 'input' key (and optionally 'expected'); got keys "
                f"{', '.join(map(repr, item)) or 'none'}. Split flat rows with "
                "skynet_dspy.split_row(row, inputs=[...], outputs=[...])"
            )
        extra = [key for key in item if key not in ("input", "expected")]
        if extra:
            raise ValueError(
                f"an example dict holds only 'input' and 'expected'; it also has {', '.join(map(repr, extra))}. "
                "Put label fields inside 'expected'"
            )
        input_values, expected = item["input"], item.get("expected")
        if not isinstance(input_values, Mapping):
            raise TypeError(f"an example's 'input' must be a dict of input fields, got {shorten(input_values)}")
        if expected is not None and not isinstance(expected, Mapping):
            raise TypeError(f"an example's 'expected' must be a dict of label fields or None, got {shorten(expected)}")
        return dict(input_values), (dict(expected) if expected is not None else None)
    raise TypeError(
        f"an example is a dict {{'input': {{...}}, 'expected': {{...}}}} or a dspy.Example, got {type(item).__name__}"
    )


def _examples(items: Any, name: str) -> list[dict[str, Any]]:
    """Every example checked up front (so a bad row fails before the run), as plain split dicts."""
    if items is None or isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{name} must be a list of examples, got {type(items).__name__}")
    examples = []
    for number, item in enumerate(items):
        try:
            input_values, expected = as_example(item)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}[{number}]: {exc}") from None
        examples.append({"input": input_values, "expected": expected})
    if not examples:
        raise ValueError(f"{name} is empty; give at least one example")
    return examples


class ExampleLoader:
    """A GEPA data loader over checked examples, with the ids `example_loaders` gives them."""

    def __init__(self, ids: list[int], items: list[dict[str, Any]]):
        self._ids = ids
        self._by_id = dict(zip(ids, items, strict=True))

    def all_ids(self) -> list[int]:
        return list(self._ids)

    def fetch(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        return [self._by_id[data_id] for data_id in ids]

    def __len__(self) -> int:
        return len(self._ids)


def example_loaders(train: list[dict[str, Any]], val: list[dict[str, Any]]) -> tuple[ExampleLoader, ExampleLoader]:
    """(train, val) loaders whose ids never name two different examples.

    GEPA's evaluation cache is keyed by (candidate, example id), and gepa 0.1.4 numbers a separate valset
    from 0 like the trainset, so a valset score could be read from an unrelated training example's
    evaluation (gepa-ai/gepa#424). Here the valset keeps its positions as ids, a training example equal to
    a valset one shares its id (one evaluation serves both), and the others are numbered after the valset.
    """
    first_in_val: dict[str, int] = {}
    for position, item in enumerate(val):
        key = _content_key(item)
        if key is not None:
            first_in_val.setdefault(key, position)
    shared: set[int] = set()
    train_ids = []
    for position, item in enumerate(train):
        key = _content_key(item)
        same = first_in_val.get(key) if key is not None else None
        if same is not None and same not in shared:
            shared.add(same)
            train_ids.append(same)
        else:
            train_ids.append(len(val) + position)
    return ExampleLoader(train_ids, train), ExampleLoader(list(range(len(val))), val)


def _content_key(item: dict[str, Any]) -> str | None:
    """The example's content as text, or None when it is not plain data (such an example shares no id)."""
    try:
        return json.dumps(item, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return None


# -- run ----------------------------------------------------------------------------------


def load_run(source: Any) -> Callable[[Any, Any], Any]:
    """`run` itself, or the function `run` defined in a run.py at the given path."""
    if isinstance(source, (str, Path)):
        source = _load_run_file(Path(source))
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


def _load_run_file(path: Path) -> Callable[..., Any]:
    """`run` from run.py, loaded as metric files are (a fresh module; modules beside it importable)."""
    if not path.is_file():
        raise FileNotFoundError(f"run file not found: {path}")
    try:
        module = loading.load_file(path)
    except MetricLoadError as exc:
        raise ImportError(str(exc)) from None
    run = getattr(module, "run", None)
    if not callable(run):
        raise ImportError(f"{path} defines no function named `run`; add `def run(artifact, input):`")
    return cast(Callable[..., Any], run)


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
        self, run: Callable[[Any, Any], Any], metric: Metric, workers: RunWorkers | None = None, *,
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
        input_values, expected = self._example(example)
        result, output = self._evaluate(candidate, input_values, expected)
        return _side_info(result, input_values, output, self.metric.feedback_limit)

    def evaluate(self, candidate: str | dict[str, str], example: Any = None) -> Result:
        """The full Result (extra side-information keys included) of `candidate` on `example`."""
        input_values, expected = self._example(example)
        return self._evaluate(candidate, input_values, expected)[0]

    @staticmethod
    def _example(example: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if example is None:
            raise ValueError(
                "the evaluator needs an example {'input': ..., 'expected': ...}; give GEPA a dataset "
                "(single-task search without examples has no input for run())"
            )
        return as_example(example)

    def _evaluate(
        self, candidate: Any, input_values: dict[str, Any], expected: dict[str, Any] | None
    ) -> tuple[Result, Any]:
        """(the Result, what run() returned; _NO_OUTPUT when run() returned nothing to show)."""
        artifact = dict(candidate) if isinstance(candidate, dict) else candidate
        cap = self.metric.program_cap
        try:
            if cap is not None:
                cap.check()  # the program's spending cap is reached: run() is not even started
            if self.workers is not None:  # in a worker: what run() does cannot stall or end this process
                ran = self.workers(artifact, translate.detach(input_values))
                if ran.failure is not None:
                    outcome = Outcome(failure=ran.failure, error_type=ran.error_type, detail=ran.detail)
                    return self.metric.scorer.failed(outcome, feedback=ran.feedback), _NO_OUTPUT
                output, observation = ran.output, None
            elif self.metric.measuring:
                with self.metric.capping():  # the cap governs this run() call's model calls, no others
                    output, observation = measure.measure(self.run, artifact, translate.detach(input_values))
            else:
                output, observation = self.run(artifact, translate.detach(input_values)), None
        except SpendCapReached as exc:  # a model call run() made was refused: no more is spent
            return self.metric.scorer.failed(Outcome(failure=Failure.SPEND_CAP, detail=str(exc))), _NO_OUTPUT
        except Exception as exc:
            return self._run_failed(exc), _NO_OUTPUT
        unmeasured = "run() ran in a worker process (run_isolation='process'), where it is not measured" if (
            self.workers is not None) else None
        result = self.metric.score(
            input_values, output, expected, observation=observation, unmeasured_reason=unmeasured
        )
        return result, output

    def _run_failed(self, exc: Exception) -> Result:
        # run() is the program, not the metric: its error (never holding expected values, which run() is not
        # given) helps the reflection model fix the artifact, so the feedback keeps it.
        text = f"run(artifact, input) raised {exception_text(exc)}"
        return self.metric.scorer.failed(
            Outcome(failure=Failure.RUN_EXCEPTION, error_type=type(exc).__name__, detail=text), feedback=text
        )

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


_NO_OUTPUT: Any = object()  # run() raised or was not run: no "Generated Outputs" to show
# The side-info keys of the input fields and of run()'s return value: DSPy GEPA's reflective dataset's words.
INPUTS_KEY = "Inputs"
OUTPUT_KEY = "Generated Outputs"


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
    result: Result, input_values: Mapping[str, Any] | None = None, output: Any = _NO_OUTPUT,
    limit: int = DEFAULT_FEEDBACK_LIMIT,
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
    if run_isolation == "thread":
        return Evaluator(run_fn, loaded, owns_metric=owns)
    try:
        return Evaluator(run_fn, loaded, _run_workers(run, run_fn, loaded, run_timeout, run_isolation == "sandbox"),
                         owns_metric=owns)
    except BaseException:
        if loaded is not metric:  # loaded here: its workers are not left behind
            loaded.close()
        raise


def _run_workers(
    run: Any, run_fn: Callable[[Any, Any], Any], metric: Metric, timeout: float | None, sandboxed: bool
) -> RunWorkers:
    """Worker processes for run(), sandboxed when asked or when the metric's workers are (the run file's folder
    readable)."""
    timeout = check_timeout(timeout) if timeout is not None else metric.timeout
    path = str(run) if isinstance(run, (str, Path)) else None
    sandbox = metric.scorer.sandbox or (sandbox_for(path or run_fn, True, False) if sandboxed else None)
    if sandbox is not None:
        sandbox = dataclasses.replace(sandbox, read_only=folders_of(path or run_fn))
        sandbox.check()
    return RunWorkers(run_fn, timeout, path=path, launcher=sandbox)


# -- models -------------------------------------------------------------------------------


class _LiteLLMReflectionLM(record.CountingLM):
    """gepa.lm.LM (LiteLLM with retries, cost tracking) whose repr, and its kwargs' repr, keep the API key out."""

    def __init__(self, model: str, **kwargs: Any):
        super().__init__(model, **kwargs)
        self.completion_kwargs: dict[str, Any] = secrets.RedactedDict(self.completion_kwargs)

    # LiteLLM prints its "Provider List" banner when it cannot price a model (most local servers): not on our calls
    def __call__(self, prompt: Any) -> str:
        import litellm

        with no_banner(litellm):
            return super().__call__(prompt)

    def batch_complete(self, messages_list: list[list[dict[str, Any]]], max_workers: int = 10, **kwargs: Any) -> Any:
        import litellm

        with no_banner(litellm):
            return super().batch_complete(messages_list, max_workers=max_workers, **kwargs)

    def __repr__(self) -> str:
        return secrets.redact(f"<reflection model {self.model!r}>")


class _DspyReflectionLM:
    """A dspy.LM as GEPA's reflection model: prompt (str or chat messages) -> text."""

    def __init__(self, lm: Any, **overrides: Any):
        self.lm = lm
        self.overrides = secrets.RedactedDict(overrides)

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        outputs = self.lm(messages=messages, **self.overrides)
        first = outputs[0] if outputs else ""
        if isinstance(first, dict):
            first = first.get("text") or ""
        return str(first or "")

    def __repr__(self) -> str:
        return secrets.redact(f"<reflection model {getattr(self.lm, 'model', self.lm)!r}>")


def reflection_callable(model: Any, **overrides: Any) -> Callable[[Any], str]:
    """GEPA's reflection model, callable(prompt) -> str, from a LiteLLM model string, a dict or a dspy.LM.

    A string or dict goes through gepa.lm.LM (LiteLLM, with retries); a dict's keys are LiteLLM
    settings (model, api_base, api_key, temperature, ...). `overrides` are further settings.
    """
    if isinstance(model, (str, Mapping)):
        found = endpoint(model, "reflection model")
        assert found is not None
        settings = {**found.litellm_kwargs(), **overrides}
        return _LiteLLMReflectionLM(settings.pop("model"), **settings)
    if is_lm(model) and callable(model):
        endpoint(model, "reflection model")  # registers its key for redaction
        return _DspyReflectionLM(model, **overrides)
    if callable(model):
        return cast(Callable[[Any], str], model)
    raise TypeError(
        "reflection_lm must be a LiteLLM model string ('openai/gpt-4o-mini'), a dict of LiteLLM settings "
        f"({{'model': ..., 'api_base': ..., 'api_key': ...}}), a dspy.LM or a callable(prompt) -> str; "
        f"got {shorten(model)}"
    )


# -- the one-call entry point -------------------------------------------------------------


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

    groups = _split_config(dict(config))
    metric_options = groups.pop("metric")
    if max_metric_calls is None and not any(
        groups["engine"].get(name) is not None for name in ("max_candidate_proposals", "max_reflection_cost")
    ) and groups["top"].get("stop_callbacks") is None:
        raise ValueError("give GEPA a budget: max_metric_calls=... (or max_candidate_proposals=, stop_callbacks=)")

    train = _examples(trainset, "trainset")
    val = _examples(valset, "valset") if valset is not None else None
    if max_metric_calls is not None:
        check_budget("skynet_dspy.optimize_anything()", max_metric_calls, len(val or train),
                     groups["reflection"].get("reflection_minibatch_size") or 3)
    evaluator = make_evaluator(run, metric, metric_lm=metric_lm, reflection_lm=reflection_lm,
                               run_isolation=run_isolation, run_timeout=run_timeout, **metric_options)

    reflection = groups["reflection"]
    lm_overrides = reflection.pop("reflection_lm_kwargs", None) or {}
    reflection["reflection_lm"] = reflection_callable(reflection_lm, **lm_overrides)
    engine = {"seed": rng_seed, "cache_evaluation": True, **groups["engine"]}
    if max_metric_calls is not None:
        engine["max_metric_calls"] = max_metric_calls
    top = groups["top"]
    if evaluator.metric.spend:  # a spending cap: GEPA stops once it is reached, keeping the best candidate so far
        top["stop_callbacks"] = stop_callbacks_with_caps(top.get("stop_callbacks"), evaluator.metric)
    # ids that never name two different examples, for GEPA's evaluation cache (see example_loaders)
    dataset, validation = (train, None) if val is None else example_loaders(train, val)
    if top.get("merge") is True:
        top["merge"] = oa.MergeConfig()
    elif top.get("merge") is False:
        top["merge"] = None
    gepa_config = oa.GEPAConfig(
        engine=oa.EngineConfig(**engine),
        reflection=oa.ReflectionConfig(**reflection),
        tracking=oa.TrackingConfig(**groups["tracking"]),
        **top,
    )
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


def _split_config(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Sort optimize_anything()'s keyword arguments into load_metric options and GEPA's config groups."""
    from gepa import optimize_anything as oa

    fields = {
        "engine": {f.name for f in dataclasses.fields(oa.EngineConfig)} - {"seed", "max_metric_calls"},
        "reflection": {f.name for f in dataclasses.fields(oa.ReflectionConfig)} - {"reflection_lm"},
        "tracking": {f.name for f in dataclasses.fields(oa.TrackingConfig)},
        "top": {"merge", "refiner", "callbacks", "stop_callbacks"},
        "metric": set(METRIC_OPTIONS),
    }
    groups: dict[str, dict[str, Any]] = {name: {} for name in fields}
    unknown = []
    for name, value in config.items():
        if name in _REFUSED:
            raise TypeError(f"optimize_anything() does not take {name}=: {_REFUSED[name]}")
        group = next((group for group, names in fields.items() if name in names), None)
        if group is None:
            unknown.append(name)
        else:
            groups[group][name] = value
    if unknown:
        known = set().union(*fields.values()) - set(_REFUSED) | {"max_metric_calls", "objective", "background"}
        raise unknown_option("optimize_anything()", unknown[0], known)
    return groups
