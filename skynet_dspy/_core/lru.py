"""A bounded, thread-safe least-recently-used map: cachetools' LRUCache behind a lock."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

from cachetools import LRUCache

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `size` entries; the least recently used goes first. A size of 0 keeps nothing."""

    def __init__(self, size: int):
        self.size = size
        self._items: LRUCache[K, V] = LRUCache(maxsize=max(1, size))
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        if self.size > 0:
            with self._lock:
                self._items[key] = value

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
