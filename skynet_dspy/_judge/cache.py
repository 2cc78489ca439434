"""Where judge answers are kept, so an identical request is paid once: memory, a folder on disk, or Redis.

Keys are digests of the request (entries.request_key); each stored entry is JSON carrying the answer, an integrity
check, and the model and settings it was made with, never a credential. Nothing read from a store is decoded as
anything but JSON (diskcache's pickled values are refused unread), so a store's contents cannot run code. A folder is
held open by descriptor once checked, so swapping it afterwards changes nothing. A store that is busy or broken
during a run is skipped for that call, and a foreign or damaged entry is a miss, each with one warning: the cache is
never why a call fails. Processes sharing a store send an identical request once: the first sets a short-lived
marker naming itself (entries.owner_marker), the others wait for its answer; a dead owner's marker is taken over.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._core import secrets
from .._core.lru import LRU
from .._core.values import whole_number
from .entries import MARKER_TTL, BadEntry, SharedStore, owner_gone

MEMORY_CACHE_SIZE = 10_000  # answers kept in memory per judge
DEFAULT_DISK_CACHE_SIZE = 2**30  # bytes on disk before the least recently stored answers are evicted
DISK_LOCK_TIMEOUT = 1.0  # seconds to wait for a disk store another process holds before going on without it
WRITE_QUEUE_WAIT = 5.0  # seconds a write waits for this process's other writes (each bounded by the lock timeout)
OPEN_WAIT = 2.0  # seconds load_metric waits to open a disk store another process holds before going on without it


def private_folder(path: Path, option: str = "judge_cache", what: str = "the judge cache") -> str:
    """Create `path` private to this user (mode 0700), or check an existing one is: owned by this user and writable
    by no one else (who could plant entries). Returns the folder as held open by descriptor (/proc/self/fd/N where
    there is /proc): whoever can write its parent cannot swap it after this check."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}={str(path)!r} is a file; give a folder")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        link = path.lstat()
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        info = os.fstat(folder)  # the folder itself, after any symlink to it
    except OSError as exc:
        raise ValueError(
            f"{what} at {path} cannot be used ({type(exc).__name__}: {exc}); give another {option}="
        ) from None
    me = os.getuid()
    problem = None
    for what, stat in (("folder", info), ("symbolic link to the folder", link)):
        if stat.st_uid != me and problem is None:
            problem = (f"{option}={str(path)!r}: the {what} belongs to another user (uid {stat.st_uid}, you are {me}), "
                       "who could plant entries in it; use a folder of your own, e.g. '~/.cache/skynet-dspy-judge'")
    if problem is None and info.st_mode & 0o022:
        problem = (f"{option}={str(path)!r}: the folder can be written by other users (mode {info.st_mode & 0o777:o}), "
                   f"who could plant entries in it; make it private (chmod 700 {path}) or use another folder")
    held = f"/proc/self/fd/{folder}"
    if problem is not None or not os.path.isdir(held):
        os.close(folder)
    if problem is not None:
        raise ValueError(problem)
    return held if os.path.isdir(held) else str(path)


_safe_disk: Any = None


def safe_disk(diskcache: Any) -> Any:
    """A diskcache Disk that never unpickles: values and keys are str or bytes only, and a stored value of any
    other mode (diskcache's pickle mode, planted by someone else) raises BadEntry unread. Files it reads or
    deletes must be inside the cache folder (a planted row could name another path)."""
    global _safe_disk
    if _safe_disk is not None:
        return _safe_disk

    class SafeDisk(diskcache.Disk):  # type: ignore[misc,unused-ignore]
        def put(self, key: Any) -> Any:
            if not isinstance(key, str):
                raise TypeError("this store keeps str keys only")
            return super().put(key)

        def get(self, key: Any, raw: bool) -> Any:
            if not raw:
                raise BadEntry("a pickled key")
            return super().get(key, raw)

        def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
            if read or not isinstance(value, (str, bytes)):
                raise TypeError("this store keeps JSON text only")
            return super().store(value, read, key=key)

        def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
            if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY, diskcache.core.MODE_TEXT):
                raise BadEntry("a pickled value (diskcache's pickle mode), which skynet-dspy never writes")
            if filename is not None and not self._inside(filename):
                raise BadEntry("a value naming a file outside the cache folder")
            return super().fetch(mode, filename, value, read)

        def remove(self, file_path: Any) -> Any:
            return super().remove(file_path) if self._inside(file_path) else None

        def _inside(self, filename: Any) -> bool:
            root = os.path.realpath(self._directory)
            inside = isinstance(filename, str) and os.path.realpath(os.path.join(root, filename))
            return bool(inside) and str(inside).startswith(root + os.sep)

    _safe_disk = SafeDisk
    return SafeDisk


def json_cache(path: Path, what: str, **settings: Any) -> Any:
    """A diskcache.Cache in a private folder, held by descriptor, that keeps JSON text only (safe_disk)."""
    import diskcache

    return diskcache.Cache(private_folder(path.expanduser(), "folder", what), disk=safe_disk(diskcache), **settings)


class DiskStore(SharedStore):
    """Answers in a folder, through diskcache: size-bounded, shared safely by threads and processes."""

    def __init__(self, directory: str | os.PathLike[str], size_limit: int = DEFAULT_DISK_CACHE_SIZE):
        import diskcache

        path = Path(directory).expanduser()
        super().__init__(str(path))
        held = private_folder(path)
        self.errors = (diskcache.Timeout, sqlite3.Error, OSError)
        self._write_lock = threading.Lock()
        # diskcache opens a store by writing its settings, waiting up to 60 s while another process holds it:
        # it is opened on a thread of its own, so a held store costs load at most OPEN_WAIT, never a call.
        self._cache: Any = None
        self._closed = False
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        threading.Thread(target=self._open, args=(diskcache, held, size_limit), daemon=True,
                         name="skynet-dspy judge cache").start()
        if not self._opened.wait(OPEN_WAIT):
            self._warn(self.where, TimeoutError(
                "another process holds the store; it is opened in the background, and used once it is free"))
        elif self._open_error is not None:  # a damaged store fails here, not in the middle of a run
            exc = self._open_error
            raise ValueError(f"the judge cache at {self.where} cannot be used ({type(exc).__name__}: {exc}); delete "
                             "the folder or give another judge_cache=") from None

    def _open(self, diskcache: Any, held: str, size_limit: int) -> None:
        try:
            cache = diskcache.Cache(held, size_limit=size_limit, timeout=DISK_LOCK_TIMEOUT,
                                    eviction_policy="least-recently-stored", disk=safe_disk(diskcache))
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

    def skipping(self) -> bool:
        return self._cache is None or super().skipping()

    def _raw(self, key: str) -> Any:
        return self._cache.get(key, default=None, retry=False)

    def _write(self, key: str, entry: str) -> None:
        with self._writing():
            self._cache.set(key, entry, retry=False)

    def _claim(self, marker: str, owner: str) -> bool:
        """Set the marker (naming this process) unless a live owner holds it."""
        with self._writing(), self._cache.transact(retry=False):
            held = self._marker(marker)
            if held is not None and not owner_gone(held):
                return False
            self._cache.set(marker, owner, expire=MARKER_TTL, retry=False)
        return True

    def _unclaim(self, marker: str, owner: str) -> None:
        with self._writing(even_when_busy=True), self._cache.transact(retry=False):
            if self._marker(marker) == owner:
                self._cache.delete(marker, retry=False)

    def _marker(self, marker: str) -> Any:
        """A marker's value; None when there is none or it is not a marker (a planted value)."""
        try:
            return self._cache.get(marker, default=None, retry=False)
        except BadEntry:
            return None

    @contextlib.contextmanager
    def _writing(self, even_when_busy: bool = False) -> Iterator[None]:
        """One writer per process at a time: this process's threads queue here, not inside SQLite, where a
        writer waiting for the GIL between statements would keep the others past their lock timeout. Each
        write is bounded by DISK_LOCK_TIMEOUT, so the queue moves."""
        if not self._write_lock.acquire(timeout=WRITE_QUEUE_WAIT):
            raise TimeoutError(f"this process's writes to the store queued for over {WRITE_QUEUE_WAIT:g} s")
        try:
            if not even_when_busy and self.skipping():  # the store was busy a moment ago: do not wait again
                raise TimeoutError("the store was busy a moment ago")
            yield
        finally:
            self._write_lock.release()

    def close(self) -> None:
        self._closed = True
        if self._cache is not None:
            self._cache.close()


class AnswerCache:
    """Memory in front, an optional shared store behind: get() looks in both, put() writes both."""

    def __init__(self, store: SharedStore | None = None, memory_size: int = MEMORY_CACHE_SIZE):
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
    redis = isinstance(spec, str) and spec.startswith(("redis://", "rediss://", "unix://"))
    if size_limit is not None:
        whole_number("judge_cache_size", size_limit, minimum=1, unit="bytes")
        if isinstance(spec, bool) or not isinstance(spec, (str, os.PathLike)) or redis:
            raise ValueError(
                "judge_cache_size= bounds the judge's disk cache (bytes); give judge_cache='some/folder' with it, "
                f"or leave it out (judge_cache={secrets.redact(repr(spec))})"
            )
    if spec is False or spec is None:
        return None
    if spec is True:
        return AnswerCache()
    if redis:
        from .redis_store import RedisStore

        return AnswerCache(RedisStore(spec))
    if isinstance(spec, (str, os.PathLike)):
        return AnswerCache(DiskStore(spec, size_limit or DEFAULT_DISK_CACHE_SIZE))
    raise TypeError(
        "judge_cache must be True (in memory), False, a folder path for a disk cache, or a redis://host:port/db URL; "
        f"got {type(spec).__name__}"
    )
