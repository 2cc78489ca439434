"""Async metrics: an `async def score` run on a fresh event loop, cancelled at the call's deadline, and blocking work
a coroutine awaits (an llm() request) run on a daemon thread in a copy of the caller's context (asyncio.to_thread's
threads are joined at exit: a request hung in HTTP would hold the process).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import LLMCallError

T = TypeVar("T")

# llm() requests one metric call may have in flight at once; more wait for their turn. At most the requests a
# worker process relays at once (isolation/handle.py MAX_LLM_AT_ONCE), so a gather of any size is never refused.
LLM_AT_ONCE = 16
GRACE = 1.0  # seconds the tasks a timed-out or finished coroutine left behind get to end once cancelled


class CoroutineTimedOut(Exception):
    """A coroutine score ran past its timeout: it was cancelled, with everything it awaited."""


@dataclass(slots=True)
class _CallState:
    """What allm() keeps per metric call (every task of its loop sees it): its turns, and whether it has ended."""

    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(LLM_AT_ONCE))
    ended: bool = False


_call_state: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar("skynet_aio_call", default=None)


def run(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run `coroutine` on a fresh event loop; CoroutineTimedOut once `timeout` seconds pass (None: the executor
    alone bounds the call). On a thread whose own loop is running (a notebook's), on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(coroutine, timeout)
    return _in_daemon_thread(lambda: _run_here(coroutine, timeout)).result()


def _run_here(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    loop = asyncio.new_event_loop()
    state = _CallState()
    token = _call_state.set(state)  # the loop's tasks copy this context
    try:
        return loop.run_until_complete(_within(coroutine, timeout))
    finally:
        state.ended = True  # an llm() a cleanup or a leftover task asks now is refused: its call is over
        _call_state.reset(token)
        _close(loop)


def _in_daemon_thread(work: Callable[[], T]) -> Future[T]:
    """`work()` started on a daemon thread in a copy of this context, its value or error set on the Future returned
    (`work` never starts once the Future is cancelled)."""
    future: Future[T] = Future()
    context = contextvars.copy_context()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(work))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)

    threading.Thread(target=target, name="skynet-await", daemon=True).start()
    return future


async def _within(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    deadline = asyncio.timeout(timeout)  # None: no deadline, and it never expires
    try:
        async with deadline:
            value = await coroutine
    except TimeoutError:
        if not deadline.expired():
            raise  # the metric's own TimeoutError
        value = None
    if deadline.expired():  # timed out, or caught the cancellation and returned anyway: past its timeout either way
        raise CoroutineTimedOut(f"the coroutine ran past its timeout of {timeout:g} s") from None
    return value  # type: ignore[return-value]


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the coroutine left running, give it a moment to end, and close the loop (never waiting for
    threads: a request still in flight finishes on its own, and its answer is dropped)."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=GRACE))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def in_thread(work: Callable[[], T]) -> T:
    """`work()` run on a daemon thread in a copy of this context, awaited without blocking the running loop.
    Cancelling the await drops the result (asyncio.wrap_future leaves a closed loop alone); the thread finishes on
    its own."""
    return await asyncio.wrap_future(_in_daemon_thread(work))


async def llm_turn(ask: Callable[[], str]) -> str:
    """`ask()` (a blocking llm() request) awaited on its own thread, at most LLM_AT_ONCE of one call at once."""
    state = _call_state.get() or _CallState()

    def guarded() -> str:
        if state.ended:  # queued when its metric call ended: it never starts
            raise LLMCallError("llm() was called after its metric call had ended")
        return ask()

    async with state.slots:
        return await in_thread(guarded)
