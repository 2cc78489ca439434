"""The template: one process per pool that imports the metric once and forks a ready worker on demand.

The prefork design of gunicorn's --preload, Celery's prefork pool and multiprocessing's forkserver with
preloaded modules, with a fresh interpreter as the template (never a fork of the user's process, whose
DSPy and LiteLLM threads make fork unsafe, and whose script must not run again):

    user's process                            template (python -P, DSPy-free)        worker (forked)
    ──────────────                            ───────────────────────────────        ───────────────
    Template()      ──── Popen ─────────────▶ watches the user's process (pidfd)
    load(spec)      ──── "load" ────────────▶ imports the metric, under the timeout
                    ◀─── info, threads ─────  gc.freeze(): shared pages stay shared
    ForkedWorker()  ──── "fork" + one end ──▶ os.fork() ───────────────────────────▶ setsid, PR_SET_PDEATHSIG,
                         of a socketpair                                             the worker's main loop
                         (SCM_RIGHTS)                                                on that socket
                    ◀─── pid ───────────────
                    ◀═══════════ calls, llm() requests, outcomes: the worker's own socket ═══════════▶
    kill(): SIGKILL by pid (a pidfd tells it exited)
                    ──── "reap" pid ────────▶ waitpid (it is the worker's parent)
                    ◀─── exit status ───────
    (user's process dies)                     pidfd readable: kills every process     PDEATHSIG: dies with
                                              with the pool's mark, and exits         the template

The template never runs score, so its single thread is never starved of the GIL by a metric, and it reaps
a worker only when the user's process asks (so a pid the user's process kills is never reused meanwhile).
A template that has more than one thread after importing the metric cannot be forked safely: the pool then
starts fresh interpreters instead (handle.WorkerProcess), and a template that loads nothing stays as the
pool's warden (its watch on the user's process). Messages are framed like multiprocessing.Connection's.
"""

from __future__ import annotations

import ctypes
import gc
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from ..errors import WorkerError
from . import dumpable, tree, wire
from .handle import (
    BOOT_CODE,
    STARTUP_TIMEOUT,
    Gone,
    Launcher,
    WorkerProcess,
    output_stream,
    set_send_timeout,
    worker_environment,
)

# Taken before the metric loads, which may replace what the os module holds.
_getpid, _getppid, _fork_process, _setsid, _close, _exit = os.getpid, os.getppid, os.fork, os.setsid, os.close, os._exit
_TEMPLATE_CODE = BOOT_CODE + "from skynet_dspy._core.isolation.template import main; main()"
_PR_SET_PDEATHSIG = 1
_REQUEST_TIMEOUT = 10.0  # seconds the template may take to fork or reap (it runs no metric code)


def supported() -> bool:
    """Whether workers can be forked from a template here (Linux: fork, pidfds, prctl)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


# -- the user's side ------------------------------------------------------------------------------------------


class Template:
    """The template process, seen from the user's process: load the metric once, fork workers, reap them."""

    def __init__(self, pool_token: str, launcher: Launcher | None = None) -> None:
        ours, theirs = socket.socketpair()
        self._dumpable = dumpable.Hold()  # it imports the metric and forks workers: they cannot read our memory
        # a launcher (sandbox.py) starts it inside bubblewrap: its workers are forked in there, in its PID namespace
        self.launcher = launcher
        try:
            self.proc = (launcher.start if launcher is not None else subprocess.Popen)(
                [sys.executable, "-P", "-c", _TEMPLATE_CODE, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env={**worker_environment(), tree.MARK: pool_token},
                cwd=os.getcwd(),
                stdin=subprocess.DEVNULL,
                stdout=output_stream(),
                stderr=output_stream(),
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            self._dumpable.release()
            raise WorkerError(f"could not start the metric's template process ({sys.executable}): {exc}") from None
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self._sock = ours
        self._lock = threading.Lock()
        self.threads: list[str] = []  # threads the metric's import left running (the template is then unsafe)
        try:  # its interpreter has started: what follows (the metric's import) is timed from here
            ready = _receive(ours, time.monotonic() + STARTUP_TIMEOUT)
        except (OSError, ValueError):
            ready = None
        if ready is None:
            self.kill()
            ours.close()
            raise WorkerError(
                f"the metric's template process did not start ({sys.executable}; its error output, if any, is above)"
            )

    def request(self, message: dict[str, Any], seconds: float, fd: int | None = None) -> dict[str, Any] | None:
        """The template's answer to `message` (with `fd` passed along), None after `seconds` (the template is
        then killed: its answer would come out of turn); Gone when it exited. One request at a time."""
        with self._lock:
            if self.proc.poll() is not None:
                raise Gone
            try:
                _send(self._sock, wire.to_worker(message), fd)
                data = _receive(self._sock, time.monotonic() + seconds)
            except TimeoutError:
                self.kill()
                return None
            except (OSError, ValueError):
                raise Gone from None
        if data is None:
            raise Gone
        try:
            reply = wire.from_worker(data)
        except Exception:  # not plain data: the template is not to be trusted
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

    def load(self, spec: dict[str, Any], feedback_limit: int, seconds: float) -> dict[str, Any] | None:
        """Import the metric in the template: its `loaded`/`load_failed` reply, None after `seconds`."""
        reply = self.request({"kind": "load", "spec": spec, "feedback_limit": feedback_limit}, seconds)
        if reply is not None and isinstance(reply.get("threads"), list):
            self.threads = [str(name) for name in reply["threads"]]
        return reply

    def reap(self, pid: int) -> int | None:
        """Collect a worker that exited (the template is its parent): its exit status as Popen gives it."""
        try:
            reply = self.request({"kind": "reap", "pid": pid}, _REQUEST_TIMEOUT)
        except Gone:
            return None
        status = reply.get("status") if reply else None
        return status if isinstance(status, int) else None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self._dumpable.release()

    def close(self) -> None:
        """Stop the template (it kills what is left of the pool first)."""
        if self.alive:
            try:
                with self._lock:
                    _send(self._sock, wire.to_worker({"kind": "stop"}), None)
                self.proc.wait(STARTUP_TIMEOUT / 10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._sock.close()


class ForkedWorker(WorkerProcess):
    """A worker forked from the template: the same socket protocol as a fresh one, but not our child."""

    def __init__(self, template: Template, send_timeout: float, token: str) -> None:
        ours, theirs = socket.socketpair()
        set_send_timeout(ours, send_timeout)
        self.token = token
        self._template = template
        self._status: int | None = None
        self._reaped = False
        self._kill_lock = threading.Lock()
        try:
            reply = template.request(
                {"kind": "fork", "token": token}, _REQUEST_TIMEOUT, theirs.fileno()
            )
        except Gone:
            reply = None
        finally:
            theirs.close()
        outer = template.outer_pid(reply["pid"]) if reply and isinstance(reply.get("pid"), int) else None
        if not reply or reply.get("kind") != "forked" or outer is None:
            ours.close()
            raise WorkerError("the metric's template process could not fork a worker")
        self._inner_pid = reply["pid"]  # the template's name for it (another one inside a sandbox)
        self._attach(ours, outer)
        # Its state, read before every call (healthy): kept open, it stays this process's whatever reuses the pid,
        # and a read costs a few µs where opening the file each time took 15 (`make bench` row 9d)
        try:
            self._stat: int | None = os.open(f"/proc/{self.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._stat = None

    @property
    def returncode(self) -> int | None:
        return self._status

    def healthy(self) -> bool:
        if self._received or self._poller.poll(0):  # bytes on the socket, or the pidfd says it exited
            return False
        if self._stat is None:
            return False
        try:
            state = os.pread(self._stat, 1024, 0).rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return False
        return state not in (b"T", b"t", b"Z", b"X")  # stopped, traced, or exited

    def _close(self) -> None:
        super()._close()
        with self.send_lock:  # one closer takes it, as super() does the pidfd
            stat, self._stat = getattr(self, "_stat", None), None
        if stat is not None:
            try:
                os.close(stat)
            except OSError:
                pass

    def kill(self) -> None:
        """Kill the worker and what it started (as WorkerProcess.kill), then have the template reap it (once, when
        two threads kill it at the same time)."""
        with self._kill_lock:
            self._kill()

    def _kill(self) -> None:
        if self._reaped:
            return
        if self._exited(0) and not self._template.alive:
            # it died with the template and was reaped by init: its pid may be another process's by now, so
            # only what carries its mark is killed
            for pid in tree.marked(self.token):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self._reaped = True
            self._close()
            return
        if not self._exited(0):
            try:
                os.kill(self.pid, signal.SIGSTOP)
            except OSError:
                pass
        tree.kill_descendants(self.pid, self.token)
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._exited(STARTUP_TIMEOUT / 10)
        self._status = self._template.reap(self._inner_pid)
        self._reaped = True
        self._close()

    def stop(self) -> None:
        try:
            self.send(wire.to_worker({"kind": "stop"}))
            self._exited(1.0)
        except (OSError, ValueError):
            pass
        self.kill()

    def _exited(self, seconds: float) -> bool:
        """Whether the worker exited, waiting at most `seconds` (its pidfd turns readable)."""
        if self._pidfd is None:
            return True
        try:
            return bool(select.select([self._pidfd], [], [], seconds)[0])
        except (OSError, ValueError):
            return True


# -- the template's side --------------------------------------------------------------------------------------


def main() -> None:
    """Entry point of the template process: serve the user's process on the socket given as the first argument."""
    from . import worker

    worker.prepare()
    control = socket.socket(fileno=int(sys.argv[1]))
    parent = _getppid()
    try:
        watch: int | None = os.pidfd_open(parent)  # readable once the user's process is gone, however it went
    except OSError:
        watch = None
    poller = select.poll()
    poller.register(control, select.POLLIN)
    if watch is not None:
        poller.register(watch, select.POLLIN)
    libc = ctypes.CDLL(None, use_errno=True)
    _send(control, wire.to_parent({"kind": "ready"}), None)
    loaded, feedback_limit = None, 0
    workers: set[int] = set()
    try:
        while _getppid() == parent:
            events = poller.poll(250)
            if watch is not None and any(fd == watch for fd, _ in events):
                return
            if not events:
                continue
            data, fds = _receive_request(control)
            if data is None:
                return
            message = wire.from_parent(data)
            kind = message.get("kind")
            if kind == "load":
                feedback_limit = message["feedback_limit"]
                loaded, reply = worker.load_reply(message)
                reply["threads"] = _other_threads()
                gc.freeze()  # the collector then never writes to what the import made: those pages stay shared
            elif kind == "fork" and fds:
                try:
                    pid = _fork(fds[0], message["token"], loaded, feedback_limit, libc, [control.fileno(), watch])
                except OSError as exc:  # EAGAIN, ENOMEM: this start fails, the pool goes on
                    _close(fds[0])
                    reply = {"kind": "error", "message": str(exc)}
                else:
                    workers.add(pid)
                    reply = {"kind": "forked", "pid": pid}
            elif kind == "reap" and message.get("pid") in workers:
                workers.discard(message["pid"])
                reply = {"kind": "reaped", "status": _reap(message["pid"])}
            elif kind == "stop":
                return
            else:
                reply = {"kind": "error"}
            for fd in fds[1:] if kind == "fork" else fds:
                os.close(fd)
            _send(control, wire.to_parent(reply), None)
    finally:
        # what is left of the pool ends with it: the workers (they would also die of PDEATHSIG) and, found by
        # the pool's mark, what they started, wherever it moved
        for pid in workers:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        pool = os.environ.get(tree.MARK)
        if pool:
            tree.kill_pool(pool)
        _exit(0)


def _fork(fd: int, token: str, loaded: Any, feedback_limit: int, libc: Any, close: list[int | None]) -> int:
    """Fork a worker that serves `fd` with the metric already loaded; its pid."""
    template = _getpid()
    pid = _fork_process()
    if pid:
        _close(fd)
        return pid
    try:
        _setsid()  # its own process group: killing it kills what it forked
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the kernel kills it when the template ends
        if _getppid() != template:  # the template ended before the line above
            _exit(1)
        for other in close:
            if other is not None:
                _close(other)
        os.environ[tree.MARK] = token  # what it starts carries its own mark (tree.py)
        sys.argv[1:] = [str(fd)]  # as in a fresh worker: the argument names the worker's socket
        from . import worker

        worker.run(fd, loaded, feedback_limit)
    finally:
        _exit(1)


def _reap(pid: int) -> int | None:
    """Wait for the worker `pid` (killed or exited already) and give its status as Popen.returncode would."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


def _other_threads() -> list[str]:
    """The threads of this process other than the main one, named (Python's names, else the kernel's)."""
    try:
        tasks = [task for task in os.listdir("/proc/self/task") if int(task) != os.getpid()]
    except OSError:
        tasks = []
    named = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    if named or not tasks:
        return named
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8", errors="replace") as file:
                names.append(f"native thread {file.read().strip()!r}")
        except OSError:
            names.append("a native thread")
    return names


# -- framing: multiprocessing.Connection's (a 4-byte length, then the bytes), a descriptor on the first byte ---


def _send(sock: socket.socket, data: bytes, fd: int | None) -> None:
    framed = struct.pack("!i", len(data)) + data
    if fd is not None:  # sent with the first byte alone, so a reader gets it with the header
        socket.send_fds(sock, [framed[:1]], [fd])
        framed = framed[1:]
    sock.sendall(framed)


def _receive_request(sock: socket.socket) -> tuple[bytes | None, list[int]]:
    """The template reads a request (the user's process is trusted here): its bytes and any descriptor."""
    first, fds, _, _ = socket.recv_fds(sock, 4, 1)
    if not first:
        return None, fds
    rest = _exact(sock, 4 - len(first), None)
    if rest is None:
        return None, fds
    return _exact(sock, struct.unpack("!i", first + rest)[0], None), fds


def _receive(sock: socket.socket, deadline: float) -> bytes | None:
    """The user's process reads the template's reply, bounded in time and size; None when it closed."""
    header = _exact(sock, 4, deadline)
    if header is None:
        return None
    size = struct.unpack("!i", header)[0]
    if not 0 <= size <= wire.MAX_MESSAGE:
        raise ValueError("the template sent what no template of ours sends")
    return _exact(sock, size, deadline)


def _exact(sock: socket.socket, size: int, deadline: float | None) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise TimeoutError
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)
