"""Whether a GEPA budget buys anything, checked before the run.

GEPA spends `max_metric_calls` on (candidate, example) evaluations: first the seed on the whole valset, then per
proposal a minibatch of the parent and the same minibatch of the new candidate. A budget below valset +
MIN_PROPOSALS x 2 x minibatch ends after one or two proposals, or none: this says so before anything is spent.
"""

from __future__ import annotations

from .._core.logs import logger

MIN_PROPOSALS = 3  # the proposals a budget should buy after the seed's valset evaluation


def check_budget(where: str, max_metric_calls: int, valset_size: int, minibatch_size: int) -> None:
    """Warn (once, before the run) when `max_metric_calls` cannot buy the valset and MIN_PROPOSALS proposals."""
    calls, valset, per_proposal = int(max_metric_calls), max(1, int(valset_size)), 2 * max(1, int(minibatch_size))
    smallest = valset + MIN_PROPOSALS * per_proposal
    if calls >= smallest:
        return
    proposals = max(0, calls - valset) // per_proposal
    bought = (
        f"not even the seed's evaluation on the valset ({valset} calls)" if calls < valset
        else f"the seed's evaluation on the valset ({valset} calls) and {proposals} "
        f"proposal{'s' if proposals != 1 else ''}"
    )
    logger.warning(
        "skynet-dspy %s: max_metric_calls=%d buys %s; each proposal evaluates a minibatch of %d twice (%d calls), "
        "and one that does better is evaluated on the valset again. Give max_metric_calls=%d or more for at least "
        "%d proposals (or a smaller valset / reflection_minibatch_size).",
        where, calls, bought, per_proposal // 2, per_proposal, smallest, MIN_PROPOSALS,
    )
