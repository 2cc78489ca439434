"""One metric worker process, seen from the user's process: started (forked by template.py, in a session of its
own), read from (plain data only), checked, killed; its llm() requests answered here.
"""

from __future__ import annotations

import math
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..context import LLMHandler, answer_llm, llm_pool
from ..errors import LLMCallError, WorkerError, judge_error_to_plain
from . import tree, wire

if TYPE_CHECKING:
    from .template import Template

STARTUP_TIMEOUT = 60.0  # seconds a new interpreter may take to be ready (a loaded machine)
REQUEST_TIMEOUT = 10.0  # seconds the template may take to fork or reap (it runs no metric code)
MAX_LLM_AT_ONCE = 16  # llm() requests one worker may have in flight; more are refused at once
_STOP_GRACE = 1.0  # seconds bwrap may take to exit after the worker it started did
_NO_MESSAGE = object()  # no whole message received yet
PARENT_VARIABLE = "SKYNET_DSPY_PARENT"  # the user's process's pid: a template or worker dies with it
MEMORY_VARIABLE = "SKYNET_DSPY_MAX_MEMORY"  # bytes of address space a sandboxed template and its workers may map
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
    """One worker, forked by its template or, `serving`, the template itself (template.py); used by one calling
    thread at a time."""

    def __init__(self, template: Template, send_timeout: float, token: str, serving: bool = False) -> None:
        ours, theirs = socket.socketpair()
        # a worker that stops reading (a thread of the metric stopped it) must not hold a sender forever
        whole, fraction = divmod(max(send_timeout, 0.001), 1.0)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(whole), int(fraction * 1e6)))
        output, written = os.pipe2(os.O_CLOEXEC)  # its stdout and stderr, read here without blocking
        os.set_blocking(output, False)
        self.token, self.template, self.serving = token, template, serving  # the token marks its processes (tree.py)
        self.returncode: int | None = None  # how it ended, as Popen says it (None while it runs or when unknown)
        self._reaped = False
        self._closed_by_worker = False  # its end of the socket closed: it is exiting (or closed it itself)
        self._kill_lock = threading.Lock()
        try:
            message = {"kind": "serve" if serving else "fork", "token": token}
            reply = template.request(message, REQUEST_TIMEOUT, [theirs.fileno(), written])
        except Gone:
            reply = None
        finally:
            theirs.close()
            os.close(written)
        pid = template.outer_pid(reply["pid"]) if reply and isinstance(reply.get("pid"), int) else None
        if not reply or reply.get("kind") != "forked" or pid is None:
            ours.close()
            os.close(output)
            raise WorkerError("the metric's template process could not fork a worker")
        self._inner_pid: int = reply["pid"]  # the template's name for it (another one inside a sandbox)
        self.conn = Connection(ours.detach())
        self.output = Output(output)
        self.send_lock = threading.Lock()
        self.pid = pid
        self.calls = 0  # calls it has answered (for worker_max_calls)
        self.answered: int | None = None  # the call it answered last (its own late reply may follow a forged one)
        self.llm_slots = threading.BoundedSemaphore(MAX_LLM_AT_ONCE)
        self._received = bytearray()  # bytes read from the socket, not yet a whole message
        try:
            self._pidfd = os.pidfd_open(pid)  # readable once the process exits: no polling for its death
            # kept open for healthy(): it stays this process's whatever reuses the pid (`make bench` row 9d)
            self._stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # gone already (reaped inside a sandbox): its socket's end says so
            self._pidfd = self._stat = -1
        self._poller = select.poll()
        for fd in (self.conn.fileno(), output, self._pidfd):
            if fd >= 0:
                self._poller.register(fd, select.POLLIN)
        try:
            ready = self.wait(time.monotonic() + STARTUP_TIMEOUT)
        except Gone:
            ready = None
        if not (isinstance(ready, dict) and ready.get("kind") == "ready"):
            self.kill()
            said = self.output.take()
            raise WorkerError(f"a metric worker process did not start ({exit_text(self.returncode)})"
                              + (f"; its output: {said}" if said else ""))

    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.conn.send_bytes(data)

    def serve_llm(self, message: dict[str, Any], call_id: int, llm: LLMHandler | None) -> bool:
        """Answer the worker's llm() request here, where the judge and its keys are, on the bounded llm() pool (so
        the call's timeout keeps running; `llm` is bound to the call's scope); False when refused at once."""
        reply = {"kind": "llm_reply", "request": message.get("request")}
        if not self.llm_slots.acquire(blocking=False):
            refused = LLMCallError(f"more than {MAX_LLM_AT_ONCE} llm() calls at once from one metric call")
            self._reply({**reply, "error": judge_error_to_plain(refused)})
            return False

        def answer() -> None:
            answered = answer_llm(llm, message.get("instructions"), message.get("input"), message.get("settings"),
                                  ended=message.get("call") != call_id)
            self.llm_slots.release()
            self._reply({**reply, **answered})

        llm_pool.submit(answer)
        return True

    def _reply(self, reply: dict[str, Any]) -> None:
        with suppress(OSError, ValueError):  # the worker is gone (timed out, killed): nobody is waiting
            self.send(wire.to_worker(reply))

    def wait(self, deadline: float) -> Any:
        """The worker's next message, or None at the deadline; Gone when the process is gone. Framed here as bytes
        come, so what a metric writes into its socket (half a frame, a huge header) cannot outlast the deadline."""
        conn_fd = self.conn.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # checked first: a flood of buffered messages must not outlast the deadline
                return None
            message = self._message()
            if message is not _NO_MESSAGE:
                return message
            ready = {fd for fd, _ in self._poller.poll(math.ceil(remaining * 1000))}
            if self.output.fd in ready and not self.output.read():  # every writer closed it: nothing more to say
                self._poller.unregister(self.output.fd)
            ready.discard(self.output.fd)
            if not ready:
                continue
            if conn_fd not in ready:
                raise Gone  # only the pidfd is readable: the process exited
            try:
                chunk = os.read(conn_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._closed_by_worker = True
                raise Gone
            self._received += chunk

    def _message(self) -> Any:
        """The next whole message received, or _NO_MESSAGE; Gone for what no worker of ours sends (a size past
        wire.MAX_MESSAGE, or what is not plain data)."""
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
        try:
            state = os.pread(self._stat, 1024, 0).rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return False
        return state not in (b"T", b"t", b"Z", b"X")  # stopped, traced, or exited

    def kill(self) -> None:
        """Kill the worker and everything it started, found in its tree or by its mark (tree.py), and reap it (once,
        when two threads kill it at the same time): no zombie is left."""
        with self._kill_lock:
            if self._reaped:
                return
            self._reaped = True
            template = self.template
            if self.serving:
                if self._closed_by_worker or self._exited(0):
                    with suppress(subprocess.TimeoutExpired):  # it ended itself: bwrap exits in a moment
                        template.proc.wait(_STOP_GRACE)
                tree.kill_descendants(template.pid, self.token)
                if template.alive:
                    self._signal()
                template.kill()
                self.returncode = template.proc.returncode
            elif self._exited(0) and not template.alive:
                # it died with the template and was reaped by init: its pid may be another process's by now, so
                # only what carries its mark is killed
                tree.kill_descendants(None, self.token)
            else:
                tree.kill_descendants(self.pid, self.token)
                self._signal()
                self._exited(STARTUP_TIMEOUT / 10)
                self.returncode = template.reap(self._inner_pid)
            with self.send_lock:  # an llm() answer sent as it closes would go to whatever reuses the descriptor
                with suppress(OSError):
                    self.conn.close()
                # taken under the lock: two threads killing one worker (close() and a call's timeout) close it once
                fds, self.output.fd, self._pidfd, self._stat = (self.output.fd, self._pidfd, self._stat), -1, -1, -1
            for fd in fds:
                if fd >= 0:
                    os.close(fd)

    def _signal(self) -> None:
        for kill in (os.killpg, os.kill):  # its process group: what it forked
            with suppress(ProcessLookupError, PermissionError):
                kill(self.pid, signal.SIGKILL)

    def _exited(self, seconds: float) -> bool:
        """Whether the worker exited, waiting at most `seconds` (its pidfd turns readable)."""
        try:
            return bool(select.select([self._pidfd], [], [], seconds)[0])
        except (OSError, ValueError):
            return True


def private_memory(pid: int) -> int | None:
    """Bytes of memory `pid` holds resident of its own (pages shared with the template are not counted), or
    None when /proc cannot say."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as file:
            text = file.read()
    except OSError:
        return None
    private = (line for line in text.splitlines() if line.startswith((b"Private_Clean:", b"Private_Dirty:")))
    return sum(int(line.split()[1]) * 1024 for line in private)


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

