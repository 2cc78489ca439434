"""Timing summaries, importing nothing beyond the standard library (the native Predict run imports no skynet_dspy)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not ordered:
        raise ValueError("no samples")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return float(ordered[index])


def summarize_ns(samples: Sequence[int]) -> dict[str, float]:
    """Median, p90, p99 and mean of per-call times given in nanoseconds, in microseconds."""
    ordered = sorted(samples)
    return {
        "median_us": percentile(ordered, 0.5) / 1000,
        "p90_us": percentile(ordered, 0.9) / 1000,
        "p99_us": percentile(ordered, 0.99) / 1000,
        "mean_us": sum(ordered) / len(ordered) / 1000,
    }
