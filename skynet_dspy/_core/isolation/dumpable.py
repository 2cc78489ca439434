"""While metric workers are alive, the user's process is not dumpable: a same-user worker cannot read its memory.

A worker runs as the user. Where the user is not root, Linux lets a process of the same uid read another's
/proc/<pid>/mem and /proc/<pid>/environ only while the target is "dumpable" (ptrace access rules), so a
metric could read a key given only in Python (metric_lm={"api_key": ...}) out of the user's process.
`prctl(PR_SET_DUMPABLE, 0)` closes that without root, and is undone when the last worker is gone, because
it also refuses the user's own debuggers and profilers that attach by pid (gdb -p, py-spy --pid):
measured in docs/sandbox.md. Root (CAP_SYS_PTRACE) is not stopped by it. Workers are unaffected: exec
makes every new program dumpable again. Python has no prctl(), so it is called through ctypes.

SKYNET_DSPY_KEEP_DUMPABLE=1 in the environment leaves the process as it is (to attach a profiler).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
KEEP = "SKYNET_DSPY_KEEP_DUMPABLE"  # set to 1: never change the user's process

_lock = threading.Lock()
_held = 0  # live workers
_before: int | None = None  # the dumpable state before the first worker, restored after the last


def _prctl(option: int, value: int = 0) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):
        return -1


def hold() -> None:
    """A worker started: the user's process stops being dumpable (Linux only)."""
    global _held, _before
    if not sys.platform.startswith("linux") or os.environ.get(KEEP) == "1":
        return
    with _lock:
        _held += 1
        if _held == 1:
            state = _prctl(_PR_GET_DUMPABLE)
            _before = state if state >= 0 else None
            if _before:
                _prctl(_PR_SET_DUMPABLE, 0)


def release() -> None:
    """A worker is gone: after the last one, the user's process is dumpable again if it was before."""
    global _held, _before
    with _lock:
        if _held == 0:
            return
        _held -= 1
        if _held == 0 and _before:
            _prctl(_PR_SET_DUMPABLE, _before)
            _before = None


class Hold:
    """One process's hold (a worker's, the template's): taken when made, given back once by release(), however
    often it is called and from whichever thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = True
        self._process = os.getpid()  # a fork of the user's process inherits the object, not the hold
        hold()

    def release(self) -> None:
        with self._lock:
            if not self._held or os.getpid() != self._process:
                return
            self._held = False
        release()


def _forget_in_child() -> None:
    """A fork of the user's process owns none of its workers: it starts dumpable, as the user's process was."""
    global _held, _before, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    if _held and _before:
        _prctl(_PR_SET_DUMPABLE, _before)
    _held, _before = 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def dumpable() -> bool:
    """Whether the user's process is dumpable now (for tests)."""
    return _prctl(_PR_GET_DUMPABLE) == 1
