"""llm() inside a worker, answered here in the user's process (which holds the judge and its keys) on the bounded
llm() pool, so the call's timeout keeps running; every request is checked again (a worker may write its own)."""

from __future__ import annotations

from typing import Any

from ..context import LLMHandler, llm_pool
from ..errors import NO_JUDGE_MODEL, LLMCallError, ModelNotConfigured, judge_failure
from ..types import Failure
from ..values import check_llm_arguments, exception_text
from . import wire
from .handle import MAX_LLM_AT_ONCE, WorkerProcess


def serve_llm(worker: WorkerProcess, message: dict[str, Any], call_id: int, llm: LLMHandler | None) -> bool:
    """Answer a worker's llm() request (`llm` is bound to the call's scope); False when it was refused at once (too
    many in flight)."""
    request_id = message.get("request")
    if not worker.llm_slots.acquire(blocking=False):
        _reply(worker, _llm_error(request_id, Failure.JUDGE_ERROR,
                                  f"more than {MAX_LLM_AT_ONCE} llm() calls at once from one metric call"))
        return False

    def answer() -> None:
        instructions, input_text, settings = message.get("instructions"), message.get("input"), message.get("settings")
        settings = settings if isinstance(settings, dict) else {}
        try:
            if message.get("call") != call_id:
                raise LLMCallError("llm() was called after its metric call had ended")
            if llm is None:
                raise ModelNotConfigured(NO_JUDGE_MODEL)
            check_llm_arguments(instructions, input_text, settings)  # again here: a worker may write its own request
            reply = {"kind": "llm_reply", "request": request_id,
                     "text": str(llm(instructions, input_text, settings))}  # type: ignore[arg-type]  # checked above
        except Exception as exc:  # noqa: BLE001 - every failure is answered, or the worker would wait forever
            kind = judge_failure(exc)
            text = exception_text(exc) if kind is None else str(exc)
            called = exc if isinstance(exc, LLMCallError) else None  # a failed call says its HTTP status
            reply = _llm_error(request_id, kind or Failure.JUDGE_ERROR, text,
                               called.status if called else None, called.refused if called else False)
        worker.llm_slots.release()
        _reply(worker, reply)

    llm_pool.submit(answer)
    return True


def _llm_error(
    request_id: Any, kind: Failure, message: str, status: int | None = None, refused: bool = False
) -> dict[str, Any]:
    error = {"failure": str(kind), "message": message, "status": status, "refused": refused}
    return {"kind": "llm_reply", "request": request_id, "error": error}


def _reply(worker: WorkerProcess, reply: dict[str, Any]) -> None:
    try:
        worker.send(wire.to_worker(reply))
    except (OSError, ValueError):  # the worker is gone (timed out, killed): nobody is waiting
        pass
