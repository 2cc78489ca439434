"""The items of the contract check after the metric has loaded: one function per item, from the calls made."""

from __future__ import annotations

from typing import Any

from .._core.contract import MAX_TIMEOUT, was_cut
from .._core.types import Failure, Item, Status
from .cases import Case
from .report import Call, CheckItem, Role

_TOLERANCE = 1e-9
# Failures that break the contract on any call, and failures that stop the check (nothing more is run).
_ALWAYS_BROKEN = frozenset({Failure.INVALID, Failure.MISSING_FIELD, Failure.CRASHED, Failure.JUDGE_NOT_CONFIGURED,
                            Failure.JUDGE_ERROR, Failure.JUDGE_UNREACHABLE, Failure.SPEND_CAP, Failure.LOAD})
STOPPING = frozenset({Failure.TIMEOUT, Failure.OVERLOADED})
_NAMED_SCORE_RULES = ("scores is not a dict", "too many named scores", "named score")


def all_items(
    calls: list[Call], cases: list[Case], timeout: float, output_fields: Any, failure_score: float = 0.0
) -> list[CheckItem]:
    """The items that read the calls: return value, timeout, named scores, perfect output."""
    return [
        return_value(calls),
        timeout_item(calls, timeout),
        named_scores(calls),
        perfect_output(calls, cases, output_fields, failure_score),
    ]


def return_value(calls: list[Call]) -> CheckItem:
    name = Item.RETURN_VALUE
    given_cases = {call.case for call in calls if call.role is Role.GIVEN}

    def case_output(call: Call) -> bool:
        """The output the case gave or, giving none, chose: its expected values (not a probe the check added)."""
        return call.role is Role.GIVEN or (call.role is Role.PERFECT and call.case not in given_cases)

    # A bad shape always breaks the contract; an exception only on the case's own output, since score may
    # reasonably reject the probes the check adds.
    broken = [
        call for call in calls
        if call.result.failure in _ALWAYS_BROKEN or (call.result.failure is Failure.EXCEPTION and case_output(call))
    ]
    if broken:
        first = broken[0]
        failed = sum(call.result.failure is not None and call.result.failure not in STOPPING for call in calls)
        more = f" ({failed} of {len(calls)} calls failed)" if failed > 1 else ""
        advice = ""
        if first.result.failure is Failure.JUDGE_NOT_CONFIGURED:
            advice = (" To check a metric that calls llm(), give it a model: metric_lm= in Python, or "
                      "--metric-lm MODEL (and --api-base URL) on the command line")
        return CheckItem(name, Status.FAILED, f"{first.label}: {first.problem.rstrip('.')}.{more}{advice}")
    valid = [call for call in calls if call.result.ok]
    if not valid:
        why = "no call returned in time" if calls else "no call was made"
        return CheckItem(name, Status.NOT_RUN, f"not checked: {why}")
    notes = []
    empty = [call for call in valid if not call.result.feedback.strip()]
    if empty:
        notes.append(
            f"the feedback is empty on {empty[0].label}: the reflection model learns only from feedback, so say "
            "what is wrong and what a right answer looks like"
        )
    cut = [call for call in valid if was_cut(call.result.feedback)]
    if cut:
        notes.append(
            f"the feedback on {cut[0].label} is over the limit and was cut; shorten it or raise feedback_limit="
        )
    extra = sorted({str(key) for call in valid for key in call.result.extra})
    kept = f"; extra keys kept for you, not shown to the optimizer: {', '.join(extra)}" if extra else ""
    summary = f"valid (score, {{'feedback': ...}}) on {len(valid)} call(s){kept}"
    if notes:
        return CheckItem(name, Status.WARNING, f"{summary}; but {'; and '.join(notes)}")
    return CheckItem(name, Status.PASSED, summary)


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


def _shape_hint(case: Case, output_fields: Any) -> str:
    """When a case's expected values hold more than one field, how to make them look like the output."""
    if output_fields is not None or not case.expected or len(case.expected) < 2:
        return ""
    return (
        f". Its expected values hold {len(case.expected)} fields ({', '.join(map(str, case.expected))}) and were "
        "given as a dict: if the output is only some of them, pass output_fields=[...] naming those "
        "(--output-fields a,b on the command line)"
    )


# What the verdict and the item suggest when a perfect output does not score highest.
NEVER_REWARDS = "look for an inverted comparison (== where != was meant, a negated check) or a wrong field"


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values whose == raises or is ambiguous (arrays): taken as different
        return False


def perfect_output(
    calls: list[Call], cases: list[Case], output_fields: Any = None, failure_score: float = 0.0
) -> CheckItem:
    """Fails when the expected values as output score no higher than the failure score, or lower than an
    output that differs from them (a metric that never rewards a right answer); warns when every output
    scores the same (a metric that ignores the output, or judges only its form)."""
    name = Item.PERFECT_OUTPUT
    if not any(case.expected for case in cases):
        return CheckItem(name, Status.NOT_RUN, "skipped: no case has expected values to try as a perfect output")
    if not any(call.role is Role.PERFECT for call in calls) and output_fields is not None:
        return CheckItem(
            name, Status.NOT_RUN,
            f"skipped: no case's expected values hold any of the output fields {', '.join(output_fields)}, so "
            "there is no perfect output to try",
        )
    # An exception on the expected values is news only when the same case's given output scored fine.
    scored = {call.case for call in calls if call.role is Role.GIVEN and call.result.ok}
    rejected = [
        call for call in calls
        if call.role is Role.PERFECT and call.case in scored and call.result.failure is Failure.EXCEPTION
    ]
    perfect = [call for call in calls if call.role is Role.PERFECT and call.result.ok]
    if rejected:
        call = rejected[0]
        return CheckItem(
            name, Status.WARNING,
            f"{call.label}: {call.problem}. If your expected values are not shaped like an output (say, a list of "
            "required fields), ignore this; otherwise score should accept a perfect answer"
            f"{_shape_hint(cases[call.case - 1], output_fields)}",
        )
    if not perfect:
        return CheckItem(name, Status.NOT_RUN, "not checked: no call on the expected values returned a valid score")
    valid = [call for call in calls if call.result.ok]
    best = max(valid, key=lambda call: call.result.score)
    margin = _TOLERANCE * max(1.0, abs(best.result.score), abs(failure_score))
    others = [call for call in valid if call.role is not Role.PERFECT]
    scores = {call.result.score for call in valid}
    floor = [call for call in perfect if call.result.score <= failure_score + margin]
    if floor:
        call = floor[0]
        hint = _shape_hint(cases[call.case - 1], output_fields)
        return CheckItem(
            # expected values of several fields, no output_fields: the check only guessed the output's shape
            name, Status.WARNING if hint else Status.FAILED,
            f"a perfect output scores {call.result.score:.4g} ({call.label}), no higher than the failure score "
            f"{failure_score:g}: an optimizer can never tell it from a failed call, so nothing is rewarded. "
            f"Check how score compares output with expected: {NEVER_REWARDS}{hint}",
        )
    low = [
        (call, other) for call in perfect for other in valid
        if other.result.score > call.result.score + margin and not _same(other.output, call.output)
    ]
    if low:
        call, other = max(low, key=lambda pair: pair[1].result.score - pair[0].result.score)
        hint = _shape_hint(cases[call.case - 1], output_fields)
        return CheckItem(
            name, Status.WARNING if hint else Status.FAILED,
            f"a perfect output scores {call.result.score:.4g} ({call.label}), below the {other.result.score:.4g} "
            f"of an output that differs from it ({other.label}). A perfect answer should score at least as high "
            f"as any other: {NEVER_REWARDS}{hint}",
        )
    lowest = min(call.result.score for call in perfect)
    if others and max(scores) - min(scores) <= margin:
        return CheckItem(
            name, Status.WARNING,
            f"every output tried, the perfect ones included, scores {lowest:.4g}: score does not seem to tell a "
            "right output from a wrong one (does it read the output? compare the right field?). If it judges only "
            "the output's form, ignore this"
            f"{_shape_hint(cases[perfect[0].case - 1], output_fields)}",
        )
    if others and all(call.role is Role.CONTRAST for call in others):
        # Only probes to compare with: a tie on every case means score cannot tell right from wrong.
        right_of = {call.case: call.result.score for call in perfect}
        pairs = [(right_of[call.case], call) for call in others if call.case in right_of]
        if pairs and all(right <= call.result.score for right, call in pairs):
            right, first = pairs[0]
            return CheckItem(
                name, Status.WARNING,
                f"on every case the expected values as output score no higher than another case's expected values "
                f"(case {first.case}: {right:.4g} vs {first.result.score:.4g}): score does not seem to tell a right "
                "output from a wrong one. If it judges only the output's form, ignore this"
                f"{_shape_hint(cases[first.case - 1], output_fields)}",
            )
    if not others:
        return CheckItem(
            name, Status.PASSED,
            f"the expected values as output score {lowest:.4g}; no other output to compare with (give cases an "
            "'output', or several cases with different expected values)",
        )
    best_other = max(call.result.score for call in others)
    return CheckItem(
        name, Status.PASSED,
        f"the expected values as output score {lowest:.4g} or more; the {len(others)} other output(s) tried score "
        f"at most {best_other:.4g}",
    )
