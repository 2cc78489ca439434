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
about 1.5x this module's whole call (97 vs 65 µs median); its shared task channel would also let a
process forked inside score take tasks. So this module manages its processes itself, in the simplest
way that keeps those promises.
"""

from __future__ import annotations

import itertools
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Any

from ..call import CallRequest
from ..context import LLMHandler
from ..errors import LLMCallError, MetricLoadError, ModelNotConfigured, SpendCapReached, WorkerError
from ..secrets import credential_free_environment
from ..types import Failure, Item, MetricInfo, Outcome
from ..values import exception_text
from . import wire

DEFAULT_MAX_WORKERS = 32
STARTUP_TIMEOUT = 60.0  # seconds a new interpreter may take to be ready (a loaded machine)
_STOP_GRACE = 1.0  # seconds a worker told to stop may take before it is killed
_MAX_LLM_AT_ONCE = 16  # llm() requests one worker may have in flight; more are refused at once
_WORKER_CODE = "from skynet_dspy._core.isolation.worker import main; main()"


class _Gone(Exception):
    """The worker process exited (or its socket closed) while a reply was awaited."""


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class _Worker:
    """One worker process and its socket; used by one calling thread at a time."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=_worker_environment(),
                cwd=os.getcwd(),
                stdin=subprocess.DEVNULL,
                stdout=_stream(),
                stderr=_stream(),
                start_new_session=True,  # its own process group: killing it kills what it forked
            )
        except OSError as exc:
            ours.close()
            raise WorkerError(f"could not start a metric worker process ({sys.executable}): {exc}") from None
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.send_lock = threading.Lock()
        self.pid = self.proc.pid
        self._pidfd = _pidfd(self.pid)
        self._poller = select.poll()
        self._poller.register(self.conn.fileno(), select.POLLIN)
        if self._pidfd is not None:
            self._poller.register(self._pidfd, select.POLLIN)
        self.info: MetricInfo | None = None
        self.llm_slots = threading.BoundedSemaphore(_MAX_LLM_AT_ONCE)
        try:
            ready = self.wait(time.monotonic() + STARTUP_TIMEOUT)
        except _Gone:
            ready = None
        if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
            self.kill()
            raise WorkerError(
                f"a metric worker process did not start ({_exit_text(self.proc.returncode)}; its error output, "
                "if any, is above)"
            )

    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.conn.send_bytes(data)

    def wait(self, deadline: float) -> Any:
        """The worker's next message, or None at the deadline; _Gone when the process is gone."""
        conn_fd = self.conn.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._pidfd is None:  # no pidfd (not Linux): look at the process every quarter second
                remaining = min(remaining, 0.25)
                if self.proc.poll() is not None and not self.conn.poll(0):
                    raise _Gone
            events = self._poller.poll(math.ceil(remaining * 1000))
            if not events:
                continue
            if any(fd == conn_fd for fd, _ in events) or self.conn.poll(0):
                try:
                    return wire.from_worker(self.conn.recv_bytes())
                except (EOFError, OSError):
                    raise _Gone from None
                except Exception:  # a reply that is not plain data: the worker is not to be trusted
                    raise _Gone from None
            raise _Gone  # only the pidfd is readable: the process exited

    def kill(self) -> None:
        """Kill the worker and everything it forked, and reap it (no zombie is left)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self._close()

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within a second."""
        try:
            self.send(wire.to_worker(("stop",)))
            self.proc.wait(_STOP_GRACE)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        self.kill()

    def _close(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self._pidfd is not None:
            try:
                os.close(self._pidfd)
            except OSError:
                pass
            self._pidfd = None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # readable once the process exits: no polling for its death
    except (AttributeError, OSError):
        return None


def _stream() -> int | None:
    """Where a worker's prints go: the user's stderr (never stdout, which may carry a report)."""
    try:
        return sys.__stderr__.fileno() if sys.__stderr__ is not None else None
    except (AttributeError, OSError, ValueError):
        return None


def _worker_environment() -> dict[str, str]:
    """The user's environment without credentials, with this Python's import path (the user's script dir too)."""
    env = credential_free_environment()
    paths = [entry or os.getcwd() for entry in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"  # a metric's prints arrive even when it exits without flushing
    return env


def source_spec(source: Any) -> dict[str, Any]:
    """How a worker finds the metric: a file path, an importable module name, or the pickled `score`.

    A callable cloudpickle cannot send is a MetricLoadError naming isolation="thread".
    """
    if isinstance(source, (str, Path)):
        return {"path": str(source)}
    if isinstance(source, ModuleType):
        name = source.__name__
        if name != "__main__" and not name.startswith("skynet_metric_") and getattr(source, "__spec__", None):
            return {"module": name}
        if getattr(source, "__file__", None):
            return {"path": source.__file__}
        source = getattr(source, "score", None)
        if not callable(source):
            raise MetricLoadError(f"the module {name} defines no function named `score`")
    elif not callable(source):
        from ..loading import load

        load(source)  # raises the TypeError naming what a source may be, here rather than in a worker
    import inspect

    import cloudpickle

    try:
        pickled = cloudpickle.dumps(source, protocol=wire.PROTOCOL)
    except Exception as exc:
        shown = getattr(source, "__qualname__", type(source).__name__)
        raise MetricLoadError(
            f"{shown} cannot be sent to a metric worker process ({exception_text(exc)}). Define score in a "
            "metric.py and load that file, make it a plain module-level function, or run it in this process "
            "with load_metric(..., isolation='thread')"
        ) from None
    import linecache

    owner = inspect.getmodule(source)
    spec = getattr(owner, "REWARD_SPEC", None) if owner is not None else None
    file = getattr(getattr(source, "__code__", None), "co_filename", None)
    lines = linecache.getlines(file) if file else []  # a notebook cell's source lives only in this process
    return {
        "pickled": pickled,
        "reward_spec": wire.to_plain(spec) if isinstance(spec, dict) else None,
        "file": file,
        "source": lines if sum(map(len, lines)) < 1_000_000 else [],
    }


class ProcessExecutor:
    """The metric in worker processes: loaded in the first worker now, in later ones as they start."""

    isolation = "process"

    def __init__(self, source: Any, timeout: float, feedback_limit: int, max_workers: int | None = None):
        self.timeout = timeout
        self.feedback_limit = feedback_limit
        self.max_workers = max_workers or DEFAULT_MAX_WORKERS
        self._spec = source_spec(source)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()  # every live worker, busy or idle
        self._starting = 0
        self._closed = False
        self._call_ids = itertools.count(1)
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._owner)
        worker = self._start()  # loads the metric: a MetricLoadError here is load_metric()'s
        self.info: MetricInfo = worker.info  # type: ignore[assignment]
        self._release(worker)

    # -- the pool ------------------------------------------------------------------------------

    def _start(self) -> _Worker:
        """A new worker with the metric loaded (under the metric's timeout)."""
        worker = _Worker()
        with self._cond:
            self._workers.add(worker)
        try:
            worker.send(wire.to_worker(("load", self._spec, self.feedback_limit)))
            reply = worker.wait(time.monotonic() + self.timeout)
        except _Gone:
            self._discard(worker)
            raise MetricLoadError(
                f"importing the metric {_exit_text(worker.proc.returncode)} (in its worker process); fix the "
                "module-level code so the file imports cleanly"
            ) from None
        if not isinstance(reply, tuple) or len(reply) < 2:
            self._discard(worker)
            raise MetricLoadError(
                f"importing the metric did not finish within the {self.timeout:g} s timeout; move slow work "
                "out of the module's top level (into score, or cache it), or raise timeout="
            )
        if reply[0] == "load_failed" and len(reply) == 3:
            self._discard(worker)
            if reply[2] == "not_found":
                raise FileNotFoundError(reply[1])
            raise MetricLoadError(reply[1], Item(reply[2]) if reply[2] in set(Item) else Item.LOADS)
        worker.info = wire.info_from_plain(reply[1])
        return worker

    def _acquire(self) -> _Worker:
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

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed and worker in self._workers:
                self._idle.append(worker)
                self._cond.notify()
                return
        self._discard(worker)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            self._workers.discard(worker)
            self._cond.notify()

    # -- a call ----------------------------------------------------------------------------

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score in a worker; an Outcome whatever the metric does (loops, hangs, exits, forks)."""
        try:
            worker = self._acquire()
        except MetricLoadError as exc:
            return Outcome(failure=Failure.CRASHED, detail=f"a new worker process could not load the metric: {exc}")
        except WorkerError as exc:
            return Outcome(failure=Failure.CRASHED, detail=str(exc))
        call_id = next(self._call_ids)
        observation = asdict(request.observation) if request.observation is not None else None
        try:
            data = wire.to_worker((
                "call", call_id, request.input, request.output, request.expected, observation,
                request.unmeasured_reason,
            ))
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
            outcome, keep = self._await(worker, call_id, llm)
        except _Gone:
            self._discard(worker)
            return Outcome(
                failure=Failure.CRASHED,
                detail=f"the metric's worker process {_exit_text(worker.proc.returncode)} during the call "
                "(sys.exit, os._exit, a crash or a signal in score); a new worker takes the next call",
            )
        except OSError:
            self._discard(worker)
            return Outcome(failure=Failure.CRASHED, detail="the metric's worker process closed its connection")
        if keep:
            self._release(worker)
        else:
            self._discard(worker)
        return outcome

    def _await(self, worker: _Worker, call_id: int, llm: LLMHandler | None) -> tuple[Outcome, bool]:
        deadline = time.monotonic() + self.timeout
        while True:
            message = worker.wait(deadline)
            if message is None:
                return Outcome(
                    failure=Failure.TIMEOUT,
                    detail=f"score() did not return within {self.timeout:g} s; its worker process was killed",
                ), False
            kind = message[0] if isinstance(message, tuple) and message else None
            if kind == "llm":
                _serve_llm(worker, message, call_id, llm)
            elif kind == "outcome" and len(message) == 4 and message[1] == call_id:
                return wire.outcome_from_plain(message[2]), not message[3]
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


def _kill_all(workers: set[_Worker], owner: int) -> None:
    if os.getpid() != owner:  # a fork of the user's process: the workers are its parent's, not ours to stop
        return
    for worker in list(workers):
        worker.kill()
    workers.clear()


_ERRORS: tuple[tuple[type[BaseException], Failure], ...] = (
    (ModelNotConfigured, Failure.JUDGE_NOT_CONFIGURED),
    (SpendCapReached, Failure.SPEND_CAP),
)


def _serve_llm(worker: _Worker, message: tuple[Any, ...], call_id: int, llm: LLMHandler | None) -> None:
    """Answer a worker's llm() request on a helper thread, so the call's timeout keeps running meanwhile."""
    if len(message) != 6:
        return
    _, asked_for, request_id, instructions, input_text, settings = message
    if not worker.llm_slots.acquire(blocking=False):
        _reply(worker, ("llm_reply", request_id, "error", str(Failure.JUDGE_ERROR),
                        f"more than {_MAX_LLM_AT_ONCE} llm() calls at once from one metric call", None, False))
        return

    def answer() -> None:
        try:
            if asked_for != call_id:
                raise LLMCallError("llm() was called after its metric call had ended")
            if llm is None:
                raise ModelNotConfigured("skynet.llm() has no model to call")
            if not isinstance(instructions, str) or not (input_text is None or isinstance(input_text, str)):
                raise LLMCallError("llm() takes instructions and input as str")
            text = llm(instructions, input_text, settings if isinstance(settings, dict) else {})
            reply: tuple[Any, ...] = ("llm_reply", request_id, "ok", str(text))
        except LLMCallError as exc:
            reply = ("llm_reply", request_id, "error", str(Failure.JUDGE_ERROR), str(exc), exc.status, exc.refused)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, or the worker would wait forever
            kind = next((kind for exc_type, kind in _ERRORS if isinstance(exc, exc_type)), Failure.JUDGE_ERROR)
            text = str(exc) if kind is not Failure.JUDGE_ERROR else exception_text(exc)
            reply = ("llm_reply", request_id, "error", str(kind), text, None, False)
        worker.llm_slots.release()
        _reply(worker, reply)

    threading.Thread(target=answer, name="skynet-llm-for-worker", daemon=True).start()


def _reply(worker: _Worker, reply: tuple[Any, ...]) -> None:
    try:
        worker.send(wire.to_worker(reply))
    except (OSError, ValueError):  # the worker is gone (timed out, killed): nobody is waiting
        pass
