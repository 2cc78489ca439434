"""`skynet-dspy score`: a thread pool of metric.score calls (a failed call is a row with its failure kind), the
rows written as CSV or JSONL, each cell safe for where it goes, and a summary.
"""

from __future__ import annotations

import csv
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
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
    """Each case's output: its own, or its expected values as the output; a ValueError names a case with neither."""
    from .._dspy.translate import perfect_output

    outputs = []
    for number, case in enumerate(cases, 1):
        output = case.output if case.has_output else perfect_output(case.expected, output_fields)
        if not case.has_output and output is None:
            raise ValueError(
                f"case {number} has no 'output', and its expected values hold none of the output fields "
                f"{', '.join(output_fields or [])}; give it an 'output' to score"
            )
        outputs.append(output)
    return outputs


def score_cases(metric: Any, cases: Sequence[Any], *, threads: int, progress: Callable[[int, int], None],
                on_scored: Callable[[Scored], None]) -> None:
    """Score every case from `threads` threads; `on_scored` is called on this thread as each call finishes, then
    progress(cases scored, cases).

    At most 4 calls per thread are in flight or queued, so a million cases never become a million tasks. A
    KeyboardInterrupt stops at once, not waiting for the calls.
    """
    outputs = outputs_of(cases, getattr(metric, "output_fields", None))

    def one(index: int) -> Scored:
        return Scored(index + 1, metric.score(cases[index].input, outputs[index], cases[index].expected))

    indices, scored = iter(range(len(cases))), 0
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="skynet-dspy score")
    try:
        pending = {pool.submit(one, index) for index in itertools.islice(indices, threads * 4)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            pending |= {pool.submit(one, index) for index in itertools.islice(indices, len(done))}
            for future in sorted(done, key=lambda future: future.result().case):  # a set: in case order
                on_scored(future.result())
            scored += len(done)
            progress(scored, len(cases))
    except BaseException:  # a Ctrl-C: closing the metric ends the calls in progress
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _csv_row(item: Scored, named: dict[str, str]) -> list[Any]:
    result = item.result
    scores = result.scores or {}
    return [
        item.case, repr(float(result.score)),
        *("" if scores.get(name) is None else repr(float(scores[name])) for name in named),
        safe_text.csv_cell(result.feedback), str(result.failure) if result.failure is not None else "",
        safe_text.csv_cell(result.detail or ""),
    ]


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


class RowFile:
    """The rows written as they come (`add`), each flushed: to `path` (CSV or JSONL by `kind`), or as JSONL to
    standard output when `path` is None (in the order calls finish).

    `finish` rewrites the file in case order. A CSV row bringing a named score the header lacks rewrites the
    file with the new header (a temporary file renamed over it, so an interrupt never leaves half a file).
    """

    def __init__(self, path: Path | None, kind: str | None):
        self.path = path
        self.kind = kind or "jsonl"
        self.rows: list[Scored] = []
        self._named: dict[str, str] = {}
        self._handle: TextIO | None = sys.stdout if path is None else None
        if path is not None:
            self._rewrite(self.rows)

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
        """Put the rows in case order, rewrite the file so, and close it."""
        self.rows.sort(key=lambda item: item.case)
        if self.path is not None:
            self._rewrite(self.rows)
        self.close()

    def close(self) -> None:
        if self._handle is not None and self.path is not None:
            self._handle.close()
        self._handle = None

    def _rewrite(self, rows: Sequence[Scored]) -> None:
        assert self.path is not None
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        named = table.named(dict.fromkeys(name for item in rows for name in (item.result.scores or {})),
                            set(FIXED), "scores")
        try:
            with open(temporary, "w", encoding="utf-8", newline="") as handle:
                if self.kind == "csv":
                    writer = csv.writer(handle)
                    writer.writerow([safe_text.csv_cell(column) for column in
                                     ("case", "score", *named.values(), "feedback", "failure", "detail")])
                    writer.writerows(_csv_row(item, named) for item in rows)
                else:
                    handle.writelines(_json_line(item) for item in rows)
            self.close()
            os.replace(temporary, self.path)
        except BaseException:  # a Ctrl-C or a full disk while rewriting: the last whole file stays
            temporary.unlink(missing_ok=True)
            raise
        self._named = named
        self._handle = open(self.path, "a", encoding="utf-8", newline="")


def summarize(scored: Sequence[Scored], seconds: float) -> str:
    """The summary of a scoring run that took `seconds`: cases, mean scores, failures by kind."""
    results = [item.result for item in scored]
    means, failures = table.score_means(results), table.failure_counts(results)
    text = f"scored {len(results)} case(s) in {seconds:.1f} s"
    text += f" ({len(results) / seconds:.0f} cases/s)" if seconds > 0 else ""
    if "score" in means:
        text += f": mean score {means.pop('score'):.4g}"
    named = [f"{name.removeprefix('scores/')} {value:.4g}" for name, value in means.items()]
    text += f" ({', '.join(named)})" if named else ""
    failed = sum(failures.values())
    if failed:
        kinds = ", ".join(f"{count} {kind}" for kind, count in failures.items())
        text += f"; {failed} of {len(results)} call(s) failed: {kinds}"
    else:
        text += "; every call worked"
    return safe_text.for_terminal(text)
