"""The Ray actor on one node of isolation="ray": the metric in the package's own worker pool, its llm() relayed.

The driver calls `start(call)`, then `next_event(call)` until the outcome; each event (an llm() request, or the
outcome) is plain values, read on the driver by wire.py's class-refusing unpickler; `llm_reply` answers a
request. Ray is not imported at module level: the driver imports this module too.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import threading
from concurrent.futures import Future
from typing import Any

from ..call import CallRequest
from ..errors import LLMCallError, MetricLoadError, judge_error
from ..types import Failure, Outcome
from ..values import exception_text
from . import wire

DEADLINE_MARGIN = 60.0  # seconds past 2 x timeout the driver waits for a node before it scores the call crashed


class NodeHost:
    """The Ray actor on one node: the metric in the package's own worker pool, its llm() relayed to the driver."""

    def __init__(self, source: bytes, timeout: float, pool: dict[str, Any]):
        self._source = source
        self._timeout = timeout
        self._pool = pool  # ProcessExecutor's other arguments: feedback_limit, max_workers, max_calls, max_memory
        self._executor: Any = None
        self._events: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}  # per call, until its outcome is read
        self._waiting: dict[int, dict[int, Future[dict[str, Any]]]] = {}  # per call in progress: llm() requests
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def load(self) -> bytes:
        """Load the metric in the node's worker pool: what it found, or why it failed (plain values)."""
        from .process import ProcessExecutor

        try:
            source = pickle.loads(self._source)
            self._executor = ProcessExecutor(source, self._timeout, **self._pool)
        except Exception as exc:  # noqa: BLE001 - the driver gets the reason in words, whatever it was
            item = str(exc.item) if isinstance(exc, MetricLoadError) else None
            message = str(exc) if item else exception_text(exc)
            return wire.to_parent({"kind": "load_failed", "message": message, "item": item})
        return wire.to_parent({"kind": "loaded", "info": wire.info_to_plain(self._executor.info)})

    def start(self, call_id: int, payload: bytes) -> bytes:
        """Start one call (`payload`: the pickled CallRequest) and return its first event."""
        with self._lock:
            self._events[call_id] = queue.SimpleQueue()
            self._waiting[call_id] = {}
        threading.Thread(target=self._run, args=(call_id, pickle.loads(payload)), daemon=True).start()
        return self.next_event(call_id)

    def _relay(self, call_id: int, instructions: str, input: str | None, settings: dict[str, Any]) -> str:
        answer: Future[dict[str, Any]] = Future()
        with self._lock:
            if call_id not in self._waiting:
                raise LLMCallError("llm() was called after its metric call had ended")
            request_id = next(self._ids)
            self._waiting[call_id][request_id] = answer
        self._events[call_id].put({"kind": "llm", "request": request_id, "instructions": instructions,
                                   "input": input, "settings": wire.to_plain(settings)})
        try:
            reply = answer.result(self._timeout + DEADLINE_MARGIN)
        except Exception:  # noqa: BLE001 - timed out, or cancelled when the call ended
            raise LLMCallError("llm() got no answer from the user's process before its metric call ended") from None
        if "text" in reply:
            return str(reply["text"])
        raise judge_error(reply["error"])

    def _run(self, call_id: int, request: CallRequest) -> None:
        try:
            outcome = self._executor.run(request, lambda *args: self._relay(call_id, *args))
        except Exception as exc:  # noqa: BLE001 - the driver gets an outcome whatever happened here
            outcome = Outcome(failure=Failure.CRASHED, detail=f"the node's worker pool failed: {exception_text(exc)}")
        with self._lock:
            for answer in self._waiting.pop(call_id).values():
                answer.cancel()  # its llm() gets "no answer before the call ended"
        self._events[call_id].put({"kind": "outcome", "outcome": wire.outcome_to_plain(outcome)})

    def next_event(self, call_id: int) -> bytes:
        """The call's next event: an llm() request or its outcome."""
        event = self._events[call_id].get()
        if event["kind"] == "outcome":
            self._events.pop(call_id, None)
        return wire.to_parent(event)

    def llm_reply(self, call_id: int, request_id: int, reply: dict[str, Any]) -> None:
        """The driver's answer to one llm() request (dropped when its call has ended)."""
        with self._lock:
            answer = self._waiting.get(call_id, {}).pop(request_id, None)
        if answer is not None:
            answer.set_result(reply)

    def pids(self) -> dict[str, Any]:
        """This host's process id, node and metric workers' process ids (for tests and for the curious)."""
        import ray

        workers = self._executor.worker_pids if self._executor is not None else []
        return {"host": os.getpid(), "workers": workers, "node": ray.get_runtime_context().get_node_id()}

    def stop(self) -> None:
        """Stop the node's metric workers (calls in progress there end as failures)."""
        if self._executor is not None:
            self._executor.close()
