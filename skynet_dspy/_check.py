"""The contract check: run a metric on a few cases and say, item by item, what is wrong (SPEC §7)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _secrets, _translate
from ._contract import EXCEPTION, INVALID, TIMEOUT, Result, check_timeout, shorten
from ._loading import MetricLoadError
from ._reward import RewardSpecError

CASES_CHECKED = 3
PASSED, FAILED, WARNING, NOT_RUN = "passed", "failed", "warning", "not run"
ITEMS = (
    "Metric loads",
    "Metric signature",
    "Reward spec",
    "Metric return value",
    "Metric timeout",
    "Named scores",
    "Perfect output scores highest",
)


@dataclass(frozen=True)
class CheckItem:
    """One line of the report: an item of the contract, its status and why."""

    name: str
    status: str
    message: str

    @property
    def passed(self) -> bool:
        return self.status in (PASSED, WARNING)


@dataclass(frozen=True)
class CaseRun:
    """The metric's result on one case: on its given output (if any) and on the perfect output."""

    input: dict[str, Any]
    expected: dict[str, Any] | None
    output: Any
    result: Result | None
    perfect: Result | None


@dataclass
class ContractReport:
    """What check_contract found: `.ok`, `.items` (one per check item) and `.cases`."""

    metric: str
    items: list[CheckItem] = field(default_factory=list)
    cases: list[CaseRun] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(item.passed for item in self.items)

    def item(self, name: str) -> CheckItem:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(name)

    def __str__(self) -> str:
        width = max(len(item.name) for item in self.items)
        lines = [f"Contract check of {self.metric}: {'OK' if self.ok else 'FAILED'}"]
        for item in self.items:
            mark = {PASSED: "ok  ", FAILED: "FAIL", WARNING: "warn", NOT_RUN: " -- "}[item.status]
            lines.append(f"  [{mark}] {item.name.ljust(width)}  {item.message}")
        return _secrets.redact("\n".join(lines))

    def _repr_html_(self) -> str:
        colors = {PASSED: "#1a7f37", FAILED: "#cf222e", WARNING: "#9a6700", NOT_RUN: "#6e7781"}
        rows = "".join(
            f"<tr><td>{html.escape(item.name)}</td>"
            f"<td style='color:{colors[item.status]};font-weight:bold'>{item.status}</td>"
            f"<td style='text-align:left'>{html.escape(item.message)}</td></tr>"
            for item in self.items
        )
        verdict = "contract holds" if self.ok else "contract broken"
        return _secrets.redact(
            f"<div><b>Contract check of {html.escape(self.metric)}: {verdict}</b>"
            "<table><thead><tr><th>item</th><th>status</th><th>message</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
        )


def _case(example: Any) -> tuple[dict[str, Any], dict[str, Any] | None, Any, bool]:
    """(input, expected, output, has_output) of a dspy.Example or a plain case dict."""
    if hasattr(example, "inputs") and hasattr(example, "_store"):
        return _translate.example_input(example), _translate.example_expected(example), None, False
    if not isinstance(example, dict) or "input" not in example:
        raise ValueError(
            "each example must be a dspy.Example or a dict {'input': {...}, 'output': ..., 'expected': {...}}; "
            f"got {shorten(example)}"
        )
    if not isinstance(example["input"], dict):
        raise ValueError(f"a case's 'input' must be a dict of input fields, got {shorten(example['input'])}")
    expected = example.get("expected")
    if expected is not None and not isinstance(expected, dict):
        raise ValueError(f"a case's 'expected' must be a dict or null, got {shorten(expected)}")
    if "output" not in example and expected is None:
        raise ValueError(f"a case needs an 'output' or 'expected' values to score; got {shorten(example)}")
    return example["input"], expected, example.get("output"), "output" in example


def check_contract(source: Any, examples: Iterable[Any], **options: Any) -> ContractReport:
    """Run the metric on the first three examples and report every contract item.

    `source` is what load_metric takes (or a Metric); `examples` are dspy.Examples or dicts
    {"input": {...}, "output": ..., "expected": {...} | None}. When a case has no output, its
    expected values serve as the output. Options are load_metric's.
    """
    from ._adapter import Metric, load_metric

    check_timeout(options.get("timeout", 60))
    cases = [_case(example) for example in list(examples)[:CASES_CHECKED]]
    if not cases:
        raise ValueError("check_contract needs at least one example to run the metric on")
    name = source.loaded.name if isinstance(source, Metric) else _source_name(source)
    report = ContractReport(name)
    add = report.items.append
    try:
        metric = source if isinstance(source, Metric) else load_metric(source, measure=False, **options)
    except (MetricLoadError, FileNotFoundError, RewardSpecError) as exc:
        item = getattr(exc, "item", "Metric loads")
        failed_at = ITEMS.index(item) if item in ITEMS else 0
        for position, item_name in enumerate(ITEMS):
            if position < failed_at:
                add(CheckItem(item_name, PASSED, "loaded" if position == 0 else "ok"))
            elif position == failed_at:
                add(CheckItem(item_name, FAILED, str(exc)))
            else:
                add(CheckItem(item_name, NOT_RUN, f"not run: {item} failed"))
        return report

    add(CheckItem("Metric loads", PASSED, f"loaded {metric.loaded.name}"))
    arity = "score(input, output, expected)" if metric.loaded.takes_expected else "score(input, output)"
    add(CheckItem("Metric signature", PASSED, f"called as {arity}"))
    if metric.loaded.reward_spec is not None:
        add(CheckItem("Reward spec", PASSED, "REWARD_SPEC is valid"))
    _run_cases(metric, cases, report)
    return report


def _source_name(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    return getattr(source, "__file__", None) or getattr(source, "__qualname__", None) or repr(source)


def _run_cases(metric: Any, cases: Sequence[tuple], report: ContractReport) -> None:
    add = report.items.append
    stopped = None
    for index, (input_values, expected, output, has_output) in enumerate(cases, 1):
        if stopped:
            break
        perfect_output = _translate.perfect_output(expected, metric.output_fields)
        given = metric.score(input_values, output, expected) if has_output else None
        perfect = None
        if given is None or given.failure != TIMEOUT:
            perfect = metric.score(input_values, perfect_output, expected)
        report.cases.append(CaseRun(input_values, expected, output if has_output else perfect_output, given, perfect))
        if any(run is not None and run.failure == TIMEOUT for run in (given, perfect)):
            stopped = index

    runs = [(index, run) for index, case in enumerate(report.cases, 1) for run in (case.result, case.perfect) if run]
    broken = [(index, run) for index, run in runs if run.failure in (EXCEPTION, INVALID, "missing_field")]
    if broken:
        index, run = broken[0]
        add(CheckItem("Metric return value", FAILED, f"case {index}: {run.feedback}"))
    elif stopped and not any(run.failure is None for _, run in runs):
        add(CheckItem("Metric return value", NOT_RUN, "no call finished within the timeout"))
    else:
        empty = [index for index, run in runs if run.failure is None and not run.feedback.strip()]
        if empty:
            add(CheckItem("Metric return value", WARNING,
                          f"valid, but the feedback is empty on case {empty[0]}: the reflection model learns "
                          "from feedback, so say what is wrong and what right looks like"))
        else:
            add(CheckItem("Metric return value", PASSED, f"valid (score, {{'feedback': ...}}) on {len(runs)} call(s)"))

    if stopped:
        add(CheckItem("Metric timeout", FAILED,
                      f"case {stopped}: the metric did not return within {metric.timeout:g} s; the remaining "
                      "cases were not run. Make score() faster or raise timeout= (at most 600 s)"))
    else:
        add(CheckItem("Metric timeout", PASSED, f"every call returned within {metric.timeout:g} s"))

    add(_named_scores_item([run for _, run in runs if run.failure is None]))
    add(_perfect_item(report.cases))


def _named_scores_item(results: list[Result]) -> CheckItem:
    if not results:
        return CheckItem("Named scores", NOT_RUN, "no valid return value to read")
    names = [tuple(sorted(result.scores)) if result.scores else () for result in results]
    if not any(names):
        return CheckItem("Named scores", PASSED, "none given (optional)")
    if len(set(names)) > 1:
        shown = " vs ".join(", ".join(group) or "none" for group in dict.fromkeys(names))
        return CheckItem("Named scores", WARNING,
                         f"the names differ between calls ({shown}); give the same names every time so the "
                         "optimizer can compare candidates on each")
    return CheckItem("Named scores", PASSED, f"{', '.join(names[0])} on every call")


def _perfect_item(cases: list[CaseRun]) -> CheckItem:
    perfect = [(index, case.perfect) for index, case in enumerate(cases, 1) if case.perfect and case.perfect.ok]
    if not perfect:
        return CheckItem("Perfect output scores highest", NOT_RUN, "no case has expected values to try")
    if all(case.expected is None for case in cases):
        return CheckItem("Perfect output scores highest", NOT_RUN, "no case has expected values to try")
    seen = [run.score for case in cases for run in (case.result, case.perfect) if run is not None and run.ok]
    best = max(seen)
    low = [(index, run) for index, run in perfect if run.score < best]
    if low:
        index, run = low[0]
        return CheckItem("Perfect output scores highest", WARNING,
                         f"case {index}: giving the expected values as the output scores {run.score:g}, below "
                         f"{best:g} seen elsewhere ({shorten(run.feedback, 120)}); a perfect answer should score "
                         "at least as high as any other — check how the metric compares output with expected")
    return CheckItem("Perfect output scores highest", PASSED,
                     f"the expected values as output score {best:g}, the highest seen")
