"""Scoring many cases with a loaded metric (`skynet-dspy score`): a thread pool of metric.score calls, the rows
written as CSV or JSONL, and a summary of what failed.

Each call goes through metric.score, so it gets the isolation load_metric set up (worker processes by
default, killed at the timeout); a failed call is a row with its failure kind, never a stopped run.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .._core import safe_text
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
    on_scored: Callable[[Scored], None] | None = None,
) -> list[Scored]:
    """Score every case with `metric.score` from `threads` threads; the results in case order.

    `on_scored(scored)` is called on the calling thread as each call finishes (in the order they finish), so
    rows can be written as they come; `progress(1)` after each call. At most a few calls per thread are queued
    at a time, so a file of a million cases does not become a million waiting tasks. A KeyboardInterrupt stops
    the run at once: what `on_scored` was given is what was scored.
    """
    outputs = outputs_of(cases, getattr(metric, "output_fields", None))
    results: list[Result | None] = [None] * len(cases)

    def one(index: int) -> int:
        case = cases[index]
        results[index] = metric.score(case.input, outputs[index], case.expected)
        if progress is not None:
            progress(1)
        return index

    def done(index: int) -> None:
        result = results[index]
        if on_scored is not None and result is not None:
            on_scored(Scored(index + 1, result))

    if threads <= 1:
        for index in range(len(cases)):
            done(one(index))
    else:
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="skynet-dspy score")
        pending: set[Future[int]] = set()
        try:
            for index in range(len(cases)):
                pending.add(pool.submit(one, index))
                if len(pending) >= threads * 4:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        done(future.result())
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    done(future.result())
        except BaseException:  # a Ctrl-C: no waiting for the calls in progress (closing the metric ends them)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return [Scored(number, result) for number, result in enumerate(results, 1) if result is not None]


# -- writing the rows ------------------------------------------------------------------------------------
# Every cell is made safe for where it goes (_core/safe_text.py): CSV text cells a spreadsheet would evaluate
# get a leading ', numbers stay numbers, a field with a line break is quoted (csv's \r\n line ends quote both
# \r and \n); JSONL is valid UTF-8 with no raw control byte.


def score_columns(scored: Sequence[Scored]) -> dict[str, str]:
    """Named score → its CSV column (the bare name, or scores.NAME when the name is a fixed column)."""
    names = dict.fromkeys(name for item in scored for name in (item.result.scores or {}))
    return table.named(names, set(FIXED), "scores")


def write_csv(stream: TextIO, scored: Sequence[Scored]) -> None:
    """One CSV row per case: case, score, each named score, feedback, failure ("" when it worked), detail."""
    named = score_columns(scored)
    writer = csv.writer(stream)
    writer.writerow(_csv_header(named))
    for item in scored:
        writer.writerow(_csv_row(item, named))


def _csv_header(named: dict[str, str]) -> list[Any]:
    return [safe_text.csv_cell(column) for column in ("case", "score", *named.values(), "feedback", "failure",
                                                        "detail")]


def _csv_row(item: Scored, named: dict[str, str]) -> list[Any]:
    result = item.result
    scores = result.scores or {}
    return [
        item.case, repr(float(result.score)), *(_cell(scores.get(name)) for name in named),
        safe_text.csv_cell(result.feedback), str(result.failure) if result.failure is not None else "",
        safe_text.csv_cell(result.detail or ""),
    ]


def write_jsonl(stream: TextIO, scored: Sequence[Scored]) -> None:
    """One JSON object per line: case, score, scores, feedback, failure (null when it worked), detail."""
    for item in scored:
        stream.write(_json_line(item))


def _json_line(item: Scored) -> str:
    result = item.result
    return safe_text.json_text({
        "case": item.case,
        "score": float(result.score),
        "scores": dict(result.scores or {}),
        "feedback": result.feedback,
        "failure": str(result.failure) if result.failure is not None else None,
        "detail": result.detail,
    }) + "\n"


def _cell(value: Any) -> str:
    return "" if value is None else repr(float(value))


class RowFile:
    """The rows of a scoring run written to `path` as they come (`add`), each flushed, so an interrupted run
    keeps every row scored so far; `finish` rewrites them in case order. CSV or JSONL by `kind`.

    A CSV's header names the named scores seen so far: a row bringing a new one rewrites the file with the new
    header (into a temporary file, then renamed over it, so an interrupt never leaves half a file).
    """

    def __init__(self, path: Path, kind: str):
        self.path = path
        self.kind = kind
        self.rows: list[Scored] = []
        self._named: dict[str, str] = {}
        self._handle: TextIO | None = None
        self._rewrite(self.rows)

    @property
    def count(self) -> int:
        return len(self.rows)

    def add(self, item: Scored) -> None:
        self.rows.append(item)
        if self.kind == "csv" and any(name not in self._named for name in (item.result.scores or {})):
            self._rewrite(self.rows)
            return
        assert self._handle is not None
        if self.kind == "csv":
            csv.writer(self._handle).writerow(_csv_row(item, self._named))
        else:
            self._handle.write(_json_line(item))
        self._handle.flush()

    def finish(self) -> None:
        """Rewrite the rows in case order and close the file."""
        self._rewrite(sorted(self.rows, key=lambda item: item.case))
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _rewrite(self, rows: Sequence[Scored]) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "w", encoding="utf-8", newline="") as handle:
                if self.kind == "csv":
                    named = score_columns(rows)
                    write_csv(handle, rows)
                else:
                    write_jsonl(handle, rows)
            self.close()
            os.replace(temporary, self.path)
        except BaseException:  # a Ctrl-C or a full disk while rewriting: the last whole file stays
            temporary.unlink(missing_ok=True)
            raise
        if self.kind == "csv":
            self._named = named
        self._handle = open(self.path, "a", encoding="utf-8", newline="")


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
        return safe_text.for_terminal(text)


def summarize(scored: Sequence[Scored], seconds: float) -> Summary:
    """The summary of a scoring run that took `seconds`."""
    results = [item.result for item in scored]
    return Summary(len(scored), table.failure_counts(results), table.score_means(results), seconds)
