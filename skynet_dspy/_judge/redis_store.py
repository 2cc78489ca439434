"""Judge answers on a Redis server: one cache shared by runs on several machines (`judge_cache="redis://..."`).

Entries are JSON with an integrity check (anything else is a miss, with one warning), under
`skynet-dspy:judge:<digest>`; the in-flight marker of an identical request is a SET NX with an expiry (cache.py).
A server that cannot be reached during a run means "no cache for this call", with one warning; at load it is a
clear error.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from .._core import secrets
from ..errors import MissingExtra
from .entries import MARKER_TTL, SharedStore, owner_gone

KEY_PREFIX = "skynet-dspy:judge:"
SOCKET_TIMEOUT = 2.0  # seconds for any Redis command: a slow server never holds a judge call for long

# Set KEYS[1] to ARGV[2] (with an expiry of ARGV[3] ms; "" deletes it), only if it still holds ARGV[1].
_SWAP = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end "
    "if ARGV[2] == '' then return redis.call('del', KEYS[1]) end "
    "return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])"
)


class RedisStore(SharedStore):
    """Answers in Redis; entries carry model and settings, never a key."""

    def __init__(self, url: str):
        try:
            import redis
        except ImportError:
            raise MissingExtra(
                "judge_cache='redis://...' needs the redis client: pip install 'skynet-dspy[redis]'"
            ) from None
        secrets.register(urllib.parse.urlsplit(url).password)  # redis://:password@host: no user for the URL pattern
        super().__init__(secrets.redact(url))
        self.errors = (redis.RedisError, OSError)
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

    def _raw(self, key: str) -> Any:
        return self._client.get(KEY_PREFIX + key)

    def _write(self, key: str, entry: str) -> None:
        self._client.set(KEY_PREFIX + key, entry)

    def _claim(self, marker: str, owner: str) -> bool:
        """Set the marker (naming this process) unless a live owner holds it: a dead owner's is taken over."""
        ttl = int(MARKER_TTL * 1000)
        if self._client.set(KEY_PREFIX + marker, owner, nx=True, px=ttl):
            return True
        held = self._client.get(KEY_PREFIX + marker)
        return held is not None and owner_gone(held) and bool(self._client.eval(_SWAP, 1, KEY_PREFIX + marker,
                                                                                  held, owner, ttl))

    def _unclaim(self, marker: str, owner: str) -> None:
        self._client.eval(_SWAP, 1, KEY_PREFIX + marker, owner, "", 0)
