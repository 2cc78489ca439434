"""Measured times with their jitter taken out, so the same work measures the same from run to run.

A model call's latency and a program's own work vary between identical runs (by 20-50% for single calls on a
loaded machine or a provider's busy minute); an optimizer comparing candidates by a strict "greater than"
(GEPA) would take that noise for an improvement. Each kind of time keeps an anchor: the fastest time seen,
moved only when a time comes in below it by more than RESET (and a few milliseconds), so a first run's
warm-up is left behind and a millisecond's wobble is not news.

- A model call's kind is its model and its answer's size (doubling steps): its latency is the kind's
  anchor when within the band above it (CALL_BAND of it, or CALL_FLOOR_MS, whichever is larger), and as
  measured beyond, so a provider that became slower shows. What a faster program saves by making fewer
  calls, or calls with shorter answers, counts in full; one call's luck does not (nor does a shorter
  prompt's small saving).
- A program's own work (its time outside model calls) is reported as its anchor when within the band above
  it (OWN_BAND of it, or OWN_FLOOR_MS, whichever is larger), and as measured beyond: real extra work counts.

Hand-written: no library does this for one process's measurements.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable

from .._core.lru import LRU

CALL_BAND = 0.5  # a model call up to 50% slower than its kind's anchor is the anchor plus noise
CALL_FLOOR_MS = 10.0  # ... or up to 10 ms slower, whichever is larger (a first connection, a busy moment)
OWN_BAND = 0.5  # own work up to 50% above its anchor is the anchor's plus noise
OWN_FLOOR_MS = 25.0  # ... or up to 25 ms above it, whichever is larger (a GC pause)
WAIT_FLOOR_MS = 50.0  # the time it waited outside model calls: up to 50 ms above its anchor (the GIL, a busy core)
RESET = 0.05  # an anchor moves down for a time more than 5% below it,
RESET_FLOOR_MS = 2.0  # and 2 ms below it (own work: OWN_RESET_FLOOR_MS): rare moves, each a step that matters
OWN_RESET_FLOOR_MS = 5.0


class Anchors:
    """Anchors by kind (a model call's model and sizes, a program's class), bounded."""

    def __init__(self, size: int = 4096):
        self._anchors: LRU[Hashable, float] = LRU(size)
        self._lock = threading.Lock()

    def steady(self, key: Hashable, value_ms: float, band: float = math.inf, floor_ms: float = 0.0,
               reset_floor_ms: float = RESET_FLOOR_MS) -> float:
        """`value_ms` as reported: the anchor of `key` when within `band` (a fraction of it, or `floor_ms`,
        whichever is larger) above it, else the value itself. Moves the anchor down first, when due."""
        if not value_ms >= 0:  # negative or NaN: nothing to steady
            return value_ms
        with self._lock:
            anchor = self._anchors.get(key)
            if anchor is None or value_ms < anchor - max(anchor * RESET, reset_floor_ms):
                self._anchors.put(key, value_ms)
                return value_ms
        if value_ms <= anchor + max(anchor * band, floor_ms):
            return anchor
        return value_ms

    def known(self, key: Hashable) -> bool:
        """Whether `key` has an anchor (a time of its kind was seen in this process)."""
        return self._anchors.get(key) is not None

    def at_most(self, key: Hashable, value_ms: float) -> float:
        """`value_ms`, or the anchor of `key` when that is lower."""
        anchor = self._anchors.get(key)
        return value_ms if anchor is None else min(value_ms, anchor)

    def current(
        self, key: Hashable, value_ms: float, band: float = CALL_BAND, floor_ms: float = CALL_FLOOR_MS
    ) -> float:
        """`value_ms` against the anchor of `key` as it stands now: the anchor when within `band` (or `floor_ms`)
        above it, else `value_ms` itself (`value_ms` when it has no anchor). Moves nothing."""
        anchor = self._anchors.get(key)
        if anchor is None or value_ms > anchor + max(anchor * band, floor_ms):
            return value_ms
        return anchor

    def forget(self) -> None:
        """Drop every anchor (for tests)."""
        with self._lock:
            self._anchors = LRU(self._anchors.size)


anchors = Anchors()
