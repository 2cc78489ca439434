"""The metric object DSPy calls: one adapter for Evaluate, BootstrapFewShot, MIPROv2 and GEPA (SPEC §4).

The hot path of a call is: memo lookup → translate the Example/Prediction (_translate) → run
`score` under the timeout (_runner) → validate the return (_contract) → wrap it in a Score.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import dspy
from dspy.primitives.example import Example

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
from ._loading import LoadedMetric, load
from ._models import Models

logger = logging.getLogger("skynet_dspy")

DEFAULT_MEMO_SIZE = 4096
_FAILURE_KINDS = (EXCEPTION, TIMEOUT, INVALID, MISSING_FIELD, OVERLOADED)
_BIG = 10**300  # ints beyond this are left to validate_return (they overflow a float)


Raw = tuple  # (score, feedback, scores, extra, failure): a Result's fields, before a Result is built


def _raw_of(result: Result) -> Raw:
    return (result.score, result.feedback, result.scores, result.extra, result.failure)


def _as_raw(value: Any, base: Any, fields: dict[str, Any]) -> Raw:
    """A Result's fields from Prediction-style construction (copy(), pickling, Score(0.5)), for Score."""
    if type(value) is Result:
        return _raw_of(value)
    if type(value) is tuple:
        return value
    store = dict(base._store) if isinstance(base, Example) else dict(base or {})
    store.update(fields)
    if value is not None:
        store.setdefault("score", value)
    previous = base._raw if isinstance(base, Score) else None
    scores = store.get("objective_scores")
    return (
        float(store.get("score", 0.0)),
        str(store.get("feedback") or ""),
        dict(scores) if scores else None,
        dict(previous[3]) if previous is not None else {},
        previous[4] if previous is not None else None,
    )


_LOUD_STREAKS = frozenset({10, 100, 1000, 10000})


class Score(dspy.Prediction, float):
    """What the adapter returns to DSPy: `score`, `feedback` and (when the metric named scores) `objective_scores`.

    A dspy.Prediction for GEPA, and a float (the score) everywhere DSPy or the user wants a number:
    sum(), averages, comparisons with a metric_threshold, json, pandas, `f"{s:.2f}"`. It is truthy
    only for a successful call with a score above zero, so BootstrapFewShot never takes a zero (or
    a failed call) as a good demo. The full Result, extra side-information keys included, is on
    `.result`, never among the fields DSPy reads.
    """

    def __new__(cls, result: Any = None, base: Any = None, **fields: Any) -> Score:
        raw = result if type(result) is tuple else _as_raw(result, base, fields)
        self = float.__new__(cls, raw[0])
        store: dict[str, Any] = {"score": raw[0], "feedback": raw[1]}
        if raw[2]:
            store["objective_scores"] = dict(raw[2])
        state = self.__dict__  # what dspy.Prediction.__init__ sets, without its per-attribute __setattr__
        state["_store"] = store
        state["_completions"] = None
        state["_lm_usage"] = None
        state["_raw"] = raw
        return self

    __init__ = object.__init__  # __new__ did it all

    @property
    def result(self) -> Result:
        """The metric call in full: score, feedback, named scores, extra keys, and the failure kind (or None)."""
        state = self.__dict__
        result = state.get("_result")
        if result is None:
            result = state["_result"] = Result(*self._raw)
        return result

    def __bool__(self) -> bool:
        return self._raw[4] is None and self._store["score"] > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Example):
            return Example.__eq__(self, other)
        return float.__eq__(float(self), other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = float.__hash__

    def __repr__(self) -> str:
        store = self._store
        extra = f", objective_scores={store['objective_scores']!r}" if "objective_scores" in store else ""
        return f"Score({store['score']!r}, feedback={store['feedback']!r}{extra})"

    __str__ = __repr__


def _fast_raw(value: Any, limit: int) -> Raw | None:
    """The fields of the commonest valid return, (number, {"feedback": str}), or None to validate in full."""
    if type(value) is not tuple or len(value) != 2:
        return None
    number, info = value
    kind = type(number)
    if kind is float:
        if number - number != 0.0:  # NaN or infinite
            return None
    elif kind is int and -_BIG < number < _BIG:
        number = float(number)
    else:
        return None
    if type(info) is not dict or len(info) != 1:
        return None
    try:
        feedback = info.get("feedback")
    except Exception:  # a hostile key colliding with "feedback": validate_return deals with it
        return None
    if type(feedback) is not str or len(feedback) > limit:
        return None
    return (number, feedback, None, {}, None)


class Metric:
    """A Skynet `score` function wrapped as a DSPy metric and a GEPA feedback metric.

    Built by `skynet_dspy.load_metric()`. DSPy calls it as `metric(gold, pred, trace=None,
    pred_name=None, pred_trace=None, program_trace=None)` and gets a Score; on plain values use
    `metric.score(input, output, expected)`, which gives a Result.
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
        failure = None if isinstance(failure_score, bool) else as_number(failure_score)
        if failure is None or not math.isfinite(failure):
            raise ValueError(f"failure_score must be a finite number, got {failure_score!r}; the default is 0.0")
        self.failure_score = failure
        if isinstance(output_fields, str):
            output_fields = [output_fields]
        if output_fields is not None:
            output_fields = list(output_fields)
            if not output_fields or not all(isinstance(name, str) and name for name in output_fields):
                raise ValueError(
                    f"output_fields must name the prediction's output fields, e.g. ['answer'], got {output_fields!r}"
                )
        self.output_fields: list[str] | None = output_fields
        if to_output is not None and not callable(to_output):
            raise TypeError("to_output must be a function taking the dspy.Prediction and returning the output")
        self.to_output = to_output
        self.feedback_limit = check_feedback_limit(feedback_limit)
        if not isinstance(memo_size, int) or isinstance(memo_size, bool) or memo_size < 0:
            raise ValueError(f"memo_size must be a whole number of entries, 0 or more, got {memo_size!r}")
        self.models = models if models is not None else Models(
            metric_lm=metric_lm, reflection_lm=reflection_lm, cache=judge_cache
        )
        self.__name__ = f"skynet:{loaded.name}"
        self._memo_size = memo_size
        # (id(gold), id(pred)) -> (gold, pred, gold fields, pred fields, raw result). Holding gold and
        # pred keeps their ids from being reused while the entry lives; the field snapshots catch
        # an example or prediction changed in place since it was scored.
        self._memo: OrderedDict[tuple[int, int], tuple[Any, Any, Any, Any, Raw]] = OrderedDict()
        self._unmeasured_call: _context.MetricCall | None = None  # reused while no run was measured
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._failure_streak = 0  # failed calls in a row; reaching each of _LOUD_STREAKS logs an error
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
        hit = self._memo.get(key)
        if hit is not None and hit[0] is gold and hit[1] is pred and _unchanged(hit, gold, pred):
            with self._lock:
                self._counts["memo_hits"] += 1
            return Score(hit[4])
        raw = self._score_dspy(gold, pred)
        if self._memo_size and raw[4] != OVERLOADED:  # a call never run is worth trying again
            entry = (gold, pred, _fields_of(gold), _fields_of(pred), raw)
            memo = self._memo
            with self._lock:
                memo[key] = entry
                if len(memo) > self._memo_size:
                    memo.popitem(last=False)
        return Score(raw)

    def _score_dspy(self, gold: Any, pred: Any) -> Raw:
        try:
            input_values, expected = _translate.split_example(gold)
        except Exception as exc:
            return self._failed(EXCEPTION, f"Could not read the example for the metric: {_describe(exc)}")
        try:
            output = _translate.prediction_output(pred, self.output_fields, self.to_output)
        except _translate.MissingOutputField as exc:
            return self._failed(MISSING_FIELD, f"The program's output is incomplete: {exc}.")
        except Exception as exc:
            where = "to_output raised" if self.to_output is not None else "could not read the prediction:"
            return self._failed(EXCEPTION, f"The metric was not run: {where} {_describe(exc)}")
        observation, reason = _measure.observation_for(pred)
        return self._run(input_values, output, expected, observation, reason)

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
        """Call `score` with the call's context set, enforce the timeout, validate the return.

        The values are passed as given (callers detach them); never raises for the metric's faults.
        """
        return Result(*self._run(input_values, output, expected, observation, unmeasured_reason))

    def _run(
        self,
        input_values: dict[str, Any],
        output: Any,
        expected: dict[str, Any] | None,
        observation: _measure.Observation | None,
        unmeasured_reason: str | None,
    ) -> Raw:
        if observation is None:
            reason = unmeasured_reason or "the run was not measured"
            call = self._unmeasured_call
            if call is None or call.unmeasured_reason != reason or call.models is not self.models:
                call = self._unmeasured_call = _context.MetricCall(self.models, None, reason)
        else:
            call = _context.MetricCall(self.models, observation, unmeasured_reason)
        loaded = self.loaded
        if loaded.takes_expected:
            args: tuple[Any, ...] = (call, loaded.score, input_values, output, expected)
        else:
            args = (call, loaded.score, input_values, output)
        outcome, value = self._runner.run(_context.run_in, self.timeout, args)
        with self._lock:
            self._counts["calls"] += 1
        if outcome == _runner.DONE:
            raw = _fast_raw(value, self.feedback_limit)
            if raw is not None:
                self._failure_streak = 0
                redacted = _secrets.redact(raw[1])  # validate_return redacts; the fast path must too
                return raw if redacted is raw[1] else (raw[0], redacted, None, {}, None)
            try:
                result = validate_return(value, feedback_limit=self.feedback_limit)
                self._failure_streak = 0
                return _raw_of(result)
            except ContractViolation as exc:
                # The rule only: the offending value may hold expected values, and feedback reaches the optimizer.
                return self._failed(
                    INVALID, f"The metric's return value broke the contract: {exc.rule}.", detail=str(exc)
                )
        if outcome == _runner.RAISED:
            return self._failed(EXCEPTION, f"The metric raised {_describe(value)}")
        if outcome == _runner.TIMED_OUT:
            return self._failed(
                TIMEOUT,
                f"The metric timed out after {self.timeout:g} s: score() did not return in time, "
                "and the run went on without it.",
            )
        return self._failed(
            OVERLOADED,
            f"The metric was not run: {value} earlier calls are still stuck past their timeout "
            f"of {self.timeout:g} s.",
        )

    def _failed(self, kind: str, feedback: str, detail: str | None = None) -> Raw:
        text = cut_feedback(_secrets.redact(feedback), self.feedback_limit)
        with self._lock:
            self._counts[kind] += 1
            first = kind not in self._warned
            self._warned.add(kind)
            self._failure_streak += 1
            streak = self._failure_streak
        if streak in _LOUD_STREAKS:
            logger.error(
                "skynet-dspy metric %s: the last %d calls all failed (latest: %s: %s). Every failed call scores %g, "
                "so the optimizer learns nothing and its budget is spent: run skynet_dspy.check_contract() on "
                "the metric to see what is wrong.",
                self.loaded.name, streak, kind, _secrets.redact(detail) if detail else text, self.failure_score,
            )
        if first:
            shown = _secrets.redact(detail) if detail else text
            logger.warning(
                "skynet-dspy metric %s: %s: %s (scored %g; the run goes on; later %s failures are counted in "
                "metric.stats, not logged)",
                self.loaded.name, kind, shown, self.failure_score, kind,
            )
        extra = {"detail": _secrets.redact(detail)} if detail else {}
        return (self.failure_score, text, None, extra, kind)

    def _count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    # -- what the user reads ----------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counts: calls (score invocations), memo_hits, and each failure kind (exception, timeout, invalid, ...)."""
        with self._lock:
            counts = dict(self._counts)
        base = {"calls": 0, "memo_hits": 0} | {kind: 0 for kind in _FAILURE_KINDS}
        return base | counts

    @property
    def judge_usage(self) -> Any:
        """The llm() calls this metric made: calls, cache hits, tokens, USD cost and time."""
        return getattr(self.models, "usage", None)

    def __repr__(self) -> str:
        return f"<skynet_dspy.Metric {self.loaded.name} timeout={self.timeout:g}s>"


def _fields_of(record: Any) -> Any:
    store = getattr(record, "_store", None)
    return dict(store) if type(store) is dict else None


def _unchanged(hit: tuple[Any, Any, Any, Any, Raw], gold: Any, pred: Any) -> bool:
    """True when gold and pred hold the same fields as when the memo entry was made."""
    try:
        return hit[2] == getattr(gold, "_store", None) and hit[3] == getattr(pred, "_store", None)
    except Exception:  # fields that refuse comparison (e.g. arrays): score again
        return False


def _describe(exc: BaseException) -> str:
    """'ValueError: message' for feedback; never raises, even for an exception whose str() does."""
    name = type(exc).__name__
    try:
        message = f"exit code {exc.code!r}" if isinstance(exc, SystemExit) else str(exc)
    except Exception as inner:
        message = f"<its message could not be read: str() raised {type(inner).__name__}>"
    return f"{name}: {message}" if message else name


def load_metric(source: Any, **options: Any) -> Metric:
    """Load a Skynet metric and wrap it for DSPy and GEPA.

    `source` is a path to metric.py, an imported module, or a `score` callable. Options:
    timeout (s, default 60, at most 600), failure_score (0.0), output_fields (names of the
    prediction's output columns), to_output (prediction -> output), metric_lm and
    reflection_lm (for llm()), feedback_limit (20,000 characters), memo_size (4096).
    """
    if isinstance(source, Metric):
        if options:
            raise TypeError("load_metric() got a Metric already; pass the metric file or function to set options")
        return source
    known = [name for name in inspect.signature(Metric).parameters if name != "loaded"]
    unknown = [name for name in options if name not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"load_metric() got an unknown option {unknown[0]!r}{hint}. Options: {', '.join(known)}")
    return Metric(load(source), **options)
