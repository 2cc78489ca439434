"""Measured times with their jitter taken out, so the same work measures the same from run to run.

A model call's latency and a program's own work vary by a few milliseconds between identical runs; an
optimizer comparing candidates by a strict "greater than" (GEPA) would take that noise for an improvement.
Each kind of time (a model's call latency for answers of a size, a program's own work) keeps an anchor: the
fastest time seen, moved only when a time comes in clearly (more than RESET) below it. A time within the band
above the anchor (BAND of it, or FLOOR_MS, whichever is larger) is reported as the anchor itself; a time beyond
it is real, and reported as measured. On a loaded machine (or a provider's busy minute) single calls take 20-30%
longer at random, so the band is wide: what a faster program saves by making fewer calls, or shorter answers,
still counts in full; a call's wobble does not. Hand-written: no library does this for one process's measurements.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from .._core.lru import LRU

BAND = 0.5  # a time up to 50% above the anchor is the anchor's time plus noise
FLOOR_MS = 10.0  # ... or up to 10 ms above it, whichever is larger
RESET = 0.05  # the anchor moves down only for a time more than 5% (and RESET_FLOOR_MS) below it: a first
RESET_FLOOR_MS = 1.0  # run's warm-up is left behind, a sub-millisecond wobble is not news


class Anchors:
    """Anchors by kind (a model's name, a program's class), bounded."""

    def __init__(self, size: int = 4096):
        self._anchors: LRU[Hashable, float] = LRU(size)
        self._lock = threading.Lock()

    def steady(self, key: Hashable, value_ms: float) -> float:
        """`value_ms` as reported: the anchor of `key` when within its band, else the value itself."""
        if value_ms < 0 or value_ms != value_ms:
            return value_ms
        with self._lock:
            anchor = self._anchors.get(key)
            if anchor is None or value_ms < anchor - max(anchor * RESET, RESET_FLOOR_MS):
                self._anchors.put(key, value_ms)
                return value_ms
        if value_ms <= anchor + max(anchor * BAND, FLOOR_MS):
            return anchor
        return value_ms

    def known(self, key: Hashable) -> bool:
        """Whether `key` has an anchor (a time of its kind was seen in this process)."""
        return self._anchors.get(key) is not None

    def at_most(self, key: Hashable, value_ms: float) -> float:
        """`value_ms`, or the anchor of `key` when that is lower: for a first call, whose time held the
        process's one-time set-up (a connection opened), replayed once the kind's time is known."""
        anchor = self._anchors.get(key)
        return value_ms if anchor is None else min(value_ms, anchor)

    def forget(self) -> None:
        """Drop every anchor (for tests)."""
        with self._lock:
            self._anchors = LRU(self._anchors.size)


anchors = Anchors()
