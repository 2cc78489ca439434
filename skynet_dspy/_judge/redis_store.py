"""Judge answers on a Redis server: one cache shared by runs on several machines (`judge_cache="redis://..."`).

Identical requests in flight in different processes reach the model once: the first takes a short-lived
lock in Redis (SET NX with an expiry), the others wait for its answer. A server that cannot be reached
during a run means "no cache for this call", with one warning; at load it is a clear error.
"""

from __future__ import annotations

import time
from typing import Any

from .._core import secrets
from ..errors import MissingExtra
from .entries import WarnOnce, entry_text, stored_entry

KEY_PREFIX = "skynet-dspy:judge:"
LOCK_SECONDS = 120  # an answer being fetched holds its lock at most this long (a crashed holder frees it)
WAIT_STEP = 0.05  # seconds between looks for an answer another process is fetching
SOCKET_TIMEOUT = 2.0  # seconds for any Redis command: a slow server never holds a judge call for long


class RedisStore:
    """Answers in Redis under `skynet-dspy:judge:<digest>`; entries carry model and settings, never a key."""

    def __init__(self, url: str):
        try:
            import redis
        except ImportError:
            raise MissingExtra(
                "judge_cache='redis://...' needs the redis client: pip install 'skynet-dspy[redis]'"
            ) from None
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

    def get(self, key: str) -> str | None:
        try:
            return entry_text(self._client.get(KEY_PREFIX + key))
        except self._errors as exc:
            self._warn(self.where, exc)
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        try:
            self._client.set(KEY_PREFIX + key, stored_entry(text, request))
        except self._errors as exc:
            self._warn(self.where, exc)

    def lead_or_wait(self, key: str, patience: float) -> str | None:
        """None when this process should send the request (it holds the lock now); else the answer another
        process fetched while this one waited (at most `patience` seconds)."""
        lock = f"{KEY_PREFIX}lock:{key}"
        try:
            if self._client.set(lock, "1", nx=True, ex=LOCK_SECONDS):
                return None
            deadline = time.monotonic() + patience
            while time.monotonic() < deadline:
                text = entry_text(self._client.get(KEY_PREFIX + key))
                if text is not None:
                    return text
                if not self._client.exists(lock):  # the holder failed or gave up: try to lead instead
                    if self._client.set(lock, "1", nx=True, ex=LOCK_SECONDS):
                        return None
                time.sleep(WAIT_STEP)
        except self._errors as exc:
            self._warn(self.where, exc)
        return None

    def release(self, key: str) -> None:
        try:
            self._client.delete(f"{KEY_PREFIX}lock:{key}")
        except self._errors as exc:
            self._warn(self.where, exc)
