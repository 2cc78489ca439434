"""The contract check: run a metric on a few cases and say, item by item, what is wrong (docs/contract.md#names).
Problems with the metric are reported, never raised; only bad arguments raise.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from .._core.options import MetricOptions, MetricSource, check_names
from .._core.types import Item, JudgeUsage, Result, Status
from .._core.values import shorten, whole_number
from ..errors import MetricLoadError, RewardSpecError, WorkerError
from . import agreement, items, stability
from .agreement import DEFAULT_MIN_AGREEMENT, HumanScores
from .cases import CASES_CHECKED, Case, cases
from .items import STOPPING, same_value
from .report import Call, CaseRun, CheckItem, ContractReport, Role
from .stability import DEFAULT_MAX_SPREAD

if TYPE_CHECKING:
    from .._dspy.metric import Metric

__all__ = ["CheckItem", "ContractReport", "check_contract"]  # what skynet_dspy exports from here

Progress = Callable[[int, int], None]  # (calls done, calls planned)


def check_contract(
    source: MetricSource | Metric,
    examples: Iterable[Any],
    *,
    max_cases: int | None = CASES_CHECKED,
    inputs: Sequence[str] | None = None,
    progress: Progress | None = None,
    repeat: int = 1,
    max_spread: float = DEFAULT_MAX_SPREAD,
    human: HumanScores | None = None,
    min_agreement: float = DEFAULT_MIN_AGREEMENT,
    **options: Unpack[MetricOptions],
) -> ContractReport:
    """Run the metric on the first `max_cases` examples and report every contract item.

    When a case has no output, its expected values serve as the output. Problems with the metric are in the
    report, never raised.

    Args:
        source: What load_metric takes (a path to metric.py, a module, a score function), or a Metric.
        examples: dspy.Examples, dicts {"input": {...}, "output": ..., "expected": {...} | None}, or flat rows
            when `inputs` names the input fields.
        max_cases: How many examples to run (None: all).
        inputs: The input fields of flat rows (every other key is an expected value).
        progress: Called as progress(done, planned) after each call.
        repeat: Score each case's own output this many times, asking the judge again each time (its cache left
            out; the cost is logged before the repeats run; max_judge_cost_usd still holds), and add the item
            "Scores are stable" (docs/trustworthy.md).
        max_spread: "Scores are stable" warns when a case's score or a named score varies by more than this.
        human: A JSONL file, or one person's score per example in order (a number, None, or
            {"score": ..., "scores": {...}}): adds "Agrees with people" (Spearman, Cohen's kappa, mean absolute
            difference per score).
        min_agreement: "Agrees with people" warns below this agreement.
        **options: `MetricOptions` for load_metric (timeout, isolation, output_fields, ...).

    Returns:
        The ContractReport: `.ok`, one CheckItem per contract item; with repeat/human, `.stability` and
        `.agreement`.

    Raises:
        TypeError: An unknown option, or options beside a Metric already loaded.
        DataError: A case that cannot be read.
    """
    from .._dspy.metric import Metric, load_metric, reject_options_for_loaded

    given_metric = isinstance(source, Metric)
    if isinstance(source, Metric):
        reject_options_for_loaded("check_contract()", source, options)
    check_names("check_contract()", options, MetricOptions)
    if max_cases is not None:
        whole_number("max_cases", max_cases, minimum=1, unit="cases")
    runs, max_spread = stability.check_repeat(repeat, max_spread)
    min_agreement = agreement.check_min_agreement(min_agreement)
    labels = None if human is None else agreement.human_labels(human)
    checked = cases(examples, max_cases, inputs)
    if labels is not None:
        agreement.check_labels(labels, examples, checked)
    report = ContractReport(source.info.label if isinstance(source, Metric) else _source_name(source))
    if isinstance(examples, Sized):  # a generator is never read past the cases checked
        report.not_run = max(0, len(examples) - len(checked))
    asked = [item for item, wanted in ((Item.STABLE, runs > 1), (Item.AGREES, labels is not None)) if wanted]
    options.setdefault("measure", False)  # a check scores given outputs, no program's runs
    try:
        metric = source if isinstance(source, Metric) else load_metric(source, **options)
    except (MetricLoadError, FileNotFoundError, RewardSpecError, WorkerError) as exc:
        _add_load_failure(report, exc, asked)
        return report
    try:
        before = metric.judge_usage
        _check_calls(metric, report, checked, progress)
        if runs > 1:
            _repeat(metric, report, runs, max_spread, before, progress)
        if labels is not None:
            report.agreement = agreement.agreement(report.cases, labels, min_agreement)
            report.items.append(agreement.agreement_item(report.agreement))
    finally:
        if not given_metric:
            metric.close()
    return report


def _check_calls(metric: Metric, report: ContractReport, checked: list[Case], progress: Progress | None) -> None:
    """The items of a loaded metric: its signature, then those the calls on the cases show."""
    info = metric.info
    report.items.append(CheckItem(Item.LOADS, Status.PASSED, f"loaded {report.metric}"))
    arity = ("async " if info.is_async else "") + (
        "score(input, output, expected)" if info.takes_expected else "score(input, output)")
    hint = f". {info.hint}" if info.hint else ""
    report.items.append(CheckItem(Item.SIGNATURE, Status.WARNING if hint else Status.PASSED,
                                  f"called as {arity}{hint}"))
    if info.reward_spec is not None:
        report.items.append(CheckItem(Item.REWARD_SPEC, Status.PASSED, "REWARD_SPEC is valid"))
    with _adapter_warnings_silenced():
        _run_calls(metric, checked, report, progress)
    report.stopped = len(checked) - len(report.cases)  # a call did not return in time: the rest were not run
    calls, fields = report.calls, metric.output_fields
    report.items += [items.return_value(calls, checked, fields), items.timeout_item(calls, metric.timeout),
                     items.named_scores(calls), items.perfect_output(calls, checked, fields, metric.failure_score)]


def _repeat(metric: Metric, report: ContractReport, runs: int, max_spread: float, before: JudgeUsage,
            progress: Progress | None) -> None:
    """The repeats of each case's own output, unless the contract is broken; adds "Scores are stable"."""
    broken = [item.name for item in report.items if item.status is Status.FAILED]
    if not broken and report.cases:
        report.stability = stability.announce(metric, report, runs, max_spread, before)
        with _adapter_warnings_silenced():
            stability.repeat_cases(metric, report, report.stability, progress)
    report.items.append(stability.stability_item(report.stability, broken))


def _source_name(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    return getattr(source, "__file__", None) or getattr(source, "__qualname__", None) or shorten(source, 80)


def _add_load_failure(report: ContractReport, exc: BaseException, asked: Sequence[Item] = ()) -> None:
    failed_at = getattr(exc, "item", Item.LOADS)  # MetricLoadError and RewardSpecError name theirs
    reached = False
    for name in Item:
        if name is failed_at:
            report.items.append(CheckItem(name, Status.FAILED, str(exc)))
            reached = True
        elif name is Item.REWARD_SPEC or name in (Item.STABLE, Item.AGREES) and name not in asked:
            continue  # only shown when the metric defines REWARD_SPEC (unknown here), or when asked for
        elif not reached:
            message = f"loaded {report.metric}" if name is Item.LOADS else "ok"
            report.items.append(CheckItem(name, Status.PASSED, message))
        else:
            report.items.append(CheckItem(name, Status.NOT_RUN, f"not run: {failed_at} failed"))


@contextlib.contextmanager
def _adapter_warnings_silenced() -> Iterator[None]:
    """Hold back the scorer's "metric failed, the run goes on" log lines: the report says it better."""
    logger = logging.getLogger("skynet_dspy")
    thread = threading.get_ident()

    def from_other_threads(record: logging.LogRecord) -> bool:
        return record.thread != thread

    logger.addFilter(from_other_threads)
    try:
        yield
    finally:
        logger.removeFilter(from_other_threads)


def _plan(case: Case, perfects: list[Any], index: int) -> list[tuple[Role, Any, int | None]]:
    """The calls to make on a case: its given output, its expected values as output (the perfect answer), and,
    with no output given, the next case's expected values that differ from its own (a wrong answer)."""
    perfect = perfects[index]
    plan: list[tuple[Role, Any, int | None]] = [(Role.GIVEN, case.output, None)] if case.has_output else []
    if perfect is not None:
        plan.append((Role.PERFECT, perfect, None))
    if case.has_output or perfect is None:
        return plan
    following = (other % len(perfects) for other in range(index + 1, index + len(perfects)))
    other = next((o for o in following if perfects[o] is not None and not same_value(perfects[o], perfect)), None)
    return plan if other is None else [*plan, (Role.CONTRAST, perfects[other], other + 1)]


def _run_calls(metric: Any, checked: list[Case], report: ContractReport, progress: Progress | None) -> None:
    """Make the planned calls, stopping at the first that does not return in time."""
    from .._dspy.translate import perfect_output

    perfects = [perfect_output(case.expected, metric.output_fields) for case in checked]
    plans = [_plan(case, perfects, index) for index, case in enumerate(checked)]
    planned, done = sum(len(plan) for plan in plans), 0
    for number, (case, plan) in enumerate(zip(checked, plans, strict=True), 1):
        runs: dict[Role, Result] = {}
        for role, output, source_case in plan:
            started = time.perf_counter()
            runs[role] = result = metric.score(case.input, output, case.expected)
            report.calls.append(Call(number, role, output, result, time.perf_counter() - started, source_case))
            done += 1
            if progress is not None:
                progress(done, planned)
            if result.failure in STOPPING:
                break
        output = case.output if case.has_output else perfects[number - 1]
        report.cases.append(CaseRun(case.input, case.expected, output, runs.get(Role.GIVEN), runs.get(Role.PERFECT)))
        if any(result.failure in STOPPING for result in runs.values()):
            return
