"""Measured times with their jitter taken out, so the same work measures the same from run to run.

A model call's latency and a program's own work vary between identical runs (20-50% for single calls on a loaded
machine); GEPA, comparing candidates by a strict "greater than", would take that noise for an improvement. Each kind
of time keeps an anchor, the fastest time seen (moved only for a time more than RESET, and a few ms, below it, so a
first run's warm-up is left behind): a time within the band above its anchor (a fraction of it, or a floor in ms,
whichever is larger) is reported as the anchor, a time beyond as measured, so real extra work or a slower provider
shows. A model call's kind is its model and answer size (measure._kind); a program's own work, its class.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable

from cachetools import LRUCache

CALL_BAND = 0.5  # a model call up to 50% slower than its kind's anchor is the anchor plus noise
CALL_FLOOR_MS = 10.0  # ... or up to 10 ms slower, whichever is larger (a first connection, a busy moment)
OWN_BAND = 0.5  # own work up to 50% above its anchor is the anchor's plus noise
OWN_FLOOR_MS = 25.0  # ... or up to 25 ms above it, whichever is larger (a GC pause)
WAIT_FLOOR_MS = 50.0  # the time it waited outside model calls: up to 50 ms above its anchor (the GIL, a busy core)
RESET = 0.05  # an anchor moves down for a time more than 5% below it,
RESET_FLOOR_MS = 2.0  # and 2 ms below it (own work: OWN_RESET_FLOOR_MS): rare moves, each a step that matters
OWN_RESET_FLOOR_MS = 5.0


class Anchors:
    """Anchors by kind, bounded."""

    def __init__(self, size: int = 4096):
        self._anchors: LRUCache[Hashable, float] = LRUCache(size)
        self._lock = threading.Lock()

    def steady(self, key: Hashable, value_ms: float, band: float = math.inf, floor_ms: float = 0.0,
               reset_floor_ms: float = RESET_FLOOR_MS) -> float:
        """`value_ms` as reported against the anchor of `key`, after moving the anchor down when due."""
        if not value_ms >= 0:  # negative or NaN: nothing to steady
            return value_ms
        with self._lock:
            anchor = self._anchors.get(key)
            if anchor is None or value_ms < anchor - max(anchor * RESET, reset_floor_ms):
                self._anchors[key] = value_ms
                return value_ms
        return self.current(key, value_ms, band, floor_ms)

    def known(self, key: Hashable) -> bool:
        """Whether `key` has an anchor (a time of its kind was seen in this process)."""
        with self._lock:
            return key in self._anchors

    def at_most(self, key: Hashable, value_ms: float) -> float:
        """`value_ms`, or the anchor of `key` when that is lower."""
        with self._lock:
            anchor = self._anchors.get(key)
        return value_ms if anchor is None else min(value_ms, anchor)

    def current(
        self, key: Hashable, value_ms: float, band: float = CALL_BAND, floor_ms: float = CALL_FLOOR_MS
    ) -> float:
        """`value_ms` against the anchor of `key` as it stands: the anchor when within the band above it (or
        `floor_ms`), else `value_ms` itself. Moves nothing."""
        with self._lock:
            anchor = self._anchors.get(key)
        if anchor is None or value_ms > anchor + max(anchor * band, floor_ms):
            return value_ms
        return anchor


anchors = Anchors()
