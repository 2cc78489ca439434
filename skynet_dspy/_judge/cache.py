"""Where judge answers are kept, so an identical request is paid once: memory, a folder on disk, or Redis.

Keys are digests of the request (model, messages, settings) without the API key; each stored entry
carries the answer and the model and settings it was made with, never a key. A store that is busy or
broken during a run is skipped for that call, with one warning: the cache is never why a call fails.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from .._core import secrets
from .._core.lru import LRU
from .._core.values import whole_number
from .entries import HeldLocks, WarnOnce, entry_text, stored_entry

MEMORY_CACHE_SIZE = 10_000  # answers kept in memory per judge
DEFAULT_DISK_CACHE_SIZE = 2**30  # bytes on disk before the least recently stored answers are evicted
DISK_LOCK_TIMEOUT = 1.0  # seconds to wait for a disk store another process holds before going on without it
WRITE_QUEUE_WAIT = 5.0  # seconds a write waits for this process's other writes (each bounded by the lock timeout)
BUSY_BACKOFF = 2.0  # seconds the store is skipped after it was busy or broken, so waiting threads go on at once
OPEN_WAIT = 2.0  # seconds load_metric waits to open a disk store another process holds before going on without it
IN_FLIGHT_MARGIN = 5.0  # a request's in-flight marker outlives the judge's request timeout by this many seconds
WAIT_STEP = 0.05  # seconds between looks for an answer another process is fetching
IN_FLIGHT_PREFIX = "skynet-dspy:in-flight:"


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
        except OSError as exc:
            raise self._unusable(exc) from None
        self._timeout = diskcache.Timeout
        self._warn = WarnOnce()
        self._held = HeldLocks()
        self._write_lock = threading.Lock()
        self._skip_until = 0.0  # monotonic time until which the store is skipped (it was busy or broken)
        # diskcache opens a store by writing its settings, waiting up to 60 s while another process holds it:
        # it is opened on a thread of its own, so a held store costs load at most OPEN_WAIT, never a call.
        self._cache: Any = None
        self._closed = False
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        threading.Thread(target=self._open, args=(diskcache, path, size_limit), daemon=True,
                         name="skynet-dspy judge cache").start()
        if not self._opened.wait(OPEN_WAIT):
            self._warn(self.where, TimeoutError(
                "another process holds the store; it is opened in the background, and used once it is free"))
        elif self._open_error is not None:  # a damaged store fails here, not in the middle of a run
            raise self._unusable(self._open_error) from None

    def _open(self, diskcache: Any, path: Path, size_limit: int) -> None:
        try:
            cache = diskcache.Cache(
                str(path), size_limit=size_limit, timeout=DISK_LOCK_TIMEOUT, eviction_policy="least-recently-stored"
            )
            cache.get("skynet-dspy:probe")
            cache.close()  # this thread's connection; each thread that uses the store opens its own
        except (sqlite3.DatabaseError, OSError) as exc:  # sqlite3.OperationalError is a DatabaseError
            self._open_error = exc  # raised by load if it is still waiting; else the store stays unused
        else:
            if self._closed:
                cache.close()
            else:
                self._cache = cache
        finally:
            self._opened.set()

    def _unusable(self, exc: BaseException) -> ValueError:
        return ValueError(
            f"the judge cache at {self.where} cannot be used ({type(exc).__name__}: {exc}); delete the folder or "
            "give another judge_cache="
        )

    def _usable(self) -> Any:
        """The open store, or None: not open (yet), or busy or broken less than BUSY_BACKOFF ago."""
        if self._skip_until and time.monotonic() < self._skip_until:
            return None
        return self._cache

    def _failed(self, exc: BaseException) -> None:
        """A store operation failed: warn (once) and skip the store for BUSY_BACKOFF, so threads that
        would wait for the same lock go on at once."""
        self._skip_until = time.monotonic() + BUSY_BACKOFF
        self._warn(self.where, exc)

    def get(self, key: str) -> str | None:
        cache = self._usable()
        if cache is None:  # not open (yet), or busy a moment ago: no cache for this call
            return None
        try:
            return entry_text(cache.get(key, default=None, retry=False))
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        cache = self._usable()
        if cache is None:
            return
        try:
            with self._writing():
                cache.set(key, stored_entry(text, request), retry=False)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)

    def lead_or_wait(self, key: str, patience: float) -> str | None:
        """None when this process should send the request (it holds the in-flight marker now); else the answer
        another process sharing the folder fetched while this one waited (at most `patience` seconds)."""
        marker, token, cache = f"{IN_FLIGHT_PREFIX}{key}", uuid.uuid4().hex, self._usable()
        if cache is None:
            return None
        try:
            expire = patience + IN_FLIGHT_MARGIN
            if self._take(cache, marker, key, token, expire):
                # leading now; but the answer may have been stored since this process looked
                return entry_text(cache.get(key, default=None, retry=False))
            deadline = time.monotonic() + patience
            while time.monotonic() < deadline:
                text = entry_text(cache.get(key, default=None, retry=False))
                if text is not None:
                    return text
                if marker not in cache:  # the holder finished or gave up: look once more, or lead
                    if self._take(cache, marker, key, token, expire):
                        return entry_text(cache.get(key, default=None, retry=False))
                time.sleep(WAIT_STEP)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)
        return None

    def _take(self, cache: Any, marker: str, key: str, token: str, expire: float) -> bool:
        with self._writing():
            if not cache.add(marker, token, expire=expire, retry=False):
                return False
        self._held.hold(key, token)
        return True

    def release(self, key: str) -> None:
        """Remove the in-flight marker on `key` if this process set it (another process's is left alone)."""
        token = self._held.release(key)
        if token is None:
            return
        marker, cache = f"{IN_FLIGHT_PREFIX}{key}", self._cache  # tried even when busy: others wait for it
        if cache is None:
            return
        try:
            with self._writing(even_when_busy=True), cache.transact(retry=False):
                if cache.get(marker, default=None, retry=False) == token:
                    cache.delete(marker, retry=False)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)  # the marker expires by itself

    @contextlib.contextmanager
    def _writing(self, even_when_busy: bool = False) -> Iterator[None]:
        """One writer per process at a time: this process's threads queue here, not inside SQLite, where a
        writer waiting for the GIL between statements would keep the others past their lock timeout. Each
        write is bounded by DISK_LOCK_TIMEOUT, so the queue moves."""
        if not self._write_lock.acquire(timeout=WRITE_QUEUE_WAIT):
            raise self._timeout(f"this process's writes to the store queued for over {WRITE_QUEUE_WAIT:g} s")
        try:
            if not even_when_busy and self._usable() is None:  # the store was busy a moment ago: do not wait again
                raise self._timeout("the store was busy a moment ago")
            yield
        finally:
            self._write_lock.release()

    def close(self) -> None:
        self._closed = True
        if self._cache is not None:
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
    """The cache a `judge_cache=` option asks for: True memory, False none, a folder path, or a redis:// URL.

    `size_limit` (judge_cache_size=) is the disk cache's size in bytes, past which the least recently
    stored answers are evicted; it applies to a folder only.
    """
    if size_limit is not None:
        whole_number("judge_cache_size", size_limit, minimum=1, unit="bytes")
        if isinstance(spec, bool) or spec is None or not isinstance(spec, (str, os.PathLike)) or str(spec).startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError(
                "judge_cache_size= bounds the judge's disk cache (bytes); give judge_cache='some/folder' with it, "
                f"or leave it out (judge_cache={secrets.redact(repr(spec))})"
            )
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
