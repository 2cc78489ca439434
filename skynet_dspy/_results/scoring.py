"""Scoring many cases with a loaded metric (`skynet-dspy score`): a thread pool of metric.score calls, the rows
written as CSV or JSONL, and a summary of what failed.

Each call goes through metric.score, so it gets the isolation load_metric set up (worker processes by
default, killed at the timeout); a failed call is a row with its failure kind, never a stopped run.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TextIO

from .._core.types import Result
from . import table

FIXED = ("case", "score", "feedback", "failure", "detail")


@dataclass(frozen=True)
class Scored:
    """One case as scored: its number (1-based, in file order) and the metric's Result."""

    case: int
    result: Result


def outputs_of(cases: Sequence[Any], output_fields: Sequence[str] | None) -> list[Any]:
    """What each case gives score as its output: its own, or (without one) its expected values as the output.

    `cases` are the contract check's Cases (input, expected, output, has_output). A ValueError names the first
    case that has neither.
    """
    from .._dspy.translate import perfect_output

    outputs = []
    for number, case in enumerate(cases, 1):
        if case.has_output:
            outputs.append(case.output)
            continue
        perfect = perfect_output(case.expected, output_fields)
        if perfect is None:
            raise ValueError(
                f"case {number} has no 'output', and its expected values hold none of the output fields "
                f"{', '.join(output_fields or [])}; give it an 'output' to score"
            )
        outputs.append(perfect)
    return outputs


def score_cases(
    metric: Any,
    cases: Sequence[Any],
    *,
    threads: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[Scored]:
    """Score every case with `metric.score` from `threads` threads; the results in case order.

    `progress(1)` is called after each call. At most a few calls per thread are queued at a time, so a file
    of a million cases does not become a million waiting tasks.
    """
    outputs = outputs_of(cases, getattr(metric, "output_fields", None))
    results: list[Result | None] = [None] * len(cases)

    def one(index: int) -> None:
        case = cases[index]
        results[index] = metric.score(case.input, outputs[index], case.expected)
        if progress is not None:
            progress(1)

    if threads <= 1:
        for index in range(len(cases)):
            one(index)
    else:
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="skynet-dspy score")
        pending: set[Future[None]] = set()
        try:
            for index in range(len(cases)):
                pending.add(pool.submit(one, index))
                if len(pending) >= threads * 4:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        future.result()
            for future in pending:
                future.result()
        except BaseException:  # a Ctrl-C: no waiting for the calls in progress (closing the metric ends them)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return [Scored(number, result) for number, result in enumerate(results, 1) if result is not None]


# -- writing the rows ------------------------------------------------------------------------------------


def score_columns(scored: Sequence[Scored]) -> dict[str, str]:
    """Named score → its CSV column (the bare name, or scores.NAME when the name is a fixed column)."""
    names = dict.fromkeys(name for item in scored for name in (item.result.scores or {}))
    return table.named(names, set(FIXED), "scores")


def write_csv(stream: TextIO, scored: Sequence[Scored]) -> None:
    """One CSV row per case: case, score, each named score, feedback, failure ("" when it worked), detail."""
    named = score_columns(scored)
    writer = csv.writer(stream)
    writer.writerow(["case", "score", *named.values(), "feedback", "failure", "detail"])
    for item in scored:
        result = item.result
        scores = result.scores or {}
        writer.writerow([
            item.case, repr(float(result.score)), *(_cell(scores.get(name)) for name in named), result.feedback,
            str(result.failure) if result.failure is not None else "", result.detail or "",
        ])


def write_jsonl(stream: TextIO, scored: Sequence[Scored]) -> None:
    """One JSON object per line: case, score, scores, feedback, failure (null when it worked), detail."""
    for item in scored:
        result = item.result
        stream.write(json.dumps({
            "case": item.case,
            "score": float(result.score),
            "scores": dict(result.scores or {}),
            "feedback": result.feedback,
            "failure": str(result.failure) if result.failure is not None else None,
            "detail": result.detail,
        }, ensure_ascii=False) + "\n")


def _cell(value: Any) -> str:
    return "" if value is None else repr(float(value))


# -- the summary -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """What a scoring run came to: cases, failures by kind, mean score and named-score means, time."""

    cases: int
    failures: dict[str, int]
    means: table.ScoreMeans
    seconds: float

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def __str__(self) -> str:
        rate = f" ({self.cases / self.seconds:.0f} cases/s)" if self.seconds > 0 else ""
        text = f"scored {self.cases} case(s) in {self.seconds:.1f} s{rate}"
        if self.means.score is not None:
            text += f": mean score {self.means.score:.4g}"
        named = [f"{name} {value:.4g}" for name, value in self.means.named.items()]
        if named:
            text += f" ({', '.join(named)})"
        if self.failed:
            kinds = ", ".join(f"{count} {kind}" for kind, count in self.failures.items())
            text += f"; {self.failed} of {self.cases} call(s) failed: {kinds}"
        else:
            text += "; every call worked"
        return text


def summarize(scored: Sequence[Scored], seconds: float) -> Summary:
    """The summary of a scoring run that took `seconds`."""
    results = [item.result for item in scored]
    return Summary(len(scored), table.failure_counts(results), table.score_means(results), seconds)
