"""Measurement of the program's own run on each example: wall time and model usage (SPEC §5).

Placeholder interface; the measuring itself lands with the measurement issue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Observation:
    """The program's measured run on the example being scored."""

    run_ms: float | None  # wall time of the run, milliseconds
    cost_usd: float | None  # USD cost of its model calls; None when a price is unknown
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_unknown_reason: str | None = None  # why cost_usd is None, for feedback

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def install() -> None:
    """Start measuring DSPy program runs in this process (idempotent)."""


def observation_for(prediction: Any) -> tuple[Observation | None, str | None]:
    """The measured run that produced `prediction`, or (None, why it was not measured)."""
    return None, "no measured program run was found for this prediction"
