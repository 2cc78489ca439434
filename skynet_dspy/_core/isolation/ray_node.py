"""The Ray actor on one node of isolation="ray": the metric in the package's own worker pool, its llm() relayed.

One `NodeHost` per node hosts a ProcessExecutor, so the timeout, the process-tree kill and the contract checks
stay on the node, exactly as on one machine. The driver talks to it through a step protocol: `start(call)` and
`next_event(call)` return the call's next event, an llm() request or its outcome; the driver answers requests
with `llm_reply`. Events are plain values pickled here and read on the driver by wire.py's class-refusing
unpickler. Nothing here imports Ray at module level: this module is imported on the driver too.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import threading
from typing import Any

from ..call import CallRequest
from ..errors import LLMCallError, MetricLoadError, judge_error
from ..types import Failure, Outcome
from ..values import exception_text
from . import wire

DEADLINE_MARGIN = 60.0  # seconds past 2 x timeout the driver waits for a node before it scores the call crashed
POLL = 5.0  # seconds a node holds a next_event request before answering "pending"


class _Box:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: dict[str, Any] | None = None


class _NodeCall:
    """One call in progress on a node: its events for the driver, and its llm() requests awaiting an answer."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.waiting: dict[int, _Box] = {}
        self.lock = threading.Lock()
        self.ended = False
        self.ids = itertools.count(1)


class NodeHost:
    """The Ray actor on one node: the metric in the package's own worker pool, its llm() relayed to the driver."""

    def __init__(self, source: bytes, timeout: float, feedback_limit: int, workers: int,
                 recycle: dict[str, int | None] | None = None):
        self._source = source
        self._recycle = recycle or {}  # the node pool's max_calls / max_memory (worker_max_calls / _memory)
        self._timeout = timeout
        self._feedback_limit = feedback_limit
        self._workers = workers
        self._executor: Any = None
        self._calls: dict[int, _NodeCall] = {}
        self._lock = threading.Lock()

    def load(self) -> bytes:
        """Load the metric in the node's first worker process: what it found, or why it failed (plain values)."""
        from .process import ProcessExecutor

        try:
            source = pickle.loads(self._source)
            if isinstance(source, dict) and "module" in source:
                import importlib

                source = importlib.import_module(source["module"])
            self._executor = ProcessExecutor(
                source, self._timeout, self._feedback_limit, max_workers=self._workers,
                max_calls=self._recycle.get("max_calls"), max_memory=self._recycle.get("max_memory"),
            )
        except FileNotFoundError as exc:
            return wire.to_parent({"kind": "load_failed", "message": str(exc), "item": "not_found"})
        except MetricLoadError as exc:
            return wire.to_parent({"kind": "load_failed", "message": str(exc), "item": str(exc.item)})
        except Exception as exc:  # noqa: BLE001 - the driver gets the reason in words, whatever it was
            return wire.to_parent({"kind": "load_failed", "message": exception_text(exc), "item": None})
        return wire.to_parent({"kind": "loaded", "info": wire.info_to_plain(self._executor.info),
                               "node": node_name(), "pid": os.getpid()})

    def start(self, call_id: int, payload: bytes) -> bytes:
        """Start one call (`payload`: the pickled CallRequest) and return its first event."""
        request = pickle.loads(payload)
        call = _NodeCall()
        with self._lock:
            self._calls[call_id] = call
        threading.Thread(target=self._run, args=(call, request), name="skynet-ray-call", daemon=True).start()
        return self.next_event(call_id)

    def _run(self, call: _NodeCall, request: CallRequest) -> None:
        def relay(instructions: str, input: str | None, settings: dict[str, Any]) -> str:
            box = _Box()
            with call.lock:
                if call.ended:
                    raise LLMCallError("llm() was called after its metric call had ended")
                request_id = next(call.ids)
                call.waiting[request_id] = box
            call.events.put({"kind": "llm", "request": request_id, "instructions": instructions, "input": input,
                             "settings": wire.to_plain(settings)})
            if not box.event.wait(self._timeout + DEADLINE_MARGIN) or box.value is None:
                raise LLMCallError("llm() got no answer from the user's process before its metric call ended")
            if "text" in box.value:
                return str(box.value["text"])
            error = box.value.get("error") or {}
            kind = error.get("failure")
            failure = Failure(kind) if kind in set(Failure) else Failure.JUDGE_ERROR
            raise judge_error(failure, str(error.get("message")), error.get("status"), bool(error.get("refused")))

        try:
            outcome = self._executor.run(request, relay)
        except Exception as exc:  # noqa: BLE001 - the driver gets an outcome whatever happened here
            outcome = Outcome(failure=Failure.CRASHED, detail=f"the node's worker pool failed: {exception_text(exc)}")
        with call.lock:
            call.ended = True
            waiting, call.waiting = call.waiting, {}
        for box in waiting.values():
            box.event.set()  # its value stays None: "no answer before the call ended"
        call.events.put({"kind": "outcome", "outcome": wire.outcome_to_plain(outcome)})

    def next_event(self, call_id: int) -> bytes:
        """The call's next event: an llm() request, its outcome, or "pending" after a few seconds of neither."""
        with self._lock:
            call = self._calls.get(call_id)
        if call is None:
            return wire.to_parent({"kind": "unknown"})
        try:
            event = call.events.get(timeout=POLL)
        except queue.Empty:
            return wire.to_parent({"kind": "pending"})
        if event["kind"] == "outcome":
            with self._lock:
                self._calls.pop(call_id, None)
        return wire.to_parent(event)

    def llm_reply(self, call_id: int, request_id: int, reply: dict[str, Any]) -> None:
        """The driver's answer to one llm() request of a call (dropped when the call has ended)."""
        with self._lock:
            call = self._calls.get(call_id)
        if call is None:
            return
        with call.lock:
            box = call.waiting.pop(request_id, None)
        if box is not None:
            box.value = reply
            box.event.set()

    def pids(self) -> dict[str, Any]:
        """This host's process id and its metric workers' (for tests and for the curious)."""
        workers = getattr(self._executor, "worker_pids", []) if self._executor is not None else []
        return {"host": os.getpid(), "workers": list(workers), "node": node_name()}

    def stop(self) -> None:
        """Stop the node's metric workers (calls in progress there end as failures)."""
        if self._executor is not None:
            self._executor.close()


def node_name() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - a name for messages only
        return os.uname().nodename

