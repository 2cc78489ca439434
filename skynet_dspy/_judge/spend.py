"""A spending cap: the measured dollars of the judge's or the program's model calls against a limit.

Checked before each call and charged after it; the judge reserves each request's largest cost first, so the spend
passes the limit by at most one reservation, and refuses a request whose cost cannot be known.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from .._core.context import llm_pool
from .._core.errors import SpendCapReached
from .._core.logs import logger
from .._core.values import as_number, shorten
from .limits import WAIT_STEP, Cancelled


@dataclass(frozen=True, slots=True)
class Spend:
    """A snapshot of one cap: dollars measured, the limit, calls refused, calls whose price was unknown."""

    option: str  # the option that set it: "max_judge_cost_usd" or "max_program_cost_usd"
    limit_usd: float
    spent_usd: float
    refused: int  # model calls refused because the cap was reached
    unpriced: int  # answered calls with no known price (not counted in spent_usd)

    @property
    def reached(self) -> bool:
        return self.spent_usd >= self.limit_usd


class SpendCap:
    """The spend of `whose` model calls ("the judge", "the program") against `option`'s dollar limit."""

    def __init__(self, option: str, limit_usd: float, whose: str):
        number = None if isinstance(limit_usd, bool) else as_number(limit_usd)
        if number is None or not math.isfinite(number) or number < 0:
            raise ValueError(f"{option} must be a number of US dollars, 0 or more; got {shorten(limit_usd)}")
        self.option = option
        self.limit_usd = float(number)
        self.whose = whose
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified when a reservation is given back
        self._spent = self._reserved = 0.0  # _reserved: estimates of the requests in flight
        self._refused = self._unpriced = 0
        self._logged_reached = self._logged_unpriced = False

    @property
    def reached(self) -> bool:
        """Whether the measured spend has reached the limit (no more calls are made)."""
        return self._spent >= self.limit_usd

    def check(self) -> None:
        """Before a model call: raise SpendCapReached (and count the refusal) when the cap is reached."""
        self.reserve(0.0)  # the program's calls reserve nothing: this waits for no one

    def reserve(self, estimate_usd: float | None, unpriced: str = "no price known",
                cancelled: threading.Event | None = None) -> float:
        """Reserve a request's largest cost until charge(), waiting while requests in flight hold the rest (Cancelled
        once `cancelled` is set); SpendCapReached once the limit is reached or the cost is unknown (`unpriced`)."""
        with self._settled:
            while self._spent < self.limit_usd and estimate_usd is not None:
                if self._spent + self._reserved < self.limit_usd:
                    self._reserved += estimate_usd
                    return estimate_usd
                with llm_pool.waiting():
                    self._settled.wait(WAIT_STEP)
                if cancelled is not None and cancelled.is_set():
                    raise Cancelled
            spent = self._spent
            self._refused += 1
        if estimate_usd is None and spent < self.limit_usd:
            raise SpendCapReached(f"{self.whose}'s request was not sent: its cost cannot be known ({unpriced}), and "
                                  f"{self.option}={self.limit_usd:g} caps the spend, so it cannot be counted as free; "
                                  "register the model's price with litellm.register_model(...), or drop the cap")
        self._log_reached(spent)
        raise SpendCapReached(self._message(spent))

    def charge(self, cost_usd: float | None, unpriced: str | None = None, reserved_usd: float = 0.0) -> None:
        """After a call: add its cost (None: unknown, `unpriced` says why, warned once); give back its reservation."""
        with self._settled:
            self._reserved = max(0.0, self._reserved - reserved_usd)
            self._settled.notify_all()
            unknown = cost_usd is None
            warn = unknown and not self._logged_unpriced
            self._unpriced += unknown
            self._logged_unpriced |= unknown
            self._spent += max(0.0, float(cost_usd or 0.0))
            spent, reached = self._spent, self._spent >= self.limit_usd
        if warn:
            logger.warning("skynet-dspy %s: a model call's cost is unknown (%s), so the cap of $%g cannot count it "
                           "(later such calls are not logged); register the model's price with "
                           "litellm.register_model(...) to cap it", self.option, unpriced or "no price known",
                           self.limit_usd)
        if reached:
            self._log_reached(spent)

    def snapshot(self) -> Spend:
        with self._lock:
            return Spend(self.option, self.limit_usd, self._spent, self._refused, self._unpriced)

    def _log_reached(self, spent: float) -> None:
        with self._lock:
            if self._logged_reached:
                return
            self._logged_reached = True
        logger.error("skynet-dspy: %s; calls already sent finish, and the optimizer stops.", self._message(spent))

    def _message(self, spent: float) -> str:
        return (f"{self.whose}'s measured model spend ${spent:.6f} reached {self.option}={self.limit_usd:g}, so no "
                f"more of {self.whose}'s model calls are made")
