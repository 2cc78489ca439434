"""The contract check's report as text, HTML and JSON; every text redacted, then made safe for where it goes."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .._core import safe_text, secrets
from .._core.types import Failure, Item, Result, Status
from .._core.values import clip

if TYPE_CHECKING:
    from .agreement import Agreement
    from .stability import Stability

_WIDTH = 120
_MARKS = {Status.PASSED: " ok ", Status.FAILED: "FAIL", Status.WARNING: "warn", Status.NOT_RUN: " -- "}
_COLORS = {Status.PASSED: "#1a7f37", Status.FAILED: "#cf222e", Status.WARNING: "#9a6700", Status.NOT_RUN: "#6e7781"}
_CELL = "text-align:left;vertical-align:top;white-space:pre-wrap"
_FEEDBACK_LINES = 8  # lines of one call's feedback the text report shows


class Role(StrEnum):
    """What a call of the check gave score as the output."""

    GIVEN = "given"  # the case's own output
    PERFECT = "perfect"  # the case's expected values
    CONTRAST = "contrast"  # another case's expected values


@dataclass(frozen=True)
class CheckItem:
    """One line of the report: an item of the contract, its status and why.

    Attributes:
        name: The contract item (docs/contract.md#names).
        status: Passed, failed, a warning, or not run.
        message: Why, in a sentence.
    """

    name: str
    status: Status
    message: str

    @property
    def passed(self) -> bool:
        return self.status in (Status.PASSED, Status.WARNING)


@dataclass(frozen=True)
class CaseRun:
    """The metric's results on one case: on its given output (`output`, else its expected values), and on its
    expected values as output (`perfect`)."""

    input: dict[str, Any]
    expected: dict[str, Any] | None
    output: Any
    result: Result | None
    perfect: Result | None

    @property
    def own(self) -> Result | None:
        """The result on the case's own output: its given one, else its expected values."""
        return self.result if self.result is not None else self.perfect


@dataclass(frozen=True)
class Call:
    """One call of `score` made by the check."""

    case: int  # 1-based
    role: Role
    output: Any
    result: Result
    seconds: float
    source_case: int | None = None  # for CONTRAST: the case whose expected values were given

    @property
    def label(self) -> str:
        """Which call this was, in words: 'case 2, given output'."""
        what = {Role.GIVEN: "given output", Role.PERFECT: "expected values as output",
                Role.CONTRAST: f"case {self.source_case}'s expected values as output"}[self.role]
        return f"case {self.case}, {what}"

    @property
    def problem(self) -> str:
        """What went wrong, in full (what an optimizer never sees)."""
        detail = self.result.detail or self.result.feedback.rstrip(".")
        if self.result.failure is Failure.INVALID:
            return f"the return value broke the contract: {detail}"
        return detail


def _cases(count: int) -> str:
    return f"{count} case{'s' if count != 1 else ''}"


@dataclass
class ContractReport:
    """What check_contract found: `.ok`, `.items` (one per check item), `.cases` and `.calls`.

    Attributes:
        metric: The metric checked, as the user named it.
        items: One CheckItem per contract item.
        cases: The cases run, with their calls' results.
        calls: Every call made, in order.
        not_run: Cases left out by max_cases.
        stopped: Cases not run because a call did not return in time.
        run_all_hint: How to run every case (max_cases=None; --all on the command line).
        stability: With repeat=, how much each case's scores varied (docs/trustworthy.md).
        agreement: With human=, how the metric agrees with people.
    """

    metric: str
    items: list[CheckItem] = field(default_factory=list)
    cases: list[CaseRun] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    not_run: int = 0  # cases given but not checked (beyond the number asked for)
    stopped: int = 0  # cases among those asked for that were not run: a call did not return in time
    run_all_hint: str = "max_cases=None runs every case"  # the CLI says "--all runs every case"
    stability: Stability | None = None  # with repeat=: each case's spread over its runs (stability.py)
    agreement: Agreement | None = None  # with human=: agreement with a person's scores (agreement.py)

    def case_rows(self) -> list[tuple[CaseRun, dict[str, Any]]]:
        """Each case scored, with the columns repeat= and human= add: what results_frame(report) shows."""
        return [(run, {name: value for section in self._sections.values()
                       for name, value in section.columns(number).items()})
                for number, run in enumerate(self.cases, 1) if run.own is not None]

    @property
    def _sections(self) -> dict[str, Stability | Agreement]:
        """The sections repeat= and human= add, by their key in to_dict()."""
        return {name: section for name, section in (("stability", self.stability), ("agreement", self.agreement))
                if section is not None}

    @property
    def ok(self) -> bool:
        """True when no item failed (warnings and items not run for lack of data do not count)."""
        return not any(item.status is Status.FAILED for item in self.items)

    def item(self, name: str | Item) -> CheckItem:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(f"no check item named {name!r}; the items are: {', '.join(i.name for i in self.items)}")

    @property
    def verdict(self) -> str:
        """One sentence: does the contract hold, and what to look at."""
        failed = [item.name for item in self.items if item.status is Status.FAILED]
        warned = [item.name for item in self.items if item.status is Status.WARNING]
        if failed:
            broken = f"The contract is broken: {len(failed)} item(s) failed ({', '.join(failed)})."
            if Item.PERFECT_OUTPUT in failed:
                broken += (" A perfect output does not score highest, so an optimizer is never rewarded for a right "
                           "answer: look for an inverted comparison or a wrong field in score.")
            return broken
        if warned:
            return f"The contract holds, with {len(warned)} warning(s) ({', '.join(warned)})."
        return "The contract holds."

    @property
    def heading(self) -> str:
        ran = f" on {_cases(len(self.cases))}" if self.cases else ""
        notes = []
        if self.stopped:
            notes.append(f"{_cases(self.stopped)} not run after a call did not return in time")
        if self.not_run:
            notes.append(f"{self.not_run} more {_cases(self.not_run).partition(' ')[2]} not run; {self.run_all_hint}")
        skipped = f" ({'; '.join(notes)})" if notes else ""
        return f"Contract check of {self.metric}{ran}{skipped}"

    def __str__(self) -> str:
        width = max((len(item.name) for item in self.items), default=0)
        lines = [self.heading, ""]
        indent = " " * (width + 11)
        for item in self.items:
            head = f"  [{_MARKS[item.status]}] {item.name.ljust(width)}  "
            lines.extend(_wrap(secrets.redact(item.message), head, indent))
        if self.calls:
            lines += ["", "Calls:"]
            label_width = max(len("call"), *(len(call.label) for call in self.calls))
            score_width = max(len("score"), *(len(_score_text(call.result)) for call in self.calls))
            under = " " * (label_width + score_width + 6)  # where the feedback column starts
            room = max(40, _WIDTH - len(under))
            lines.append(f"  {'call'.ljust(label_width)}  {'score'.ljust(score_width)}  feedback")
            for call in self.calls:
                shown = _score_text(call.result).ljust(score_width)
                first, *rest = _feedback_lines(safe_text.for_terminal(secrets.redact(call.result.feedback)), room)
                lines.append(f"  {call.label.ljust(label_width)}  {shown}  {first}".rstrip())
                lines.extend(under + line for line in rest)
        for section in self._sections.values():
            lines.extend(["", *section.lines()])
        lines += ["", self.verdict]
        return safe_text.for_terminal(secrets.redact("\n".join(lines)))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colored = [(item.name, (str(item.status), f"color:{_COLORS[item.status]};font-weight:bold"), item.message)
                   for item in self.items]
        calls = [(call.label, _score_text(call.result), clip(call.result.feedback, 2000)) for call in self.calls]
        sections = "".join(f"<pre>{_html(chr(10).join(section.lines()))}</pre>" for section in self._sections.values())
        color = _COLORS[Status.FAILED] if not self.ok else _COLORS[Status.PASSED]
        return (
            f"<div><p><b>{_html(self.heading)}</b>: <span style='color:{color}'>{_html(self.verdict)}</span></p>"
            + _html_table(("item", "status", "message"), colored)
            + (f"<details><summary>Calls</summary>{_html_table(('call', 'score', 'feedback'), calls)}</details>"
               if calls else "")
            + sections + "</div>"
        )

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (what `skynet-dspy check --json` prints); every string valid UTF-8."""
        data: dict[str, Any] = safe_text.json_safe({
            "metric": secrets.redact(self.metric),
            "ok": self.ok,
            "verdict": self.verdict,
            "cases_run": len(self.cases),
            "cases_not_run": self.not_run + self.stopped,
            "items": [
                {"name": item.name, "status": str(item.status), "passed": item.passed,
                 "message": secrets.redact(item.message)}
                for item in self.items
            ],
            "calls": [
                {"call": call.label, "score": call.result.score, "failure": call.result.failure,
                 "feedback": secrets.redact(call.result.feedback), "seconds": round(call.seconds, 4)}
                for call in self.calls
            ],
            **{name: section.to_dict() for name, section in self._sections.items()},
        })
        return data

    def to_json(self) -> str:
        """The report as JSON: valid UTF-8, no raw control byte (safe to print)."""
        return safe_text.json_text(self.to_dict(), indent=2)


def _html(text: str) -> str:
    return safe_text.for_html(secrets.redact(text))


def _html_table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A table of text cells; a cell given as (text, style) gets that style too."""
    cells = "".join(
        "<tr>" + "".join(
            f"<td style='{_CELL};{cell[1] if isinstance(cell, tuple) else ''}'>"
            f"{_html(cell[0] if isinstance(cell, tuple) else cell)}</td>" for cell in row) + "</tr>"
        for row in rows
    )
    names = "".join(f"<th style='text-align:left'>{name}</th>" for name in head)
    return f"<table><thead><tr>{names}</tr></thead><tbody>{cells}</tbody></table>"


def _wrap(message: str, head: str, indent: str) -> list[str]:
    lines: list[str] = []
    for number, paragraph in enumerate(message.splitlines() or [""]):
        wrapped = textwrap.wrap(
            paragraph, _WIDTH, initial_indent=head if number == 0 else indent, subsequent_indent=indent,
            break_long_words=False, break_on_hyphens=False,
        )
        lines.extend(wrapped or [(head if number == 0 else indent).rstrip()])
    return lines


def _feedback_lines(feedback: str, room: int) -> list[str]:
    """A call's feedback as the report shows it: line by line (a reward()'s components each on its own),
    wrapped at `room` characters, at most _FEEDBACK_LINES lines."""
    lines = [
        wrapped
        for line in feedback.splitlines()
        for wrapped in textwrap.wrap(" ".join(line.split()), room, break_on_hyphens=False)
    ] or [""]
    if len(lines) > _FEEDBACK_LINES:
        hidden = len(lines) - _FEEDBACK_LINES + 1
        lines = [*lines[: _FEEDBACK_LINES - 1], f"... ({hidden} more lines)"]
    return lines


def _score_text(result: Result) -> str:
    return str(result.failure) if result.failure is not None else f"{result.score:.4g}"
