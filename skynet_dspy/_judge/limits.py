"""How fast the judge may send: requests in flight and per minute (per metric), pauses and a breaker (per endpoint).

Hand-written: LiteLLM's Router counts a fixed minute, so a minute's quota goes out at once. Every wait ends when the
request's call ends (`cancelled`), and gives its llm() pool thread back meanwhile, so no metric delays another's.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from .._core.context import llm_pool
from .._core.values import whole_number

WAIT_STEP = 0.05  # seconds between looks at a cancelled request while it waits for a slot
BREAKER_SECONDS = 15.0  # once an endpoint cannot be reached, requests to it fail at once for this long


class Cancelled(Exception):
    """The request's metric call ended (or its metric was closed) before it was sent."""


def wait(seconds: float, cancelled: threading.Event) -> None:
    """Sleep `seconds`, or raise Cancelled as soon as `cancelled` is set."""
    if seconds > 0:
        with llm_pool.waiting():
            cancelled.wait(seconds)
    if cancelled.is_set():
        raise Cancelled


def checked_limit(name: str, value: object) -> int | None:
    """judge_max_concurrency= / judge_rpm=: a whole number, 1 or more, or None (no limit)."""
    return None if value is None else whole_number(name, value, minimum=1, unit="requests")


class InFlight:
    """At most `limit` requests in flight at once (None: no limit)."""

    def __init__(self, limit: int | None):
        self._slots = threading.BoundedSemaphore(limit) if limit is not None else None

    def acquire(self, cancelled: threading.Event) -> None:
        if self._slots is None or self._slots.acquire(blocking=False):
            return
        with llm_pool.waiting():
            while not self._slots.acquire(timeout=WAIT_STEP):
                if cancelled.is_set():
                    raise Cancelled

    def release(self) -> None:
        if self._slots is not None:
            self._slots.release()


class PerMinute:
    """At most `rpm` request starts a minute, spread evenly: a token bucket refilled at rpm/60 a second, holding a
    small burst (rpm/20, between 1 and 10). A request takes a token, waiting for its turn when there is none."""

    def __init__(self, rpm: int | None):
        self.rpm = rpm
        self.burst = max(1, min(10, (rpm or 0) // 20))
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._updated = time.monotonic()

    def acquire(self, cancelled: threading.Event) -> None:
        if self.rpm is None:
            return
        rate = self.rpm / 60.0
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * rate) - 1
            self._updated = now
            delay = -self._tokens / rate  # > 0: this request's turn is that far away, after those waiting
        try:
            wait(delay, cancelled)
        except Cancelled:
            with self._lock:
                self._tokens += 1  # the turn goes to the next request
            raise


@dataclass
class EndpointState:
    """What the judge learnt of one endpoint: paused (its 429s cluster), or unreachable (its breaker is open)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    paused_until: float = 0.0  # monotonic
    throttled: bool = False  # its last answer was a 429
    open_until: float = 0.0  # monotonic: the breaker is open until then
    last_error: str = ""

    def before_send(self, cancelled: threading.Event) -> str | None:
        """Wait out a pause; while the breaker is open, why the request must fail at once (else None)."""
        while (pause := self.paused_until - time.monotonic()) > 0 or time.monotonic() < self.open_until:
            if time.monotonic() < self.open_until:
                return (f"it could not be reached a moment ago ({self.last_error}); not trying again for "
                        f"{self.open_until - time.monotonic():.0f} s")
            wait(pause, cancelled)
        return None

    def paused(self) -> bool:
        return time.monotonic() < self.paused_until

    def rate_limited(self, seconds: float) -> None:
        """A 429 that asks to wait `seconds` (bounded): when it follows another 429, every request to the endpoint
        that has not started pauses that long; after a lone one, only its own request waits."""
        with self.lock:
            if self.throttled and math.isfinite(seconds) and seconds > 0:
                self.paused_until = max(self.paused_until, time.monotonic() + seconds)
            self.throttled = True

    def unreachable(self, error: str) -> None:
        """A connection refused, a name that does not resolve: requests to the endpoint fail at once for a while."""
        with self.lock:
            self.last_error, self.open_until = error, time.monotonic() + BREAKER_SECONDS

    def answered(self) -> None:
        with self.lock:
            self.throttled, self.open_until = False, 0.0


_endpoints: dict[tuple[str, str], EndpointState] = {}
_endpoints_lock = threading.Lock()


def endpoint_state(model: str, api_base: str | None) -> EndpointState:
    """The process-wide state of an endpoint (a model at a base URL), shared by every judge that calls it."""
    with _endpoints_lock:
        return _endpoints.setdefault((model, api_base or ""), EndpointState())
