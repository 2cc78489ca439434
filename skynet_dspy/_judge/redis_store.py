"""Judge answers on a Redis server: one cache shared by runs on several machines (`judge_cache="redis://..."`).

Identical requests in flight in different processes reach the model once: the first takes a short-lived
lock in Redis (SET NX with an expiry, refreshed by a heartbeat while its owner lives; the value names the
owner, so a dead owner's lock is taken over at once), the others wait for its answer. Entries are JSON
with an integrity check; anything else is a miss, with one warning. A server that cannot be reached
during a run means "no cache for this call", with one warning; at load it is a clear error.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from typing import Any

from .._core import secrets
from ..errors import MissingExtra
from .entries import MARKER_TTL, BadEntry, HeldLocks, WarnOnce, entry_text, owner_gone, owner_marker, stored_entry

KEY_PREFIX = "skynet-dspy:judge:"
WAIT_STEP = 0.05  # seconds between looks for an answer another process is fetching
SOCKET_TIMEOUT = 2.0  # seconds for any Redis command: a slow server never holds a judge call for long
BUSY_BACKOFF = 2.0  # seconds the server is left alone after a command failed, so other calls go on at once


class RedisStore:
    """Answers in Redis under `skynet-dspy:judge:<digest>`; entries carry model and settings, never a key."""

    def __init__(self, url: str):
        try:
            import redis
        except ImportError:
            raise MissingExtra(
                "judge_cache='redis://...' needs the redis client: pip install 'skynet-dspy[redis]'"
            ) from None
        password = urllib.parse.urlsplit(url).password if isinstance(url, str) else None
        secrets.register(password)  # redis://:password@host has no user name, which the URL pattern needs
        self.where = secrets.redact(url)
        self._errors = (redis.RedisError, OSError)
        try:
            self._client = redis.Redis.from_url(
                url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
            )
            self._client.ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise ValueError(
                f"the judge cache at {self.where} cannot be reached "
                f"({type(exc).__name__}: {secrets.redact(str(exc))}); "
                "start the Redis server, fix the URL, or give another judge_cache="
            ) from None
        self._warn = WarnOnce()
        self._held = HeldLocks(self._heartbeat)
        self._skip_until = 0.0  # monotonic time until which the server is left alone (a command failed)

    def get(self, key: str) -> str | None:
        if self._skipping():
            return None
        try:
            return self._read(key)
        except self._errors as exc:
            self._failed(exc)
            return None

    def _read(self, key: str) -> str | None:
        """The answer stored under `key`; None for none, and for a foreign or damaged entry (warned once)."""
        try:
            return entry_text(self._client.get(KEY_PREFIX + key), key)
        except BadEntry as exc:
            self._warn.bad_entry(self.where, exc)
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        if self._skipping():
            return
        try:
            self._client.set(KEY_PREFIX + key, stored_entry(text, request, key))
        except self._errors as exc:
            self._failed(exc)

    def _skipping(self) -> bool:
        return bool(self._skip_until) and time.monotonic() < self._skip_until

    def _failed(self, exc: BaseException) -> None:
        """A command failed: warn (once) and leave the server alone for BUSY_BACKOFF, so a server that hangs
        costs one call its socket timeout, not every call."""
        self._skip_until = time.monotonic() + BUSY_BACKOFF
        self._warn(self.where, exc)

    def lead_or_wait(self, key: str, patience: float, stop: threading.Event | None = None) -> str | None:
        """None when this process should send the request (it holds the lock now); else the answer another
        process fetched while this one waited (at most `patience` seconds, or until `stop` is set)."""
        lock, token = f"{KEY_PREFIX}lock:{key}", uuid.uuid4().hex
        if self._skipping():
            return None
        try:
            if self._take(lock, key, token):
                # leading now; but the answer may have been stored since this process looked
                return self._read(key)
            deadline = time.monotonic() + patience
            while time.monotonic() < deadline:
                text = self._read(key)
                if text is not None:
                    return text
                # the holder finished, gave up, went silent (the lock expired) or died: look once more, or lead
                if self._take(lock, key, token):
                    return self._read(key)
                if stop is not None and stop.wait(WAIT_STEP):  # the request's call ended: stop waiting
                    break
                if stop is None:
                    time.sleep(WAIT_STEP)
        except self._errors as exc:
            self._failed(exc)
        return None

    def _take(self, lock: str, key: str, token: str) -> bool:
        """Take the lock on `key` (naming this process), unless a live owner holds it: the lock of a dead process on
        this host is taken over at once."""
        mine = owner_marker(token)
        if not self._client.set(lock, mine, nx=True, px=int(MARKER_TTL * 1000)):
            held = self._client.get(lock)
            if held is None or not owner_gone(held):
                return False
            if not self._client.eval(_TAKE_OVER, 1, lock, held, mine, int(MARKER_TTL * 1000)):
                return False
        self._held.hold(key, token)
        return True

    def _heartbeat(self, key: str, token: str) -> None:
        """Keep this process's lock on `key` from expiring while it fetches the answer."""
        self._client.eval(_REFRESH, 1, f"{KEY_PREFIX}lock:{key}", token, int(MARKER_TTL * 1000))

    def release(self, key: str) -> None:
        """Free the lock on `key` if this process holds it (another process's lock is left alone)."""
        token = self._held.release(key)
        if token is None:
            return
        try:
            self._client.eval(_RELEASE, 1, f"{KEY_PREFIX}lock:{key}", token)
        except self._errors as exc:
            self._warn(self.where, exc)


# Whether the lock KEYS[1] holds this process's token ARGV[1] (it may have expired and been taken since).
_MINE = (
    "local v = redis.call('get', KEYS[1]) if not v then return false end "
    "local ok, owner = pcall(cjson.decode, v) "
    "if not ok or type(owner) ~= 'table' or owner['token'] ~= ARGV[1] then return false end "
)
_RELEASE = _MINE + "return redis.call('del', KEYS[1])"
_REFRESH = _MINE + "return redis.call('pexpire', KEYS[1], ARGV[2])"
# Replace a dead owner's lock, only if it is still the value that was judged dead.
_TAKE_OVER = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
    "return false"
)
