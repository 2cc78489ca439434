"""Where judge answers are kept, so an identical request is paid once: memory, a folder (diskcache), or Redis.

Entries are JSON text (answer, integrity check, model, settings; never a credential), never decoded as anything
else. A folder is private to the user and held by descriptor. A busy or broken store is skipped with one warning.
Processes sharing a store send a request once: the first sets a marker naming itself, the others wait for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache
from cachetools import LRUCache

from .._core import secrets
from .._core.context import llm_pool
from .._core.errors import require_extra
from .._core.logs import logger
from .._core.values import whole_number
from .endpoints import is_credential_setting, public_settings, register_url_credentials
from .limits import WAIT_STEP, Cancelled

MEMORY_CACHE_SIZE = 10_000  # answers kept in memory per judge
DEFAULT_DISK_CACHE_SIZE = 2**30  # bytes on disk before the least recently stored answers are evicted
DISK_LOCK_TIMEOUT = 1.0  # seconds to wait for a disk store another process holds before going on without it
OPEN_WAIT = 2.0  # seconds load waits to open a disk store another process holds before going on without it
REDIS_TIMEOUT = 2.0  # seconds for any Redis command
MARKER_TTL = 30.0  # an in-flight marker expires after this long (its owner is slow, or on a dead machine)
BUSY_BACKOFF = 2.0  # seconds a store is skipped after it was busy or broken
IN_FLIGHT_PREFIX = "skynet-dspy:in-flight:"
KEY_PREFIX = "skynet-dspy:judge:"  # of every Redis key
ENTRY_VERSION = 2  # entries of another version (or none) are a miss
# Settings that do not change the answer: left out of the key (and so never written anywhere).
_NOT_KEYED = frozenset({"api_key", "timeout", "request_timeout", "extra_headers", "headers", "num_retries",
                        "max_retries"})


class BadEntry(Exception):
    """A stored value that is not a judge answer of this version: a pickle, damaged, or failing its check."""


def request_key(request: dict[str, Any]) -> str:
    """The cache key of a request: a digest of everything that shapes the answer, never a credential."""
    keyed = {key: value for key, value in request.items() if key not in _NOT_KEYED and not is_credential_setting(key)}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=repr, ensure_ascii=False).encode()).hexdigest()


def _check(key: str, text: str) -> str:
    return hashlib.sha256(f"{ENTRY_VERSION}\0{key}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()


def stored_entry(text: str, request: dict[str, Any], key: str) -> str:
    """The JSON a store keeps for an answer: text, key, integrity check, model and settings (no credential)."""
    settings = {name: value for name, value in public_settings(request).items()
                if name not in _NOT_KEYED | {"messages", "model"}}
    entry = {"v": ENTRY_VERSION, "key": key, "text": text, "check": _check(key, text),
             "model": str(request.get("model")), "settings": settings}
    return secrets.redact(json.dumps(entry, sort_keys=True, default=repr, ensure_ascii=False))


def entry_text(raw: Any, key: str) -> str | None:
    """The answer stored under `key`, None for none; BadEntry for anything else (decoded as JSON only)."""
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
    except (ValueError, TypeError):
        raise BadEntry("a value that is not JSON text (a pickle, damaged, or written by something else)") from None
    text = entry.get("text") if isinstance(entry, dict) and entry.get("v") == ENTRY_VERSION else None
    if not isinstance(text, str) or not text or entry.get("key") != key or entry.get("check") != _check(key, text):
        raise BadEntry("an entry of another version, or one that fails its integrity check")
    return text


def private_folder(path: Path, option: str = "judge_cache", what: str = "the judge cache") -> str:
    """Create `path` private to this user (0700), or check an existing one is (owned by this user, writable by no one
    else, who could plant entries). Returns it held open by descriptor (/proc/self/fd/N), so it cannot be swapped."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}={str(path)!r} is a file; give a folder")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        link = path.lstat()
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ValueError(f"{what} at {path} cannot be used ({type(exc).__name__}: {exc}); give another {option}=") \
            from None
    info, me, problem = os.fstat(folder), os.getuid(), None
    for name, stat in (("symbolic link to the folder", link), ("folder", info)):
        if stat.st_uid != me:
            problem = (f"{option}={str(path)!r}: the {name} belongs to another user (uid {stat.st_uid}, you are {me}), "
                       "who could plant entries in it; use a folder of your own, e.g. '~/.cache/skynet-dspy-judge'")
    if problem is None and info.st_mode & 0o022:
        problem = (f"{option}={str(path)!r}: the folder can be written by other users (mode {info.st_mode & 0o777:o}), "
                   f"who could plant entries in it; make it private (chmod 700 {path}) or use another folder")
    if problem is not None:
        os.close(folder)
        raise ValueError(problem)
    return f"/proc/self/fd/{folder}"  # Linux, as the workers


class JsonDisk(diskcache.Disk):  # type: ignore[misc,unused-ignore]
    """A diskcache Disk keeping str keys and JSON text in the database only: any other mode raises BadEntry unread."""

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise BadEntry("a pickled key")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if read or not isinstance(value, (str, bytes)):
            raise TypeError("this store keeps JSON text only")
        return 0, diskcache.core.MODE_RAW, None, sqlite3.Binary(value) if isinstance(value, bytes) else value

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if mode != diskcache.core.MODE_RAW:
            raise BadEntry("a pickled value or a file (diskcache's default modes), which skynet-dspy never writes")
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path: Any) -> None:
        """Nothing: this Disk writes no file, and a planted row's is not its to delete."""


def json_cache(path: Path, what: str, **settings: Any) -> diskcache.Cache:
    """A diskcache.Cache in a private folder, held by descriptor, that keeps JSON text only (JsonDisk)."""
    return diskcache.Cache(private_folder(path.expanduser(), "folder", what), disk=JsonDisk, **settings)


def _started(pid: int) -> str | None:
    """When process `pid` started (from /proc; a reused pid gives another value), or None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_marker() -> str:
    """An in-flight marker's value: who holds it (host, pid, the process's start time) and a token of its own."""
    pid = os.getpid()
    return json.dumps({"host": socket.gethostname(), "pid": pid, "start": _started(pid), "token": uuid.uuid4().hex})


def owner_gone(raw: Any) -> bool:
    """Whether a marker's owner is a process on this host that no longer runs (a marker naming none counts too)."""
    try:
        owner = json.loads(raw)
        host, pid, start = owner["host"], int(owner["pid"]), owner["start"]
    except (ValueError, TypeError, KeyError):
        return True
    return host == socket.gethostname() and start is not None and _started(pid) != start


class AnswerCache:
    """Answers in memory; a subclass adds a shared store (`_raw`, `_write`; markers `_claim`ed and `_unclaim`ed). The
    first thread to ask leads in its process, then through the store's marker among processes; the others wait."""

    errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, where: str = "memory"):
        self.where = where
        self.memory: LRUCache[str, str] = LRUCache(MEMORY_CACHE_SIZE)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._skip_until = 0.0  # monotonic time until which the store is skipped (it was busy or broken)
        self._leaders: dict[str, str] = {}  # key -> the owner marker of this process's thread sending it

    def _raw(self, key: str) -> Any:
        return None

    def _write(self, key: str, entry: str) -> None:
        return None

    def _claim(self, marker: str, owner: str) -> bool:
        return True

    def _unclaim(self, marker: str, owner: str) -> None:
        return None

    def close(self) -> None:
        """Release what the store holds open."""

    def _warn_once(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        logger.warning("skynet-dspy judge cache %s: %s", self.where, secrets.redact(message))

    def skipping(self) -> bool:
        return time.monotonic() < self._skip_until

    def _failed(self, exc: BaseException) -> None:
        """Warn once; skip the store for BUSY_BACKOFF (a store that hangs costs one call its timeout, not all)."""
        self._skip_until = time.monotonic() + BUSY_BACKOFF
        self._warn_once("failed", f"{type(exc).__name__}: {exc} (going on without it for this call; later such "
                                  "problems are not logged)")

    def _read(self, key: str) -> str | None:
        try:
            text = entry_text(self._raw(key), key)
        except BadEntry as exc:
            self._warn_once("entry", f"found {exc}; it was read as a miss, never decoded, and is replaced by the fresh "
                                     "answer (later such entries are not logged). Only skynet-dspy should write here.")
            return None
        if text is not None:
            with self._lock:
                self.memory[key] = text
        return text

    def get(self, key: str) -> str | None:
        with self._lock:
            text = self.memory.get(key)
        try:
            return text if text is not None or self.skipping() else self._read(key)
        except self.errors as exc:
            self._failed(exc)
            return None

    def put(self, key: str, text: str, request: dict[str, Any]) -> None:
        with self._lock:
            self.memory[key] = text
        try:
            if not self.skipping():
                self._write(key, stored_entry(text, request, key))
        except self.errors as exc:
            self._failed(exc)

    def lead_or_wait(self, key: str, patience: float, stop: threading.Event | None = None) -> str | None:
        """The answer (cached, or once its sender has it), or None: this thread sends it, leading until release().
        Another process is waited for at most `patience` seconds; `stop` ends every wait (limits.Cancelled)."""
        owner, deadline, stop = owner_marker(), time.monotonic() + patience, stop or threading.Event()
        text = self.get(key)
        if text is not None:
            return text
        text = self._lead_in_process(key, owner, stop)
        if text is not None:
            return text
        try:  # this thread leads in its process; another process may be sending it
            while not self.skipping() and not self._claim(IN_FLIGHT_PREFIX + key, owner):
                text = self._read(key)
                if text is not None or time.monotonic() > deadline or stop.wait(WAIT_STEP):
                    break
            else:
                text = None if self.skipping() else self._read(key)  # stored since this thread looked?
        except self.errors as exc:
            self._failed(exc)
        if text is not None:
            self.release(key)
        return text

    def _lead_in_process(self, key: str, owner: str, stop: threading.Event) -> str | None:
        """None once this thread leads on `key` in its process; the answer if another thread sent it meanwhile."""
        with self._lock:
            if self._leaders.setdefault(key, owner) == owner:
                return None
        with llm_pool.waiting():
            while not stop.wait(WAIT_STEP):  # another thread of this process is sending it
                with self._lock:  # the leader stores its answer before it lets go of the lead
                    text = self.memory.get(key)
                    if text is not None or self._leaders.setdefault(key, owner) == owner:
                        return text
        raise Cancelled

    def release(self, key: str) -> None:
        """Clear the lead on `key` if this thread took it (another process's marker is left to expire)."""
        with self._lock:
            owner = self._leaders.pop(key, None)
        try:
            if owner is not None:
                self._unclaim(IN_FLIGHT_PREFIX + key, owner)
        except self.errors as exc:
            self._failed(exc)


class DiskStore(AnswerCache):
    """Answers in a private folder, through diskcache: size-bounded, shared by threads and processes."""

    def __init__(self, directory: str | os.PathLike[str], size_limit: int = DEFAULT_DISK_CACHE_SIZE):
        path = Path(directory).expanduser()
        super().__init__(str(path))
        held = private_folder(path)
        self.errors = (diskcache.Timeout, sqlite3.Error, OSError)
        self._write_lock = threading.Lock()
        self._cache: Any = None
        self._closed = False
        self._open_error: BaseException | None = None
        # diskcache waits up to 60 s to open a store another process holds: opened on a thread, that costs load at
        # most OPEN_WAIT (the store is used once it opens)
        opening = threading.Thread(target=self._open, args=(held, size_limit), daemon=True)
        opening.start()
        opening.join(OPEN_WAIT)
        if opening.is_alive():
            self._failed(TimeoutError("another process holds the store; it is used once it is free"))
        elif self._open_error is not None:  # a damaged store fails at load, not in the middle of a run
            exc = self._open_error
            raise ValueError(f"the judge cache at {self.where} cannot be used ({type(exc).__name__}: {exc}); delete "
                             "the folder or give another judge_cache=") from None

    def _open(self, held: str, size_limit: int) -> None:
        try:
            cache = diskcache.Cache(held, size_limit=size_limit, timeout=DISK_LOCK_TIMEOUT,
                                    eviction_policy="least-recently-stored", disk=JsonDisk)
            cache.get("skynet-dspy:probe")
            cache.close()  # this thread's connection; each thread opens its own
        except (sqlite3.DatabaseError, OSError, BadEntry) as exc:
            self._open_error = exc
        else:
            self._cache = None if self._closed else cache

    def skipping(self) -> bool:
        return self._cache is None or super().skipping()

    def _raw(self, key: str) -> Any:
        return self._cache.get(key, default=None, retry=False)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One writer per process: threads queue here, not in SQLite (a writer waiting for the GIL between statements
        would keep the others past their lock timeout); once the store was busy, the queue goes on without it."""
        with self._write_lock:
            if self.skipping():
                raise TimeoutError("the store was busy a moment ago")
            yield

    def _write(self, key: str, entry: str) -> None:
        with self._writing():
            self._cache.set(key, entry, retry=False)

    def _claim(self, marker: str, owner: str) -> bool:
        with self._writing(), self._cache.transact(retry=False):
            try:
                held = self._cache.get(marker, default=None, retry=False)
            except BadEntry:  # a planted value: not a live owner's
                held = None
            if held is not None and not owner_gone(held):
                return False
            self._cache.set(marker, owner, expire=MARKER_TTL, retry=False)
        return True

    def _unclaim(self, marker: str, owner: str) -> None:
        if self._cache is None:  # never opened: this process set no marker
            return
        with self._write_lock, self._cache.transact(retry=False):
            if self._raw(marker) == owner:
                self._cache.delete(marker, retry=False)

    def close(self) -> None:
        self._closed = True
        if self._cache is not None:
            self._cache.close()


# Set KEYS[1] to ARGV[2] (expiring in ARGV[3] ms; "" deletes it), only if it still holds ARGV[1].
_SWAP = ("if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end "
         "if ARGV[2] == '' then return redis.call('del', KEYS[1]) end "
         "return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])")


class RedisStore(AnswerCache):
    """Answers on a Redis server (`judge_cache="redis://..."`), shared by runs on several machines."""

    def __init__(self, url: str):
        redis = require_extra("redis", "redis", "judge_cache='redis://...'")
        register_url_credentials(url)  # redis://:password@host, as written and decoded
        super().__init__(secrets.redact(url))
        self.errors = (redis.RedisError, OSError)
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT)
            self._client.ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise ValueError(f"the judge cache at {self.where} cannot be reached ({type(exc).__name__}: "
                             f"{secrets.redact(str(exc))}); start the Redis server, fix the URL, or give another "
                             "judge_cache=") from None

    def _raw(self, key: str) -> Any:
        return self._client.get(KEY_PREFIX + key)

    def _write(self, key: str, entry: str) -> None:
        self._client.set(KEY_PREFIX + key, entry)

    def _claim(self, marker: str, owner: str) -> bool:
        ttl = int(MARKER_TTL * 1000)
        if self._client.set(KEY_PREFIX + marker, owner, nx=True, px=ttl):
            return True
        held = self._client.get(KEY_PREFIX + marker)
        return held is not None and owner_gone(held) and bool(
            self._client.eval(_SWAP, 1, KEY_PREFIX + marker, held, owner, ttl))

    def _unclaim(self, marker: str, owner: str) -> None:
        self._client.eval(_SWAP, 1, KEY_PREFIX + marker, owner, "", 0)


def make_cache(spec: Any, size_limit: int | None = None) -> AnswerCache | None:
    """The cache `judge_cache=` asks for (True, False, a folder, a redis:// URL); judge_cache_size=`size_limit`."""
    redis = isinstance(spec, str) and spec.startswith(("redis://", "rediss://", "unix://"))
    folder = isinstance(spec, (str, os.PathLike)) and not redis
    if size_limit is not None:
        whole_number("judge_cache_size", size_limit, minimum=1, unit="bytes")
        if not folder:
            raise ValueError("judge_cache_size= bounds the judge's disk cache (bytes); give judge_cache='some/folder' "
                             f"with it, or leave it out (judge_cache={secrets.redact(repr(spec))})")
    if spec is False or spec is None:
        return None
    if spec is True:
        return AnswerCache()
    if redis or folder:
        return RedisStore(spec) if redis else DiskStore(spec, size_limit or DEFAULT_DISK_CACHE_SIZE)
    raise TypeError("judge_cache must be True (in memory), False, a folder path for a disk cache, or a "
                    f"redis://host:port/db URL; got {type(spec).__name__}")
