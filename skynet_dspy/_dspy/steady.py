"""Measured times with their jitter taken out, so the same work measures the same from run to run.

A model call's latency and a program's own work vary between identical runs (20-50% for single calls on a loaded
machine); GEPA, comparing candidates by a strict "greater than", would take that noise for an improvement. Each kind
of time keeps an anchor: its first time, moved down only to a time beyond the band below it among its first WARM_UP
(a cold first connection is left behind), then fixed for the process with its noise band. Until then the band is a
fraction of the anchor or a floor in ms, whichever is larger; once fixed, it is narrowed to SPREAD times the spread
the kind's first times measured (never below the floor), so a steady provider's real slow-down shows although it is
well under half its latency. Only first times measured one after another narrow it: of work done concurrently, the
first to finish are the fastest of their batch, whose spread understates the noise. A time up to the band above its
anchor, or below it, is reported as the anchor; a time beyond the band is reported as measured. An anchor moves by
no small step: a move by a few ms would make the examples scored before it (the seed's, or a parent's) look slower
than the same work after it. A model call's kind is its model, endpoint and answer size (measure._kind); a program's
own work, its class.

Garbage collection is left out of a program's own work (`clocks`): every collection outside its model calls, and of
its CPU time its own thread's. A collection stops every thread running Python, for up to a second in a
large heap (a long-running notebook), whatever the candidate does.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass

from cachetools import LRUCache


@dataclass(frozen=True)
class Band:
    """How far above its anchor a time may be and still be the anchor plus noise: `fraction` of the anchor, or
    `floor_ms`, whichever is larger; narrowed to the kind's measured spread once its anchor is fixed."""

    fraction: float
    floor_ms: float

    def width(self, anchor: float, spread: float | None = None) -> float:
        """The band above `anchor`, ms; with the kind's measured `spread`, SPREAD times it, within the floor and the
        fraction."""
        widest = max(anchor * self.fraction, self.floor_ms)
        return widest if spread is None else max(self.floor_ms, min(widest, SPREAD * spread))


# The widest band and the floor: the floor is what one busy moment adds to any time.
CALL = Band(0.5, 10.0)  # a model call: 10 ms (a first connection, a busy moment)
OWN = Band(0.5, 25.0)  # a program's CPU time outside model calls: 25 ms (a cache miss, a page fault)
WAIT = Band(0.5, 50.0)  # the time it waited outside model calls: 50 ms (the GIL, a busy core)
WARM_UP = 4  # a kind's first times, while its anchor may still move down
SAMPLED = 8  # a kind's first times, whose spread (highest less lowest, a cold start left out) fixes its band
SPREAD = 3.0  # a fixed band is this many times that spread


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


@dataclass(slots=True)
class _Kind:
    """One kind's anchor, its first times (up to SAMPLED), and its band's width once fixed."""

    anchor: float
    band: Band
    times: list[float]
    width: float | None = None
    ended: float = -math.inf  # when the last of the first times ended (perf_counter seconds)
    overlapped: bool = False  # whether any two of the first times were measured at once

    def take(self, value_ms: float, started: float | None) -> None:
        """Take one of the first times (of work begun at `started`, None when unknown): into the anchor while it warms
        up; the last fixes the band, to the spread of those within it when none overlapped."""
        if len(self.times) < WARM_UP and value_ms + self.band.width(value_ms) < self.anchor:  # a cold start before
            self.anchor = value_ms
        self.times.append(value_ms)
        self.overlapped = self.overlapped or started is None or started < self.ended
        self.ended = time.perf_counter()
        if len(self.times) == SAMPLED:
            kept = [ms for ms in self.times if ms <= self.anchor + self.band.width(self.anchor)]  # no cold start
            self.width = self.band.width(self.anchor, None if self.overlapped else max(kept) - min(kept))

    def reported(self, value_ms: float) -> float:
        """`value_ms` as reported: the anchor, unless beyond the band above it."""
        width = self.band.width(self.anchor) if self.width is None else self.width
        return value_ms if value_ms > self.anchor + width else self.anchor


class Anchors:
    """Anchors by kind, bounded."""

    def __init__(self, size: int = 4096):
        self._kinds: LRUCache[Hashable, _Kind] = LRUCache(size)
        self._lock = threading.Lock()

    def steady(self, key: Hashable, value_ms: float, band: Band = CALL, started: float | None = None) -> float:
        """`value_ms` as reported against the anchor of `key`, after taking it into the kind's first times (of work
        begun at `started`, perf_counter seconds, ending now)."""
        if not value_ms >= 0:  # negative or NaN: nothing to steady
            return value_ms
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None:
                self._kinds[key] = kind = _Kind(value_ms, band, [])
            if kind.width is None:
                kind.take(value_ms, started)
            return kind.reported(value_ms)

    def warming(self, key: Hashable) -> bool:
        """Whether the anchor of `key` is not fixed yet (fewer than WARM_UP times of its kind seen)."""
        with self._lock:
            kind = self._kinds.get(key)
            return kind is None or len(kind.times) < WARM_UP

    def at_most(self, key: Hashable, value_ms: float) -> float:
        """`value_ms`, or the anchor of `key` when that is lower."""
        with self._lock:
            kind = self._kinds.get(key)
            return value_ms if kind is None else min(value_ms, kind.anchor)

    def current(self, key: Hashable, value_ms: float) -> float:
        """`value_ms` against the anchor of `key` as it stands: the anchor unless beyond its band. Moves nothing."""
        with self._lock:
            kind = self._kinds.get(key)
            return value_ms if kind is None else kind.reported(value_ms)


anchors = Anchors()
clocks = Clocks()
