"""A judge answer as the stores keep it: its key, the stored entry (answer, model, settings; never a key), and the
store processes share (SharedStore: a folder, a Redis server), with its in-flight markers naming their owner."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
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
BUSY_BACKOFF = 2.0  # seconds a store is skipped after it was busy or broken, so waiting threads go on at once
WAIT_STEP = 0.05  # seconds between looks for an answer another process is fetching
IN_FLIGHT_PREFIX = "skynet-dspy:in-flight:"


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


class SharedStore:
    """A store processes share (a folder, a Redis server): answers by key, and an in-flight marker per key so an
    identical request is sent once. A subclass reads and writes raw values and sets / clears markers."""

    errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, where: str):
        self.where = where
        self._warn = WarnOnce()
        self._skip_until = 0.0  # monotonic time until which the store is skipped (it was busy or broken)
        self._held: dict[str, str] = {}  # the markers this process set, by key
        self._held_lock = threading.Lock()

    def _raw(self, key: str) -> Any:
        raise NotImplementedError

    def _write(self, key: str, entry: str) -> None:
        raise NotImplementedError

    def _claim(self, marker: str, owner: str) -> bool:
        raise NotImplementedError

    def _unclaim(self, marker: str, owner: str) -> None:
        raise NotImplementedError

    def skipping(self) -> bool:
        return bool(self._skip_until) and time.monotonic() < self._skip_until

    def _failed(self, exc: BaseException) -> None:
        """An operation failed: warn (once) and skip the store for BUSY_BACKOFF, so a store that hangs costs one call
        its timeout, not every call."""
        self._skip_until = time.monotonic() + BUSY_BACKOFF
        self._warn(self.where, exc)

    def get(self, key: str) -> str | None:
        if self.skipping():
            return None
        try:
            return self._read(key)
        except self.errors as exc:
            self._failed(exc)
            return None

    def _read(self, key: str) -> str | None:
        """The answer stored under `key`; None for none, and for a foreign or damaged entry (warned once)."""
        try:
            return entry_text(self._raw(key), key)
        except (BadEntry, UnicodeDecodeError, ValueError) as exc:
            self._warn.bad_entry(self.where, exc if isinstance(exc, BadEntry) else BadEntry(str(exc)))
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        if self.skipping():
            return
        try:
            self._write(key, stored_entry(text, request, key))
        except self.errors as exc:
            self._failed(exc)

    def lead_or_wait(self, key: str, patience: float, stop: threading.Event | None = None) -> str | None:
        """None when this process should send the request (it holds the marker on `key` now); else the answer another
        process fetched while this one waited (at most `patience` seconds, or until `stop` is set)."""
        owner, deadline, stop = owner_marker(), time.monotonic() + patience, stop or threading.Event()
        try:
            while not self.skipping():
                if self._claim(IN_FLIGHT_PREFIX + key, owner):
                    with self._held_lock:
                        self._held[key] = owner
                    return self._read(key)  # the answer may have been stored since this process looked
                text = self._read(key)
                if text is not None or time.monotonic() > deadline or stop.wait(WAIT_STEP):
                    return text
        except self.errors as exc:
            self._failed(exc)
        return None

    def release(self, key: str) -> None:
        """Clear the marker on `key` if this process set it (another process's is left alone; it also expires)."""
        with self._held_lock:
            owner = self._held.pop(key, None)
        if owner is not None:
            try:
                self._unclaim(IN_FLIGHT_PREFIX + key, owner)
            except self.errors as exc:
                self._failed(exc)
