"""isolation="process" (the default): score runs in worker processes that the user's process can kill.

A small pool per metric, grown lazily to the concurrency the caller uses (DSPy's or GEPA's threads),
up to `max_workers`, reused across calls. Each call is one exchange on the worker's own socket: the
calling thread sends the call, serves the worker's llm() requests on helper threads meanwhile, and
waits at most the timeout. A worker that passes it is killed with its whole process group (SIGKILL:
nothing a metric does can block it) and reaped; so is a worker that exits, crashes or forks. The next
call starts a fresh one.

Workers are started with `subprocess` (fork+exec of a fresh interpreter): safe beside DSPy's and
LiteLLM's threads, and the user's own script is never re-run (multiprocessing's spawn and forkserver
re-import the main module in every worker). Measured against pebble's ProcessPool on the same machine
(`make bench`, row 6b, benchmarks/isolation.py): pebble's round trip of a trivial function alone takes
1.3-1.5x this module's whole call (97 vs 65 µs median, 138 vs 103 on a busier machine); its shared task
channel would also let a process forked inside score take tasks. So this module manages its processes
itself, in the simplest way that keeps those promises: handle.py is one worker process, source.py how a
worker finds the metric, worker.py the worker's own loop.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import weakref
from dataclasses import asdict
from typing import Any

from ..call import CallRequest
from ..context import LLMHandler
from ..contract import CUT_MARGIN, check_return
from ..errors import (
    NO_JUDGE_MODEL,
    ContractViolation,
    LLMCallError,
    MetricLoadError,
    ModelNotConfigured,
    WorkerError,
    judge_failure,
)
from ..types import Failure, Item, MetricInfo, Outcome
from ..values import check_llm_arguments, exception_text
from . import wire
from .handle import MAX_LLM_AT_ONCE, Gone, WorkerProcess, exit_text
from .source import source_spec

DEFAULT_MAX_WORKERS = 32
_MAX_REFUSED = 1000  # refused llm() requests in one call before it is ended as a flood (each is answered here)


class _Tampered(Exception):
    """The worker answered an earlier call a second time: a reply was forged, so the last one may have been."""


class ProcessExecutor:
    """The metric in worker processes: loaded in the first worker now, in later ones as they start."""

    def __init__(self, source: Any, timeout: float, feedback_limit: int, max_workers: int | None = None):
        self.timeout = timeout
        self.feedback_limit = feedback_limit
        self.max_workers = max_workers or DEFAULT_MAX_WORKERS
        self._spec = source_spec(source)
        self._cond = threading.Condition()
        self._idle: list[WorkerProcess] = []
        self._workers: set[WorkerProcess] = set()  # every live worker, busy or idle
        self._starting = 0
        self._closed = False
        self._call_ids = itertools.count(1)
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._owner)
        worker = self._start()  # loads the metric: a MetricLoadError here is load_metric()'s
        self.info: MetricInfo = worker.info  # type: ignore[assignment]
        self._release(worker)

    # -- the pool ------------------------------------------------------------------------------

    def _start(self) -> WorkerProcess:
        """A new worker with the metric loaded (under the metric's timeout)."""
        worker = WorkerProcess(self.timeout)
        with self._cond:
            self._workers.add(worker)
        try:
            worker.send(wire.to_worker({"kind": "load", "spec": self._spec, "feedback_limit": self.feedback_limit}))
            reply = worker.wait(time.monotonic() + self.timeout)
        except Gone:
            self._discard(worker)
            raise MetricLoadError(
                f"importing the metric {exit_text(worker.proc.returncode)} (in its worker process); fix the "
                "module-level code so the file imports cleanly"
            ) from None
        if not isinstance(reply, dict):
            self._discard(worker)
            raise MetricLoadError(
                f"importing the metric did not finish within the {self.timeout:g} s timeout; move slow work "
                "out of the module's top level (into score, or cache it), or raise timeout="
            )
        if reply.get("kind") == "load_failed":
            self._discard(worker)
            message, item = str(reply.get("message")), reply.get("item")
            if item == "not_found":
                raise FileNotFoundError(message)
            raise MetricLoadError(message, Item(item) if item in set(Item) else Item.LOADS)
        if reply.get("kind") != "loaded" or not isinstance(reply.get("info"), dict):
            self._discard(worker)
            raise MetricLoadError("the metric's worker process answered the load with something else")
        worker.info = wire.info_from_plain(reply["info"])
        return worker

    def _acquire(self) -> WorkerProcess:
        if os.getpid() != self._owner:
            self._forget_inherited_workers()
        with self._cond:
            while True:
                if self._closed:
                    raise WorkerError("this metric was closed; load it again to score more")
                if self._idle:
                    return self._idle.pop()
                if len(self._workers) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                self._cond.wait()
        try:
            return self._start()
        finally:
            with self._cond:
                self._starting -= 1
                self._cond.notify()

    def _release(self, worker: WorkerProcess) -> None:
        with self._cond:
            if not self._closed and worker in self._workers:
                self._idle.append(worker)
                self._cond.notify()
                return
        self._discard(worker)

    def _discard(self, worker: WorkerProcess) -> None:
        worker.kill()
        with self._cond:
            self._workers.discard(worker)
            self._cond.notify()

    # -- a call ----------------------------------------------------------------------------

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score in a worker; an Outcome whatever the metric does (loops, hangs, exits, forks).

        A worker an earlier call spoiled without it showing (it shut or wrote into its own socket, or stopped
        itself as the call arrived) cannot take the call, or answers an earlier call again: it is replaced and
        the call runs once more, on a new worker. score runs at most once for the call either way.
        """
        outcome = self._run_once(request, llm)
        if outcome is None:
            outcome = self._run_once(request, llm)
        if outcome is None:
            return Outcome(
                failure=Failure.CRASHED,
                detail="two metric worker processes in a row could not take the call or answered an earlier call "
                "again (score shut, stopped or wrote into its worker's socket); both were replaced",
            )
        return outcome

    def _run_once(self, request: CallRequest, llm: LLMHandler | None) -> Outcome | None:
        """One attempt at the call; None when the worker turned out to have been spoiled (see run)."""
        try:
            worker = self._acquire()
            while worker.used and not worker.healthy():  # what an earlier call left behind broke it
                self._discard(worker)
                worker = self._acquire()
        except MetricLoadError as exc:
            return Outcome(failure=Failure.CRASHED, detail=f"a new worker process could not load the metric: {exc}")
        except WorkerError as exc:
            return Outcome(failure=Failure.CRASHED, detail=str(exc))
        call_id = next(self._call_ids)
        observation = asdict(request.observation) if request.observation is not None else None
        try:
            data = wire.to_worker({
                "kind": "call", "call": call_id, "input": request.input, "output": request.output,
                "expected": request.expected, "observation": observation,
                "unmeasured_reason": request.unmeasured_reason,
            })
        except Exception as exc:
            self._release(worker)
            return Outcome(
                failure=Failure.EXCEPTION,
                error_type=type(exc).__name__,
                detail=f"the values to score cannot be sent to the metric's worker process ({exception_text(exc)}); "
                "give plain values (to_output=...), or use isolation='thread'",
            )
        worker.used = True
        try:
            worker.send(data)
        except OSError:  # shut, closed or not reading: it never had the whole call, so score did not run
            self._discard(worker)
            return None
        except BaseException:  # a Ctrl-C while sending: no worker is lost to the pool
            self._discard(worker)
            raise
        try:
            outcome, keep = self._await(worker, call_id, llm)
        except _Tampered:
            self._discard(worker)
            return None
        except Gone:
            self._discard(worker)
            return Outcome(
                failure=Failure.CRASHED,
                detail=f"the metric's worker process {exit_text(worker.proc.returncode)} during the call "
                "(sys.exit, os._exit, a crash or a signal in score); a new worker takes the next call",
            )
        except OSError:
            self._discard(worker)
            return Outcome(failure=Failure.CRASHED, detail="the metric's worker process closed its connection")
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the worker is not reused, and the run goes on
            self._discard(worker)
            return Outcome(
                failure=Failure.CRASHED,
                detail=f"the reply of the metric's worker process could not be read ({exception_text(exc)})",
            )
        except BaseException:  # a Ctrl-C in the user's process: it propagates, and no worker is lost to the pool
            self._discard(worker)
            raise
        if keep:
            self._release(worker)
        else:
            self._discard(worker)
        return outcome

    def _await(self, worker: WorkerProcess, call_id: int, llm: LLMHandler | None) -> tuple[Outcome, bool]:
        deadline = time.monotonic() + self.timeout
        refused = 0
        while True:
            message = worker.wait(deadline)
            if message is None:
                return Outcome(
                    failure=Failure.TIMEOUT,
                    detail=f"score() did not return within {self.timeout:g} s; its worker process was killed",
                ), False
            kind = message.get("kind") if isinstance(message, dict) else None
            if kind == "llm":
                if not _serve_llm(worker, message, call_id, llm):
                    refused += 1
                    if refused > _MAX_REFUSED:
                        return Outcome(
                            failure=Failure.CRASHED,
                            detail=f"score() sent more than {_MAX_REFUSED} llm() requests beyond the "
                            f"{MAX_LLM_AT_ONCE} at once a call may make; its worker process was stopped",
                        ), False
            elif kind == "outcome" and message.get("call") == call_id:
                outcome = _checked(wire.outcome_from_plain(message.get("outcome")), self.feedback_limit)
                return outcome, not message.get("retire")
            elif kind == "outcome" and isinstance(message.get("call"), int) and message["call"] < call_id:
                raise _Tampered
            else:
                unexpected = "the metric's worker process sent an unexpected reply"
                return Outcome(failure=Failure.CRASHED, detail=unexpected), False

    def close(self) -> None:
        """Stop every worker of this metric (calls in progress end as failures)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            worker.stop()
            with self._cond:
                self._workers.discard(worker)
        self._finalizer()

    def _forget_inherited_workers(self) -> None:
        """In a fork of the user's process, leave the parent's workers alone and start our own."""
        self._cond = threading.Condition()
        self._idle, self._workers, self._starting = [], set(), 0
        self._owner = os.getpid()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._owner)

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of this metric's live workers (for tests and for the curious)."""
        with self._cond:
            return sorted(worker.pid for worker in self._workers)


def _checked(outcome: Outcome, feedback_limit: int) -> Outcome:
    """A worker's result checked again here, against the same rules (a metric may write its own replies)."""
    result = outcome.result
    if result is None:
        return outcome
    if result.scores is None and not result.extra and math.isfinite(result.score) and (
        len(result.feedback) <= feedback_limit + CUT_MARGIN
    ):  # a bare (score, {"feedback": ...}): nothing below could fail (saves ~10 µs a call, `make bench` row 6)
        return outcome
    info: dict[str, Any] = {**result.extra, "feedback": result.feedback}
    if result.scores is not None:
        info["scores"] = result.scores
    try:
        checked = check_return((result.score, info), feedback_limit + CUT_MARGIN)
    except ContractViolation as violation:
        return Outcome(failure=Failure.INVALID, rule=violation.rule, detail=str(violation))
    return Outcome(
        result=checked, detail=outcome.detail, judge_problem=outcome.judge_problem, judge_detail=outcome.judge_detail
    )


def _kill_all(workers: set[WorkerProcess], owner: int) -> None:
    if os.getpid() != owner:  # a fork of the user's process: the workers are its parent's, not ours to stop
        return
    for worker in list(workers):
        worker.kill()
    workers.clear()


def _serve_llm(worker: WorkerProcess, message: dict[str, Any], call_id: int, llm: LLMHandler | None) -> bool:
    """Answer a worker's llm() request on a helper thread, so the call's timeout keeps running meanwhile.
    False when it was refused at once (too many in flight)."""
    request_id = message.get("request")
    if not worker.llm_slots.acquire(blocking=False):
        _reply(worker, _llm_error(request_id, Failure.JUDGE_ERROR,
                                  f"more than {MAX_LLM_AT_ONCE} llm() calls at once from one metric call"))
        return False

    def answer() -> None:
        instructions, input_text, settings = message.get("instructions"), message.get("input"), message.get("settings")
        settings = settings if isinstance(settings, dict) else {}
        try:
            if message.get("call") != call_id:
                raise LLMCallError("llm() was called after its metric call had ended")
            if llm is None:
                raise ModelNotConfigured(NO_JUDGE_MODEL)
            check_llm_arguments(instructions, input_text, settings)  # again here: a worker may write its own request
            reply = {"kind": "llm_reply", "request": request_id,
                     "text": str(llm(instructions, input_text, settings))}  # type: ignore[arg-type]  # checked above
        except Exception as exc:  # noqa: BLE001 - every failure is answered, or the worker would wait forever
            kind = judge_failure(exc)
            text = exception_text(exc) if kind is None else str(exc)
            called = exc if isinstance(exc, LLMCallError) else None  # a failed call says its HTTP status
            reply = _llm_error(request_id, kind or Failure.JUDGE_ERROR, text,
                               called.status if called else None, called.refused if called else False)
        worker.llm_slots.release()
        _reply(worker, reply)

    threading.Thread(target=answer, name="skynet-llm-for-worker", daemon=True).start()
    return True


def _llm_error(
    request_id: Any, kind: Failure, message: str, status: int | None = None, refused: bool = False
) -> dict[str, Any]:
    error = {"failure": str(kind), "message": message, "status": status, "refused": refused}
    return {"kind": "llm_reply", "request": request_id, "error": error}


def _reply(worker: WorkerProcess, reply: dict[str, Any]) -> None:
    try:
        worker.send(wire.to_worker(reply))
    except (OSError, ValueError):  # the worker is gone (timed out, killed): nobody is waiting
        pass
