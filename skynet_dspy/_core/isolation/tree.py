"""Finding and killing every process a metric worker started, including those that left its process group.

A process group misses a child that called setsid() (a daemon's double fork), which may leave the worker's
process tree as well. So each worker's environment carries a mark of its own (`MARK`), inherited by what it
starts: `marked` finds those in /proc, wherever they moved (not one started with an environment of the metric's
own making, found only while it is below the worker). The worker is no subreaper: reaping orphans would take exit
codes the metric's own Popen objects wait for.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

MARK = "SKYNET_DSPY_WORKER"  # the environment variable naming the worker a process descends from
_ROUNDS = 5  # a process killed while forking may leave a fresh child: look again, up to this many times


def _stat(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state, parent, ...); empty when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rpartition(b")")[2].split()
    except OSError:
        return []


def _processes() -> dict[int, int]:
    """Every live (not zombie) process: pid -> parent pid."""
    found = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else []
        if len(fields) > 1 and fields[0] != b"Z":
            found[int(entry)] = int(fields[1])
    return found


def parent(pid: int) -> int | None:
    """The parent of `pid`; None when it is gone."""
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else None


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


def marked(token: str) -> list[int]:
    """The live processes whose environment says they descend from the worker `token` names (or from any worker of
    the pool it names: a worker's mark is its pool's, a dot, and its own)."""
    needle = f"{MARK}={token}".encode()
    found = []
    for pid in _processes():
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                entries = file.read().split(b"\0")
        except OSError:
            continue
        if pid != os.getpid() and any(entry == needle or entry.startswith(needle + b".") for entry in entries):
            found.append(pid)
    return found


def kill_marked(token: str) -> None:
    """SIGKILL every process carrying the mark `token` (or the mark of a worker of the pool it names)."""
    _kill_until_none(lambda: set(marked(token)))


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
