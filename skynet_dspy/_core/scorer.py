"""A metric as the user's process sees it: plain values in, a Result out, whatever the metric does. The Scorer
owns the executor, counts every kind of failure and logs it (once per kind, and when calls keep failing in a row).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from . import safe_text, secrets
from .call import CallRequest
from .context import LLMHandler
from .contract import check_feedback_limit, check_timeout, cut_feedback, finish_feedback
from .errors import WorkerError
from .isolation import Executor
from .isolation.process import ProcessExecutor
from .isolation.ray_cluster import RayCluster, RayExecutor
from .isolation.sandbox import sandbox_for
from .isolation.thread import ThreadExecutor
from .loading import load
from .logs import logger
from .reward import validate_spec
from .types import Failure, MetricInfo, Observation, Outcome, ProgramUsage, Result
from .values import finite_number, whole_number

_LOUD_STREAKS = frozenset({10, 100, 1000, 10000})
_SETUP_PROBLEMS = frozenset({Failure.JUDGE_NOT_CONFIGURED, Failure.JUDGE_ERROR, Failure.LOAD})

_SETUP = "this is a setup problem, not a fault of the output."
_NEUTRAL = {
    Failure.EXCEPTION: "the metric raised {error_type} while scoring this output.",
    Failure.TIMEOUT: "the metric timed out after {timeout:g} s on this output.",
    Failure.INVALID: "the metric returned a value that breaks the metric contract ({rule}); this is a fault of the "
    "metric, not of the output.",
    Failure.CRASHED: "the metric's process stopped while scoring this output (it exited or crashed); this is a "
    "fault of the metric.",
    Failure.LOAD: f"the metric could not be loaded; {_SETUP}",
    Failure.MEMORY: "the metric's process passed its memory limit while scoring this output; this is a limit of "
    "the setup, not a fault of the output.",
    Failure.OVERLOADED: "the metric was not run, because earlier calls are still stuck past their timeout.",
    Failure.JUDGE_NOT_CONFIGURED: f"the metric's judge model is not configured; {_SETUP}",
    Failure.JUDGE_ERROR: f"the metric's judge model could not answer; {_SETUP}",
    Failure.JUDGE_UNREACHABLE: "the metric's judge model could not be reached (its requests failed after their "
    "retries); this is not a fault of the output.",
    Failure.SPEND_CAP: "a spending cap was reached, so no more model calls are made.",
}


def neutral_feedback(outcome: Outcome, timeout: float) -> str:
    """The feedback of a failed call, built from nothing the metric chose (docs/contract.md#a-failed-call)."""
    kind = outcome.failure
    if kind is Failure.CRASHED and outcome.error_type == "fork":
        return "Not scored: the metric tried to start a process of its own; this is a fault of the metric."
    text = _NEUTRAL.get(kind, "the metric could not score this output.")  # type: ignore[arg-type]
    return "Not scored: " + text.format(error_type=outcome.error_type or "an exception", timeout=timeout,
                                        rule=outcome.rule)


class Scorer:
    """Loads a metric and scores plain values with it, never raising for its faults; `llm` answers its llm() (the
    metric's Judge, which falls back to configure_llm()'s models itself)."""

    def __init__(
        self,
        source: Any,
        *,
        timeout: float,
        failure_score: float,
        feedback_limit: int,
        isolation: str | RayCluster = "process",
        workers: int | None = None,
        llm: LLMHandler,
        worker_max_calls: int | None = None,
        worker_max_memory: int | None = None,
        sandbox: bool = False,
        sandbox_network: bool = False,
    ):
        self.timeout = check_timeout(timeout)
        self.failure_score = finite_number("failure_score", failure_score, default=0.0)
        self.feedback_limit = check_feedback_limit(feedback_limit)
        cluster = _cluster(isolation)
        _check_workers(isolation, workers, worker_max_calls, worker_max_memory)
        self.isolation = "ray" if cluster is not None else str(isolation)
        self.llm = llm
        # the pool's memory check (worker_max_memory) holds in a sandbox too; its address-space limit is a backstop
        # with room for what a process maps but never uses (thread stacks, libraries), so it never fires first
        backstop = None if worker_max_memory is None else 2 * worker_max_memory + 2**30
        # the Sandbox its workers start in, or None
        self.sandbox = sandbox_for(source, sandbox, sandbox_network, self.isolation, max_memory=backstop)
        if cluster is not None:
            self.executor: Executor = RayExecutor(
                source, self.timeout, self.feedback_limit, cluster, workers,
                max_calls=worker_max_calls, max_memory=worker_max_memory,
            )
        elif isolation == "process":
            self.executor = ProcessExecutor(
                source, self.timeout, self.feedback_limit, workers,
                max_calls=worker_max_calls, max_memory=worker_max_memory, launcher=self.sandbox,
            )
        else:
            self.executor = ThreadExecutor(load(source), self.timeout, self.feedback_limit)
        self.info: MetricInfo = self.executor.info
        # in this process, an async score's coroutine is cancelled at the timeout by its own loop (a thread cannot
        # be stopped); a worker process is killed at the timeout, its coroutine with it
        self._coroutine_timeout = self.timeout if self.isolation == "thread" and self.info.is_async else None
        if self.info.reward_spec is not None:
            validate_spec(self.info.reward_spec)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter({"calls": 0, "memo_hits": 0} | {str(kind): 0 for kind in Failure})
        self._logged: set[str] = set()
        self._streak = 0  # failed calls in a row
        self._runs = 0  # Evaluates and optimizations in progress (run())
        self._unreachable = ""  # the latest judge_unreachable failure's detail, for run()
        self._program = ProgramUsage()  # the measured runs of the calls made, added up
        self.closed = False

    def score(self, request: CallRequest) -> Result:
        """Run one call and give its Result: the metric's own on success, the failure score otherwise."""
        if self.closed:  # the caller's mistake, not the metric's: an error, never a failure scored as the metric's
            raise WorkerError(f"the metric {self.info.label} was closed; load it again to score more")
        if self._coroutine_timeout is not None:
            request = replace(request, timeout=self._coroutine_timeout)
        outcome = self.executor.run(request, self.llm)
        if self.closed and outcome.result is None:  # closed under the call (a Ctrl-C): not the metric's fault
            raise WorkerError(f"the metric {self.info.label} was closed while this call ran; nothing was scored")
        observed = request.observation if isinstance(request.observation, Observation) else None
        with self._lock:
            self._counts["calls"] += 1
            if outcome.result is not None:
                self._streak = 0
            if observed is not None:
                self._program = self._program.plus(observed)
        problem = outcome.judge_problem
        if problem is not None and problem not in (Failure.SPEND_CAP, Failure.JUDGE_UNREACHABLE):
            self._setup_problem(problem, outcome.judge_detail or "")
        result = self.failed(outcome) if outcome.result is None else self._succeeded(outcome.result)
        # the program's measured run it was given stays on the result (for tables and receipts)
        return result if observed is None else replace(result, observation=observed)

    def _succeeded(self, result: Result) -> Result:
        """The Result of a call that worked: its feedback cut to the limit, no key in what reaches the optimizer."""
        result = finish_feedback(result, self.feedback_limit)
        if result.extra and self.isolation != "thread":
            result = replace(result, extra=safe_text.map_strings(result.extra, secrets.redact))
        if result.scores:  # the names reach the optimizer, like the feedback: no key among them
            names = {secrets.redact(name): value for name, value in result.scores.items()}
            if names != result.scores:
                result = replace(result, scores=names)
        return result

    def failed(self, outcome: Outcome, feedback: str | None = None) -> Result:
        """The Result of a failed call (`feedback` overrides the neutral sentence), counted and logged."""
        kind = outcome.failure or Failure.EXCEPTION
        detail = secrets.redact(outcome.detail or kind.value)
        text = secrets.redact(feedback if feedback is not None else neutral_feedback(outcome, self.timeout))
        # the feedback cap holds for failures too (docs/contract.md#return-value)
        text = cut_feedback(text, self.feedback_limit)
        with self._lock:
            self._counts[kind] += 1
            in_streak = kind is not Failure.SPEND_CAP  # a spending cap reached is no fault of the metric
            self._streak += in_streak
            streak = self._streak if in_streak else 0
            first = kind not in self._logged
            self._logged.add(kind)
            if kind is Failure.JUDGE_UNREACHABLE:
                self._unreachable = detail
        if kind is Failure.SPEND_CAP:
            pass  # logged once, as an error, where the cap was reached (_judge/spend.py)
        elif kind in _SETUP_PROBLEMS:
            self._setup_problem(kind, detail)
        elif first:
            logger.warning(
                "skynet-dspy metric %s: %s: %s (scored %g; the run goes on; later %s failures are counted in "
                "metric.stats, not logged)",
                self.info.label, kind, detail, self.failure_score, kind,
            )
        if streak in _LOUD_STREAKS:
            logger.error(
                "skynet-dspy metric %s: the last %d calls all failed (latest: %s: %s). Every failed call scores %g, "
                "so the optimizer learns nothing and its budget is spent: run skynet_dspy.check_contract() on the "
                "metric to see what is wrong.",
                self.info.label, streak, kind, detail, self.failure_score,
            )
        return Result(self.failure_score, text, None, {}, kind, detail, output=outcome.output)

    @contextmanager
    def run(self) -> Iterator[None]:
        """An Evaluate or an optimization: at the end of the outermost one in progress, say once how many of its
        calls could not reach the judge."""
        with self._lock:
            self._runs += 1
            outer, before = self._runs == 1, Counter(self._counts)
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1
                failed = self._counts[Failure.JUDGE_UNREACHABLE] - before[Failure.JUDGE_UNREACHABLE]
                calls = self._counts["calls"] - before["calls"]
            if outer and failed > 0:
                logger.error(
                    "skynet-dspy metric %s: %d of %d calls could not reach the judge: %s. They scored %g (failure kind "
                    "%s in metric.stats and the results table).",
                    self.info.label, failed, calls, self._unreachable, self.failure_score, Failure.JUDGE_UNREACHABLE,
                )

    def _setup_problem(self, kind: Failure, detail: str) -> None:
        """Log a setup problem (no judge model, a refused key, a spending cap) as an error, the first time."""
        key = f"setup:{kind}"
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        which = "Calls" if kind is Failure.LOAD else "Calls that need the judge"
        logger.error(
            "skynet-dspy metric %s: %s: %s. %s score %g until this is fixed.",
            self.info.label, kind, secrets.redact(detail).rstrip("."), which, self.failure_score,
        )

    def count(self, kind: str) -> None:
        """Count an event that happened outside a call (a memo hit, a run that raised)."""
        with self._lock:
            self._counts[kind] += 1

    @property
    def program_usage(self) -> ProgramUsage:
        """The measured program runs the calls were given, added up (all zero when none was measured)."""
        with self._lock:
            return self._program

    @property
    def stats(self) -> dict[str, int]:
        """Counts: calls, memo_hits, and each failure kind."""
        with self._lock:
            return {str(key): value for key, value in self._counts.items()}

    def close(self) -> None:
        """Stop the metric's worker processes; a call after this raises WorkerError."""
        self.closed = True
        self.executor.close()


def _cluster(isolation: Any) -> RayCluster | None:
    """The Ray cluster `isolation` names (None for "process" or "thread"); a ValueError for anything else."""
    cluster = RayCluster() if isolation == "ray" else isolation if isinstance(isolation, RayCluster) else None
    if cluster is None and isolation not in ("process", "thread"):
        raise ValueError(
            f"isolation must be 'process' (the default), 'thread', 'ray' or a skynet_dspy.RayCluster(...), "
            f"got {isolation!r}"
        )
    return cluster


def _check_workers(isolation: Any, workers: Any, max_calls: Any, max_memory: Any) -> None:
    if workers is not None:
        whole_number("workers", workers, minimum=1, unit="worker processes")
    if max_calls is not None:
        whole_number("worker_max_calls", max_calls, minimum=1, unit="calls")
    if max_memory is not None:
        whole_number("worker_max_memory", max_memory, minimum=2**20, unit="bytes (e.g. 500 * 2**20)")
    if isolation == "thread" and (max_calls is not None or max_memory is not None):
        raise ValueError(
            "worker_max_calls= and worker_max_memory= recycle worker processes; isolation='thread' has none "
            "(leave them out, or use isolation='process')"
        )
