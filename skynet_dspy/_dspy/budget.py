"""Whether a GEPA budget buys anything: the valset evaluation plus a few proposals, checked before the run.

GEPA spends `max_metric_calls` on (candidate, example) evaluations: first the seed on the whole valset,
then per proposal a minibatch of the parent and the same minibatch of the new candidate (and the valset
again for a candidate that does better). A budget below valset + MIN_PROPOSALS x 2 x minibatch ends after
one or two proposals, or none, and is only noticed after the run; this says so before anything is spent.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core.logs import logger

MIN_PROPOSALS = 3  # the proposals a budget should buy after the seed's valset evaluation


@dataclass(frozen=True, slots=True)
class Budget:
    """What a budget of metric calls buys a GEPA run."""

    max_metric_calls: int
    valset_size: int
    minibatch_size: int

    @property
    def per_proposal(self) -> int:
        """Metric calls of one proposal: the parent's and the new candidate's minibatch."""
        return 2 * self.minibatch_size

    @property
    def proposals(self) -> int:
        """Proposals the budget buys after the seed's valset evaluation (none when it cannot buy that)."""
        return max(0, self.max_metric_calls - self.valset_size) // self.per_proposal

    @property
    def smallest(self) -> int:
        """The smallest budget that buys the valset evaluation and MIN_PROPOSALS proposals."""
        return self.valset_size + MIN_PROPOSALS * self.per_proposal

    @property
    def enough(self) -> bool:
        return self.max_metric_calls >= self.smallest


def check_budget(where: str, max_metric_calls: int, valset_size: int, minibatch_size: int) -> Budget:
    """Warn (once, before the run) when `max_metric_calls` cannot buy the valset and MIN_PROPOSALS proposals."""
    budget = Budget(int(max_metric_calls), max(1, int(valset_size)), max(1, int(minibatch_size)))
    if not budget.enough:
        bought = (
            f"not even the seed's evaluation on the valset ({budget.valset_size} calls)"
            if budget.max_metric_calls < budget.valset_size
            else f"the seed's evaluation on the valset ({budget.valset_size} calls) and {budget.proposals} "
            f"proposal{'s' if budget.proposals != 1 else ''}"
        )
        logger.warning(
            "skynet-dspy %s: max_metric_calls=%d buys %s; each proposal evaluates a minibatch of %d twice (%d calls), "
            "and one that does better is evaluated on the valset again. Give max_metric_calls=%d or more for at least "
            "%d proposals (or a smaller valset / reflection_minibatch_size).",
            where, budget.max_metric_calls, bought, budget.minibatch_size, budget.per_proposal, budget.smallest,
            MIN_PROPOSALS,
        )
    return budget
