"""Running a call under a timeout without being held up by it (SPEC §6).

Python cannot kill a thread, so each call runs on a reusable daemon worker thread and the
caller waits at most `timeout` seconds. A worker whose call overran is left to finish on its
own and then rejoins the pool; at most `max_stuck` such workers exist at once, after which
new calls are refused at once instead of piling up threads.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

DONE, RAISED, TIMED_OUT, OVERLOADED = "done", "raised", "timed_out", "overloaded"
DEFAULT_MAX_STUCK = 16
_MAX_IDLE = 64


class _Job:
    __slots__ = ("fn", "context", "finished", "outcome", "value", "abandoned")

    def __init__(self, fn: Callable[[], Any], context: contextvars.Context):
        self.fn = fn
        self.context = context
        self.finished = threading.Lock()
        self.finished.acquire()
        self.outcome = DONE
        self.value: Any = None
        self.abandoned = False


class _Worker:
    __slots__ = ("pool", "wake", "job")

    def __init__(self, pool: TimeoutRunner):
        self.pool = pool
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: _Job | None = None
        threading.Thread(target=self._loop, name="skynet-metric", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.wake.acquire()
            job = self.job
            if job is None:
                return
            try:
                job.value = job.context.run(job.fn)
            except BaseException as exc:  # SystemExit from a metric is contained too
                job.outcome, job.value = RAISED, exc
            self.job = None
            if not self.pool._finish(self, job):
                return


class TimeoutRunner:
    """Runs callables on pooled worker threads, returning (outcome, value) within a timeout."""

    def __init__(self, max_stuck: int = DEFAULT_MAX_STUCK):
        self.max_stuck = max_stuck
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self.stuck = 0

    def run(self, fn: Callable[[], Any], timeout: float) -> tuple[str, Any]:
        """(DONE, value), (RAISED, exception), (TIMED_OUT, None) or (OVERLOADED, stuck count)."""
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
            elif self.stuck >= self.max_stuck:
                return OVERLOADED, self.stuck
            else:
                worker = None
        if worker is None:
            worker = _Worker(self)
        job = _Job(fn, contextvars.copy_context())
        worker.job = job
        worker.wake.release()
        if job.finished.acquire(timeout=timeout):
            return job.outcome, job.value
        with self._lock:
            if job.finished.acquire(blocking=False):  # finished just as the wait ran out
                return job.outcome, job.value
            job.abandoned = True
            self.stuck += 1
        return TIMED_OUT, None

    def _finish(self, worker: _Worker, job: _Job) -> bool:
        """Hand the result back and return the worker to the pool; False tells it to exit."""
        with self._lock:
            if job.abandoned:
                self.stuck -= 1
            else:
                job.finished.release()
            if len(self._idle) >= _MAX_IDLE:
                return False
            self._idle.append(worker)
            return True
