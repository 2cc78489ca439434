"""The bounded pool that answers worker processes' llm() requests, and the scope that cancels a call's requests."""

from __future__ import annotations

import os
import threading

from skynet_dspy._core.context import CallScope, LLMPool, current_scope, llm_pool


def test_the_pool_never_runs_more_threads_than_its_size_and_runs_everything():
    pool = LLMPool(4)
    release, ran, lock = threading.Event(), [], threading.Lock()
    running = []

    def work(number: int) -> None:
        with lock:
            running.append(threading.current_thread().name)
        release.wait(5)
        with lock:
            ran.append(number)

    before = threading.active_count()
    for number in range(40):
        pool.submit(lambda n=number: work(n))
    assert threading.active_count() - before <= 4
    release.set()
    deadline = threading.Event()
    for _ in range(100):
        if len(ran) == 40:
            break
        deadline.wait(0.05)
    assert sorted(ran) == list(range(40))
    assert threading.active_count() - before <= 4  # reused, not replaced


def test_a_fork_gets_a_pool_of_its_own():
    done = threading.Event()
    llm_pool.submit(done.set)
    assert done.wait(5)
    pid = os.fork()
    if pid == 0:  # the child has none of the parent's pool threads: its work must still run
        ran = threading.Event()
        llm_pool.submit(ran.set)
        os._exit(0 if ran.wait(5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_scope_sets_its_watchers_when_it_ends_and_binds_handlers():
    scope = CallScope()
    early, late = threading.Event(), threading.Event()
    scope.watch(early)
    seen = []
    handler = scope.bind(lambda instructions, input, settings: seen.append(current_scope()) or "ok")
    assert handler("i", None, {}) == "ok" and seen == [scope] and current_scope() is None
    assert not early.is_set()
    scope.end()
    assert early.is_set() and scope.ended
    scope.watch(late)  # watching an ended scope is set at once
    assert late.is_set()
    assert CallScope().bind(None) is None


def test_the_pool_grows_only_to_the_work_at_once():
    pool = LLMPool(32)
    for _ in range(300):  # one request at a time, as sequential llm() calls make them
        done = threading.Event()
        pool.submit(done.set)
        assert done.wait(5)
    assert pool._threads <= 3  # one, plus one per moment a thread was finishing as the next work came


def test_a_request_bound_to_an_ended_scope_never_reaches_its_handler():
    import pytest

    from skynet_dspy._core.errors import LLMCallError

    calls = []
    scope = CallScope()
    bound = scope.bind(lambda instructions, input, settings: calls.append(instructions) or "ok")
    assert bound("first", None, {}) == "ok"
    scope.end()  # the call ended while a request of it still waited on the pool
    with pytest.raises(LLMCallError, match="after its metric call had ended"):
        bound("late", None, {})
    assert calls == ["first"]
