"""The contract check: run a metric on a few cases and say, item by item, what is wrong (SPEC §7)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import html
import itertools
import linecache
import logging
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _secrets, _translate
from ._contract import (
    DEFAULT_TIMEOUT,
    EXCEPTION,
    INVALID,
    MAX_TIMEOUT,
    MISSING_FIELD,
    OVERLOADED,
    TIMEOUT,
    Result,
    check_timeout,
    shorten,
    was_cut,
)
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
CASE_KEYS = ("input", "output", "expected")

# What a call of the check gave score as the output.
GIVEN, PERFECT, CONTRAST = "given", "perfect", "contrast"
_BROKEN = (EXCEPTION, INVALID, MISSING_FIELD)
_STOPPED = (TIMEOUT, OVERLOADED)
_TOLERANCE = 1e-9
_WIDTH = 120
_MARKS = {PASSED: " ok ", FAILED: "FAIL", WARNING: "warn", NOT_RUN: " -- "}
_COLORS = {PASSED: "#1a7f37", FAILED: "#cf222e", WARNING: "#9a6700", NOT_RUN: "#6e7781"}


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
    """The metric's results on one case.

    `output` is the case's given output, or its expected values when it gave none. `result` is the
    score of the given output (None when there was none), `perfect` that of the expected values as
    output, `contrast` that of another case's expected values (tried when the case gave no output).
    """

    input: dict[str, Any]
    expected: dict[str, Any] | None
    output: Any
    result: Result | None
    perfect: Result | None
    contrast: Result | None = None


@dataclass(frozen=True)
class Call:
    """One call of `score` made by the check."""

    case: int  # 1-based
    role: str  # GIVEN, PERFECT or CONTRAST
    output: Any
    result: Result
    seconds: float
    where: str | None = None  # for an exception: the line of the metric that raised
    source_case: int | None = None  # for CONTRAST: the case whose expected values were given
    no_expected: bool = False  # the case had no expected values, so score got expected=None

    @property
    def label(self) -> str:
        """Which call this was, in words: 'case 2, given output'."""
        what = {
            GIVEN: "given output",
            PERFECT: "expected values as output",
            CONTRAST: f"case {self.source_case}'s expected values as output",
        }[self.role]
        return f"case {self.case}, {what}"

    @property
    def problem(self) -> str:
        """The failure feedback, with the metric line that raised when it is known."""
        detail = self.result.extra.get("detail") if self.result.failure == INVALID else None
        # The adapter keeps the offending value out of feedback (it may hold expected values); the check shows it.
        text = f"the return value broke the contract: {detail}" if detail else self.result.feedback.rstrip(".")
        if self.where:
            text += f" (at {self.where})"
        if self.no_expected and self.result.failure == EXCEPTION and "NoneType" in self.result.feedback:
            text += ". This case has no expected values, so score got expected=None: handle None, or give the case"
            text += " 'expected' values"
        return text


@dataclass
class ContractReport:
    """What check_contract found: `.ok`, `.items` (one per check item), `.cases` and `.calls`."""

    metric: str
    items: list[CheckItem] = field(default_factory=list)
    cases: list[CaseRun] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no item failed (warnings and items not run for lack of data do not count)."""
        return not any(item.status == FAILED for item in self.items)

    def item(self, name: str) -> CheckItem:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(f"no check item named {name!r}; the items are: {', '.join(i.name for i in self.items)}")

    @property
    def verdict(self) -> str:
        """One sentence: does the contract hold, and what to look at."""
        failed = [item.name for item in self.items if item.status == FAILED]
        warned = [item.name for item in self.items if item.status == WARNING]
        if failed:
            return f"The contract is broken: {len(failed)} item(s) failed ({', '.join(failed)})."
        if warned:
            return f"The contract holds, with {len(warned)} warning(s) ({', '.join(warned)})."
        return "The contract holds."

    def __str__(self) -> str:
        width = max((len(item.name) for item in self.items), default=0)
        count = len(self.cases)
        ran = f" on {count} case{'s' if count != 1 else ''}" if count else ""
        lines = [f"Contract check of {self.metric}{ran}", ""]
        indent = " " * (width + 11)
        for item in self.items:
            head = f"  [{_MARKS[item.status]}] {item.name.ljust(width)}  "
            lines.extend(_wrap(item.message, head, indent))
        if self.calls:
            lines.append("")
            lines.append("Calls:")
            label_width = max(len(call.label) for call in self.calls)
            room = max(40, _WIDTH - label_width - 14)
            for call in self.calls:
                shown = _score_text(call.result)
                feedback = " ".join(call.result.feedback.split())
                lines.append(f"  {call.label.ljust(label_width)}  {shown.ljust(9)} {_clip(feedback, room)}")
        lines.append("")
        lines.append(self.verdict)
        return _secrets.redact("\n".join(lines))

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td style='text-align:left'>{html.escape(item.name)}</td>"
            f"<td style='color:{_COLORS[item.status]};font-weight:bold;text-align:left'>{item.status}</td>"
            f"<td style='text-align:left'>{html.escape(item.message)}</td></tr>"
            for item in self.items
        )
        calls = "".join(
            f"<tr><td style='text-align:left'>{html.escape(call.label)}</td>"
            f"<td style='text-align:left'>{html.escape(_score_text(call.result))}</td>"
            f"<td style='text-align:left'>{html.escape(_clip(call.result.feedback, 300))}</td></tr>"
            for call in self.calls
        )
        calls_table = (
            "<details><summary>Calls</summary><table><thead><tr><th>call</th><th>score</th><th>feedback</th>"
            f"</tr></thead><tbody>{calls}</tbody></table></details>"
            if calls
            else ""
        )
        color = _COLORS[FAILED] if not self.ok else _COLORS[PASSED]
        return _secrets.redact(
            f"<div><p><b>Contract check of {html.escape(self.metric)}</b>: "
            f"<span style='color:{color}'>{html.escape(self.verdict)}</span></p>"
            "<table><thead><tr><th>item</th><th>status</th><th>message</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>{calls_table}</div>"
        )


def _wrap(message: str, head: str, indent: str) -> list[str]:
    wrapped = textwrap.wrap(
        message, _WIDTH, initial_indent=head, subsequent_indent=indent, break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapped or [head.rstrip()]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _score_text(result: Result) -> str:
    if result.failure is not None:
        return result.failure
    return f"{result.score:.4g}"


# -- the cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Case:
    input: dict[str, Any]
    expected: dict[str, Any] | None
    output: Any
    has_output: bool


def parse_case(example: Any) -> _Case:
    """A dspy.Example or a plain case dict, checked; a ValueError saying what is wrong otherwise."""
    import dspy

    if isinstance(example, dspy.Example):
        input_values, expected = _translate.split_example(example)
        return _Case(input_values, expected, None, False)
    if not isinstance(example, dict):
        raise ValueError(
            "each case must be a dspy.Example or a dict {'input': {...}, 'output': ..., 'expected': {...}}; "
            f"got {shorten(example)}"
        )
    unknown = [str(key) for key in example if key not in CASE_KEYS]
    if unknown:
        raise ValueError(
            f"a case has unknown key(s) {', '.join(map(repr, unknown))}; a case holds 'input', and 'output' "
            "and/or 'expected'"
        )
    if "input" not in example:
        raise ValueError(f"a case has no 'input' (a dict of the example's input fields); got {shorten(example)}")
    if not isinstance(example["input"], dict):
        raise ValueError(f"a case's 'input' must be a dict of input fields, got {shorten(example['input'])}")
    expected = example.get("expected")
    if expected is not None and not isinstance(expected, dict):
        raise ValueError(
            f"a case's 'expected' must be a dict keyed by output column, or null; got {shorten(expected)}"
        )
    if "output" not in example and not expected:
        raise ValueError(
            "a case needs an 'output' to score, or 'expected' values to use as the output; "
            f"got {shorten(example)}"
        )
    return _Case(example["input"], expected or None, example.get("output"), "output" in example)


def _cases(examples: Iterable[Any]) -> list[_Case]:
    if isinstance(examples, (str, bytes, dict)) or not isinstance(examples, Iterable):
        raise TypeError(
            "check_contract() takes a list of cases (dspy.Examples or dicts with 'input', 'output', "
            f"'expected'); got {type(examples).__name__}"
        )
    cases = [parse_case(example) for example in itertools.islice(examples, CASES_CHECKED)]
    if not cases:
        raise ValueError("check_contract() needs at least one case to run the metric on; it got none")
    return cases


# -- the check ------------------------------------------------------------------------------


def check_contract(source: Any, examples: Iterable[Any], **options: Any) -> ContractReport:
    """Run the metric on the first three examples and report every contract item.

    `source` is what load_metric takes (or a Metric); `examples` are dspy.Examples or dicts
    {"input": {...}, "output": ..., "expected": {...} | None}. When a case has no output, its
    expected values serve as the output. Options are load_metric's (timeout=60 s, at most 600).
    Problems with the metric are reported, never raised; bad arguments raise ValueError/TypeError.
    """
    from ._adapter import Metric, load_metric, logger

    given_metric = isinstance(source, Metric)
    if given_metric and options:
        raise TypeError(
            "check_contract() got a loaded Metric and options; set options when loading it, "
            "or pass the metric file or function instead"
        )
    check_timeout(options.get("timeout", DEFAULT_TIMEOUT))
    cases = _cases(examples)
    report = ContractReport(source.loaded.name if given_metric else _source_name(source))
    try:
        metric = source if given_metric else load_metric(source, **{"measure": False, **options})
    except (MetricLoadError, FileNotFoundError, RewardSpecError) as exc:
        _add_load_failure(report, exc)
        return report

    _check_output_fields(cases, metric.output_fields)
    loaded = metric.loaded
    report.items.append(CheckItem("Metric loads", PASSED, f"loaded {report.metric}"))
    arity = "score(input, output, expected)" if loaded.takes_expected else "score(input, output)"
    report.items.append(CheckItem("Metric signature", PASSED, f"called as {arity}"))
    if loaded.reward_spec is not None:
        report.items.append(CheckItem("Reward spec", PASSED, "REWARD_SPEC is valid"))
    files = {_code_file(loaded.score), getattr(loaded.module, "__file__", None)} - {None}
    metric.loaded = dataclasses.replace(loaded, score=_traced(loaded.score, files))
    try:
        with _adapter_warnings_silenced(logger):
            _run_calls(metric, cases, report)
    finally:
        if given_metric:
            metric.loaded = loaded  # the user's Metric is left as it was given
    report.items.extend(_items(report.calls, cases, metric.timeout, metric.output_fields))
    return report


def _source_name(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    return getattr(source, "__file__", None) or getattr(source, "__qualname__", None) or shorten(source, 80)


def _add_load_failure(report: ContractReport, exc: BaseException) -> None:
    failed_at = getattr(exc, "item", "Metric loads")  # MetricLoadError and RewardSpecError name theirs
    reached = False
    for name in ITEMS:
        if name == failed_at:
            report.items.append(CheckItem(name, FAILED, str(exc)))
            reached = True
        elif name == "Reward spec":
            continue  # only shown when the metric defines REWARD_SPEC, which is unknown here
        elif not reached:
            report.items.append(CheckItem(name, PASSED, f"loaded {report.metric}" if name == "Metric loads" else "ok"))
        else:
            report.items.append(CheckItem(name, NOT_RUN, f"not run: {failed_at} failed"))


# Where the call of the check in progress keeps the line of the metric that raised; the worker
# thread running score sees the same holder, since it runs in a copy of the caller's context.
_raised_at: ContextVar[dict | None] = ContextVar("skynet_check_raised_at", default=None)


def _code_file(fn: Any) -> str | None:
    """The file a score function's code is in (functions, methods, partials, callable objects)."""
    for candidate in (fn, getattr(fn, "func", None), type(fn).__dict__.get("__call__")):
        code = getattr(candidate, "__code__", None)
        if code is not None:
            return code.co_filename
    return None


def _traced(score: Callable[..., Any], files: set[str]) -> Callable[..., Any]:
    """`score`, noting for the report the line of the metric's own file where an exception came from."""

    @functools.wraps(score)
    def traced(*args: Any) -> Any:
        try:
            return score(*args)
        except BaseException as exc:
            holder = _raised_at.get()
            if holder is not None:
                holder["where"] = _raised_in(exc, files)
            raise

    return traced


def _raised_in(exc: BaseException, files: set[str]) -> str | None:
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in files:
            found = frame
    if found is None:
        return None
    code = (found.line or linecache.getline(found.filename, found.lineno or 0)).strip()
    name = Path(found.filename).name
    return f"{name}, line {found.lineno}" + (f": `{_clip(code, 100)}`" if code else "")


@contextlib.contextmanager
def _adapter_warnings_silenced(logger: logging.Logger) -> Iterator[None]:
    """Hold back the adapter's "metric failed, the run goes on" log lines: the report says it better."""
    thread = threading.get_ident()

    def from_other_threads(record: logging.LogRecord) -> bool:
        return record.thread != thread

    logger.addFilter(from_other_threads)
    try:
        yield
    finally:
        logger.removeFilter(from_other_threads)


def _call(metric: Any, number: int, role: str, case: _Case, output: Any, source_case: int | None = None) -> Call:
    holder: dict[str, Any] = {}
    token = _raised_at.set(holder)
    started = time.perf_counter()
    try:
        result = metric.score(case.input, output, case.expected)
    finally:
        _raised_at.reset(token)
    where = holder.get("where") if result.failure == EXCEPTION else None
    seconds = time.perf_counter() - started
    return Call(number, role, output, result, seconds, where, source_case, case.expected is None)


def _check_output_fields(cases: list[_Case], columns: Any) -> None:
    """A clear error when output_fields names a column the labelled cases lack (most often a typo)."""
    if columns is None:
        return
    for number, case in enumerate(cases, 1):
        missing = [name for name in columns if case.expected and name not in case.expected]
        if missing:
            raise ValueError(
                f"output_fields names {', '.join(map(repr, missing))}, but case {number}'s expected values hold "
                f"only {', '.join(map(repr, case.expected))}; name the output columns as they appear in expected"
            )


def _run_calls(metric: Any, cases: list[_Case], report: ContractReport) -> None:
    """Score each case's given output and its expected values as output (or, with no output given,
    another case's expected values), stopping at the first call that does not return in time."""
    perfects = [_translate.perfect_output(case.expected, metric.output_fields) for case in cases]
    for number, case in enumerate(cases, 1):
        plan: list[tuple[str, Any, int | None]] = []
        if case.has_output:
            plan.append((GIVEN, case.output, None))
        if case.expected:
            plan.append((PERFECT, perfects[number - 1], None))
        if not case.has_output:
            other = _contrast(perfects, number - 1, cases)
            if other is not None:
                plan.append((CONTRAST, perfects[other], other + 1))
        runs: dict[str, Result] = {}
        for role, output, source_case in plan:
            call = _call(metric, number, role, case, output, source_case)
            report.calls.append(call)
            runs[role] = call.result
            if call.result.failure in _STOPPED:
                break
        report.cases.append(CaseRun(
            case.input, case.expected, case.output if case.has_output else perfects[number - 1],
            runs.get(GIVEN), runs.get(PERFECT), runs.get(CONTRAST),
        ))
        if any(result.failure in _STOPPED for result in runs.values()):
            return


def _contrast(perfects: list[Any], index: int, cases: list[_Case]) -> int | None:
    """The index of another case whose expected values differ from this case's, to score as a wrong output."""
    if not cases[index].expected:
        return None
    for offset in range(1, len(cases)):
        other = (index + offset) % len(cases)
        if cases[other].expected:
            try:
                if perfects[other] != perfects[index]:
                    return other
            except Exception:  # values whose == raises or is ambiguous (arrays) are skipped
                continue
    return None


# -- the items ------------------------------------------------------------------------------


def _items(calls: list[Call], cases: list[_Case], timeout: float, output_fields: Any) -> list[CheckItem]:
    return [
        _return_value_item(calls),
        _timeout_item(calls, timeout),
        _named_scores_item([call for call in calls if call.result.ok]),
        _perfect_item(calls, cases, output_fields),
    ]


def _return_value_item(calls: list[Call]) -> CheckItem:
    name = "Metric return value"
    given_cases = {call.case for call in calls if call.role == GIVEN}

    def case_output(call: Call) -> bool:
        """The output the case gave or, giving none, chose: its expected values (not a probe the check added)."""
        return call.role == GIVEN or (call.role == PERFECT and call.case not in given_cases)

    # A bad shape always breaks the contract; an exception only on the case's own output, since
    # score may reasonably reject the probes the check adds.
    broken = [
        call for call in calls
        if call.result.failure in (INVALID, MISSING_FIELD) or (call.result.failure == EXCEPTION and case_output(call))
    ]
    if broken:
        first = broken[0]
        failed = sum(call.result.failure in _BROKEN for call in calls)
        more = f" ({failed} of {len(calls)} calls failed)" if failed > 1 else ""
        return CheckItem(name, FAILED, f"{first.label}: {first.problem}.{more}")
    valid = [call for call in calls if call.result.ok]
    if not valid:
        return CheckItem(name, NOT_RUN, "not checked: no call returned in time")
    notes = []
    empty = [call for call in valid if not call.result.feedback.strip()]
    if empty:
        notes.append(
            f"the feedback is empty on {empty[0].label}: the reflection model learns only from feedback, "
            "so say what is wrong and what a right answer looks like"
        )
    cut = [call for call in valid if was_cut(call.result.feedback)]
    if cut:
        notes.append(
            f"the feedback on {cut[0].label} is over the limit and was cut; shorten it or raise feedback_limit="
        )
    extra = sorted({key for call in valid for key in call.result.extra})
    kept = f"; extra keys kept for you, not shown to the optimizer: {', '.join(extra)}" if extra else ""
    summary = f"valid (score, {{'feedback': ...}}) on {len(valid)} call(s){kept}"
    if notes:
        return CheckItem(name, WARNING, f"{summary}; but {'; and '.join(notes)}")
    return CheckItem(name, PASSED, summary)


def _timeout_item(calls: list[Call], timeout: float) -> CheckItem:
    name = "Metric timeout"
    stuck = [call for call in calls if call.result.failure in _STOPPED]
    if stuck:
        call = stuck[0]
        if call.result.failure == TIMEOUT:
            message = (
                f"{call.label}: score did not return within {timeout:g} s; the call was abandoned and the "
                f"remaining calls were not run. Make score faster, or raise the timeout (at most {MAX_TIMEOUT:g} s)"
            )
        else:
            message = f"{call.label}: {call.result.feedback}"
        return CheckItem(name, FAILED, message)
    if not calls:
        return CheckItem(name, NOT_RUN, "no call was made")
    slowest = max(call.seconds for call in calls)
    return CheckItem(name, PASSED, f"every call returned within the {timeout:g} s timeout (slowest {slowest:.2f} s)")


def _named_scores_item(valid: list[Call]) -> CheckItem:
    name = "Named scores"
    if not valid:
        return CheckItem(name, NOT_RUN, "not checked: no valid return value to read")
    names = [tuple(sorted(call.result.scores)) if call.result.scores else () for call in valid]
    if not any(names):
        return CheckItem(name, PASSED, "none given (optional)")
    if len(set(names)) > 1:
        shown = " vs ".join("{" + ", ".join(group) + "}" if group else "none" for group in dict.fromkeys(names))
        return CheckItem(
            name, WARNING,
            f"the names differ between calls ({shown}); give the same names on every call so the optimizer "
            "can compare candidates on each",
        )
    return CheckItem(name, PASSED, f"{', '.join(names[0])} on every call")


def _shape_hint(case: _Case, output_fields: Any) -> str:
    """When a case's expected values hold more than one field, how to make them look like the output."""
    if output_fields is not None or not case.expected or len(case.expected) < 2:
        return ""
    return (
        f". Its expected values hold {len(case.expected)} fields ({', '.join(map(str, case.expected))}) and were "
        "given as a dict: if the output is only some of them, pass output_fields=[...] naming those"
    )


def _perfect_item(calls: list[Call], cases: list[_Case], output_fields: Any = None) -> CheckItem:
    name = "Perfect output scores highest"
    if not any(case.expected for case in cases):
        return CheckItem(name, NOT_RUN, "skipped: no case has expected values to try as a perfect output")
    # An exception on the expected values is news only when the same case's given output scored fine.
    scored = {call.case for call in calls if call.role == GIVEN and call.result.ok}
    rejected = [
        call for call in calls if call.role == PERFECT and call.case in scored and call.result.failure == EXCEPTION
    ]
    perfect = [call for call in calls if call.role == PERFECT and call.result.ok]
    if rejected:
        call = rejected[0]
        return CheckItem(
            name, WARNING,
            f"{call.label}: {call.problem}. If your expected values are not shaped like an output (say, a "
            "list of required fields), ignore this; otherwise score should accept a perfect answer"
            f"{_shape_hint(cases[call.case - 1], output_fields)}",
        )
    if not perfect:
        return CheckItem(name, NOT_RUN, "not checked: no call on the expected values returned a valid score")
    valid = [call for call in calls if call.result.ok]
    best = max(valid, key=lambda call: call.result.score)
    margin = _TOLERANCE * max(1.0, abs(best.result.score))
    low = [call for call in perfect if call.result.score < best.result.score - margin]
    if low:
        call = low[0]
        return CheckItem(
            name, WARNING,
            f"a perfect output scores {call.result.score:.4g} ({call.label}), below the {best.result.score:.4g} "
            f"of another output ({best.label}). A perfect answer should score at least as high as any other: "
            "check how score compares output with expected (an inverted comparison? the wrong field?)"
            f"{_shape_hint(cases[call.case - 1], output_fields)}",
        )
    others = [call for call in valid if call.role != PERFECT]
    lowest = min(call.result.score for call in perfect)
    if others and all(call.role == CONTRAST for call in others):
        # Only probes to compare with: a tie on every case means score cannot tell right from wrong.
        right_of = {call.case: call.result.score for call in perfect}
        pairs = [(right_of[call.case], call) for call in others if call.case in right_of]
        if pairs and all(right <= call.result.score for right, call in pairs):
            right, first = pairs[0]
            return CheckItem(
                name, WARNING,
                f"on every case the expected values as output score no higher than another case's expected values "
                f"(case {first.case}: {right:.4g} vs {first.result.score:.4g}): score does "
                "not seem to tell a right output from a wrong one. If it judges only the output's form, ignore this"
                f"{_shape_hint(cases[first.case - 1], output_fields)}",
            )
    if not others:
        return CheckItem(
            name, PASSED,
            f"the expected values as output score {lowest:.4g}; no other output to compare with (give cases "
            "an 'output', or several cases with different expected values)",
        )
    best_other = max(call.result.score for call in others)
    return CheckItem(
        name, PASSED,
        f"the expected values as output score {lowest:.4g} or more; the {len(others)} other output(s) tried "
        f"score at most {best_other:.4g}",
    )
