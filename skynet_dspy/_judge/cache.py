"""Where judge answers are kept, so an identical request is paid once: memory, a folder on disk, or Redis.

Keys are digests of the request (model, messages, settings) without any credential; each stored entry
is JSON carrying the answer, an integrity check, and the model and settings it was made with, never a
credential. Nothing read from a store is decoded as anything but JSON (diskcache's pickled values are
refused unread), so a store's contents cannot run code. A store that is busy or broken during a run is
skipped for that call, and a foreign or damaged entry is a miss, each with one warning: the cache is
never why a call fails.
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
from .entries import (
    MARKER_TTL,
    BadEntry,
    HeldLocks,
    WarnOnce,
    entry_text,
    marker_token,
    owner_gone,
    owner_marker,
    stored_entry,
)

MEMORY_CACHE_SIZE = 10_000  # answers kept in memory per judge
DEFAULT_DISK_CACHE_SIZE = 2**30  # bytes on disk before the least recently stored answers are evicted
DISK_LOCK_TIMEOUT = 1.0  # seconds to wait for a disk store another process holds before going on without it
WRITE_QUEUE_WAIT = 5.0  # seconds a write waits for this process's other writes (each bounded by the lock timeout)
BUSY_BACKOFF = 2.0  # seconds the store is skipped after it was busy or broken, so waiting threads go on at once
OPEN_WAIT = 2.0  # seconds load_metric waits to open a disk store another process holds before going on without it
WAIT_STEP = 0.05  # seconds between looks for an answer another process is fetching
IN_FLIGHT_PREFIX = "skynet-dspy:in-flight:"


class AnswerStore(Protocol):
    """A place that outlives one judge: a folder on disk, a Redis server."""

    where: str

    def get(self, key: str) -> str | None: ...

    def put(self, key: str, text: str, request: dict[str, Any]) -> None: ...


def private_folder(path: Path, option: str = "judge_cache") -> None:
    """Create `path` private to this user (mode 0700), or check an existing one is: owned by this user and
    writable by no one else. Anyone else who can write the folder could plant entries or markers."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}={str(path)!r} is a file; give a folder for the judge's disk cache")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()  # the folder itself, after any symlink to it
        link = path.lstat()
    except OSError as exc:
        raise ValueError(
            f"the judge cache at {path} cannot be used ({type(exc).__name__}: {exc}); give another {option}="
        ) from None
    me = os.getuid()
    for what, stat in (("folder", info), ("symbolic link to the folder", link)):
        if stat.st_uid != me:
            raise ValueError(
                f"{option}={str(path)!r}: the {what} belongs to another user (uid {stat.st_uid}, you are {me}), who "
                "could plant entries in it; use a folder of your own, e.g. judge_cache='~/.cache/skynet-dspy-judge'"
            )
    if info.st_mode & 0o022:
        raise ValueError(
            f"{option}={str(path)!r}: the folder can be written by other users (mode {info.st_mode & 0o777:o}), who "
            f"could plant entries in it; make it private (chmod 700 {path}) or use another folder"
        )


_safe_disk: Any = None


def safe_disk(diskcache: Any) -> Any:
    """A diskcache Disk that never unpickles: values and keys are str or bytes only, and a stored value of any
    other mode (diskcache's pickle mode, planted by someone else) raises BadEntry unread. Files it reads or
    deletes must be inside the cache folder (a planted row could name another path)."""
    global _safe_disk
    if _safe_disk is not None:
        return _safe_disk

    class SafeDisk(diskcache.Disk):
        def put(self, key: Any) -> Any:
            if not isinstance(key, str):
                raise TypeError("the judge cache keeps str keys only")
            return super().put(key)

        def get(self, key: Any, raw: bool) -> Any:
            if not raw:
                raise BadEntry("a pickled key")
            return super().get(key, raw)

        def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
            if read or not isinstance(value, (str, bytes)):
                raise TypeError("the judge cache keeps JSON text only")
            return super().store(value, read, key=key)

        def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
            if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY, diskcache.core.MODE_TEXT):
                raise BadEntry("a pickled value (diskcache's pickle mode), which the judge never writes")
            if filename is not None and not self._inside(filename):
                raise BadEntry("a value naming a file outside the cache folder")
            return super().fetch(mode, filename, value, read)

        def remove(self, file_path: Any) -> Any:
            if self._inside(file_path):
                return super().remove(file_path)
            return None

        def _inside(self, filename: Any) -> bool:
            root = os.path.realpath(self._directory)
            if not isinstance(filename, str):
                return False
            return os.path.realpath(os.path.join(root, filename)).startswith(root + os.sep)

    _safe_disk = SafeDisk
    return SafeDisk


class DiskStore:
    """Answers in a folder, through diskcache: size-bounded, shared safely by threads and processes."""

    def __init__(self, directory: str | os.PathLike[str], size_limit: int = DEFAULT_DISK_CACHE_SIZE):
        import diskcache

        path = Path(directory).expanduser()
        self.where = str(path)
        private_folder(path)
        self._timeout = diskcache.Timeout
        self._warn = WarnOnce()
        self._held = HeldLocks(self._heartbeat)
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
                str(path), size_limit=size_limit, timeout=DISK_LOCK_TIMEOUT, eviction_policy="least-recently-stored",
                disk=safe_disk(diskcache),
            )
            cache.get("skynet-dspy:probe")
            cache.close()  # this thread's connection; each thread that uses the store opens its own
        except (sqlite3.DatabaseError, OSError, BadEntry) as exc:  # sqlite3.OperationalError is a DatabaseError
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
            return self._read(cache, key)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)
            return None

    def _read(self, cache: Any, key: str) -> str | None:
        """The answer stored under `key`; None for none, and for a foreign or damaged entry (warned once)."""
        try:
            return entry_text(cache.get(key, default=None, retry=False), key)
        except (BadEntry, UnicodeDecodeError, ValueError) as exc:
            self._warn.bad_entry(self.where, exc if isinstance(exc, BadEntry) else BadEntry(str(exc)))
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        cache = self._usable()
        if cache is None:
            return
        try:
            with self._writing():
                cache.set(key, stored_entry(text, request, key), retry=False)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)

    def lead_or_wait(self, key: str, patience: float, stop: threading.Event | None = None) -> str | None:
        """None when this process should send the request (it holds the in-flight marker now); else the answer
        another process sharing the folder fetched while this one waited (at most `patience` seconds, or until
        `stop` is set)."""
        marker, token, cache = f"{IN_FLIGHT_PREFIX}{key}", uuid.uuid4().hex, self._usable()
        if cache is None:
            return None
        try:
            if self._take(cache, marker, key, token):
                # leading now; but the answer may have been stored since this process looked
                return self._read(cache, key)
            deadline = time.monotonic() + patience
            while time.monotonic() < deadline:
                text = self._read(cache, key)
                if text is not None:
                    return text
                # the holder finished, gave up, went silent (the marker expired) or died: look once more, or lead
                if self._take(cache, marker, key, token):
                    return self._read(cache, key)
                if stop is not None and stop.wait(WAIT_STEP):  # the request's call ended: stop waiting
                    break
                if stop is None:
                    time.sleep(WAIT_STEP)
        except (self._timeout, sqlite3.Error, OSError) as exc:
            self._failed(exc)
        return None

    def _take(self, cache: Any, marker: str, key: str, token: str) -> bool:
        """Set the in-flight marker on `key` (naming this process), unless a live owner holds it: a marker whose
        owner is a dead process on this host is taken over at once."""
        with self._writing(), cache.transact(retry=False):
            held = _marker(cache, marker)
            if held is not None and not owner_gone(held):
                return False
            cache.set(marker, owner_marker(token), expire=MARKER_TTL, retry=False)
        self._held.hold(key, token)
        return True

    def _heartbeat(self, key: str, token: str) -> None:
        """Keep this process's marker on `key` from expiring while it fetches the answer."""
        cache = self._cache
        if cache is None:
            return
        marker = f"{IN_FLIGHT_PREFIX}{key}"
        with self._writing(even_when_busy=True), cache.transact(retry=False):
            if marker_token(_marker(cache, marker)) == token:
                cache.touch(marker, expire=MARKER_TTL, retry=False)

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
                if marker_token(_marker(cache, marker)) == token:
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


def _marker(cache: Any, marker: str) -> Any:
    """An in-flight marker's value; None when there is none or it is not a marker (a planted value)."""
    try:
        return cache.get(marker, default=None, retry=False)
    except BadEntry:
        return None


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
