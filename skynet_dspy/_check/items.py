"""The items of the contract check after the metric has loaded: one function per item, from the calls made."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .._core.contract import MAX_TIMEOUT, was_cut
from .._core.types import Failure, Item, Status
from .._core.values import closest
from .cases import Case
from .report import Call, CheckItem, Role

_TOLERANCE = 1e-9
# Failures that break the contract on any call, and failures that stop the check (nothing more is run).
_ALWAYS_BROKEN = frozenset({Failure.INVALID, Failure.MISSING_FIELD, Failure.CRASHED, Failure.JUDGE_NOT_CONFIGURED,
                            Failure.JUDGE_ERROR, Failure.JUDGE_UNREACHABLE, Failure.SPEND_CAP, Failure.LOAD})
STOPPING = frozenset({Failure.TIMEOUT, Failure.OVERLOADED})
_PERFECT = Item.PERFECT_OUTPUT
_NAMED_SCORE_RULES = ("scores is not a dict", "too many named scores", "named score")


def return_value(calls: list[Call], cases: list[Case], output_fields: Any) -> CheckItem:
    name = Item.RETURN_VALUE
    if not calls:
        return CheckItem(name, Status.FAILED, _nothing_to_score(cases, output_fields))
    broken = _broken_calls(calls)
    if broken:
        failed = sum(call.result.failure is not None and call.result.failure not in STOPPING for call in calls)
        more = f" ({failed} of {len(calls)} calls failed)" if failed > 1 else ""
        advice = ""
        if broken[0].result.failure is Failure.JUDGE_NOT_CONFIGURED:
            advice = (" To check a metric that calls llm(), give it a model: metric_lm= in Python, or "
                      "--metric-lm MODEL (and --api-base URL) on the command line")
        return CheckItem(name, Status.FAILED, f"{broken[0].label}: {broken[0].problem.rstrip('.')}.{more}{advice}")
    valid = [call for call in calls if call.result.ok]
    if not valid:
        return CheckItem(name, Status.NOT_RUN, "not checked: no call returned in time")
    extra = sorted({str(key) for call in valid for key in call.result.extra})
    kept = f"; extra keys kept for you, not shown to the optimizer: {', '.join(extra)}" if extra else ""
    summary = f"valid (score, {{'feedback': ...}}) on {len(valid)} call(s){kept}"
    notes = _feedback_notes(valid)
    if notes:
        return CheckItem(name, Status.WARNING, f"{summary}; but {'; and '.join(notes)}")
    return CheckItem(name, Status.PASSED, summary)


def _nothing_to_score(cases: list[Case], output_fields: Any) -> str:
    """Why no call could be made, naming the likely typo in output_fields."""
    labels = sorted({str(key) for case in cases for key in (case.expected or {})})
    hint = ""
    if output_fields:
        guess = closest(output_fields[0], labels)
        hint = f" (did you mean {guess!r}?)" if guess and guess not in output_fields else ""
    return (
        "no call could be made: no case gives an 'output', and no case's expected values hold the output fields "
        f"{', '.join(output_fields or [])}{hint} (labels present: {', '.join(labels) or 'none'}). Give cases an "
        "'output', or name output fields the labels hold"
    )


def _broken_calls(calls: list[Call]) -> list[Call]:
    """A bad shape breaks the contract on any call; an exception only on the case's own output (its given output,
    else its expected values): score may reasonably reject the probes the check adds."""
    given_cases = {call.case for call in calls if call.role is Role.GIVEN}
    return [
        call for call in calls
        if call.result.failure in _ALWAYS_BROKEN or call.result.failure is Failure.EXCEPTION and (
            call.role is Role.GIVEN or call.role is Role.PERFECT and call.case not in given_cases)
    ]


def _feedback_notes(valid: list[Call]) -> list[str]:
    empty = next((call for call in valid if not call.result.feedback.strip()), None)
    cut = next((call for call in valid if was_cut(call.result.feedback)), None)
    notes = []
    if empty:
        notes.append(f"the feedback is empty on {empty.label}: the reflection model learns only from feedback, so "
                     "say what is wrong and what a right answer looks like")
    if cut:
        notes.append(f"the feedback on {cut.label} is over the limit and was cut; shorten it or raise feedback_limit=")
    return notes


def timeout_item(calls: list[Call], timeout: float) -> CheckItem:
    name = Item.TIMEOUT
    stuck = [call for call in calls if call.result.failure in STOPPING]
    if stuck:
        call = stuck[0]
        if call.result.failure is Failure.TIMEOUT:
            message = (
                f"{call.label}: score did not return within {timeout:g} s; the call was stopped and the remaining "
                f"calls were not run. Make score faster, or raise the timeout (at most {MAX_TIMEOUT:g} s)"
            )
        else:
            message = f"{call.label}: {call.problem}"
        return CheckItem(name, Status.FAILED, message)
    if not calls:
        return CheckItem(name, Status.NOT_RUN, "no call was made")
    slowest = max(call.seconds for call in calls)
    return CheckItem(
        name, Status.PASSED, f"every call returned within the {timeout:g} s timeout (slowest {slowest:.2f} s)"
    )


def named_scores(calls: list[Call]) -> CheckItem:
    name = Item.NAMED_SCORES
    bad = [
        call for call in calls
        if call.result.failure is Failure.INVALID and (call.result.detail or "").startswith(_NAMED_SCORE_RULES)
    ]
    if bad:
        return CheckItem(name, Status.FAILED, f"{bad[0].label}: {bad[0].problem}")
    valid = [call for call in calls if call.result.ok]
    if not valid:
        return CheckItem(name, Status.NOT_RUN, "not checked: no valid return value to read")
    names = [tuple(sorted(call.result.scores)) if call.result.scores else () for call in valid]
    if not any(names):
        return CheckItem(name, Status.PASSED, "none given (optional)")
    if len(set(names)) > 1:
        shown = " vs ".join("{" + ", ".join(group) + "}" if group else "none" for group in dict.fromkeys(names))
        return CheckItem(
            name, Status.WARNING,
            f"the names differ between calls ({shown}); give the same names on every call so the optimizer can "
            "compare candidates on each",
        )
    return CheckItem(name, Status.PASSED, f"{', '.join(names[0])} on every call")


def same_value(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values whose == raises or is ambiguous (arrays): taken as different (and skipped)
        return False


@dataclass(frozen=True)
class _Tried:
    """What perfect_output() reads: the calls, the cases, and the figures every step compares with."""

    calls: list[Call]
    cases: list[Case]
    output_fields: Any
    failure_score: float

    @cached_property
    def valid(self) -> list[Call]:
        return [call for call in self.calls if call.result.ok]

    @cached_property
    def perfect(self) -> list[Call]:
        return [call for call in self.valid if call.role is Role.PERFECT]

    @cached_property
    def others(self) -> list[Call]:
        return [call for call in self.valid if call.role is not Role.PERFECT]

    @cached_property
    def margin(self) -> float:
        best = max(call.result.score for call in self.valid)
        return _TOLERANCE * max(1.0, abs(best), abs(self.failure_score))

    @property
    def lowest(self) -> float:
        return min(call.result.score for call in self.perfect)

    def hint(self, call: Call) -> str:
        """When the call's case's expected values hold more than one field, how to make them look like the output."""
        case = self.cases[call.case - 1]
        if self.output_fields is not None or not case.expected or len(case.expected) < 2:
            return ""
        return (
            f". Its expected values hold {len(case.expected)} fields ({', '.join(map(str, case.expected))}) and were "
            "given as a dict: if the output is only some of them, pass output_fields=[...] naming those "
            "(--output-fields a,b on the command line)"
        )


def perfect_output(
    calls: list[Call], cases: list[Case], output_fields: Any = None, failure_score: float = 0.0
) -> CheckItem:
    """Fails when the expected values as output score no higher than the failure score, or lower than an
    output that differs from them (a metric that never rewards a right answer); warns when every output
    scores the same (a metric that ignores the output, or judges only its form)."""
    tried = _Tried(calls, cases, output_fields, failure_score)
    for step in (_nothing_to_try, _perfect_rejected, _at_failure_score, _below_another, _all_alike, _ties_only):
        item = step(tried)
        if item is not None:
            return item
    return _perfect_passed(tried)


def _nothing_to_try(tried: _Tried) -> CheckItem | None:
    if not any(case.expected for case in tried.cases):
        return CheckItem(_PERFECT, Status.NOT_RUN, "skipped: no case has expected values to try as a perfect output")
    if not any(call.role is Role.PERFECT for call in tried.calls) and tried.output_fields is not None:
        return CheckItem(
            _PERFECT, Status.NOT_RUN,
            f"skipped: no case's expected values hold any of the output fields {', '.join(tried.output_fields)}, "
            "so there is no perfect output to try",
        )
    return None


def _perfect_rejected(tried: _Tried) -> CheckItem | None:
    # An exception on the expected values is news only when the same case's given output scored fine.
    scored = {call.case for call in tried.calls if call.role is Role.GIVEN and call.result.ok}
    rejected = [
        call for call in tried.calls
        if call.role is Role.PERFECT and call.case in scored and call.result.failure is Failure.EXCEPTION
    ]
    if rejected:
        call = rejected[0]
        return CheckItem(
            _PERFECT, Status.WARNING,
            f"{call.label}: {call.problem}. If your expected values are not shaped like an output (say, a list of "
            f"required fields), ignore this; otherwise score should accept a perfect answer{tried.hint(call)}",
        )
    if not tried.perfect:
        return CheckItem(_PERFECT, Status.NOT_RUN,
                         "not checked: no call on the expected values returned a valid score")
    return None


def _at_failure_score(tried: _Tried) -> CheckItem | None:
    floor = [call for call in tried.perfect if call.result.score <= tried.failure_score + tried.margin]
    if not floor:
        return None
    return _never_rewarded(
        tried, floor[0],
        f"no higher than the failure score {tried.failure_score:g}: an optimizer can never tell it from a failed "
        "call, so nothing is rewarded. Check how score compares output with expected",
    )


def _never_rewarded(tried: _Tried, call: Call, why: str) -> CheckItem:
    """A perfect output that scores too low: a failure, or a warning when the check only guessed the output's
    shape (expected values of several fields, no output_fields)."""
    hint = tried.hint(call)
    return CheckItem(_PERFECT, Status.WARNING if hint else Status.FAILED,
                     f"a perfect output scores {call.result.score:.4g} ({call.label}), {why}: look for an inverted "
                     f"comparison (== where != was meant, a negated check) or a wrong field{hint}")


def _below_another(tried: _Tried) -> CheckItem | None:
    low = [
        (call, other) for call in tried.perfect for other in tried.valid
        if other.result.score > call.result.score + tried.margin and not same_value(other.output, call.output)
    ]
    if not low:
        return None
    call, other = max(low, key=lambda pair: pair[1].result.score - pair[0].result.score)
    return _never_rewarded(
        tried, call,
        f"below the {other.result.score:.4g} of an output that differs from it ({other.label}). A perfect answer "
        "should score at least as high as any other",
    )


def _all_alike(tried: _Tried) -> CheckItem | None:
    scores = {call.result.score for call in tried.valid}
    if not tried.others or max(scores) - min(scores) > tried.margin:
        return None
    return CheckItem(
        _PERFECT, Status.WARNING,
        f"every output tried, the perfect ones included, scores {tried.lowest:.4g}: score does not seem to tell a "
        "right output from a wrong one (does it read the output? compare the right field?). If it judges only "
        f"the output's form, ignore this{tried.hint(tried.perfect[0])}",
    )


def _ties_only(tried: _Tried) -> CheckItem | None:
    """Only probes to compare with: a tie on every case means score cannot tell right from wrong."""
    if not tried.others or not all(call.role is Role.CONTRAST for call in tried.others):
        return None
    right_of = {call.case: call.result.score for call in tried.perfect}
    pairs = [(right_of[call.case], call) for call in tried.others if call.case in right_of]
    if not pairs or not all(right <= call.result.score for right, call in pairs):
        return None
    right, first = pairs[0]
    return CheckItem(
        _PERFECT, Status.WARNING,
        f"on every case the expected values as output score no higher than another case's expected values "
        f"(case {first.case}: {right:.4g} vs {first.result.score:.4g}): score does not seem to tell a right "
        f"output from a wrong one. If it judges only the output's form, ignore this{tried.hint(first)}",
    )


def _perfect_passed(tried: _Tried) -> CheckItem:
    if not tried.others:
        return CheckItem(
            _PERFECT, Status.PASSED,
            f"the expected values as output score {tried.lowest:.4g}; no other output to compare with (give cases "
            "an 'output', or several cases with different expected values)",
        )
    best_other = max(call.result.score for call in tried.others)
    return CheckItem(
        _PERFECT, Status.PASSED,
        f"the expected values as output score {tried.lowest:.4g} or more; the {len(tried.others)} other output(s) "
        f"tried score at most {best_other:.4g}",
    )
