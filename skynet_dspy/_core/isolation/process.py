"""isolation="process" (the default): a pool of worker processes per metric, forked from a template that imported it
once (template.py), grown to the concurrency used; each call is one exchange under the timeout (past it, the worker
and all it started are killed). pebble's round trip alone takes about this module's whole call (`make bench`, 6b).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import uuid
import weakref
from dataclasses import replace
from functools import cache
from typing import Any

from ..call import CallRequest
from ..context import CallScope, LLMHandler
from ..errors import MetricLoadError, WorkerError
from ..logs import logger
from ..types import Failure, MetricInfo, Outcome
from ..values import exception_text
from . import wire
from .handle import MAX_LLM_AT_ONCE, STARTUP_TIMEOUT, Gone, WorkerProcess, exit_text, private_memory
from .sandbox import Sandbox
from .source import source_spec
from .template import Template, supported

DEFAULT_MAX_WORKERS = 32
START_VARIABLE = "SKYNET_DSPY_WORKER_START"  # internal: "fresh" forces fresh workers, for tests and benchmarks
_MAX_REFUSED = 1000  # refused llm() requests in one call before it is ended as a flood (each is answered here)
_GROWTH_PAUSE = 5.0  # seconds the pool does not grow after a worker failed to start (unless it has no worker)
_MEMORY_CHECK = 0.05  # seconds between looks at a busy worker's memory, when worker_max_memory is set
_MAX_FRESH_STARTS = max(2, os.cpu_count() or 2)  # fresh interpreters importing the metric at once, at most


class ProcessExecutor:
    """The metric in worker processes. `max_calls` replaces a worker after that many calls, `max_memory` (bytes) once
    it holds more memory of its own between calls (mid-call, the call fails as `memory`); `launcher` starts the
    templates another way (sandbox.py: in bubblewrap)."""

    def __init__(self, source: Any, timeout: float, feedback_limit: int, max_workers: int | None = None, *,
                 max_calls: int | None = None, max_memory: int | None = None, launcher: Sandbox | None = None):
        self.timeout = timeout
        self.launcher = launcher
        self.feedback_limit = feedback_limit
        self.max_workers = max_workers or DEFAULT_MAX_WORKERS
        self.max_calls = max_calls
        self.max_memory = max_memory
        if not supported():
            raise WorkerError("worker processes need Linux 5.3 or newer (fork, pidfds); use isolation='thread' here")
        self.start_mode = "fresh" if os.environ.get(START_VARIABLE) == "fresh" else "template"
        # a call waits this long at most for a worker to start; it is never charged to the call's timeout
        self.start_timeout = timeout + STARTUP_TIMEOUT
        self._spec = source_spec(source)
        self._start_failures = 0
        self._start_error: BaseException | None = None
        self._start_failed_at = -math.inf
        self._closed = False
        self._output_logged = False
        self._call_ids = itertools.count(1)
        self._new_pool()
        try:
            worker = self._new_worker(timeout)  # a MetricLoadError here is load_metric()'s
        except BaseException:
            self._finalizer()  # the template started so far goes now, not when this is collected
            raise
        self.info: MetricInfo = worker.template.info  # type: ignore[assignment]  # set by _loaded
        with self._cond:
            self._workers.add(worker)
        self._release(worker)

    def _new_pool(self) -> None:
        """No worker yet, and a new template with the next one."""
        self._cond = threading.Condition()
        self._helper_lock = threading.Lock()
        self._idle: list[WorkerProcess] = []
        self._workers: set[WorkerProcess] = set()  # every live worker, busy or idle
        self._helpers: set[Template] = set()  # every live template: the pool's, or each fresh worker's
        self._template: Template | None = None
        self._starting = 0
        self._waiting = 0  # calls waiting for a worker
        self._owner = os.getpid()
        self._pool = uuid.uuid4().hex  # the pool's mark: every worker's mark starts with it (tree.py)
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._helpers, self._owner)

    # -- starting workers ------------------------------------------------------------------------

    def _loaded(self, seconds: float) -> Template:
        """A new template that imported the metric (within `seconds` of its start)."""
        template = Template(self._pool, self.launcher)
        with self._cond:
            self._helpers.add(template)
        try:
            template.load(self._spec, self.feedback_limit, seconds, self.timeout)
        except BaseException:
            self._drop(template)
            raise
        return template

    def _drop(self, template: Template) -> None:
        template.close()
        with self._cond:
            self._helpers.discard(template)

    def _new_worker(self, seconds: float) -> WorkerProcess:
        """A new worker with the metric loaded: forked from the template, or (the template unsafe to fork) a new
        template that imports it and serves the calls itself (within `seconds` of its start)."""
        token = f"{self._pool}.{uuid.uuid4().hex}"
        with self._helper_lock:
            template = self._template
            if self.start_mode == "template" and (template is None or not template.alive):  # none yet, or killed
                if template is not None:
                    self._drop(template)
                self._template = template = self._loaded(seconds)
                if template.unsafe:
                    _log_fallback(tuple(sorted(template.unsafe)))
                    self.start_mode, self._template = "fresh", None
            fork = self.start_mode == "template"
        if fork and template is not None:
            return WorkerProcess(template, self.timeout, token)
        template = template or self._loaded(seconds)  # the unsafe template serves; a fresh worker is a template
        try:
            return WorkerProcess(template, self.timeout, token, serving=True)
        except BaseException:
            self._drop(template)
            raise

    def _grow(self) -> None:
        """Start one worker in the background; waiting calls take it, or whichever worker is idle first."""
        try:
            worker = self._new_worker(self.start_timeout)
        except BaseException as exc:  # noqa: BLE001 - a failed start is reported to the waiting calls
            worker, self._start_error = None, exc
        with self._cond:
            self._starting -= 1
            self._cond.notify_all()  # one waiter takes it (or sees it failed); the others may start more meanwhile
            if worker is None:
                self._start_failures += 1
                self._start_failed_at = time.monotonic()
                return
            if not self._closed:
                self._workers.add(worker)
                self._idle.append(worker)
                return
        worker.kill()

    # -- the pool ------------------------------------------------------------------------------

    def _acquire(self) -> WorkerProcess:
        """An idle worker, or the first one ready: MetricLoadError when none could start (not the call's fault)."""
        if os.getpid() != self._owner:
            self._forget_inherited_workers()
        deadline = time.monotonic() + self.start_timeout
        with self._cond:
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
                        raise MetricLoadError(f"a new worker process could not load the metric: {self._start_error}")
                    self._start_one_if_due(now, empty)
                    if now >= deadline and len(self._workers) < self.max_workers:  # a full pool: wait for a worker
                        raise MetricLoadError(f"no metric worker process was ready within {self.start_timeout:g} s")
                    self._cond.wait(min(deadline - now, _GROWTH_PAUSE) if deadline > now else _GROWTH_PAUSE)
            finally:
                self._waiting -= 1

    def _start_one_if_due(self, now: float, empty: bool) -> None:
        """Start a worker in the background unless the pool is full, as many are starting as calls wait (it grows
        to the concurrency used), or one failed to start in the last _GROWTH_PAUSE (unless it has none)."""
        limit = min(self._waiting, _MAX_FRESH_STARTS if self.start_mode == "fresh" else self.max_workers)
        if (len(self._workers) + self._starting < self.max_workers and self._starting < limit
                and (empty or now - self._start_failed_at > _GROWTH_PAUSE)):
            self._starting += 1
            threading.Thread(target=self._grow, name="skynet-worker-start", daemon=True).start()

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
            if worker.serving:
                self._helpers.discard(worker.template)
            self._cond.notify_all()  # room for a new worker: a waiting call may start one

    def _retire(self, worker: WorkerProcess) -> bool:
        """Whether a worker that answered its call is replaced now (worker_max_calls, worker_max_memory)."""
        worker.calls += 1
        if self.max_calls is not None and worker.calls >= self.max_calls:
            return True
        return self.max_memory is not None and self._over_memory(worker) is not None

    # -- a call ----------------------------------------------------------------------------

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score in a worker; an Outcome whatever the metric does (loops, hangs, exits, forks). A worker
        that could not take the call, or died with its template, is replaced and the call runs once more."""
        for _ in range(2):
            outcome = self._run_once(request, llm)
            if outcome is not None:
                return outcome
        return Outcome(
            failure=Failure.CRASHED,
            detail="two metric worker processes in a row could not take the call (score shut or stopped them, "
            "or their template was killed); both were replaced",
        )

    def _run_once(self, request: CallRequest, llm: LLMHandler | None) -> Outcome | None:
        """One attempt at the call; None when the worker was gone through no fault of this call."""
        try:
            worker = self._acquire()
            while not worker.healthy():  # it exited (an earlier call, its template killed) or spoke out of turn
                self._discard(worker)
                worker = self._acquire()
        except (MetricLoadError, FileNotFoundError, WorkerError) as exc:  # a worker's start is never the call's failure
            return Outcome(failure=Failure.CRASHED if self._closed else Failure.LOAD, detail=str(exc))
        call_id = next(self._call_ids)
        try:
            data = wire.to_worker(("call", call_id, request.args()))
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
        """The outcome of the call `worker` was sent (None: it died with its template); the worker is then kept
        for the next call, or replaced."""
        scope = CallScope()  # ended with the call: its llm() requests still waiting or retrying stop
        try:
            outcome, keep = self._await(worker, call_id, scope.bind(llm))
        except Gone:
            self._discard(worker)
            if not worker.serving and worker.returncode is None and not worker.template.alive:
                return None  # it died with its template, killed from outside: not the metric's doing
            return self._with_output(worker, Outcome(
                failure=Failure.CRASHED,
                detail=f"the metric's worker process {exit_text(worker.returncode)} during the call "
                "(sys.exit, os._exit, a crash or a signal in score); a new worker takes the next call",
            ))
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the worker is not reused, and the run goes on
            self._discard(worker)
            return Outcome(
                failure=Failure.CRASHED,
                detail=f"the reply of the metric's worker process could not be read ({exception_text(exc)})",
            )
        except BaseException:  # a Ctrl-C in the user's process: it propagates, and no worker is lost to the pool
            self._discard(worker)
            raise
        finally:
            scope.end()
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
        deadline = time.monotonic() + self.timeout
        refused = 0
        while True:
            step = deadline if self.max_memory is None else min(deadline, time.monotonic() + _MEMORY_CHECK)
            message = worker.wait(step)
            if message is None and time.monotonic() < deadline:  # a look at its memory (worker_max_memory)
                too_much = self._over_memory(worker)
                if too_much is not None:
                    return too_much, False
                continue
            if message is None:
                return Outcome(
                    failure=Failure.TIMEOUT,
                    detail=f"score() did not return within {self.timeout:g} s; its worker process was killed",
                ), False
            kind = message.get("kind") if isinstance(message, dict) else None
            if kind == "llm":
                if not worker.serve_llm(message, call_id, llm):
                    refused += 1
                    if refused > _MAX_REFUSED:
                        return Outcome(
                            failure=Failure.CRASHED,
                            detail=f"score() sent more than {_MAX_REFUSED} llm() requests beyond the "
                            f"{MAX_LLM_AT_ONCE} at once a call may make; its worker process was stopped",
                        ), False
            elif kind == "outcome" and message.get("call") == call_id:
                worker.answered = call_id
                outcome = wire.outcome_from_plain(message.get("outcome"), self.feedback_limit)
                return outcome, not message.get("retire")
            elif kind == "outcome" and message.get("call") == worker.answered:
                worker.answered = None  # the last call's own reply, after one the metric forged: passed over
            else:
                unexpected = "the metric's worker process sent an unexpected reply"
                return Outcome(failure=Failure.CRASHED, detail=unexpected), False

    def _over_memory(self, worker: WorkerProcess) -> Outcome | None:
        used, limit = private_memory(worker.pid), self.max_memory or 0
        if used is None or used <= limit:
            return None
        return Outcome(
            failure=Failure.MEMORY,
            detail=f"score()'s worker process held {used / 2**20:.0f} MiB, past worker_max_memory "
            f"({limit / 2**20:.0f} MiB); it was stopped and is replaced",
        )

    def close(self) -> None:
        """Stop every worker of this metric (calls in progress end as failures)."""
        if os.getpid() != self._owner:  # a fork of the user's process: the workers are its parent's
            self._forget_inherited_workers()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._finalizer()  # kills every worker, idle or busy, and every template

    def _forget_inherited_workers(self) -> None:
        """In a fork of the user's process, leave the parent's workers alone and start our own."""
        self._finalizer.detach()
        self._new_pool()

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of this metric's live workers (for tests and for the curious)."""
        with self._cond:
            return sorted(worker.pid for worker in self._workers)


def _kill_all(workers: set[WorkerProcess], helpers: set[Template], owner: int) -> None:
    if os.getpid() != owner:  # a fork of the user's process: the workers are its parent's, not ours to stop
        return
    for worker in list(workers):
        worker.kill()
    for helper in list(helpers):
        helper.close()
    workers.clear()
    helpers.clear()


@cache
def _log_fallback(unsafe: tuple[str, ...]) -> None:
    """Say once why workers start as fresh interpreters: the metric's import left threads running, or sockets,
    pipes or event descriptors open."""
    logger.warning(
        "skynet-dspy: importing the metric left %s; a process with threads cannot be forked safely, and forked "
        "workers would share one connection (one worker reading another's replies), so each worker process "
        "imports the metric itself (slower to start, and no memory shared). Open connections inside score (or "
        "lazily, once per process) to avoid this; for threads a native library started, capping them "
        "(e.g. OMP_NUM_THREADS=1, the default) may avoid it.",
        ", ".join(unsafe[:5]) + (f" and {len(unsafe) - 5} more" if len(unsafe) > 5 else ""),
    )
