"""Measured times with their jitter taken out, so the same work measures the same from run to run.

A model call's latency and a program's own work vary between identical runs (20-50% for single calls on a loaded
machine); GEPA, comparing candidates by a strict "greater than", would take that noise for an improvement. Each kind
of time keeps an anchor: its first time, moved down only to a time beyond the band below it among its first WARM_UP
(a cold first connection is left behind), then fixed for the process. A time up to the noise band above its anchor
(a fraction of it, or a floor in ms, whichever is larger), or below it, is reported as the anchor; a time beyond the
band is reported as measured, so real extra work or a slower provider shows. An anchor moves by no small step: a move
by a few ms would make the examples scored before it (the seed's, or a parent's) look slower than the same work
after it. A model call's kind is its model, endpoint and answer size (measure._kind); a program's own work, its class.

Garbage collection is left out of a program's own work (`clocks`): every collection outside its model calls, and of
its CPU time its own thread's. A collection stops every thread running Python, for up to a second in a
large heap (a long-running notebook), whatever the candidate does.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass

from cachetools import LRUCache


@dataclass(frozen=True)
class Band:
    """How far above its anchor a time may be and still be the anchor plus noise: `fraction` of the anchor, or
    `floor_ms`, whichever is larger."""

    fraction: float
    floor_ms: float

    def above(self, anchor: float) -> float:
        return anchor + max(anchor * self.fraction, self.floor_ms)

    def reported(self, anchor: float, value_ms: float) -> float:
        """`value_ms` as reported against `anchor`: the anchor, unless beyond the band above it."""
        return value_ms if value_ms > self.above(anchor) else anchor


CALL = Band(0.5, 10.0)  # a model call: 50% or 10 ms (a first connection, a busy moment)
OWN = Band(0.5, 25.0)  # a program's CPU time outside model calls: 50% or 25 ms (a cache miss, a page fault)
WAIT = Band(0.5, 50.0)  # the time it waited outside model calls: 50% or 50 ms (the GIL, a busy core)
WARM_UP = 4  # a kind's first times, while its anchor may still move down


class _Collecting(threading.local):
    started = 0.0  # when this thread's collection in progress began
    spent = 0.0  # seconds this thread spent collecting garbage


class Clocks:
    """Seconds spent collecting garbage, in the process and in this thread. No library reports collections but
    gc.callbacks, which CPython calls on the collecting thread before and after each one. A collection holds the
    GIL: it stops every thread running Python, but not one waiting for a model's answer."""

    def __init__(self) -> None:
        self.collected = 0.0  # seconds the process spent collecting garbage, on any thread
        self._thread = _Collecting()

    def start(self) -> None:
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._thread.started = now
            return
        spent = now - self._thread.started
        self.collected += spent
        self._thread.spent += spent

    def cpu(self) -> float:
        """This thread's CPU seconds, as time.thread_time, less its own collections."""
        return time.thread_time() - self._thread.spent


class Anchors:
    """Anchors by kind, bounded: for each, [the anchor, how many times were seen (up to WARM_UP)]."""

    def __init__(self, size: int = 4096):
        self._anchors: LRUCache[Hashable, list[float]] = LRUCache(size)
        self._lock = threading.Lock()

    def steady(self, key: Hashable, value_ms: float, band: Band = CALL) -> float:
        """`value_ms` as reported against the anchor of `key`, after taking it into the anchor while warming up."""
        if not value_ms >= 0:  # negative or NaN: nothing to steady
            return value_ms
        with self._lock:
            seen = self._anchors.get(key)
            if seen is None:
                self._anchors[key] = seen = [value_ms, 0]
            if seen[1] < WARM_UP:
                if band.above(value_ms) < seen[0]:  # clearly faster than the anchor: it was a cold start
                    seen[0] = value_ms
                seen[1] += 1
            anchor = seen[0]
        return band.reported(anchor, value_ms)

    def warming(self, key: Hashable) -> bool:
        """Whether the anchor of `key` is not fixed yet (fewer than WARM_UP times of its kind seen)."""
        with self._lock:
            seen = self._anchors.get(key)
        return seen is None or seen[1] < WARM_UP

    def at_most(self, key: Hashable, value_ms: float) -> float:
        """`value_ms`, or the anchor of `key` when that is lower."""
        anchor = self._anchor(key)
        return value_ms if anchor is None else min(value_ms, anchor)

    def current(self, key: Hashable, value_ms: float, band: Band = CALL) -> float:
        """`value_ms` against the anchor of `key` as it stands: the anchor unless beyond `band` above it. Moves
        nothing."""
        anchor = self._anchor(key)
        return value_ms if anchor is None else band.reported(anchor, value_ms)

    def _anchor(self, key: Hashable) -> float | None:
        with self._lock:
            seen = self._anchors.get(key)
        return None if seen is None else seen[0]


anchors = Anchors()
clocks = Clocks()
