"""The metric object DSPy calls: one adapter for Evaluate, BootstrapFewShot, MIPROv2 and GEPA (SPEC §4)."""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import dspy

from . import _context, _measure, _runner, _secrets, _translate
from ._contract import (
    DEFAULT_FEEDBACK_LIMIT,
    DEFAULT_TIMEOUT,
    EXCEPTION,
    INVALID,
    MISSING_FIELD,
    OVERLOADED,
    TIMEOUT,
    ContractViolation,
    Result,
    as_number,
    check_feedback_limit,
    check_timeout,
    cut_feedback,
    validate_return,
)
from ._loading import LoadedMetric
from ._models import Models

logger = logging.getLogger("skynet_dspy")

DEFAULT_MEMO_SIZE = 4096


class Score(dspy.Prediction):
    """What the adapter returns to DSPy: score, feedback and (when given) objective_scores.

    It acts as a number where DSPy wants one (float(), sum(), comparisons, and truthiness:
    a zero score is falsy, so BootstrapFewShot never takes it as a success). The full
    Result, extra side-information keys included, is on `.result`, off the fields DSPy reads.
    """

    def __init__(self, result: Result):
        fields: dict[str, Any] = {"score": result.score, "feedback": result.feedback}
        if result.scores:
            fields["objective_scores"] = dict(result.scores)
        super().__init__(**fields)
        self._result = result

    @property
    def result(self) -> Result:
        return self._result

    def __bool__(self) -> bool:
        return bool(self._store["score"])

    def __repr__(self) -> str:
        return f"Score({self._store['score']!r}, feedback={self._store['feedback']!r})"

    __str__ = __repr__


class Metric:
    """A Skynet `score` function wrapped as a DSPy metric and a GEPA feedback metric.

    Built by `skynet_dspy.load_metric()`. Call it as DSPy does, `metric(gold, pred, trace=None,
    pred_name=None, pred_trace=None)`, or on plain values with `metric.score(input, output, expected)`.
    """

    def __init__(
        self,
        loaded: LoadedMetric,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        failure_score: float = 0.0,
        output_fields: Sequence[str] | None = None,
        to_output: Callable[[Any], Any] | None = None,
        metric_lm: Any = None,
        reflection_lm: Any = None,
        feedback_limit: int = DEFAULT_FEEDBACK_LIMIT,
        memo_size: int = DEFAULT_MEMO_SIZE,
        judge_cache: Any = True,
        models: Models | None = None,
        measure: bool = True,
    ):
        self.loaded = loaded
        self.timeout = check_timeout(timeout)
        failure = as_number(failure_score)
        if failure is None or failure != failure or failure in (float("inf"), float("-inf")):
            raise ValueError(f"failure_score must be a finite number, got {failure_score!r}")
        self.failure_score = failure
        if isinstance(output_fields, str):
            output_fields = [output_fields]
        self.output_fields = list(output_fields) if output_fields is not None else None
        if to_output is not None and not callable(to_output):
            raise TypeError("to_output must be a function taking the dspy.Prediction and returning the output")
        self.to_output = to_output
        self.feedback_limit = check_feedback_limit(feedback_limit)
        self.models = models if models is not None else Models(
            metric_lm=metric_lm, reflection_lm=reflection_lm, cache=judge_cache
        )
        self.__name__ = f"skynet:{loaded.name}"
        self._memo_size = memo_size
        self._memo: OrderedDict[tuple[int, int], tuple[Any, Any, Score]] = OrderedDict()
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._runner = _runner.TimeoutRunner()
        if loaded.reward_spec is not None:
            from ._reward import validate_spec

            validate_spec(loaded.reward_spec)
        _secrets.refresh()
        if measure:
            _measure.install()

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

        The same example and prediction are scored once: GEPA's second call (per predictor,
        for feedback) gets the first result back without calling `score` again.
        """
        key = (id(gold), id(pred))
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None and hit[0] is gold and hit[1] is pred:
                self._memo.move_to_end(key)
                self._counts["memo_hits"] += 1
                return hit[2]
        result = self._score_dspy(gold, pred)
        returned = Score(result)
        with self._lock:
            self._memo[key] = (gold, pred, returned)  # the references keep both ids from being reused
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return returned

    def _score_dspy(self, gold: Any, pred: Any) -> Result:
        try:
            input_values = _translate.example_input(gold)
            expected = _translate.example_expected(gold)
            output = _translate.prediction_output(pred, self.output_fields, self.to_output)
        except _translate.MissingOutputField as exc:
            return self._failed(MISSING_FIELD, f"The program's output is incomplete: {exc}.")
        except Exception as exc:
            return self._failed(EXCEPTION, f"Could not translate the example for the metric: {_describe(exc)}")
        observation, reason = _measure.observation_for(pred)
        return self.run(input_values, output, expected, observation, reason)

    # -- plain values -----------------------------------------------------------------------

    def score(self, input: dict[str, Any], output: Any, expected: dict[str, Any] | None = None) -> Result:
        """Run the metric on plain values, under the timeout and the contract: always a Result."""
        return self.run(_translate.detach(input), _translate.detach(output), _translate.detach(expected))

    def run(
        self,
        input_values: dict[str, Any],
        output: Any,
        expected: dict[str, Any] | None,
        observation: _measure.Observation | None = None,
        unmeasured_reason: str | None = None,
    ) -> Result:
        """Call `score` with the call's context set, enforce the timeout, validate the return."""
        call = _context.MetricCall(self.models, observation, unmeasured_reason or "the run was not measured")
        fn = self.loaded.score
        args = (input_values, output, expected) if self.loaded.takes_expected else (input_values, output)
        outcome, value = self._runner.run(lambda: _context.run_in(call, fn, *args), self.timeout)
        self._count("calls")
        if outcome == _runner.DONE:
            try:
                result = validate_return(value, feedback_limit=self.feedback_limit)
            except ContractViolation as exc:
                return self._failed(INVALID, f"The metric's return value broke the contract: {exc}.")
            if result.feedback != _secrets.redact(result.feedback):
                result = Result(result.score, _secrets.redact(result.feedback), result.scores, result.extra)
            return result
        if outcome == _runner.RAISED:
            return self._failed(EXCEPTION, f"The metric raised {_describe(value)}")
        if outcome == _runner.TIMED_OUT:
            return self._failed(TIMEOUT, f"The metric timed out after {self.timeout:g} s and was abandoned.")
        return self._failed(
            OVERLOADED,
            f"The metric was not run: {value} earlier calls are still stuck past their timeout "
            f"of {self.timeout:g} s.",
        )

    def _failed(self, kind: str, feedback: str) -> Result:
        self._count(kind)
        text = cut_feedback(_secrets.redact(feedback), self.feedback_limit)
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("skynet-dspy metric %s: %s (scored %g; the run goes on)", kind, text, self.failure_score)
        return Result(self.failure_score, text, None, {}, kind)

    def _count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    # -- what the user reads ----------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counts: calls, memo_hits, and each failure kind (exception, timeout, invalid, ...)."""
        with self._lock:
            counts = dict(self._counts)
        base = {"calls": 0, "memo_hits": 0, EXCEPTION: 0, TIMEOUT: 0, INVALID: 0, MISSING_FIELD: 0, OVERLOADED: 0}
        return base | counts

    @property
    def judge_usage(self) -> Any:
        """The llm() calls this metric made: calls, cache hits, tokens, USD cost and time."""
        return getattr(self.models, "usage", None)

    def __repr__(self) -> str:
        return f"<skynet_dspy.Metric {self.loaded.name} timeout={self.timeout:g}s>"


def _describe(exc: BaseException) -> str:
    message = str(exc) if not isinstance(exc, SystemExit) else f"exit code {exc.code!r}"
    return f"{type(exc).__name__}: {message}".rstrip(": ") if message else type(exc).__name__


def load_metric(source: Any, **options: Any) -> Metric:
    """Load a Skynet metric and wrap it for DSPy and GEPA.

    `source` is a path to metric.py, an imported module, or a `score` callable. Options:
    timeout (s, default 60, at most 600), failure_score (0.0), output_fields (names of the
    prediction's output columns), to_output (prediction -> output), metric_lm and
    reflection_lm (for llm()), feedback_limit (20,000 characters).
    """
    from ._loading import load

    if isinstance(source, Metric):
        if options:
            raise TypeError("load_metric() got a Metric already; pass the metric file or function to set options")
        return source
    return Metric(load(source), **options)
