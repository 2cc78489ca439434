"""Where a metric's calls run: worker processes (process.py, the default), threads (thread.py) or a Ray cluster
(ray_cluster.py), all behind one small interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..call import CallRequest
    from ..context import LLMHandler
    from ..types import MetricInfo, Outcome


class Executor(Protocol):
    """Loads one metric, runs its calls (each under the timeout, whatever the metric does), and stops."""

    info: MetricInfo  # what loading the metric found

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score: plain values in, an Outcome of plain values out; llm() requests go to `llm`."""
        ...

    def close(self) -> None:
        """Stop whatever runs the metric; no call is made after this."""
        ...
