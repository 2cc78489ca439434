"""Measured times with their jitter taken out, so the same work measures the same from run to run.

A model call's latency and a program's own work vary between identical runs (20-50% for single calls on a loaded
machine); GEPA, comparing candidates by a strict "greater than", would take that noise for an improvement. Each kind
of time keeps an anchor, the first time seen: a time within the noise band around its anchor (a fraction of it, or
a floor in ms, whichever is larger) is reported as the anchor. A time beyond the band above is reported as measured,
so real extra work or a slower provider shows; a time beyond the band below moves the anchor, so a first run's
large warm-up is left behind. Small moves are what a band must not make: an anchor moved down by a few ms while a
candidate is scored would make it look faster than the parent scored a moment before with the same work.
A model call's kind is its model and answer size (measure._kind); a program's own work, its class.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass

from cachetools import LRUCache


@dataclass(frozen=True)
class Band:
    """How far a time may stray from its anchor and still be the anchor plus noise: `fraction` of the anchor
    above it (and the same ratio below: 1 / (1 + fraction)), or `floor_ms` either way, whichever is larger."""

    fraction: float
    floor_ms: float

    def above(self, anchor: float) -> float:
        return anchor + max(anchor * self.fraction, self.floor_ms)

    def below(self, anchor: float) -> float:
        return anchor - max(anchor * self.fraction / (1 + self.fraction), self.floor_ms)


CALL = Band(0.5, 10.0)  # a model call: 50% or 10 ms (a first connection, a busy moment)
OWN = Band(0.5, 25.0)  # a program's CPU time outside model calls: 50% or 25 ms (a GC pause)
WAIT = Band(0.5, 50.0)  # the time it waited outside model calls: 50% or 50 ms (the GIL, a busy core)


class Anchors:
    """Anchors by kind, bounded."""

    def __init__(self, size: int = 4096):
        self._anchors: LRUCache[Hashable, float] = LRUCache(size)
        self._lock = threading.Lock()

    def steady(self, key: Hashable, value_ms: float, band: Band = CALL) -> float:
        """`value_ms` as reported against the anchor of `key`, after moving the anchor when due."""
        if not value_ms >= 0:  # negative or NaN: nothing to steady
            return value_ms
        with self._lock:
            anchor = self._anchors.get(key)
            if anchor is None or value_ms < band.below(anchor):
                self._anchors[key] = value_ms
                return value_ms
        return value_ms if value_ms > band.above(anchor) else anchor

    def known(self, key: Hashable) -> bool:
        """Whether `key` has an anchor (a time of its kind was seen in this process)."""
        with self._lock:
            return key in self._anchors

    def at_most(self, key: Hashable, value_ms: float) -> float:
        """`value_ms`, or the anchor of `key` when that is lower."""
        with self._lock:
            anchor = self._anchors.get(key)
        return value_ms if anchor is None else min(value_ms, anchor)

    def current(self, key: Hashable, value_ms: float, band: Band = CALL) -> float:
        """`value_ms` against the anchor of `key` as it stands: the anchor when within `band` of it, else
        `value_ms` itself. Moves nothing."""
        with self._lock:
            anchor = self._anchors.get(key)
        if anchor is None or not band.below(anchor) <= value_ms <= band.above(anchor):
            return value_ms
        return anchor


anchors = Anchors()
