"""One metric worker process, seen from the user's process: started, read from, checked, killed.

The worker is a fresh interpreter (`python -P -c ... FD`, see worker.py) on a socket of its own, with a
credential-free environment and native thread pools capped, in a session of its own (a worker forked from
the template is template.ForkedWorker, the same protocol). Its replies are read back as plain data only.
"""

from __future__ import annotations

import json
import math
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, Protocol, TypeVar

from ..errors import WorkerError
from ..secrets import credential_free_environment
from ..types import MetricInfo
from . import tree, wire

STARTUP_TIMEOUT = 60.0  # seconds a new interpreter may take to be ready (a loaded machine)
MAX_LLM_AT_ONCE = 16  # llm() requests one worker may have in flight; more are refused at once
_STOP_GRACE = 1.0  # seconds a worker told to stop may take before it is killed
_NO_MESSAGE = object()  # no whole message received yet
PARENT_VARIABLE = "SKYNET_DSPY_PARENT"  # the user's process's pid: a template or worker dies with it
PATH_VARIABLE = "SKYNET_DSPY_PATH"  # the user's import path entries a worker appends after its own (JSON)
# Run first in every process that runs score (started with -P: no current directory or script folder first):
# the user's import path is appended after the standard library and site-packages, never ahead of them.
BOOT_CODE = (
    f"import json, os, sys; sys.path += [p for p in json.loads(os.environ.pop({PATH_VARIABLE!r}, '[]')) "
    "if p not in sys.path]; "
)
_WORKER_CODE = BOOT_CODE + "from skynet_dspy._core.isolation.worker import main; main()"
# Native thread pools a metric's libraries start at import, capped at one thread per worker unless the user set
# them (as loky and joblib do): N workers x all cores would oversubscribe the machine, and a pool's threads make
# the template unsafe to fork.
THREAD_CAPS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")


class Launcher(Protocol):
    """Changes how a worker is started (sandbox.py's Sandbox: inside bubblewrap); None starts it as is."""

    def start(self, argv: list[str], *, env: dict[str, str], cwd: str, **popen: Any) -> subprocess.Popen[bytes]:
        """subprocess.Popen(argv, env=env, cwd=cwd, **popen), changed as the launcher needs."""
        ...


class Gone(Exception):
    """The worker process exited (or its socket closed, or it sent what is not plain data) while a reply was
    awaited."""


def exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class WorkerProcess:
    """One worker process and its socket; used by one calling thread at a time."""

    _inner: int | None = None  # the worker itself, when `pid` is a launcher's process above it (a sandbox)
    _stat: int | None = None  # /proc/PID/stat of the process that runs the metric, kept open (healthy)
    _closed_by_worker = False  # its end of the socket closed: the worker is exiting (or closed it itself)

    def __init__(self, send_timeout: float, token: str | None = None, launcher: Launcher | None = None) -> None:
        ours, theirs = socket.socketpair()
        set_send_timeout(ours, send_timeout)
        # marks the worker's environment, so its orphans can be found (tree.py)
        self.token = token or uuid.uuid4().hex
        argv = [sys.executable, "-P", "-c", _WORKER_CODE, str(theirs.fileno())]
        env, cwd = {**worker_environment(), tree.MARK: self.token}, os.getcwd()
        start = launcher.start if launcher is not None else subprocess.Popen
        if launcher is None:
            env[PARENT_VARIABLE] = str(os.getpid())  # it dies with this process (worker.prepare)
        output, written = output_pipe()
        try:
            self.proc = spawn(lambda: start(
                argv,
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=written,
                stderr=written,
                start_new_session=True,  # its own process group: killing it kills what it forked
            ))
        except BaseException as exc:  # a Ctrl-C while a sandbox starts it too: nothing is left holding
            ours.close()
            os.close(output)
            if isinstance(exc, OSError):
                raise WorkerError(f"could not start a metric worker process ({sys.executable}): {exc}") from None
            raise
        finally:
            theirs.close()
            os.close(written)
        try:
            self._attach(ours, self.proc.pid, output)
        except BaseException:
            if self.proc.poll() is None:  # _attach kills a worker that did not start; an interrupt leaves it here
                self.proc.kill()
                self.proc.wait()
            raise
        # Started through a launcher (a sandbox), the worker is not our child but below it: its state is read in /proc
        self._inner = _innermost(self.pid) if launcher is not None else None
        self._watch_state()

    @property
    def metric_pid(self) -> int:
        """The process that runs the metric: `pid`, or the worker below a sandbox's own processes."""
        return self._inner or self.pid

    @property
    def returncode(self) -> int | None:
        """How the process ended (as Popen says it), None while it runs or when unknown."""
        return self.proc.returncode

    def _attach(self, ours: socket.socket, pid: int, output: int) -> None:
        """Take the worker's socket and the read end of its stdout/stderr, and wait for it to say it is ready."""
        self.conn = Connection(ours.detach())
        self.output = Output(output)
        self.send_lock = threading.Lock()
        self.pid = pid
        self.calls = 0  # calls it has answered (for worker_max_calls)
        self.answered: int | None = None  # the call it answered last (its own late reply may follow a forged one)
        self._pidfd = _pidfd(self.pid)
        self._poller = select.poll()
        self._poller.register(self.conn.fileno(), select.POLLIN)
        self._poller.register(output, select.POLLIN)
        if self._pidfd is not None:
            self._poller.register(self._pidfd, select.POLLIN)
        self.info: MetricInfo | None = None
        self.llm_slots = threading.BoundedSemaphore(MAX_LLM_AT_ONCE)
        self._received = bytearray()  # bytes read from the socket, not yet a whole message
        try:
            ready = self.wait(time.monotonic() + STARTUP_TIMEOUT)
        except Gone:
            ready = None
        if not (isinstance(ready, dict) and ready.get("kind") == "ready"):
            self.kill()
            written = self.output.take()
            raise WorkerError(f"a metric worker process did not start ({exit_text(self.returncode)})"
                              + (f"; its output: {written}" if written else ""))

    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.conn.send_bytes(data)

    def wait(self, deadline: float) -> Any:
        """The worker's next message, or None at the deadline; Gone when the process is gone.

        Bytes are read as they come and framed here (multiprocessing.Connection's framing), so bytes a metric
        writes into its worker's socket (half a frame, a header announcing a gigabyte) cannot make this wait past
        the deadline: the sandbox runs hostile code on this same path.
        """
        conn_fd = self.conn.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # checked first: a flood of buffered messages must not outlast the deadline
                return None
            message = self._message()
            if message is not _NO_MESSAGE:
                return message
            if self._pidfd is None:  # no pidfd (not Linux): look at the process every quarter second
                remaining = min(remaining, 0.25)
                if self.proc.poll() is not None and not self.conn.poll(0):
                    raise Gone
            events = self._read_output(self._poller.poll(math.ceil(remaining * 1000)))
            if not events:
                continue
            if not any(fd == conn_fd for fd, _ in events):
                raise Gone  # only the pidfd is readable: the process exited
            try:
                chunk = os.read(conn_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._closed_by_worker = True  # it is exiting, most likely: kill() gives it a moment
                raise Gone
            self._received += chunk

    def _read_output(self, events: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Read the worker's output when `events` say it wrote some; the other events."""
        if all(fd != self.output.fd for fd, _ in events):
            return events
        if not self.output.read():  # every writer closed it: it has nothing more to say
            self._poller.unregister(self.output.fd)
        return [event for event in events if event[0] != self.output.fd]

    def _message(self) -> Any:
        """The next whole message received (multiprocessing.Connection's framing), or _NO_MESSAGE; Gone for what no
        worker of ours sends (a size past wire.MAX_MESSAGE, or what is not plain data)."""
        if len(self._received) < 4:
            return _NO_MESSAGE
        size = struct.unpack("!i", self._received[:4])[0]
        if not 0 <= size <= wire.MAX_MESSAGE:
            raise Gone
        if len(self._received) < 4 + size:
            return _NO_MESSAGE
        data = bytes(self._received[4:4 + size])
        del self._received[:4 + size]
        try:
            return wire.from_worker(data)
        except Exception:
            raise Gone from None

    def healthy(self) -> bool:
        """Whether an idle worker can take a call: not exited nor stopped, and silent on its socket since its last
        reply (what a call left behind, a timer or a thread of the metric's, may have stopped it or written to it)."""
        if self._received or any(fd != self.output.fd for fd, _ in self._poller.poll(0)):
            return False
        if self._stat is None:  # no /proc to read (not Linux)
            return True
        try:
            state = os.pread(self._stat, 1024, 0).rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return False
        return state not in (b"T", b"t", b"Z", b"X")  # stopped, traced, or exited

    def _watch_state(self) -> None:
        """Keep the metric's process's /proc stat file open for healthy(): it stays this process's whatever reuses
        the pid, and a read costs a few µs where opening it each time took 15 (`make bench` row 9d)."""
        try:
            self._stat = os.open(f"/proc/{self.metric_pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._stat = None

    def kill(self) -> None:
        """Kill the worker and everything it started, and reap it (no zombie is left): what left its process group
        (setsid) is found in its tree or by its mark (tree.py), and killed with the group."""
        if self._inner is not None and self.proc.poll() is None and (
            self._closed_by_worker or _state(self._inner) in (None, b"Z", b"X")
        ):
            try:  # the worker under a sandbox ended (its socket closes before it is a zombie): bubblewrap exits with
                # its status in a moment
                self.proc.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass
        tree.kill_descendants(self.pid, self.token)
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
            self.send(wire.to_worker({"kind": "stop"}))
            self.proc.wait(_STOP_GRACE)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        self.kill()

    def _close(self) -> None:
        with self.send_lock:  # an llm() answer sent as it closes would go to whatever reuses the descriptor
            try:
                self.conn.close()
            except OSError:
                pass
            # taken under the lock: two threads killing one worker (close() and a call's timeout) close it once
            pidfd, self._pidfd = self._pidfd, None
            output, self.output.fd = self.output.fd, -1
            stat, self._stat = self._stat, None
        for fd in (pidfd, output, stat):
            if fd is not None and fd >= 0:
                os.close(fd)


def set_send_timeout(sock: socket.socket, seconds: float) -> None:
    """A worker that stops reading (a thread of the metric stopped it) must not hold a sender forever: a send
    that waits longer than this fails (OSError), and the worker is replaced."""
    whole, fraction = divmod(max(seconds, 0.001), 1.0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(whole), int(fraction * 1e6)))


def private_memory(pid: int) -> int | None:
    """Bytes of memory `pid` holds resident of its own (pages shared with the template are not counted), or
    None when /proc cannot say."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as file:
            text = file.read()
    except OSError:
        try:
            with open(f"/proc/{pid}/statm", "rb") as file:
                return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None
    total = 0
    for line in text.splitlines():
        if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def _innermost(pid: int) -> int | None:
    """The process at the bottom of the chain below `pid` (the worker under a sandbox's own processes)."""
    below = tree.descendants(pid)
    parents = {child: tree.parent(child) for child in below}
    leaves = [child for child in below if child not in parents.values()]
    return leaves[0] if len(leaves) == 1 else None


def _state(pid: int) -> bytes | None:
    """The state letter of `pid` in /proc (R, S, T, Z...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return bytes(file.read().rpartition(b")")[2].split()[0])
    except (OSError, IndexError):
        return None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # readable once the process exits: no polling for its death
    except (AttributeError, OSError):
        return None


class Output:
    """What a worker writes to stdout and stderr (one pipe, read here): the first KEEP bytes of a call are kept, the
    rest only counted, so a flood never reaches the user's terminal nor fills memory."""

    KEEP = 4096

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.kept = bytearray()
        self.total = 0

    def read(self) -> bool:
        """Read what the pipe holds now (it never blocks); False once every writer has closed it."""
        for _ in range(64):  # bounded: a process the metric started may write without end
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self.total += len(chunk)
            if len(self.kept) < self.KEEP:
                self.kept += chunk[:self.KEEP - len(self.kept)]
        return True

    def take(self) -> str | None:
        """The text read since the last take, or None when there was none. The worker writes out what score
        printed before it replies, so by the reply, the poll that saw it has seen the output too (wait)."""
        if not self.total:
            return None
        text = self.kept.decode("utf-8", "replace")
        if self.total > len(self.kept):
            text += f"\n[... {self.total - len(self.kept):,} more bytes of output not kept]"
        self.kept, self.total = bytearray(), 0
        return text


def output_pipe() -> tuple[int, int]:
    """A pipe for a worker's stdout and stderr: its read end (never blocking) and its write end."""
    read, write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(read, False)
    return read, write


_T = TypeVar("_T")
_spawner: tuple[int, queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]] | None = None
_spawner_lock = threading.Lock()


def spawn(start: Callable[[], _T]) -> _T:
    """`start()` (it starts a process) on one thread that lives as long as this process.

    The kernel's parent-death signal (PR_SET_PDEATHSIG, which every template and worker asks for: see
    worker.prepare) fires when the *thread* that started the process ends, and a calling thread (DSPy's) may
    end any time.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or a fork of this process inherited it
            _spawner = (os.getpid(), queue.SimpleQueue())
            threading.Thread(target=_serve_spawns, args=(_spawner[1],), name="skynet-spawner", daemon=True).start()
        requests = _spawner[1]
    done: Future[_T] = Future()
    requests.put((start, done))
    try:
        return done.result()
    except BaseException:  # a Ctrl-C while it starts: the process, once started, is not left running
        done.add_done_callback(_kill_started)
        raise


def _kill_started(started: Future[Any]) -> None:
    if started.exception() is None and isinstance(started.result(), subprocess.Popen):
        started.result().kill()


def _serve_spawns(requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
    while True:
        start, done = requests.get()
        try:
            done.set_result(start())
        except BaseException as exc:  # noqa: BLE001 - given to the caller, which raises it
            done.set_exception(exc)


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
