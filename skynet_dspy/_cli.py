"""The command line: `skynet-dspy check METRIC.py --data CASES.jsonl [--timeout S]`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from ._contract import DEFAULT_TIMEOUT, MAX_TIMEOUT, check_timeout

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad arguments or an unreadable file: reported in one line, exit code 2."""


def _read_cases(path: Path) -> list[dict[str, Any]]:
    """The cases of a JSONL file, each checked; UsageError naming the file and line otherwise."""
    from ._check import parse_case

    if path.is_dir():
        raise UsageError(f"the data file {path} is a folder; give the path of a .jsonl file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UsageError(f"data file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"the data file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read the data file {path}: {exc.strerror or exc}") from None
    cases = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{path}, line {number}: not valid JSON ({exc.msg}, column {exc.colno}); write one JSON object "
                'per line, like {"input": {...}, "expected": {...}}'
            ) from None
        try:
            parse_case(case)
        except ValueError as exc:
            raise UsageError(f"{path}, line {number}: {exc}") from None
        cases.append(case)
    if not cases:
        raise UsageError(f"the data file {path} holds no cases; write one JSON object per line")
    return cases


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


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="skynet-dspy", description="Skynet metrics (metric.py) for DSPy and GEPA."
    )
    parser.add_argument("--version", action="version", version=f"skynet-dspy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="check that a metric.py keeps the metric contract",
        description="Run METRIC.py on the first three cases of CASES.jsonl and report, item by item, whether "
        "it keeps the metric contract. Exit code: 0 the contract holds, 1 it is broken, 2 bad arguments.",
    )
    check.add_argument("metric", type=Path, metavar="METRIC.py", help="the metric file, defining score()")
    check.add_argument(
        "--data", type=Path, required=True, metavar="CASES.jsonl",
        help='one case per line: {"input": {...}, "output": ..., "expected": {...}}; without "output", '
        "the expected values are scored as the output",
    )
    check.add_argument(
        "--timeout", type=_timeout, default=DEFAULT_TIMEOUT, metavar="S",
        help=f"seconds each call of score may take (0 < S <= {MAX_TIMEOUT:g}; default {DEFAULT_TIMEOUT:g})",
    )
    check.add_argument(
        "--output-fields", type=_names, default=None, metavar="NAME[,NAME...]",
        help="the expected fields that make up an output, when expected holds more (an id, a note)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 contract holds, 1 broken, 2 bad arguments)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error (or --help / --version)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.metric.is_dir():
            raise UsageError(f"{args.metric} is a folder; give the path of the metric file, e.g. metric.py")
        if not args.metric.is_file():
            raise UsageError(f"metric file not found: {args.metric}")
        cases = _read_cases(args.data)
        from ._check import check_contract

        with contextlib.redirect_stdout(sys.stderr):  # what the metric prints must not mix into the report
            report = check_contract(args.metric, cases, timeout=args.timeout, output_fields=args.output_fields)
    except (UsageError, ValueError) as exc:  # check_contract's ValueErrors name a bad option or case
        print(f"skynet-dspy: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("skynet-dspy: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(report)
    return EXIT_OK if report.ok else EXIT_BROKEN


if __name__ == "__main__":
    sys.exit(main())
