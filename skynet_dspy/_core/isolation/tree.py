"""Finding and killing every process a metric worker started, including those that left its process group: each
worker's environment carries a mark of its own (`MARK`), inherited by what it starts, found in /proc wherever it
moved. The worker is no subreaper: reaping orphans would take exit codes the metric's own Popen objects wait for.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress

MARK = "SKYNET_DSPY_WORKER"  # the environment variable naming the worker a process descends from
_ROUNDS = 5  # a process killed while forking may leave a fresh child: look again, up to this many times


def _processes() -> dict[int, int]:
    """Every live (not zombie) process: pid -> parent pid (from the fields of /proc/PID/stat after the command name:
    state, parent, ...)."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rpartition(b")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 1 and fields[0] != b"Z":
            found[int(entry)] = int(fields[1])
    return found


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


def kill_descendants(pid: int | None, token: str | None = None) -> None:
    """SIGKILL every process below `pid` and, with `token`, every process carrying that mark (a worker's, or its
    pool's), again and again (a process may start another as it dies) until none is left or _ROUNDS have passed."""
    for _ in range(_ROUNDS):
        found = set(descendants(pid)) if pid is not None else set()
        if token is not None:
            found.update(marked(token))
        found -= {os.getpid(), pid}
        if not found:
            return
        for each in found:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(each, signal.SIGKILL)
