"""The command line: `skynet-dspy check METRIC.py --data CASES.jsonl [options]` and
`skynet-dspy score METRIC.py --data OUTPUTS.jsonl [--out results.csv|.jsonl] [--threads N]`.

Exit codes: check: 0 the contract holds, 1 it is broken; score: 0 every call worked, 1 some failed (or the
metric does not load); both: 2 bad arguments or unreadable files, 130 interrupted (score keeps the rows scored
so far). Everything printed is safe for a terminal (_core/safe_text.py): a model's text cannot drive it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ._core import secrets
from ._core.contract import DEFAULT_TIMEOUT, MAX_TIMEOUT
from ._core.options import MetricOptions, names
from ._core.safe_text import for_terminal

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader closed the pipe


class UsageError(Exception):
    """Bad arguments or an unreadable file: reported in one line, exit code 2."""


def _typed(kind: Callable[[str], Any], valid: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: `kind(text)` for which `valid` holds, else an error saying the text is not `what`."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan  # fails every comparison, so `valid` refuses it
        if not valid(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


def _at_least_one(unit: str) -> Callable[[str], Any]:
    return _typed(int, lambda n: n >= 1, f"a number of {unit}, 1 or more")


_names = _typed(lambda text: [name.strip() for name in text.split(",")], all,
                "a comma-separated list of field names, e.g. label,date")
_timeout = _typed(float, lambda x: 0 < x <= MAX_TIMEOUT,
                  f"a number of seconds in (0, {MAX_TIMEOUT:g}]; the default is {DEFAULT_TIMEOUT:g}")
_threads = _typed(int, lambda n: 1 <= n <= 256, "a number of threads from 1 to 256")
_spread = _typed(float, lambda x: 0 <= x < math.inf, "a spread of scores, 0 or more (e.g. 0.1)")
_agreement = _typed(float, lambda x: -1 <= x <= 1, "an agreement from -1 to 1 (e.g. 0.6)")
_dollars = _typed(float, lambda x: 0 < x < math.inf, "an amount of US dollars above 0 (e.g. 0.50)")


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    from ._check.agreement import DEFAULT_MIN_AGREEMENT
    from ._check.cases import CASES_CHECKED
    from ._check.stability import DEFAULT_MAX_SPREAD

    parser = argparse.ArgumentParser(prog="skynet-dspy", description="Skynet metrics (metric.py) for DSPy and GEPA.")
    parser.add_argument("--version", action="version", version=f"skynet-dspy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="check that a metric.py keeps the metric contract",
        description=f"Run METRIC.py on the first cases of CASES.jsonl ({CASES_CHECKED} by default) and report, item "
        "by item, whether it keeps the metric contract. Exit code: 0 the contract holds, 1 it is broken, 2 bad "
        "arguments.",
    )
    _add_metric_arguments(check, "CASES.jsonl")
    how_many = check.add_mutually_exclusive_group()
    how_many.add_argument("--cases", type=_at_least_one("cases"), metavar="N",
                          help=f"check the first N cases (default {CASES_CHECKED}; every case with --human)")
    how_many.add_argument("--all", action="store_true", help="check every case")
    check.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    # whether the metric can be trusted: --repeat (stability), --human (agreement); docs/cli.md
    check.add_argument(
        "--repeat", type=_at_least_one("runs"), default=1, metavar="N",
        help="score each case N times, asking the judge again each time (its cache left out; the cost is shown "
        "first), and report how much the scores vary",
    )
    check.add_argument("--max-spread", type=_spread, default=DEFAULT_MAX_SPREAD, metavar="X",
                       help=f"with --repeat: warn when a case's scores vary by more than X (default "
                       f"{DEFAULT_MAX_SPREAD:g})")
    check.add_argument(
        "--human", type=Path, metavar="LABELS.jsonl",
        help='a person\'s score for each case of --data, one line per case in the same order: a number, null, or '
        '{"score": 1, "scores": {...}}; reports the agreement between metric and person',
    )
    check.add_argument("--min-agreement", type=_agreement, default=DEFAULT_MIN_AGREEMENT, metavar="X",
                       help=f"with --human: warn when kappa (or Spearman's rho) is below X (default "
                       f"{DEFAULT_MIN_AGREEMENT:g})")
    check.add_argument("--max-judge-cost-usd", type=_dollars, metavar="USD",
                       help="stop sending llm() requests once the judge has cost this much (a cap the repeats keep)")
    score = commands.add_parser(
        "score",
        help="score every case of a JSONL file with a metric.py",
        description="Score every case of OUTPUTS.jsonl with METRIC.py and write one row per case (score, named "
        "scores, feedback, failure). Exit code: 0 every call worked, 1 some failed (the summary on stderr says how "
        "many and of which kind) or the metric does not load, 2 bad arguments or unreadable files.",
    )
    _add_metric_arguments(score, "OUTPUTS.jsonl")
    score.add_argument("--out", type=Path, metavar="results.csv|results.jsonl",
                       help="where to write the rows (.csv or .jsonl); without it, JSONL rows on standard output")
    score.add_argument("--threads", type=_threads, default=4, metavar="N",
                       help="calls of score made at a time (default 4; each thread gets a worker process)")
    return parser


def _add_metric_arguments(command: argparse.ArgumentParser, data: str) -> None:
    """The arguments check and score share: the metric file, the cases (`data` names them), and load_metric's
    options (read back by _metric_options)."""
    command.add_argument("metric", type=Path, metavar="METRIC.py", help="the metric file, defining score()")
    command.add_argument(
        "--data", type=Path, required=True, metavar=data,
        help='one case per line: {"input": {...}, "output": ..., "expected": {...}}; without "output", the expected '
        "values are scored as the output. Flat rows ({\"ticket\": ..., \"label\": ...}) with --inputs",
    )
    command.add_argument("--inputs", type=_names, metavar="NAME[,NAME...]",
                         help="read flat rows: these keys are the input fields, every other key an expected value")
    # load_metric's options, each flag named as its option (_metric_options passes those given; the rest keep
    # load_metric's defaults)
    command.add_argument("--timeout", type=_timeout, metavar="S", help=f"seconds each call of score may take "
                         f"(0 < S <= {MAX_TIMEOUT:g}; default {DEFAULT_TIMEOUT:g})")
    command.add_argument(
        "--output-fields", type=_names, metavar="NAME[,NAME...]",
        help="the fields a program's output holds (some may have no expected value, e.g. a confidence); a case "
        "without an output is scored on its expected values of these fields",
    )
    command.add_argument("--metric-lm", metavar="MODEL", help="the model llm() calls, any LiteLLM model string (its "
                         "key from the environment, as LiteLLM reads it)")
    command.add_argument("--api-base", metavar="URL", help="an OpenAI-compatible base URL for --metric-lm")
    command.add_argument("--judge-max-concurrency", type=_at_least_one("requests"), metavar="N",
                         help="at most N llm() requests in flight at once (default: no limit)")
    command.add_argument("--judge-rpm", type=_at_least_one("requests"), metavar="R",
                         help="at most R llm() requests started a minute, spread evenly (default: no limit)")
    command.add_argument(
        "--isolation", choices=("process", "thread", "ray"),
        help="where score runs: worker processes (default), threads of this process, or a Ray cluster (RAY_ADDRESS, "
        "else a local Ray; needs skynet-dspy[ray])",
    )


def _check(args: argparse.Namespace) -> int:
    from tqdm.contrib.logging import logging_redirect_tqdm

    from ._check import check_contract
    from ._check.cases import CASES_CHECKED, read_jsonl
    from ._core.logs import logger
    from ._results.progress import Progress

    options = _metric_options(args)
    rows = read_jsonl(args.data, args.inputs)
    # --cases N, --all, or the default: CASES_CHECKED cases, or every case when --human labels them
    max_cases = None if args.all or (args.cases is None and args.human is not None) else args.cases or CASES_CHECKED
    progress = Progress("skynet-dspy check", unit="calls") if not args.json else None
    # what the metric prints must not mix into the report; the package's warnings (the cost of --repeat) show on
    # stderr, each on a line of its own above the progress bar, which is cleared before the report prints
    with contextlib.redirect_stdout(sys.stderr), logging_redirect_tqdm([logger]), progress or contextlib.nullcontext():
        report = check_contract(
            args.metric, rows, max_cases=max_cases, inputs=args.inputs, progress=progress,
            repeat=args.repeat, max_spread=args.max_spread, human=args.human, min_agreement=args.min_agreement,
            **options,
        )
    report.run_all_hint = "--all runs every case"
    print(report.to_json() if args.json else report)
    return EXIT_OK if report.ok else EXIT_BROKEN


def _metric_options(args: argparse.Namespace) -> MetricOptions:
    """load_metric options from the arguments check and score share; a UsageError for a bad metric path."""
    if args.metric.is_dir():
        raise UsageError(f"{args.metric} is a folder; give the path of the metric file, e.g. metric.py")
    if not args.metric.is_file():
        raise UsageError(f"metric file not found: {args.metric}")
    if args.api_base and not args.metric_lm:
        raise UsageError("--api-base needs --metric-lm MODEL, the model to call there")
    options = cast(MetricOptions, {name: value for name, value in vars(args).items()
                                   if name in names(MetricOptions) and value is not None})
    if args.api_base:
        options["metric_lm"] = {"model": args.metric_lm, "api_base": args.api_base}
    return options


def _score(args: argparse.Namespace) -> int:
    """Score every case; write the rows; exit 0 when every call worked, 1 when some failed."""
    import time

    from ._check.cases import parse_case, read_jsonl
    from ._dspy.metric import load_metric
    from ._results import scoring
    from ._results.progress import Progress
    from .errors import MetricLoadError, RewardSpecError, WorkerError

    options = _metric_options(args)
    kind = _out_kind(args.out)
    cases = [parse_case(row, args.inputs) for row in read_jsonl(args.data, args.inputs)]
    try:
        metric = load_metric(args.metric, **{**options, "measure": False, "workers": args.threads})
    except (MetricLoadError, RewardSpecError, WorkerError) as exc:
        print(for_terminal(secrets.redact(f"skynet-dspy score: the metric does not load, nothing was scored: {exc}")),
              file=sys.stderr)
        return EXIT_BROKEN
    progress = Progress("skynet-dspy score", len(cases), unit="cases")
    rows: Any = None
    started = time.perf_counter()
    try:
        rows = scoring.RowFile(args.out, kind)
        with contextlib.redirect_stdout(sys.stderr):  # what the metric prints must not mix into the rows
            scoring.score_cases(metric, cases, threads=args.threads, progress=progress, on_scored=rows.add)
        rows.finish()
    except KeyboardInterrupt:
        progress.close()
        metric.close()  # ends the calls in progress; the scorer does not count them as the metric's failures
        kept = len(rows.rows) if rows is not None else 0
        where = f"; they are in {args.out}" if args.out is not None else " (written to standard output)"
        print(for_terminal(f"skynet-dspy score: interrupted: {kept} of {len(cases)} case(s) scored before the "
                           f"interrupt{where if kept else ''}"), file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        if args.out is None or isinstance(exc, BrokenPipeError):  # a broken pipe: main() says so
            raise
        raise UsageError(f"--out {args.out}: cannot write the rows: {exc.strerror or exc}") from None
    finally:
        progress.close()
        metric.close()
        if rows is not None:
            rows.close()
    summary = scoring.summarize(rows.rows, time.perf_counter() - started)
    where = f"; rows in {args.out}" if args.out is not None else ""
    print(for_terminal(f"skynet-dspy score: {summary}{where}"), file=sys.stderr)
    return EXIT_BROKEN if any(item.result.failure is not None for item in rows.rows) else EXIT_OK


def _out_kind(out: Path | None) -> str | None:
    """The --out file's format ("csv" or "jsonl"; None: standard output), or a UsageError for a file not writable."""
    if out is None:
        return None
    kind = {".csv": "csv", ".jsonl": "jsonl"}.get(out.suffix.lower())
    if kind is None:
        raise UsageError(f"--out {out}: write the rows to a .csv or a .jsonl file")
    if out.is_dir() or not out.parent.is_dir():
        raise UsageError(f"--out {out}: no such folder to write the file in")
    return kind


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 contract holds, 1 broken, 2 bad arguments)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error (or --help / --version)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    from .errors import DataError

    try:
        return _score(args) if args.command == "score" else _check(args)
    except (UsageError, DataError, ValueError, TypeError) as exc:  # check_contract's errors name a bad option or case
        print(for_terminal(secrets.redact(f"skynet-dspy: error: {exc}")), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("skynet-dspy: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`skynet-dspy check ... --json | head`): stop without a traceback
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # Python flushes stdout at exit: let that find no pipe
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
