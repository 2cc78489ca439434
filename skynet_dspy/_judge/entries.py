"""A judge answer as the stores keep it: its key, the stored entry (answer, model, settings; never a key)."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from .._core import secrets
from .._core.logs import logger

# Settings that do not change the answer: left out of the key (and so never written anywhere).
_NOT_KEYED = frozenset(
    {"api_key", "timeout", "request_timeout", "extra_headers", "headers", "num_retries", "max_retries"}
)


def request_key(request: dict[str, Any]) -> str:
    """The cache key of a request: a digest of everything that shapes the answer, never the key."""
    keyed = {key: value for key, value in request.items() if key not in _NOT_KEYED}
    blob = json.dumps(keyed, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def stored_entry(text: str, request: dict[str, Any]) -> str:
    """What a store keeps for an answer: the text, and the model and settings it was made with (no key)."""
    settings = {key: value for key, value in request.items() if key not in _NOT_KEYED | {"messages", "model"}}
    entry = {"text": text, "model": str(request.get("model")), "settings": settings}
    return secrets.redact(json.dumps(entry, sort_keys=True, default=repr, ensure_ascii=False))


def entry_text(raw: Any) -> str | None:
    """The answer text of a stored entry, or None for anything else (a foreign or damaged value)."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    text = entry.get("text") if isinstance(entry, dict) else None
    return text if isinstance(text, str) and text else None


class WarnOnce:
    """Log a store's first problem as a warning; later ones are only skipped."""

    def __init__(self) -> None:
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self, where: str, exc: BaseException) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        logger.warning(
            "skynet-dspy judge cache %s: %s: %s (going on without it for this call; later such problems are not "
            "logged)", where, type(exc).__name__, secrets.redact(str(exc)),
        )


class HeldLocks:
    """The in-flight locks this process holds on a shared store, by request key, each with its own token
    (so releasing never frees another process's lock on the same key)."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}
        self._lock = threading.Lock()

    def hold(self, key: str, token: str) -> None:
        with self._lock:
            self._tokens[key] = token

    def release(self, key: str) -> str | None:
        """The token of this process's lock on `key`, now forgotten; None when it holds none."""
        with self._lock:
            return self._tokens.pop(key, None)
