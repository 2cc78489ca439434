"""The metric object DSPy calls: one adapter for Evaluate, BootstrapFewShot, MIPROv2 and GEPA.

What each optimizer gets: docs/contract.md#what-the-optimizer-sees.

A call goes: the memo (GEPA asks twice for the same example and prediction) → translate.py (the
Example and Prediction become plain values) → the Scorer (the metric's worker process, validation,
failure feedback) → back as a Score, which DSPy reads as a number and GEPA as a feedback Prediction.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple, Unpack

import dspy
from cachetools import LRUCache

from .._core import aio, secrets
from .._core.call import CallRequest
from .._core.logs import logger
from .._core.options import Isolation, JudgeCache, MetricOptions, MetricSource, ModelSpec, check_names, names
from .._core.scorer import Scorer
from .._core.types import Failure, JudgeUsage, MetricInfo, Outcome, ProgramUsage, Result
from .._core.values import exception_text, whole_number
from .._judge import Judge
from .._judge.spend import Spend, SpendCap
from . import hooks, translate
from . import measure as measurement
from .score import _NO_OUTPUT
from .score import Score as Score  # public as skynet_dspy.Score, made in score.py
from .score import _rebuilt as _rebuilt  # Scores pickled before it moved to score.py name it here

_NOT_MEASURED = (
    "the metric's code does not use reward(), observation() or service_cost(), so its runs are not measured "
    "(load_metric(..., measure=True) measures them)"
)


_RETRIED = (Failure.OVERLOADED, Failure.LOAD, Failure.JUDGE_UNREACHABLE)  # not memoized: worth a retry


class _MemoEntry(NamedTuple):
    """One scored (example, prediction), held (so their ids are not reused) with snapshots of their fields."""

    gold: Any
    pred: Any
    gold_fields: Any
    pred_fields: Any
    result: Result
    output: Any  # what the metric was given (_NO_OUTPUT when the prediction could not be read)

    def still_holds(self, gold: Any, pred: Any) -> bool:
        if self.gold is not gold or self.pred is not pred:
            return False
        try:
            return bool(self.gold_fields == _snapshot(gold) and self.pred_fields == _snapshot(pred))
        except Exception:  # fields that refuse comparison (e.g. arrays): score again
            return False


def _snapshot(record: Any) -> Any:
    """The fields of an Example/Prediction or mapping (what translate.py reads them from), else a shallow copy."""
    if isinstance(record, (dspy.Example, Mapping)):
        return translate.fields_of(record)
    return copy.copy(record)


class Metric:
    """A Skynet `score` function wrapped as a DSPy metric and a GEPA feedback metric.

    Built by `skynet_dspy.load_metric()`, whose options are these keywords (`MetricOptions`). DSPy calls it as
    `metric(gold, pred, trace=None, pred_name=None, pred_trace=None, program_trace=None)` and gets a Score; on
    plain values, `metric.score(input, output, expected)` gives a Result. `close()` (or
    `with load_metric(...) as metric:`) stops its worker processes.

    Args:
        source: A path to metric.py, an imported module defining `score`, or a `score` function.
        timeout: Seconds one call of `score` may take (at most 600); importing the metric file too.
        failure_score: What a failed call scores.
        output_fields: The prediction's output fields, e.g. ["answer", "confidence"]; one name gives its bare
            value. None: the prediction's only output field, or all of them as a dict.
        to_output: A function prediction -> output, instead of output_fields.
        metric_lm: The model llm() calls: a LiteLLM model string, a dict of LiteLLM settings or a dspy.LM.
        reflection_lm: The model llm() calls when no metric_lm is given (skynet_dspy.gepa() sets it).
        judge_cache: llm() answers kept: True in memory, a folder on disk, a redis:// URL, or False
            (docs/costs.md).
        judge_cache_size: The most bytes the disk cache keeps (None: 1 GiB).
        feedback_limit: Characters of feedback kept (longer is cut, with a note).
        memo_size: (example, prediction) results remembered, so GEPA's second call is free.
        isolation: Where `score` runs: "process" (worker processes), "thread" (this process), or "ray" /
            skynet_dspy.RayCluster(...) on a Ray cluster (docs/ray.md).
        workers: The most worker processes (per node with Ray); None: 32.
        worker_max_calls: Replace a worker after this many calls (None: never; docs/worker-pool.md).
        worker_max_memory: Bytes (at least 1 MiB): replace a worker once it holds more memory of its own; a
            call that passes it fails as `memory` (None: never).
        measure: Measure each run of the program (time, model calls, cost); None: when the metric's code uses
            reward(), observation() or service_cost() (docs/measurement.md).
        max_judge_cost_usd: A spending cap on llm() calls, in US dollars: once reached, they are refused and
            `stop_callback` stops GEPA (docs/costs.md).
        max_program_cost_usd: A spending cap on the program's measured model calls, in US dollars.
        sandbox: True: every worker runs inside bubblewrap, with no network and a read-only filesystem
            (docs/sandbox.md).
        sandbox_network: True: the sandbox keeps the host's network (needs sandbox=True).
        judge_max_concurrency: At most N llm() requests in flight at once, across every thread and worker (None:
            no limit; docs/judge.md).
        judge_rpm: At most R llm() requests started a minute, spread evenly (None: no limit).
        success_threshold: A call succeeds (its Score is truthy) at or above this score; None: above 0. What
            BootstrapFewShot and MIPROv2 take as a demo; the score itself is unchanged.

    Raises:
        MetricLoadError: The file does not load, or defines no usable `score`.
        ValueError: An option's value is out of range.
        TypeError: An option of the wrong kind.
    """

    def __init__(
        self,
        source: MetricSource,
        *,
        timeout: float = 60.0,
        failure_score: float = 0.0,
        output_fields: Sequence[str] | str | None = None,
        to_output: Callable[[Any], Any] | None = None,
        metric_lm: ModelSpec = None,
        reflection_lm: ModelSpec = None,
        judge_cache: JudgeCache = True,
        judge_cache_size: int | None = None,
        feedback_limit: int = 20_000,
        memo_size: int = 4096,
        isolation: Isolation = "process",
        workers: int | None = None,
        worker_max_calls: int | None = None,
        worker_max_memory: int | None = None,
        measure: bool | None = None,
        max_judge_cost_usd: float | None = None,
        max_program_cost_usd: float | None = None,
        sandbox: bool = False,
        sandbox_network: bool = False,
        judge_max_concurrency: int | None = None,
        judge_rpm: int | None = None,
        success_threshold: float | None = None,
    ):
        self.success_threshold = _threshold(success_threshold)
        self.output_fields = _output_fields(output_fields)
        if to_output is not None and not callable(to_output):
            raise TypeError("to_output must be a function taking the dspy.Prediction and returning the output")
        self.to_output = to_output
        whole_number("memo_size", memo_size, unit="entries")
        if measure not in (None, True, False):
            raise TypeError(f"measure must be True, False or None (measure when the metric uses it), got {measure!r}")
        if max_program_cost_usd is not None and measure is False:
            raise ValueError(
                "max_program_cost_usd= caps the program's measured model cost, and measure=False turns measurement "
                "off; leave measure= out (a program cap turns it on) or drop the cap"
            )
        self.program_cap = (SpendCap("max_program_cost_usd", max_program_cost_usd, "the program")
                            if max_program_cost_usd is not None else None)
        self.judge = Judge(metric_lm=metric_lm, reflection_lm=reflection_lm, cache=judge_cache,
                           cache_size=judge_cache_size, max_cost_usd=max_judge_cost_usd,
                           max_concurrency=judge_max_concurrency, rpm=judge_rpm)
        self.scorer = Scorer(
            source, timeout=timeout, failure_score=failure_score, feedback_limit=feedback_limit,
            isolation=isolation, workers=workers, llm=self.judge,
            worker_max_calls=worker_max_calls, worker_max_memory=worker_max_memory,
            sandbox=sandbox, sandbox_network=sandbox_network,
        )
        # a program cap measures the runs of this metric's optimizations (capping())
        self.measuring = self.program_cap is not None or (
            bool(measure) if measure is not None else self.scorer.info.uses_measurement)
        if self.measuring:
            measurement.install()
        self._memo: LRUCache[tuple[int, int], _MemoEntry] | None = LRUCache(memo_size) if memo_size else None
        self._memo_lock = threading.Lock()
        self._warned_uncapped = False
        self._warned_unmeasured = False
        self.reflection_from_gepa = False  # llm()'s reflection model was set by skynet_dspy.gepa(), not given here
        self.__name__ = self.scorer.info.name
        hooks.wrap_evaluate(_evaluate)

    # -- DSPy's side ------------------------------------------------------------------------

    def __call__(
        self,
        gold: Any,
        pred: Any,
        trace: Any = None,
        pred_name: str | None = None,
        pred_trace: Any = None,
        program_trace: Any = None,
    ) -> Score:
        """Score one (example, prediction) the way every DSPy optimizer expects.

        The same example and prediction are scored once: GEPA's second call (per predictor, for
        feedback) gets the first result back without calling `score` again.
        """
        key = (id(gold), id(pred))
        with self._memo_lock:
            entry = self._memo.get(key) if self._memo is not None else None
        if entry is not None and entry.still_holds(gold, pred):
            self.scorer.count("memo_hits")
        else:
            gold_fields, pred_fields = _snapshot(gold), _snapshot(pred)
            result, output = self._score_dspy(gold, pred, gold_fields, pred_fields)
            entry = _MemoEntry(gold, pred, gold_fields, pred_fields, result, output)
            if self._memo is not None and result.failure not in _RETRIED:
                with self._memo_lock:
                    self._memo[key] = entry
        return Score(entry.result.copy())._with(entry.output, self.success_threshold)

    def _score_dspy(self, gold: Any, pred: Any, gold_fields: Any, pred_fields: Any) -> tuple[Result, Any]:
        """(the Result, the output the metric was given: _NO_OUTPUT when the prediction could not be read); the
        fields are the memo's snapshots, read instead of the records' fields again."""

        def failed(failure: Failure, detail: str, feedback: str, exc: Exception | None = None) -> tuple[Result, Any]:
            outcome = Outcome(failure=failure, error_type=type(exc).__name__ if exc else None, detail=detail)
            return self.scorer.failed(outcome, feedback=feedback), _NO_OUTPUT

        try:
            input_values, expected = translate.split_example(gold, gold_fields)
        except Exception as exc:
            return failed(Failure.EXCEPTION, f"could not read the example: {exception_text(exc)}",
                          "Not scored: the example could not be read.", exc)
        try:
            output = translate.prediction_output(pred, self.output_fields, self.to_output, pred_fields)
        except translate.MissingOutputField as exc:
            return failed(Failure.MISSING_FIELD, str(exc), "Not scored: the program's output lacks the field(s) "
                          f"{', '.join(exc.missing)} (fields present: {', '.join(exc.present) or 'none'}).")
        except Exception as exc:
            where = "to_output raised" if self.to_output is not None else "the prediction could not be read:"
            return failed(Failure.EXCEPTION, f"{where} {exception_text(exc)}",
                          f"Not scored: the program's output could not be read ({type(exc).__name__}).", exc)
        observation, reason = self._observation(pred) if self.measuring else (None, _NOT_MEASURED)
        # kept as the metric was given it: a metric in this process (isolation="thread") may change its argument
        shown = output if self.isolation != "thread" else translate.detach(output)
        return self.scorer.score(CallRequest(input_values, output, expected, observation, reason)), shown

    def _observation(self, pred: Any) -> tuple[Any, str | None]:
        """The measured run that made `pred`, warning once when it is uncapped or was not measured."""
        observation, reason = measurement.observation_for(pred)
        cap = self.program_cap
        if observation is not None and cap is not None and not self._warned_uncapped \
                and not measurement.cap_in_scope(cap):
            self._warned_uncapped = True
            logger.warning(
                "skynet-dspy: %s scored a run of the program made outside its optimization, so "
                "max_program_cost_usd=%g neither counted nor refused its model calls (it governs skynet_dspy.gepa()'s "
                "compile and optimize_anything(); wrap a hand-built dspy.Evaluate or dspy.GEPA in "
                "`with metric.capping():`). Said once per metric.", self.name, cap.limit_usd)
        if observation is None and not self._warned_unmeasured:
            self._warned_unmeasured = True
            logger.warning("skynet-dspy: %s scored a run that was not measured (speed and cost count as 0): %s. "
                           "Said once per metric.", self.name, reason)
        return observation, reason

    # -- plain values -----------------------------------------------------------------------

    def score(
        self,
        input: dict[str, Any],
        output: Any,
        expected: dict[str, Any] | None = None,
        *,
        observation: Any = None,
        unmeasured_reason: str | None = None,
    ) -> Result:
        """Run the metric on plain values, under the timeout and the contract: always a Result."""
        request = CallRequest(
            translate.detach(input), translate.detach(output), translate.detach(expected), observation,
            unmeasured_reason or (None if observation is not None else "no run of a program was measured"),
        )
        return self.scorer.score(request)

    # -- awaited from an event loop -----------------------------------------------------------

    async def acall(
        self,
        gold: Any,
        pred: Any,
        trace: Any = None,
        pred_name: str | None = None,
        pred_trace: Any = None,
        program_trace: Any = None,
    ) -> Score:
        """`await metric.acall(example, prediction)`: the call DSPy makes, awaited without blocking the running event
        loop. The call runs on a thread of its own under the same timeout and rules, for sync and async metrics
        alike; cancelling the await drops the Score (the call ends on its own, within its timeout)."""
        return await aio.in_thread(lambda: self(gold, pred, trace, pred_name, pred_trace, program_trace))

    async def ascore(
        self,
        input: dict[str, Any],
        output: Any,
        expected: dict[str, Any] | None = None,
        *,
        observation: Any = None,
        unmeasured_reason: str | None = None,
    ) -> Result:
        """`await metric.ascore(input, output, expected)`: score() on plain values, awaited like acall()."""
        return await aio.in_thread(lambda: self.score(
            input, output, expected, observation=observation, unmeasured_reason=unmeasured_reason))

    # -- what the user reads ------------------------------------------------------------------

    @property
    def info(self) -> MetricInfo:
        """What loading found: the metric's name, signature, REWARD_SPEC, whether it reads measurements."""
        return self.scorer.info

    @property
    def name(self) -> str:
        return self.scorer.info.name

    @property
    def timeout(self) -> float:
        return self.scorer.timeout

    @property
    def failure_score(self) -> float:
        return self.scorer.failure_score

    @property
    def feedback_limit(self) -> int:
        return self.scorer.feedback_limit

    @property
    def isolation(self) -> str:
        return self.scorer.isolation

    @property
    def models(self) -> Judge:
        """Where llm() goes (the judge): metric_lm, reflection_lm, its cache and usage."""
        return self.judge

    @property
    def stats(self) -> dict[str, int]:
        """Counts: calls (score invocations), memo_hits, and each failure kind (exception, timeout, invalid, ...)."""
        return self.scorer.stats

    @property
    def judge_usage(self) -> JudgeUsage:
        """The llm() calls this metric made: calls, cache hits, tokens, USD cost and time."""
        return self.judge.usage

    @property
    def program_usage(self) -> ProgramUsage:
        """The program's measured runs this metric scored, added up: runs, model calls, tokens, USD, time."""
        return self.scorer.program_usage

    @property
    def spend(self) -> dict[str, Spend]:
        """The spending caps set (max_judge_cost_usd, max_program_cost_usd): dollars measured, limit, refusals."""
        return {cap.option: cap.snapshot() for cap in self._caps()}

    @property
    def spend_cap_reached(self) -> bool:
        """Whether a spending cap of this metric is reached (no more of those model calls are made)."""
        return any(cap.reached for cap in self._caps())

    def _caps(self) -> list[SpendCap]:
        return [cap for cap in (self.judge.spend_cap, self.program_cap) if cap is not None]

    @contextmanager
    def capping(self) -> Iterator[None]:
        """Within the block, the program's runs are checked and charged against max_program_cost_usd=.

        skynet_dspy.gepa()'s compile and optimize_anything() run inside it already; wrap a hand-built
        dspy.Evaluate or dspy.GEPA in it to cap their program runs (threads DSPy starts inherit it). Program
        calls outside every such block are never refused. Without a program cap the block changes nothing.
        """
        with measurement.program_caps(self.program_cap):
            yield

    def stop_callback(self, gepa_state: Any = None) -> bool:
        """A GEPA stop callback that stops the run once a spending cap is reached (skynet_dspy.gepa() and
        optimize_anything() add it; with dspy.GEPA, pass gepa_kwargs={"stop_callbacks": [metric.stop_callback]})."""
        return self.spend_cap_reached

    def close(self) -> None:
        """Stop the metric's worker processes (they also stop when the metric is garbage or at exit) and cancel its
        llm() requests in progress: none is sent or retried after this."""
        self.judge.close()
        self.scorer.close()

    def __enter__(self) -> Metric:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # dspy.Evaluate names its results column `metric.__class__.__name__` (a function's __name__): the metric's
    # name, so the column reads "metric" for metric.py, as for a native metric function. type(metric) stays Metric
    # (isinstance, pickling, copying and reprs read the real class), as unittest.mock's spec does.
    @property  # type: ignore[misc]
    def __class__(self) -> _ColumnName:  # type: ignore[override]
        return _ColumnName(self.name)

    def __repr__(self) -> str:
        return secrets.redact(
            f"<skynet_dspy.Metric {self.scorer.info.label} isolation={self.isolation} timeout={self.timeout:g}s>"
        )


@dataclass(frozen=True, slots=True)
class _ColumnName:
    """What dspy.Evaluate reads as a Metric's class: its `__name__`, the metric's name."""

    __name__: str


def _threshold(value: Any) -> float | None:
    """success_threshold=, checked: None, or a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise TypeError(
            f"success_threshold must be a finite number (a call counts as a success at or above it), got {value!r}; "
            "e.g. success_threshold=1.0 to bootstrap only from perfect calls"
        )
    return float(value)


def _output_fields(names: Sequence[str] | str | None) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"output_fields must name the prediction's output fields, e.g. ['answer'], got {names!r}")
    return names


OPTIONS = names(MetricOptions)


def stop_callbacks_with_caps(given: Any, metric: Metric) -> Any:
    """GEPA's stop_callbacks= for a run scored by `metric`: `given` (None, one callback or a list) and, when the
    metric has a spending cap, its stop_callback after them (GEPA stops once a cap is reached)."""
    if not metric.spend:
        return given
    stoppers = [] if given is None else list(given) if isinstance(given, Sequence) else [given]
    return [*stoppers, metric.stop_callback]


def reject_options_for_loaded(where: str, metric: Metric, options: Mapping[str, Any]) -> None:
    """The TypeError for options given with a Metric already loaded (they cannot change it)."""
    if options:
        raise TypeError(
            f"{where} got a Metric already loaded, and options ({', '.join(sorted(options))}) that cannot change it; "
            "set them on skynet_dspy.load_metric(...), or pass the metric file or function instead"
        )


def load_metric(source: MetricSource, **options: Unpack[MetricOptions]) -> Metric:
    """Load a Skynet metric and wrap it for DSPy and GEPA.

    Args:
        source: A path to metric.py, an imported module defining `score`, a `score` function, or a Metric
            already loaded (returned as it is; options beside it are a TypeError).
        **options: `MetricOptions`, each described, with its default, under `Metric` (timeout, failure_score,
            output_fields, metric_lm, isolation, workers, sandbox, ...). A misspelt option is a TypeError naming
            the closest one.

    Returns:
        The Metric: call it as DSPy does, or `metric.score(input, output, expected)` on plain values;
        `close()` it (or use it in a `with` block) to stop its worker processes.

    Raises:
        MetricLoadError: The file does not load, or defines no usable `score`.
        FileNotFoundError: No file at the path.
        TypeError: An unknown option, or options beside a Metric already loaded.
        ValueError: An option's value is out of range.
    """
    if isinstance(source, Metric):
        reject_options_for_loaded("load_metric()", source, options)
        return source
    check_names("load_metric()", options, MetricOptions)
    return Metric(source, **options)


def _evaluate(original: Callable[..., Any]) -> Callable[..., Any]:
    """dspy.Evaluate.__call__ calling a measured program, and summarizing a Metric's calls at the end of the run."""

    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            args = (measurement.measured_program(args[0]), *args[1:])
        elif kwargs.get("program") is not None:
            kwargs["program"] = measurement.measured_program(kwargs["program"])
        metric = kwargs.get("metric") or getattr(self, "metric", None)
        with metric.scorer.run() if isinstance(metric, Metric) else nullcontext():
            return original(self, *args, **kwargs)

    return evaluate
