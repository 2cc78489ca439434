"""isolation="process" (the default): score runs in worker processes that the user's process can kill.

A small pool per metric, grown lazily to the concurrency the caller uses (DSPy's or GEPA's threads),
up to `max_workers`, reused across calls. Each call is one exchange on the worker's own socket: the
calling thread sends the call, serves the worker's llm() requests on helper threads meanwhile, and
waits at most the timeout. A worker that passes it is killed with its whole process group (SIGKILL:
nothing a metric does can block it) and reaped; so is a worker that exits, crashes or forks. The next
call starts a fresh one.

Workers are forked from a template process that imported the metric once (template.py: milliseconds per
worker, loaded models shared), or, when that is unsafe, started as fresh interpreters (handle.py); either
way never a fork of the user's process (DSPy's and LiteLLM's threads), and the user's own script is never
re-run (multiprocessing's spawn and forkserver re-import the main module in every worker). A call waits for
whichever worker is ready first, and that wait is not charged to its timeout.

pebble's ProcessPool round trip of a trivial function alone takes about as long as this module's whole call
(`make bench`, row 6b), and its shared task channel would let a process forked inside score take tasks: so
this module manages its processes itself. handle.py is one worker process, source.py how a worker finds the
metric, worker.py the worker's own loop, relay.py its llm() requests answered here.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import uuid
import weakref
from dataclasses import asdict, replace
from typing import Any

from ..call import CallRequest
from ..context import CallScope, LLMHandler
from ..contract import CUT_MARGIN, check_return
from ..errors import ContractViolation, MetricLoadError, WorkerError
from ..logs import logger
from ..types import Failure, Item, MetricInfo, Outcome
from ..values import exception_text
from . import wire
from .handle import MAX_LLM_AT_ONCE, STARTUP_TIMEOUT, Gone, Launcher, WorkerProcess, exit_text, private_memory
from .relay import serve_llm
from .source import source_spec
from .template import ForkedWorker, Template
from .template import supported as template_supported

DEFAULT_MAX_WORKERS = 32
START_MODES = ("template", "fresh")
START_VARIABLE = "SKYNET_DSPY_WORKER_START"  # internal: forces a start mode ("fresh"), for tests and benchmarks
_MAX_REFUSED = 1000  # refused llm() requests in one call before it is ended as a flood (each is answered here)
_GROWTH_PAUSE = 5.0  # seconds the pool does not grow after a worker failed to start (unless it has no worker)
_MEMORY_CHECK = 0.05  # seconds between looks at a busy worker's memory, when worker_max_memory is set
_MAX_FRESH_STARTS = max(2, os.cpu_count() or 2)  # fresh interpreters importing the metric at once, at most
_fallbacks_logged: set[tuple[str, ...]] = set()


class _NotTaken(Exception):
    """The worker exits without reading the call it was sent (see _late): score did not run, and the call runs on
    a new worker."""


class ProcessExecutor:
    """The metric in worker processes: imported once in a template process that forks workers as calls need
    them (template.py), or, when forking is unsafe, in each fresh interpreter (handle.py).

    `max_calls` replaces a worker after that many calls, `max_memory` (bytes) once it holds more memory of its
    own between calls (mid-call, the call fails as `memory`); `start` forces a start mode (START_MODES);
    `launcher` starts the template, or each fresh worker, another way (sandbox.py: in bubblewrap).
    """

    def __init__(
        self,
        source: Any,
        timeout: float,
        feedback_limit: int,
        max_workers: int | None = None,
        *,
        max_calls: int | None = None,
        max_memory: int | None = None,
        start: str | None = None,
        launcher: Launcher | None = None,
    ):
        self.timeout = timeout
        self.launcher = launcher  # how each worker is started (sandbox.py: inside bubblewrap); None: as is
        self.feedback_limit = feedback_limit
        self.max_workers = max_workers or DEFAULT_MAX_WORKERS
        self.max_calls = max_calls
        self.max_memory = max_memory
        # sandboxed, the template itself starts inside bubblewrap and forks the workers in there
        self.start_mode = _start_mode(start)
        # a call waits this long at most for a worker to start; it is never charged to the call's timeout
        self.start_timeout = timeout + STARTUP_TIMEOUT
        self._spec = source_spec(source)
        self._cond = threading.Condition()
        self._helper_lock = threading.Lock()  # one template (re)started at a time
        self._idle: list[WorkerProcess] = []
        self._workers: set[WorkerProcess] = set()  # every live worker, busy or idle
        self._loading: set[WorkerProcess] = set()  # fresh workers still importing the metric
        self._helpers: list[Template] = []  # the template, or the warden of fresh workers
        self._template: Template | None = None
        self._starting = 0
        self._waiting = 0  # calls waiting for a worker
        self._start_failures = 0
        self._start_error: BaseException | None = None
        self._start_failed_at = -math.inf
        self._closed = False
        self._output_logged = False
        self._call_ids = itertools.count(1)
        self._owner = os.getpid()
        self._pool = uuid.uuid4().hex  # the pool's mark: every worker's mark starts with it (tree.py)
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._loading, self._helpers, self._owner)
        try:
            if self.start_mode == "template":
                self.info: MetricInfo = self._load_template(timeout)  # a MetricLoadError here is load_metric()'s
            worker = self._new_worker(timeout)
        except BaseException:
            self._finalizer()  # the template or warden started so far goes now, not when this is collected
            raise
        if self.start_mode == "fresh":
            self.info = worker.info  # type: ignore[assignment]
        with self._cond:
            self._workers.add(worker)
        self._release(worker)

    # -- starting workers ------------------------------------------------------------------------

    def _load_template(self, seconds: float) -> MetricInfo:
        """Import the metric in a new template (within `seconds` of its start); falls back to fresh workers when
        it cannot be forked safely."""
        template = Template(self._pool, self.launcher)
        self._helpers.append(template)
        try:
            try:
                reply = template.load(self._spec, self.feedback_limit, seconds)
            except Gone:
                template.kill()
                raise MetricLoadError(
                    f"importing the metric {exit_text(template.proc.returncode)} (in its template process); fix the "
                    "module-level code so the file imports cleanly"
                ) from None
            info = self._loaded_info(reply)
        except BaseException:
            self._drop_helper(template)
            raise
        if template.unsafe:
            _log_fallback(template.unsafe)
            self._drop_helper(template)
            self.start_mode = "fresh"
        else:
            self._template = template
        return info

    def _drop_helper(self, helper: Template) -> None:
        helper.close()
        if helper in self._helpers:
            self._helpers.remove(helper)

    def _loaded_info(self, reply: Any) -> MetricInfo:
        """What a `load` reply says of the metric; MetricLoadError (or FileNotFoundError) when it did not load."""
        if not isinstance(reply, dict):
            raise MetricLoadError(
                f"importing the metric did not finish within the {self.timeout:g} s timeout; move slow work "
                "out of the module's top level (into score, or cache it), or raise timeout="
            )
        if reply.get("kind") == "load_failed":
            message, item = str(reply.get("message")), reply.get("item")
            if item == "not_found":
                raise FileNotFoundError(message)
            raise MetricLoadError(message, Item(item) if item in set(Item) else Item.LOADS)
        if reply.get("kind") != "loaded" or not isinstance(reply.get("info"), dict):
            raise MetricLoadError("the metric's worker process answered the load with something else")
        return wire.info_from_plain(reply["info"])

    def _new_worker(self, seconds: float) -> WorkerProcess:
        """A new worker with the metric loaded: forked from the template, or a fresh interpreter that imports it
        (within `seconds` of its start)."""
        token = f"{self._pool}.{uuid.uuid4().hex}"
        if self.start_mode == "template":
            with self._helper_lock:
                if self._template is None or not self._template.alive:  # killed from outside: import again
                    if self._template is not None:
                        self._drop_helper(self._template)
                        self._template = None
                    self._load_template(seconds)
                template = self._template
            if template is not None:
                return ForkedWorker(template, self.timeout, token)
        with self._helper_lock:
            if not any(helper.alive for helper in self._helpers):  # the warden: ends the workers with this process
                self._helpers.clear()
                self._helpers.append(Template(self._pool))
        worker = WorkerProcess(self.timeout, token, self.launcher)
        with self._cond:
            self._loading.add(worker)
        try:
            worker.send(wire.to_worker({"kind": "load", "spec": self._spec, "feedback_limit": self.feedback_limit}))
            try:
                reply = worker.wait(time.monotonic() + seconds)
            except Gone:
                worker.kill()
                raise MetricLoadError(
                    f"importing the metric {exit_text(worker.returncode)} (in its worker process); fix the "
                    "module-level code so the file imports cleanly"
                ) from None
            worker.info = self._loaded_info(reply)
            printed = worker.output.take()  # what its import printed: not its first call's
            if printed:
                logger.debug("skynet-dspy: importing the metric in a worker process printed:\n%s", printed)
        except BaseException:
            worker.kill()
            raise
        finally:
            with self._cond:
                self._loading.discard(worker)
        return worker

    def _grow(self) -> None:
        """Start one worker in the background; waiting calls take it, or whichever worker is idle first."""
        try:
            worker = self._new_worker(self.start_timeout)
        except BaseException as exc:  # noqa: BLE001 - a failed start is reported to the waiting calls
            with self._cond:
                self._starting -= 1
                self._start_failures += 1
                self._start_error = exc
                self._start_failed_at = time.monotonic()
                self._cond.notify_all()
            return
        with self._cond:
            self._starting -= 1
            if not self._closed:
                self._workers.add(worker)
                self._idle.append(worker)
                self._cond.notify_all()  # one waiter takes it; the others may start more meanwhile
                return
        worker.kill()

    # -- the pool ------------------------------------------------------------------------------

    def _acquire(self) -> WorkerProcess:
        """An idle worker, or the first one ready: MetricLoadError when none could start (not the call's fault)."""
        if os.getpid() != self._owner:
            self._forget_inherited_workers()
        deadline = time.monotonic() + self.start_timeout
        with self._cond:
            if self._idle and not self._closed:
                return self._idle.pop()
            failures = self._start_failures
            self._waiting += 1
            try:
                while True:
                    if self._closed:
                        raise WorkerError("this metric was closed; load it again to score more")
                    if self._idle:
                        return self._idle.pop()
                    now = time.monotonic()
                    empty = not self._workers and not self._starting
                    if self._start_failures != failures and empty:
                        raise MetricLoadError(
                            f"a new worker process could not load the metric: {self._start_error}"
                        )
                    # one start in flight per waiting call at most: the pool grows to the concurrency used
                    limit = min(self._waiting, _MAX_FRESH_STARTS if self.start_mode == "fresh" else self.max_workers)
                    if (len(self._workers) + self._starting < self.max_workers and self._starting < limit
                            and (empty or now - self._start_failed_at > _GROWTH_PAUSE)):
                        self._starting += 1
                        threading.Thread(target=self._grow, name="skynet-worker-start", daemon=True).start()
                    if now >= deadline and len(self._workers) < self.max_workers:  # a full pool: wait for a worker
                        raise MetricLoadError(f"no metric worker process was ready within {self.start_timeout:g} s")
                    self._cond.wait(min(deadline - now, _GROWTH_PAUSE) if deadline > now else _GROWTH_PAUSE)
            finally:
                self._waiting -= 1

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
            self._cond.notify_all()  # room for a new worker: a waiting call may start one

    def _retire(self, worker: WorkerProcess) -> bool:
        """Whether a worker that answered its call is replaced now (worker_max_calls, worker_max_memory)."""
        worker.calls += 1
        if self.max_calls is not None and worker.calls >= self.max_calls:
            return True
        if self.max_memory is not None:
            used = private_memory(worker.metric_pid)
            return used is not None and used > self.max_memory
        return False

    # -- a call ----------------------------------------------------------------------------

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score in a worker; an Outcome whatever the metric does (loops, hangs, exits, forks).

        A worker that could not take the call (it was gone before it had the call, or retires without reading it),
        or died with its template (killed from outside), is replaced and the call runs once more, on a new worker.
        """
        outcome = self._run_once(request, llm)
        if outcome is None:
            outcome = self._run_once(request, llm)
        if outcome is None:
            return Outcome(
                failure=Failure.CRASHED,
                detail="two metric worker processes in a row could not take the call (score shut or stopped them, "
                "or their template was killed); both were replaced",
            )
        return outcome

    def _run_once(self, request: CallRequest, llm: LLMHandler | None) -> Outcome | None:
        """One attempt at the call; None when the worker was gone through no fault of this call (see run)."""
        try:
            worker = self._acquire()
            while not worker.healthy():  # it exited (an earlier call, its template killed) or spoke out of turn
                self._discard(worker)
                worker = self._acquire()
        except (MetricLoadError, FileNotFoundError) as exc:  # starting a worker is never the call's failure
            return Outcome(failure=Failure.LOAD, detail=str(exc))
        except WorkerError as exc:
            return Outcome(failure=Failure.LOAD if not self._closed else Failure.CRASHED, detail=str(exc))
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
        try:
            worker.send(data)
        except OSError:  # shut, closed or not reading: it never had the whole call, so score did not run
            self._discard(worker)
            return None
        except BaseException:  # a Ctrl-C while sending: no worker is lost to the pool
            self._discard(worker)
            raise
        return self._answer(worker, call_id, llm)

    def _answer(self, worker: WorkerProcess, call_id: int, llm: LLMHandler | None) -> Outcome | None:
        """The outcome of the call `worker` was sent (None: it will not answer it, see run); the worker is then kept
        for the next call, or replaced."""
        try:
            outcome, keep = self._await(worker, call_id, llm)
        except _NotTaken:
            self._discard(worker)
            return None
        except Gone:
            self._discard(worker)
            if isinstance(worker, ForkedWorker) and worker.returncode is None and not worker.template.alive:
                return None  # it died with its template, killed from outside: not the metric's doing
            return self._with_output(worker, Outcome(
                failure=Failure.CRASHED,
                detail=f"the metric's worker process {exit_text(worker.returncode)} during the call "
                "(sys.exit, os._exit, a crash or a signal in score); a new worker takes the next call",
            ))
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
        outcome = self._with_output(worker, outcome)
        if keep and not self._retire(worker):
            self._release(worker)
        else:
            self._discard(worker)
        return outcome

    def _with_output(self, worker: WorkerProcess, outcome: Outcome) -> Outcome:
        """The outcome with what score wrote to stdout and stderr during the call (bounded), logged as well."""
        output = worker.output.take()
        if output is None:
            return outcome
        if not self._output_logged:
            self._output_logged = True
            logger.warning("skynet-dspy: %s wrote to stdout/stderr during a call (shown once here; each call's "
                           "first 4 kB are kept in its result's `output`, and logged at DEBUG level):\n%s",
                           self.info.label, output)
        else:
            logger.debug("skynet-dspy: %s wrote during a call:\n%s", self.info.label, output)
        result = None if outcome.result is None else replace(outcome.result, output=output)
        return replace(outcome, result=result, output=output)

    def _await(self, worker: WorkerProcess, call_id: int, llm: LLMHandler | None) -> tuple[Outcome, bool]:
        scope = CallScope()  # ended with the call: its llm() requests still waiting or retrying stop
        try:
            return self._await_in(worker, call_id, scope.bind(llm))
        finally:
            scope.end()

    def _await_in(self, worker: WorkerProcess, call_id: int, llm: LLMHandler | None) -> tuple[Outcome, bool]:
        deadline = time.monotonic() + self.timeout
        refused = 0
        while True:
            if self.max_memory is None:
                message = worker.wait(deadline)
            else:
                message = worker.wait(min(deadline, time.monotonic() + _MEMORY_CHECK))
                if message is None and time.monotonic() < deadline:
                    used = private_memory(worker.metric_pid)
                    if used is not None and used > self.max_memory:
                        return Outcome(
                            failure=Failure.MEMORY,
                            detail=f"score()'s worker process held {used / 2**20:.0f} MiB, past worker_max_memory "
                            f"({self.max_memory / 2**20:.0f} MiB); it was stopped and is replaced",
                        ), False
                    continue
            if message is None:
                return Outcome(
                    failure=Failure.TIMEOUT,
                    detail=f"score() did not return within {self.timeout:g} s; its worker process was killed",
                ), False
            kind = message.get("kind") if isinstance(message, dict) else None
            if kind == "llm":
                if not serve_llm(worker, message, call_id, llm):
                    refused += 1
                    if refused > _MAX_REFUSED:
                        return Outcome(
                            failure=Failure.CRASHED,
                            detail=f"score() sent more than {_MAX_REFUSED} llm() requests beyond the "
                            f"{MAX_LLM_AT_ONCE} at once a call may make; its worker process was stopped",
                        ), False
            elif kind == "outcome" and message.get("call") == call_id:
                worker.answered = call_id
                outcome = checked_again(wire.outcome_from_plain(message.get("outcome")), self.feedback_limit)
                return outcome, not message.get("retire")
            elif _late(message, worker):
                continue
            else:
                unexpected = "the metric's worker process sent an unexpected reply"
                return Outcome(failure=Failure.CRASHED, detail=unexpected), False

    def close(self) -> None:
        """Stop every worker of this metric (calls in progress end as failures)."""
        if os.getpid() != self._owner:  # a fork of the user's process: the workers are its parent's
            self._forget_inherited_workers()
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
        self._helper_lock = threading.Lock()
        self._idle, self._workers, self._loading, self._starting, self._waiting = [], set(), set(), 0, 0
        self._helpers, self._template = [], None  # a new template starts with the next worker
        self._owner = os.getpid()
        self._pool = uuid.uuid4().hex
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._loading, self._helpers, self._owner)

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of this metric's live workers (for tests and for the curious)."""
        with self._cond:
            return sorted(worker.pid for worker in self._workers)


def checked_again(outcome: Outcome, feedback_limit: int) -> Outcome:
    """A worker's result checked again here, against the same rules (a metric may write its own replies; a Ray
    node's worker is checked by its node, and again on the driver)."""
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


def _late(message: Any, worker: WorkerProcess) -> bool:
    """Whether `message` is the worker's own reply to the call it last answered, which a reply the metric forged
    answered first (sandbox=True runs hostile code): passed over once, as the worker reads the call in progress
    next; _NotTaken when it says the worker retires (it then exits without reading it)."""
    answered, worker.answered = worker.answered, None
    if answered is None or not isinstance(message, dict) or (message.get("kind"), message.get("call")) != (
        "outcome", answered
    ):
        return False
    if message.get("retire"):
        raise _NotTaken
    return True


def _kill_all(
    workers: set[WorkerProcess], loading: set[WorkerProcess], helpers: list[Template], owner: int
) -> None:
    if os.getpid() != owner:  # a fork of the user's process: the workers are its parent's, not ours to stop
        return
    for worker in [*workers, *loading]:
        worker.kill()
    workers.clear()
    for helper in list(helpers):
        helper.close()
    helpers.clear()


def _start_mode(start: str | None) -> str:
    mode = start or os.environ.get(START_VARIABLE) or "template"
    if mode not in START_MODES:
        raise ValueError(f"the worker start mode must be one of {START_MODES}, got {mode!r}")
    return mode if mode == "fresh" or template_supported() else "fresh"


def _log_fallback(unsafe: list[str]) -> None:
    """Say once why workers start as fresh interpreters: the metric's import left threads running, or sockets,
    pipes or event descriptors open."""
    key = tuple(sorted(unsafe))
    if key in _fallbacks_logged:
        return
    _fallbacks_logged.add(key)
    logger.warning(
        "skynet-dspy: importing the metric left %s; a process with threads cannot be forked safely, and forked "
        "workers would share one connection (one worker reading another's replies), so each worker process "
        "imports the metric itself (slower to start, and no memory shared). Open connections inside score (or "
        "lazily, once per process) to avoid this; for threads a native library started, capping them "
        "(e.g. OMP_NUM_THREADS=1, the default) may avoid it.",
        ", ".join(unsafe[:5]) + (f" and {len(unsafe) - 5} more" if len(unsafe) > 5 else ""),
    )
