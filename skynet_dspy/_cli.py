"""The command line: `skynet-dspy check METRIC.py --data CASES.jsonl [--timeout S]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2


def _read_cases(path: Path) -> list[dict[str, Any]]:
    cases = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                case = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {number}: not valid JSON ({exc.msg})") from None
            if not isinstance(case, dict):
                raise ValueError(f"{path}, line {number}: each line must be a JSON object with an 'input' key")
            cases.append(case)
    if not cases:
        raise ValueError(f"{path} holds no cases; write one JSON object per line")
    return cases


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skynet-dspy", description="Skynet metrics for DSPy and GEPA.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check that a metric.py keeps the Skynet metric contract")
    check.add_argument("metric", type=Path, help="path to metric.py")
    check.add_argument("--data", type=Path, required=True,
                       help='JSONL cases: {"input": {...}, "output": ..., "expected": {...}} per line')
    check.add_argument("--timeout", type=float, default=60.0, help="seconds per metric call (0 < S <= 600)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 contract holds, 1 broken, 2 bad arguments)."""
    args = _parser().parse_args(argv)
    from ._contract import check_timeout

    try:
        check_timeout(args.timeout)
        if not args.metric.is_file():
            raise ValueError(f"metric file not found: {args.metric}")
        cases = _read_cases(args.data)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        print(f"skynet-dspy: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from ._check import check_contract

    try:
        report = check_contract(args.metric, cases, timeout=args.timeout)
    except ValueError as exc:
        print(f"skynet-dspy: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report)
    return EXIT_OK if report.ok else EXIT_BROKEN


if __name__ == "__main__":
    sys.exit(main())
