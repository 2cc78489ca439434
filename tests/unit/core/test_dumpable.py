"""dumpable.py: holds taken and given back per process, also across a fork of the user's process."""

from __future__ import annotations

import os

from skynet_dspy._core.isolation import dumpable


def test_a_hold_is_given_back_once_however_often_it_is_released():
    before = dumpable._held
    hold = dumpable.Hold()
    assert dumpable._held == before + 1 and not dumpable.dumpable()
    hold.release()
    hold.release()
    assert dumpable._held == before


def test_a_hold_inherited_by_a_fork_is_not_the_forks_to_give_back():
    inherited = dumpable.Hold()
    try:
        held = dumpable._held
        pid = os.fork()
        if pid == 0:  # the child: it starts with no hold, and the parent's is not its to release
            ok = dumpable._held == 0
            own = dumpable.Hold()
            inherited.release()
            ok = ok and dumpable._held == 1 and not dumpable.dumpable()
            own.release()
            os._exit(0 if ok and dumpable._held == 0 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert dumpable._held == held and not dumpable.dumpable()  # the parent's hold stands
    finally:
        inherited.release()
