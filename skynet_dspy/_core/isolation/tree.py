"""Finding and killing every process a metric worker started, including those that left its process group.

Killing a worker's process group misses a child that called setsid() (subprocess.Popen(...,
start_new_session=True), a daemon's double fork), and a daemon is no longer below the worker in the
process tree either. So each worker's environment carries a mark of its own (`MARK`), which every process
it starts inherits: `marked` finds them in /proc, wherever they moved. (A child started with an
environment of the metric's own making carries no mark; it is found only while it is below the worker.)
The worker is not made a child subreaper: orphans would then become its zombies, and reaping them would
take exit codes the metric's own Popen objects wait for. Without /proc these find nothing, and the
process-group kill is all there is.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

MARK = "SKYNET_DSPY_WORKER"  # the environment variable naming the worker a process descends from
_ROUNDS = 5  # a process killed while forking may leave a fresh child: look again, up to this many times


def _processes() -> dict[int, int]:
    """Every live (not zombie) process: pid -> parent pid, from /proc; empty without /proc."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    return parents


def parent(pid: int) -> int | None:
    """The parent of `pid`, from /proc; None when it is gone (or without /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return int(file.read().rpartition(b")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, parent in _processes().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def marked(token: str, pool: bool = False) -> list[int]:
    """The live processes whose environment says they descend from the worker `token` names (with `pool`, from
    any worker of the pool `token` names: worker marks are the pool's mark, a dot, and the worker's own)."""
    needle = f"{MARK}={token}".encode()
    found = []
    me = os.getpid()
    for pid in _processes():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                environ = file.read()
        except OSError:
            continue
        entries = environ.split(b"\0")
        if needle in entries or (pool and any(entry.startswith(needle + b".") for entry in entries)):
            found.append(pid)
    return found


def kill_marked(token: str, pool: bool = False) -> None:
    """SIGKILL every process carrying the mark `token` (with `pool`, of the pool it names or one of its workers)."""
    _kill_until_none(lambda: set(marked(token, pool)))


def kill_descendants(pid: int, token: str | None = None) -> None:
    """SIGKILL every process below `pid` (and, with `token`, every process carrying the worker's mark)."""
    me = os.getpid()

    def found() -> set[int]:
        below = set(descendants(pid))
        if token is not None:
            below.update(marked(token))
        return below - {me, pid}

    _kill_until_none(found)


def _kill_until_none(find: Callable[[], set[int]]) -> None:
    """SIGKILL what `find()` returns, again and again (a process may start another as it dies), until it finds
    nothing or _ROUNDS have passed."""
    for _ in range(_ROUNDS):
        found = find()
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
