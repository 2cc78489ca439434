"""Where judge answers are kept, so an identical request is paid once: memory, a folder on disk, or Redis.

Keys are digests of the request (model, messages, settings) without the API key; each stored entry
carries the answer and the model and settings it was made with, never a key. A store that is busy or
broken during a run is skipped for that call, with one warning: the cache is never why a call fails.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Protocol

from .._core.lru import LRU
from .entries import WarnOnce, entry_text, stored_entry

MEMORY_CACHE_SIZE = 10_000  # answers kept in memory per judge
DEFAULT_DISK_CACHE_SIZE = 2**30  # bytes on disk before the least recently stored answers are evicted
DISK_LOCK_TIMEOUT = 0.2  # seconds to wait for a disk store another process holds before going on without it


class AnswerStore(Protocol):
    """A place that outlives one judge: a folder on disk, a Redis server."""

    where: str

    def get(self, key: str) -> str | None: ...

    def put(self, key: str, text: str, request: dict[str, Any]) -> None: ...


class DiskStore:
    """Answers in a folder, through diskcache: size-bounded, shared safely by threads and processes."""

    def __init__(self, directory: str | os.PathLike[str], size_limit: int = DEFAULT_DISK_CACHE_SIZE):
        import diskcache

        path = Path(directory).expanduser()
        self.where = str(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"judge_cache={str(directory)!r} is a file; give a folder for the judge's disk cache")
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(
                str(path), size_limit=size_limit, timeout=DISK_LOCK_TIMEOUT, eviction_policy="least-recently-stored"
            )
            self._cache.get("skynet-dspy:probe")  # a damaged store fails here, not in the middle of a run
        except (sqlite3.DatabaseError, OSError) as exc:
            raise ValueError(
                f"the judge cache at {path} cannot be used ({type(exc).__name__}: {exc}); delete the folder or give "
                "another judge_cache="
            ) from None
        self._timeout = diskcache.Timeout
        self._warn = WarnOnce()

    def get(self, key: str) -> str | None:
        try:
            return entry_text(self._cache.get(key, default=None, retry=False))
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._warn(self.where, exc)
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        try:
            self._cache.set(key, stored_entry(text, request), retry=False)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._warn(self.where, exc)

    def close(self) -> None:
        self._cache.close()


class AnswerCache:
    """Memory in front, an optional store behind: get() looks in both, put() writes both."""

    def __init__(self, store: AnswerStore | None = None, memory_size: int = MEMORY_CACHE_SIZE):
        self.memory: LRU[str, str] = LRU(memory_size)
        self.store = store

    def get(self, key: str) -> str | None:
        text = self.memory.get(key)
        if text is None and self.store is not None:
            text = self.store.get(key)
            if text is not None:
                self.memory.put(key, text)
        return text

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        self.memory.put(key, text)
        if self.store is not None:
            self.store.put(key, text, request)

    def describe(self) -> str:
        return self.store.where if self.store is not None else "memory"


def make_cache(spec: Any, size_limit: int | None = None) -> AnswerCache | None:
    """The cache a `judge_cache=` option asks for: True memory, False none, a folder path, or a redis:// URL."""
    if spec is False or spec is None:
        return None
    if spec is True:
        return AnswerCache()
    if isinstance(spec, str) and spec.startswith(("redis://", "rediss://", "unix://")):
        from .redis_store import RedisStore

        return AnswerCache(RedisStore(spec))
    if isinstance(spec, (str, os.PathLike)):
        return AnswerCache(DiskStore(spec, size_limit or DEFAULT_DISK_CACHE_SIZE))
    raise TypeError(
        "judge_cache must be True (in memory), False, a folder path for a disk cache, or a redis://host:port/db URL; "
        f"got {type(spec).__name__}"
    )
