"""The command line: `skynet-dspy check METRIC.py --data CASES.jsonl [options]`.

Exit codes: 0 the contract holds, 1 it is broken, 2 bad arguments or unreadable files, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from ._core.contract import DEFAULT_TIMEOUT, MAX_TIMEOUT, check_timeout

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad arguments or an unreadable file: reported in one line, exit code 2."""


def _timeout(text: str) -> float:
    try:
        return check_timeout(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds in (0, {MAX_TIMEOUT:g}]; the default is {DEFAULT_TIMEOUT:g}"
        ) from None


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of field names, e.g. label,date")
    return names


def _count(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of cases, 1 or more")
    return number


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="skynet-dspy", description="Skynet metrics (metric.py) for DSPy and GEPA.")
    parser.add_argument("--version", action="version", version=f"skynet-dspy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="check that a metric.py keeps the metric contract",
        description="Run METRIC.py on the first cases of CASES.jsonl (3 by default) and report, item by item, "
        "whether it keeps the metric contract. Exit code: 0 the contract holds, 1 it is broken, 2 bad arguments.",
    )
    check.add_argument("metric", type=Path, metavar="METRIC.py", help="the metric file, defining score()")
    check.add_argument(
        "--data", type=Path, required=True, metavar="CASES.jsonl",
        help='one case per line: {"input": {...}, "output": ..., "expected": {...}}; without "output", the expected '
        "values are scored as the output. Flat rows ({\"ticket\": ..., \"label\": ...}) with --inputs",
    )
    check.add_argument(
        "--inputs", type=_names, default=None, metavar="NAME[,NAME...]",
        help="read flat rows: these keys are the input fields, every other key an expected value",
    )
    how_many = check.add_mutually_exclusive_group()
    how_many.add_argument("--cases", type=_count, default=3, metavar="N", help="check the first N cases (default 3)")
    how_many.add_argument("--all", action="store_true", help="check every case")
    check.add_argument(
        "--timeout", type=_timeout, default=DEFAULT_TIMEOUT, metavar="S",
        help=f"seconds each call of score may take (0 < S <= {MAX_TIMEOUT:g}; default {DEFAULT_TIMEOUT:g})",
    )
    check.add_argument(
        "--output-fields", type=_names, default=None, metavar="NAME[,NAME...]",
        help="the fields a program's output holds (some may have no expected value, e.g. a confidence)",
    )
    check.add_argument(
        "--metric-lm", default=None, metavar="MODEL",
        help="the model llm() calls, any LiteLLM model string (its key from the environment, as LiteLLM reads it)",
    )
    check.add_argument("--api-base", default=None, metavar="URL", help="an OpenAI-compatible base URL for --metric-lm")
    check.add_argument(
        "--isolation", choices=("process", "thread"), default="process",
        help="where score runs: worker processes (default) or threads of this process",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    return parser


def _check(args: argparse.Namespace) -> int:
    from ._check import check_contract, read_jsonl

    if args.metric.is_dir():
        raise UsageError(f"{args.metric} is a folder; give the path of the metric file, e.g. metric.py")
    if not args.metric.is_file():
        raise UsageError(f"metric file not found: {args.metric}")
    if args.api_base and not args.metric_lm:
        raise UsageError("--api-base needs --metric-lm MODEL, the model to call there")
    rows = read_jsonl(args.data, args.inputs)
    options: dict[str, Any] = {
        "timeout": args.timeout, "output_fields": args.output_fields, "isolation": args.isolation
    }
    if args.metric_lm:
        model: Any = args.metric_lm
        if args.api_base:
            model = {"model": args.metric_lm, "api_base": args.api_base}
        options["metric_lm"] = model
    progress = _progress() if not args.json else None
    with contextlib.redirect_stdout(sys.stderr):  # what the metric prints must not mix into the report
        report = check_contract(
            args.metric, rows, max_cases=None if args.all else args.cases, inputs=args.inputs, progress=progress,
            **options,
        )
    print(report.to_json() if args.json else report)
    return EXIT_OK if report.ok else EXIT_BROKEN


def _progress() -> Any:
    """A progress line on stderr for checks that take a while (a judge, a slow metric); silent when quick."""
    import time

    started = time.monotonic()

    def show(done: int, planned: int) -> None:
        if time.monotonic() - started > 1.0 and sys.stderr.isatty():
            end = "\n" if done == planned else "\r"
            print(f"skynet-dspy check: {done}/{planned} calls", end=end, file=sys.stderr, flush=True)

    return show


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 contract holds, 1 broken, 2 bad arguments)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error (or --help / --version)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    from ._check import DataError

    try:
        return _check(args)
    except (UsageError, DataError, ValueError, TypeError) as exc:  # check_contract's errors name a bad option or case
        print(f"skynet-dspy: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("skynet-dspy: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
