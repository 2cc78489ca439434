"""A judge answer as the stores keep it: its key, the stored entry (answer, model, settings; never a key)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import uuid
from typing import Any

from .._core import secrets
from .._core.logs import logger

# Settings that do not change the answer: left out of the key (and so never written anywhere).
_NOT_KEYED = frozenset(
    {"api_key", "timeout", "request_timeout", "extra_headers", "headers", "num_retries", "max_retries"}
)
ENTRY_VERSION = 2  # entries of another version (or none) are a miss


class BadEntry(Exception):
    """A stored value that is not a judge answer of this version: a pickle, damaged, or failing its check."""


def is_credential_setting(name: object) -> bool:
    """Whether a setting's name suggests a credential (`*key*`, `*secret*`, `*token*`, `*password*`,
    `*credential*`, `azure_ad_token`, `vertex_credentials`...): such a value is never keyed, stored or shown.
    Token counts (max_tokens, max_completion_tokens) are settings, not credentials."""
    text = str(name)
    if text.lower().endswith("tokens"):
        return False
    return secrets.is_credential_name(text)


def public_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` without credentials: credential-named settings and every header's value are left out."""
    kept: dict[str, Any] = {}
    for name, value in settings.items():
        if is_credential_setting(name):
            continue
        if name in ("extra_headers", "headers") and isinstance(value, dict):
            value = {str(header): "<hidden>" for header in value}
        kept[name] = value
    return kept


def request_key(request: dict[str, Any]) -> str:
    """The cache key of a request: a digest of everything that shapes the answer, never a credential."""
    keyed = {key: value for key, value in request.items() if key not in _NOT_KEYED and not is_credential_setting(key)}
    blob = json.dumps(keyed, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _check(key: str, text: str) -> str:
    return hashlib.sha256(f"{ENTRY_VERSION}\0{key}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()


def stored_entry(text: str, request: dict[str, Any], key: str) -> str:
    """What a store keeps for an answer: JSON with the text, its key and a digest of both (the integrity
    check), and the model and settings it was made with (no credential)."""
    left_out = _NOT_KEYED | {"messages", "model"}
    settings = {name: value for name, value in public_settings(request).items() if name not in left_out}
    entry = {"v": ENTRY_VERSION, "key": key, "text": text, "check": _check(key, text),
             "model": str(request.get("model")), "settings": settings}
    return secrets.redact(json.dumps(entry, sort_keys=True, default=repr, ensure_ascii=False))


def entry_text(raw: Any, key: str) -> str | None:
    """The answer text of the entry stored under `key`; None when there is none; BadEntry for a value that is
    not a judge answer of this version (never decoded as anything but JSON: no value can run code)."""
    if raw is None:
        return None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadEntry("a value that is not UTF-8 text (e.g. a pickle)") from None
    if not isinstance(raw, str):
        raise BadEntry(f"a value of type {type(raw).__name__}, not JSON text")
    try:
        entry = json.loads(raw)
    except ValueError:
        raise BadEntry("a value that is not JSON (damaged, or written by something else)") from None
    if not isinstance(entry, dict) or entry.get("v") != ENTRY_VERSION:
        raise BadEntry("an entry of another format or version")
    text = entry.get("text")
    if not isinstance(text, str) or not text or entry.get("key") != key or entry.get("check") != _check(key, text):
        raise BadEntry("an entry that fails its integrity check")
    return text


class WarnOnce:
    """Log a store's first problem as a warning; later ones are only skipped."""

    def __init__(self) -> None:
        self._warned = False
        self._warned_entry = False
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

    def bad_entry(self, where: str, exc: BadEntry) -> None:
        """A stored value that is not a judge answer: a miss (it is replaced by the fresh answer), warned once."""
        with self._lock:
            if self._warned_entry:
                return
            self._warned_entry = True
        logger.warning(
            "skynet-dspy judge cache %s: found %s; it was read as a miss, never decoded, and is replaced by the "
            "fresh answer (later such entries are not logged). Only skynet-dspy should write to this cache.",
            where, exc,
        )


MARKER_TTL = 30.0  # an in-flight marker expires after this long: its owner is slow, silent, or on a dead machine


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None when it is not running or there is
    no /proc; a pid reused by a new process gives another value."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None


def owner_marker() -> str:
    """An in-flight marker's value: who holds it (host, pid, the process's start time) and a token of its own."""
    pid = os.getpid()
    return json.dumps({"host": socket.gethostname(), "pid": pid, "start": _started(pid), "token": uuid.uuid4().hex})


def owner_gone(raw: Any) -> bool:
    """Whether a marker's owner is known to be dead: a process on this host that no longer runs (its pid is gone or
    is another process now). A marker that names no owner is an older version's: treated as gone too."""
    owner = _owner(raw)
    if owner is None:
        return True
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False  # another machine's: it expires unless its owner keeps refreshing it
    pid = owner["pid"]
    started = _started(pid)
    if started is None:
        if os.path.isdir("/proc"):
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    return owner.get("start") is not None and started != owner.get("start")


def _owner(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    try:
        owner = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    return owner if isinstance(owner, dict) else None
