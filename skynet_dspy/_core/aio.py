"""Async metrics: an `async def score` run on an event loop of its own, and blocking work an event loop awaits.

A coroutine score runs where a sync one does (a worker process, or a thread with isolation="thread"), on a fresh
event loop, cancelled at the call's deadline (the loop's own tasks with it). Blocking work a coroutine awaits
(an llm() request, a whole metric call) runs on a daemon thread of its own, in a copy of the caller's context,
so the caller's loop keeps running meanwhile: a daemon thread, so a request hung in HTTP never holds the process
from exiting (asyncio.to_thread's executor threads are joined at exit).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import LLMCallError

T = TypeVar("T")

# llm() requests one event loop may have in flight at once; more wait for their turn. At most the requests a
# worker process relays at once (isolation/handle.py MAX_LLM_AT_ONCE), so a gather of any size is never refused.
LLM_AT_ONCE = 16
_GRACE = 1.0  # seconds the tasks a timed-out or finished coroutine left behind get to end once cancelled


class CoroutineTimedOut(Exception):
    """A coroutine score ran past its timeout: it was cancelled, with everything it awaited."""


class _LoopState:
    """What allm() keeps per event loop: its turns, and whether the metric call the loop ran has ended."""

    __slots__ = ("slots", "ended")

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(LLM_AT_ONCE)
        self.ended = False


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
_loops_lock = threading.Lock()


def _state(loop: asyncio.AbstractEventLoop) -> _LoopState:
    with _loops_lock:
        state = _loops.get(loop)
        if state is None:
            state = _loops[loop] = _LoopState()
        return state


def run(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run `coroutine` to its end on a fresh event loop; CoroutineTimedOut once `timeout` seconds pass (None: no
    limit here, the caller's executor enforces it).

    On a thread whose own loop is running (a notebook's, with isolation="thread"), the coroutine's loop gets a
    thread of its own, since one thread runs one loop at a time.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(coroutine, timeout)
    return _on_own_thread(lambda: _run_here(coroutine, timeout))


def _run_here(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    loop = asyncio.new_event_loop()
    state = _state(loop)
    try:
        return loop.run_until_complete(_within(coroutine, timeout))
    finally:
        state.ended = True  # an llm() a cleanup or a leftover task asks now is refused: its call is over
        _close(loop)


def _on_own_thread(work: Callable[[], T]) -> T:
    """`work()` on a new thread, in a copy of this context; its value returned, or its exception raised, here."""
    context = contextvars.copy_context()
    done: list[Any] = []

    def target() -> None:
        try:
            done.append((context.run(work), None))
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            done.append((None, exc))

    thread = threading.Thread(target=target, name="skynet-coroutine", daemon=True)
    thread.start()
    thread.join()
    value, error = done[0]
    if error is not None:
        raise error
    return value  # type: ignore[no-any-return]


async def _within(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    if timeout is None:
        return await coroutine
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            value = await coroutine
    except TimeoutError:
        if deadline.expired():
            raise CoroutineTimedOut(f"the coroutine ran past its timeout of {timeout:g} s") from None
        raise  # the metric's own TimeoutError
    if deadline.expired():  # it caught the cancellation and returned anyway: still past its timeout
        raise CoroutineTimedOut(f"the coroutine ran past its timeout of {timeout:g} s")
    return value


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the coroutine left running, give it a moment to end, and close the loop (never waiting for
    threads: a request still in flight finishes on its own, and its answer is dropped)."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=_GRACE))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def in_thread(work: Callable[[], T]) -> T:
    """`work()` run on a daemon thread in a copy of this context, awaited without blocking the running loop.

    Cancelling the await drops the result; the thread finishes on its own.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(value: Any, error: BaseException | None) -> None:
        if future.done():  # the await was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value, error = context.run(work), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the loop is closed: nobody awaits this any more
            pass

    threading.Thread(target=target, name="skynet-await", daemon=True).start()
    return await future


async def llm_turn(ask: Callable[[], str]) -> str:
    """`ask()` (a blocking llm() request) awaited on its own thread, at most LLM_AT_ONCE of one loop at once."""
    state = _state(asyncio.get_running_loop())

    def guarded() -> str:
        if state.ended:  # queued when its metric call ended: it never starts
            raise LLMCallError("llm() was called after its metric call had ended")
        return ask()

    async with state.slots:
        return await in_thread(guarded)
