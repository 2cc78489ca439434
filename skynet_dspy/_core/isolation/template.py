"""The template: one process per pool that imports the metric once and forks a ready worker on demand.

gunicorn's --preload from a fresh DSPy-free interpreter. The user's process sends `load`, `fork` (with the worker's
socket and output pipe) and `reap` (so a killed worker's pid is never reused meanwhile). A template the import left
unsafe to fork (threads, shared sockets or pipes) is told to `serve`: it becomes a worker, as does each later
template. The kernel ends the template with the user's process, and the workers with the template; a reaper kills what
carries the pool's mark (tree.py) once the user's process is gone. The metric's fork hooks never run here.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import select
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..errors import MetricLoadError, WorkerError
from ..logs import logger
from ..secrets import credential_free_environment
from ..types import Item, MetricInfo
from . import tree, wire, worker
from .handle import PARENT_VARIABLE, REQUEST_TIMEOUT, STARTUP_TIMEOUT, Gone, Output, exit_text

if TYPE_CHECKING:
    from .sandbox import Sandbox

PATH_VARIABLE = "SKYNET_DSPY_PATH"  # the user's import path entries a worker appends after its own (JSON)
# Native thread pools a metric's libraries start at import, capped at one thread per worker unless the user set
# them (as loky and joblib do): N workers x all cores would oversubscribe the machine, and a pool's threads make
# the template unsafe to fork.
THREAD_CAPS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")
# Taken before the metric loads, which may replace what the os module holds.
_getpid, _getppid, _fork_process, _setsid, _close, _exit = (
    os.getpid, os.getppid, os.fork, os.setsid, os.close, os._exit)
# Started with -P (no current directory or script folder first): the user's import path goes after the standard
# library and site-packages, never ahead of them.
_TEMPLATE_CODE = (
    f"import json, os, sys; sys.path += [p for p in json.loads(os.environ.pop({PATH_VARIABLE!r}, '[]')) "
    "if p not in sys.path]; from skynet_dspy._core.isolation.template import main; main()"
)
_HOOK_TIMEOUT = 5.0  # seconds a worker waits for the metric's fork hooks before it serves calls anyway
_child_hooks: list[Callable[[], object]] = []  # the metric's os.register_at_fork(after_in_child=...) hooks


def supported() -> bool:
    """Whether workers can be forked from a template here (Linux: fork, pidfds, prctl)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


_Spawns = queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]]
_spawner: tuple[int, _Spawns] | None = None
_spawner_lock = threading.Lock()


def spawn(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """`start()` on one daemon thread that lives as long as this process: the kernel's parent-death signal
    (PR_SET_PDEATHSIG, see worker.prepare) fires when the *thread* that started the process ends, and a calling
    thread (DSPy's) may end any time. A daemon thread, not a ThreadPoolExecutor, whose threads the interpreter waits
    for at exit: a Ctrl-C'd `skynet-dspy score` must exit at once."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or a fork of this process inherited it
            _spawner = (os.getpid(), queue.SimpleQueue())
            threading.Thread(target=_serve_spawns, args=(_spawner[1],), name="skynet-spawner", daemon=True).start()
        requests = _spawner[1]
    started: Future[subprocess.Popen[bytes]] = Future()
    requests.put((start, started))
    try:
        return started.result()
    except BaseException:  # a Ctrl-C while it starts: the process, once started, is not left running
        started.add_done_callback(lambda done: None if done.exception() else done.result().kill())
        raise


def _serve_spawns(requests: _Spawns) -> None:
    while True:
        start, started = requests.get()
        try:
            started.set_result(start())
        except BaseException as exc:  # noqa: BLE001 - given to the caller, which raises it
            started.set_exception(exc)


def worker_environment() -> dict[str, str]:
    """The user's environment without credentials and with native thread pools capped (THREAD_CAPS, unless the
    user set them), and this Python's import path to append after the standard library (PATH_VARIABLE)."""
    env = credential_free_environment()
    paths = [entry or os.getcwd() for entry in sys.path]
    env[PATH_VARIABLE] = json.dumps(list(dict.fromkeys(paths)))
    if "PYTHONPATH" in env:  # the user's own entries keep their place, but never the current directory
        kept = [entry for entry in env["PYTHONPATH"].split(os.pathsep) if entry not in ("", ".")]
        env["PYTHONPATH"] = os.pathsep.join(kept)
    for name in THREAD_CAPS:
        env.setdefault(name, "1")
    env["PYTHONUNBUFFERED"] = "1"  # a metric's prints arrive even when it exits without flushing
    return env


# -- the user's side ------------------------------------------------------------------------------------------


class Template:
    """The template process, seen from the user's process: load the metric once, fork workers, reap them."""

    def __init__(self, pool_token: str, launcher: Sandbox | None = None) -> None:
        ours, theirs = socket.socketpair()
        self._output = tempfile.TemporaryFile()  # what the import prints, logged once (bounded), never shown raw
        # a launcher (sandbox.py) starts it inside bubblewrap: its workers are forked in there, in its PID namespace
        # (bwrap dies with this process; inside, this pid is not the template's parent)
        self.launcher = launcher
        env = {**worker_environment(), tree.MARK: pool_token}
        if launcher is None:
            env[PARENT_VARIABLE] = str(os.getpid())  # it dies with this process (worker.prepare)
        start = launcher.start if launcher is not None else subprocess.Popen
        try:
            self.proc = spawn(lambda: start(
                [sys.executable, "-P", "-c", _TEMPLATE_CODE, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd=os.getcwd(),
                stdin=subprocess.DEVNULL,
                stdout=self._output,
                stderr=self._output,
                start_new_session=True,
            ))
        except OSError as exc:
            ours.close()
            raise WorkerError(f"could not start the metric's template process ({sys.executable}): {exc}") from None
        finally:
            theirs.close()
        self.pid = self.proc.pid
        # messages framed as multiprocessing.Connection's; descriptors for a worker go beside them on the socket
        self._sock, self._conn = ours, Connection(os.dup(ours.fileno()))
        self._lock = threading.Lock()
        self.unsafe: list[str] = []  # why forking it is unsafe after the import (threads, open descriptors)
        self.info: MetricInfo | None = None  # what loading the metric found (process.py)
        try:  # its interpreter has started: what follows (the metric's import) is timed from here
            ready = self._conn.poll(STARTUP_TIMEOUT) and self._conn.recv_bytes()
        except (OSError, EOFError):
            ready = None
        if not ready:
            self.kill()
            printed = self.printed()
            self.close()
            if launcher is not None:
                raise launcher.start_error(printed)
            raise WorkerError(f"the metric's template process did not start ({sys.executable}): {printed}")

    def request(self, message: dict[str, Any], seconds: float, fds: list[int] | None = None) -> dict[str, Any] | None:
        """The template's answer to `message` (with `fds` passed along), None after `seconds` (the template is
        then killed: its answer would come out of turn); Gone when it exited. One request at a time."""
        with self._lock:
            if self.proc.poll() is not None:
                raise Gone
            try:
                self._conn.send_bytes(wire.to_worker(message))
                if fds:
                    socket.send_fds(self._sock, [b"\0"], fds)
                if not self._conn.poll(seconds):
                    self.kill()
                    return None
                data = self._conn.recv_bytes(wire.MAX_MESSAGE)
            except (OSError, EOFError):
                raise Gone from None
        try:
            reply = wire.from_worker(data)
        except Exception:
            raise Gone from None
        if not isinstance(reply, dict):
            raise Gone
        return reply

    def outer_pid(self, pid: int) -> int | None:
        """The pid, as this process sees it, of the template's child `pid` (a pid of the sandbox's PID namespace
        when a launcher started it; found in /proc by the NSpid line of the processes below the template)."""
        if self.launcher is None:
            return pid
        for below in tree.descendants(self.proc.pid):
            try:
                with open(f"/proc/{below}/status", "rb") as file:
                    line = next((line for line in file if line.startswith(b"NSpid:")), b"")
            except OSError:
                continue
            if line.split()[-1:] == [str(pid).encode()]:
                return below
        return None

    def load(self, spec: dict[str, Any], feedback_limit: int, seconds: float, timeout: float) -> None:
        """Import the metric in the template within `seconds` (`info`, `unsafe` set); MetricLoadError (or
        FileNotFoundError) when it did not load."""
        try:
            reply = self.request({"kind": "load", "spec": spec, "feedback_limit": feedback_limit}, seconds)
        except Gone:
            self.kill()
            raise MetricLoadError(f"importing the metric {exit_text(self.proc.returncode)} (in its template "
                                  "process); fix the module-level code so the file imports cleanly") from None
        printed = self.printed()
        if printed:
            logger.info("skynet-dspy: importing the metric printed:\n%s", printed)
        if reply is None:
            raise MetricLoadError(f"importing the metric did not finish within the {timeout:g} s timeout; move slow "
                                  "work out of the module's top level (into score, or cache it), or raise timeout=")
        if reply.get("kind") == "load_failed":
            message, item = str(reply.get("message")), reply.get("item")
            if item == "not_found":
                raise FileNotFoundError(message)
            raise MetricLoadError(message, Item(item) if item in set(Item) else Item.LOADS)
        if reply.get("kind") != "loaded" or not isinstance(reply.get("info"), dict):
            raise MetricLoadError("the metric's worker process answered the load with something else")
        self.unsafe = [str(why) for why in reply["unsafe"]] if isinstance(reply.get("unsafe"), list) else []
        self.info = wire.info_from_plain(reply["info"])

    def printed(self) -> str | None:
        """What the template printed so far (its first few kB), None when nothing."""
        self._output.seek(0)
        output = Output(self._output.fileno())
        output.kept += self._output.read(Output.KEEP)
        output.total = os.fstat(self._output.fileno()).st_size
        return output.take()

    def reap(self, pid: int) -> int | None:
        """Collect a worker that exited (the template is its parent): its exit status as Popen gives it."""
        try:
            reply = self.request({"kind": "reap", "pid": pid}, REQUEST_TIMEOUT)
        except Gone:
            return None
        status = reply.get("status") if reply else None
        return status if isinstance(status, int) else None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with suppress(OSError):
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Kill the template (it runs no call: nothing is lost) and close our ends."""
        self.kill()
        self._conn.close()
        self._sock.close()
        self._output.close()


# -- the template's side --------------------------------------------------------------------------------------


def main() -> None:
    """Entry point of the template process: serve the user's process on the socket given as the first argument."""
    worker.prepare()
    control = socket.socket(fileno=int(sys.argv[1]))
    conn = Connection(os.dup(control.fileno()))
    ours = [control.fileno(), conn.fileno()]
    _start_reaper(os.environ.get(tree.MARK, ""), ours)
    os.register_at_fork = _hold_fork_hook  # the metric's hooks: see _hold_fork_hook
    conn.send_bytes(wire.to_parent({"kind": "ready"}))
    loaded, feedback_limit = None, 0
    while True:
        try:
            message = wire.from_parent(conn.recv_bytes())
        except (EOFError, OSError):
            _exit(0)
        kind = message.get("kind")
        fds = socket.recv_fds(control, 1, 2)[1] if kind in ("fork", "serve") else []
        can_start = len(fds) == 2 and loaded is not None  # a worker's socket and output, and a metric to serve
        if kind == "load":
            feedback_limit = message["feedback_limit"]
            loaded, reply = worker.load_reply(message)
            reply["unsafe"] = _other_threads() + _shared_descriptors(set(ours))
            gc.freeze()  # the collector then never writes to what the import made: those pages stay shared
        elif kind == "serve" and can_start:  # unsafe to fork: become the worker
            conn.send_bytes(wire.to_parent({"kind": "forked", "pid": _getpid()}))
            worker.run(fds, message["token"], loaded, feedback_limit, ours)
        elif kind == "fork" and can_start:
            reply = _fork(partial(worker.run, fds, message["token"], loaded, feedback_limit, ours))
        elif kind == "reap":  # only ever a worker forked here (the user's process reaps each once)
            reply = {"kind": "reaped", "status": _reap(message["pid"])}
        else:
            reply = {"kind": "error"}
        for fd in fds:
            _close(fd)
        conn.send_bytes(wire.to_parent(reply))


def _start_reaper(pool: str, control: list[int]) -> None:
    """Fork the process that kills everything carrying the pool's mark once the user's process is gone (the kernel
    kills the template and its workers then, but not what the workers started and moved); it exits with the
    template otherwise."""
    try:
        user, template = os.pidfd_open(_getppid()), os.pidfd_open(_getpid())
    except OSError:
        return
    if _fork_process() == 0:
        try:
            for fd in control:  # the user's process sees the template's socket close when the template ends
                _close(fd)
            select.select([user, template], [], [])
            if pool and select.select([user], [], [], 0)[0]:
                tree.kill_descendants(None, pool)
        finally:
            _exit(0)
    _close(user)
    _close(template)


def _hold_fork_hook(*, before: Callable[[], object] | None = None, after_in_child: Callable[[], object] | None = None,
                    after_in_parent: Callable[[], object] | None = None) -> None:
    """os.register_at_fork for the metric's code in the template: a hook for the parent's side would run in the
    template, which runs no score (one that hangs would hang every start), so it is dropped; one for the child
    runs in each worker, bounded (_run_child_hooks)."""
    if after_in_child is not None:
        _child_hooks.append(after_in_child)


def _run_child_hooks() -> None:
    """Run the metric's after_in_child hooks (in reverse order, as Python does) on a thread the worker waits for
    at most _HOOK_TIMEOUT: one that raises or hangs never stops the worker from serving calls."""
    if not _child_hooks:
        return

    def run() -> None:
        for hook in reversed(_child_hooks):
            with suppress(BaseException):  # as Python's own fork does, a failing hook is passed over
                hook()

    thread = threading.Thread(target=run, name="skynet-fork-hooks", daemon=True)
    thread.start()
    thread.join(_HOOK_TIMEOUT)


def _fork(serve: Callable[[], None]) -> dict[str, Any]:
    """Fork a worker that runs `serve`; the reply: its pid, or why the kernel refused (EAGAIN, ENOMEM: this start
    fails, the pool goes on)."""
    template = _getpid()
    try:
        pid = _fork_process()
    except OSError as exc:
        return {"kind": "error", "message": str(exc)}
    if pid:
        return {"kind": "forked", "pid": pid}
    try:
        _setsid()  # its own process group: killing it kills what it forked
        worker.die_with(template)
        _run_child_hooks()
        serve()
    finally:
        _exit(1)


def _shared_descriptors(ours: set[int]) -> list[str]:
    """The sockets, pipes and event descriptors the import left open (a client's connection, an event loop):
    every forked worker would share them, and one worker would read another's replies."""
    found = []
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd <= 2 or fd in ours:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if not target.startswith("/") and "pidfd" not in target:
            found.append(f"descriptor {fd} ({target})")
    return found


def _reap(pid: int) -> int | None:
    """Wait for the worker `pid` (killed or exited already) and give its status as Popen.returncode would."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


def _other_threads() -> list[str]:
    """The threads of this process other than the main one: Python's by name, else the native ones counted."""
    named = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    native = len(os.listdir("/proc/self/task")) - 1
    return named or ([f"{native} native thread(s)"] if native > 0 else [])
