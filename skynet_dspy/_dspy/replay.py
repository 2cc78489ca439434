"""What a model call used when first made, kept by its cache key, so a cache hit (DSPy's or LiteLLM's) is measured
as the call it replays: a program's measured cost and time must not depend on cache luck.

The figures live in a bounded map in memory and, when DSPy's disk cache is on, in a store beside it
(`<DSPy's cache folder>/skynet_dspy_call_figures`), so a hit on an answer an earlier process cached replays the same
figures. The store holds JSON text only, through the judge cache's JSON-only diskcache Disk, in a folder private to
the user: a planted pickle is a miss with a warning, never code.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cachetools import LRUCache

from .._core.logs import logger
from .._judge.cache import BadEntry, json_cache

MEMORY_ENTRIES = 65_536  # about 200 bytes each: ~13 MB at most
DISK_SIZE_LIMIT = 64 * 1024 * 1024
FOLDER = "skynet_dspy_call_figures"


@dataclass(frozen=True, slots=True)
class CallFigures:
    """One model call as first made: provider calls, tokens, cost (None: unknown, `unpriced` says why), latency;
    `first`: made while its kind's anchor was not fixed yet (its latency may hold a connection's set-up)."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    unpriced: str | None
    latency_ms: float
    first: bool = False


class Replay:
    """CallFigures by cache key: in memory (bounded), and on disk beside DSPy's cache when a folder is given."""

    def __init__(self, size: int = MEMORY_ENTRIES):
        self._memory: LRUCache[str, CallFigures] = LRUCache(size)
        self._lock = threading.Lock()
        self._disks: dict[str, Any] = {}  # folder -> diskcache.Cache, or None when it could not be opened
        self._warned = False

    def remember(self, key: str, figures: CallFigures, folder: str | None = None) -> None:
        with self._lock:
            self._memory[key] = figures
        disk = self._disk(folder)
        if disk is not None:
            try:
                disk.set(key, json.dumps(asdict(figures)))  # text, never a pickle: the folder may be shared
            except Exception as exc:  # a full or locked disk: memory still has it
                logger.debug("skynet-dspy: call figures not stored on disk: %s", exc)

    def recall(self, key: str, folder: str | None = None) -> CallFigures | None:
        with self._lock:
            found = self._memory.get(key)
        if found is not None:
            return found
        disk = self._disk(folder)
        if disk is None:
            return None
        try:
            text = disk.get(key, retry=False)
            figures = CallFigures(**json.loads(text)) if isinstance(text, str) else None
        except BadEntry as exc:  # a planted pickle: never decoded
            if not self._warned:
                self._warned = True
                logger.warning("skynet-dspy call figures %s: found %s; read as a miss, never decoded (later such "
                               "entries are not logged). Only skynet-dspy should write there.", folder, exc)
            return None
        except Exception:  # unreadable, or written by another version: not known
            return None
        if figures is not None:
            with self._lock:
                self._memory[key] = figures
        return figures

    def _disk(self, folder: str | None) -> Any:
        if folder is None:
            return None
        with self._lock:
            if folder not in self._disks:
                self._disks[folder] = _open(folder)
            return self._disks[folder]


def _open(folder: str) -> Any:
    where = Path(folder) / FOLDER
    try:
        return json_cache(where, "the call figures store", size_limit=DISK_SIZE_LIMIT, timeout=0.1)
    except Exception as exc:  # an unwritable folder, or one another user can write: figures are kept in memory only
        logger.warning("skynet-dspy: call figures are not kept on disk in %s: %s", where, exc)
        return None


replay = Replay()
