"""The metric worker: runs one loaded metric's calls, one at a time, forked from the template (template.py). It never
imports dspy or litellm; only plain values go back (wire.py); llm() goes to the user's process. A fork inside score
fails the call and retires the worker.
"""

from __future__ import annotations

import ctypes
import importlib
import linecache
import os
import pickle
import resource
import signal
import sys
import threading
import types
from contextlib import suppress
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from ..call import CallRequest, run_call
from ..errors import LLMCallError, MetricLoadError, judge_error
from ..loading import LoadedMetric, load, register_skynet
from ..types import Failure, Item, Outcome
from ..values import exception_text
from . import tree, wire
from .handle import MEMORY_VARIABLE, PARENT_VARIABLE

_worker_pid = os.getpid()
# Taken before the metric loads, which may replace what the os module holds.
_exit, _getppid, _close, _dup2 = os._exit, os.getppid, os.close, os.dup2
_libc = ctypes.CDLL(None)
_forked = threading.Event()  # set when score calls os.fork() during the call in progress


class _ParentLLM:
    """llm() inside the worker: the request goes to the user's process, which calls the judge."""

    def __init__(self, conn: Connection, send_lock: threading.Lock):
        self._conn = conn
        self._send_lock = send_lock
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._replies: dict[int, dict[str, Any]] = {}
        self._next = 0
        self._in_flight = 0  # requests sent and not yet answered
        self.call_id = 0  # the call in progress; 0 between calls

    def __call__(self, instructions: str, input: str | None, settings: dict[str, Any]) -> str:
        if os.getpid() != _worker_pid:
            raise RuntimeError("llm() cannot be called from a process forked inside score()")
        with self._lock:
            if not self.call_id:  # a thread of the metric's, after its call: the socket is the main loop's now
                raise LLMCallError("llm() was called after its metric call had ended")
            self._next += 1
            request_id = self._next
            self._in_flight += 1
            call_id = self.call_id
        try:
            message = {
                "kind": "llm", "call": call_id, "request": request_id, "instructions": instructions,
                "input": input, "settings": wire.to_plain(settings),
            }
            with self._send_lock:
                self._conn.send_bytes(wire.to_parent(message))
            reply = self._await(request_id)
        finally:
            with self._lock:
                self._in_flight -= 1
        if "text" in reply:
            return str(reply["text"])
        raise judge_error(reply["error"])

    def end_call(self) -> bool:
        """End the call in progress: llm() fails at once from now on. True when a request is still awaiting
        its reply: a thread of the metric's would then read the socket beside the main loop, so the worker
        must retire."""
        with self._lock:
            self.call_id = 0
            return self._in_flight > 0

    def _await(self, request_id: int) -> dict[str, Any]:
        """The reply to `request_id`: one thread reads at a time, filing replies for the threads they belong to."""
        with self._reading:
            while request_id not in self._replies:
                message: dict[str, Any] = wire.from_worker(self._conn.recv_bytes())
                self._replies[message["request"]] = message
            return self._replies.pop(request_id)


def _load(spec: dict[str, Any]) -> LoadedMetric:
    if "path" in spec:
        return load(spec["path"], file=spec.get("file"))
    if "module" in spec:
        return load(importlib.import_module(spec["module"]))
    score = pickle.loads(spec["pickled"])
    _restore_file(score, spec.get("file"), spec.get("source") or [])
    loaded = load(score)
    if spec.get("reward_spec") is not None and loaded.reward_spec is None:
        loaded = replace(loaded, reward_spec=spec["reward_spec"])
    return loaded


def _restore_file(score: Any, file: str | None, lines: list[str]) -> None:
    """Give a score sent by value its file name back (cloudpickle drops it), so errors name the file and line."""
    code = getattr(score, "__code__", None)
    if not file or not isinstance(code, types.CodeType) or code.co_filename != "<dynamic-code>":
        return

    def renamed(code: types.CodeType) -> types.CodeType:
        consts = tuple(renamed(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        return code.replace(co_filename=file, co_consts=consts)

    score.__code__ = renamed(code)
    if lines and file not in linecache.cache:
        linecache.cache[file] = (sum(map(len, lines)), None, lines, file)


def load_reply(message: dict[str, Any]) -> tuple[LoadedMetric | None, dict[str, Any]]:
    """Load the metric a `load` message names: the metric (None on failure) and the reply for the user's process."""
    try:
        loaded = _load(message["spec"])
        return loaded, {"kind": "loaded", "info": wire.info_to_plain(loaded.info())}
    except MetricLoadError as exc:
        return None, {"kind": "load_failed", "message": str(exc), "item": str(exc.item)}
    except FileNotFoundError as exc:
        return None, {"kind": "load_failed", "message": str(exc), "item": "not_found"}
    except BaseException as exc:  # noqa: BLE001 - an unloadable pickled score, a hostile import
        return None, {"kind": "load_failed", "item": str(Item.LOADS), "message": "the metric could not be "
                      f"loaded in its worker process: {exception_text(exc)}"}


def _serve(conn: Connection, loaded: LoadedMetric, feedback_limit: int) -> None:
    send_lock = threading.Lock()
    llm = _ParentLLM(conn, send_lock)
    recursion_limit = sys.getrecursionlimit()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    while True:
        try:
            message = wire.from_parent(conn.recv_bytes())  # ("call", its id, CallRequest.args())
        except (EOFError, OSError):  # the user's process closed it: stop
            return
        call_id = llm.call_id = message[1]
        _forked.clear()
        outcome = run_call(loaded, CallRequest(*message[2]), llm, feedback_limit)
        if os.getpid() != _worker_pid:  # the forked child, back from score: it must not go on
            os._exit(0)
        sys.setrecursionlimit(recursion_limit)  # what score may have changed must not break this loop
        if _forked.is_set():
            outcome = Outcome(
                failure=Failure.CRASHED,
                error_type="fork",
                detail="score() started a child process with os.fork(); a metric worker allows no fork, "
                "so the call was not scored and the worker and its children were stopped",
            )
        retire = llm.end_call() or _forked.is_set()  # a thread of the metric's still waits for an llm() reply
        reply = wire.to_parent({"kind": "outcome", "call": call_id, "outcome": wire.outcome_to_plain(outcome),
                                "retire": retire})
        _flush()
        # undone before the reply: a signal score left blocked and pending fails its own call, never the next one
        signal.setitimer(signal.ITIMER_REAL, 0)  # an alarm score set and did not cancel would kill an idle worker
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        with send_lock:
            conn.send_bytes(reply)
        if retire:
            return  # retire after a fork: the user's process stops this worker and its children


def _flush() -> None:
    """Write out what score printed and is still buffered (Python's streams, C's stdio): it belongs to its call."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):  # a stream the metric closed or replaced
            stream.flush()
    _libc.fflush(None)


def die_with(parent: int) -> None:
    """Have the kernel kill this process when `parent` ends (PR_SET_PDEATHSIG, even when it is stopped or stuck),
    or exit now if it already has."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if _getppid() != parent:
        _exit(1)


def prepare() -> None:
    """What the template sets up before the metric is imported."""
    parent = os.environ.pop(PARENT_VARIABLE, None)
    if parent:  # started by the user's process (not in a sandbox, whose bwrap dies with it): die with it
        die_with(int(parent))
    limit = int(os.environ.pop(MEMORY_VARIABLE, 0))
    if limit:  # its workers inherit it
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the user's process's to handle
    os.register_at_fork(after_in_parent=_forked.set)
    register_skynet()


def run(fds: list[int], token: str, loaded: Any, feedback_limit: int, control: list[int]) -> None:
    """Become a worker (a fork of the template, or the template itself): serve the socket fds[0] with the metric
    `loaded` until it closes, its output going to fds[1], the template's `control` descriptors closed; never
    returns."""
    global _worker_pid
    _worker_pid = os.getpid()
    status = 1  # a worker that fails to start says so in its exit code
    try:
        for fd in control:
            _close(fd)
        _dup2(fds[1], 1)
        _dup2(fds[1], 2)
        _close(fds[1])
        os.environ[tree.MARK] = token  # what it starts carries its own mark (tree.py)
        sys.argv[1:] = [str(fds[0])]  # the argument names the worker's socket
        conn = Connection(fds[0])
        conn.send_bytes(wire.to_parent({"kind": "ready"}))
        status = 0
        _serve(conn, loaded, feedback_limit)
    finally:
        tree.kill_descendants(os.getpid(), token)  # the metric's processes end with the worker
        _exit(status)  # no atexit handlers, no flushing of what a forked metric left behind
