"""One call of `score`, run where the metric runs (a worker process, or a thread with isolation="thread").

Everything that touches what the metric returned or raised happens here, under the call's timeout:
calling score, validating the return value, describing an exception. What leaves is an Outcome of
plain values; the scorer (in the user's process) turns it into a Result.
"""

from __future__ import annotations

import builtins
import inspect
import linecache
import os
import re
import sys
import traceback
from dataclasses import dataclass, replace
from typing import Any

from . import aio
from .context import LLMHandler, MetricCall, calling
from .contract import CUT_MARGIN, check_return
from .errors import ContractViolation, judge_failure
from .loading import LoadedMetric, signature_hint
from .types import Failure, Observation, Outcome
from .values import clip_words, exception_text


class CallTimedOut(BaseException):
    """Raised inside a `score` running in-process when its timeout has passed (isolation="thread").

    A BaseException, like KeyboardInterrupt, so a metric's `except Exception:` does not swallow it.
    """


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One call of score, in plain values: what the metric is given, and the program's measured run."""

    input: dict[str, Any]
    output: Any
    expected: dict[str, Any] | None
    observation: Observation | None = None
    unmeasured_reason: str | None = None
    # seconds an async score's coroutine may run before it is cancelled (None: the executor alone bounds the call)
    timeout: float | None = None

    def args(self) -> tuple[Any, ...]:
        """Its constructor's arguments, in order (`CallRequest(*request.args())` is the request again): what a call
        sends a worker process, without the class (a lookup by name each way)."""
        return self.input, self.output, self.expected, self.observation, self.unmeasured_reason, self.timeout

    def __reduce__(self) -> tuple[type[CallRequest], tuple[Any, ...]]:
        """Pickled as its constructor's arguments: a third less time each way than a frozen dataclass's state."""
        return CallRequest, self.args()


def run_call(
    loaded: LoadedMetric,
    request: CallRequest,
    llm: LLMHandler | None,
    feedback_limit: int,
    contain_interrupts: bool = True,
) -> Outcome:
    """Call score on the request's values with the call's context set; validate or describe what came back.

    Never raises for the metric's faults (SystemExit included). CallTimedOut always propagates, and
    KeyboardInterrupt does too unless `contain_interrupts` (a worker process contains it; in the
    user's own process a Ctrl-C must stop the run).
    """
    call = MetricCall(llm, request.observation, request.unmeasured_reason)
    with calling(call):
        try:
            value = _call_score(loaded, request)
        except aio.CoroutineTimedOut:
            detail = f"score() did not return within {request.timeout:g} s; its coroutine was cancelled"
            return _with_judge(Outcome(failure=Failure.TIMEOUT, detail=detail), call)
        except CallTimedOut:
            raise
        except KeyboardInterrupt as exc:
            if not contain_interrupts:
                raise
            return _raised(exc, loaded, request, call)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a metric is contained too
            return _raised(exc, loaded, request, call)
        try:
            outcome = Outcome(result=check_return(value, feedback_limit + CUT_MARGIN))
        except ContractViolation as violation:
            outcome = Outcome(failure=Failure.INVALID, rule=violation.rule, detail=str(violation))
        except CallTimedOut:
            raise
        except BaseException as exc:  # noqa: BLE001 - e.g. a returned object whose __float__ calls sys.exit
            if isinstance(exc, KeyboardInterrupt) and not contain_interrupts:
                raise
            rule = "unreadable return value"
            detail = f"{rule}: {type(exc).__name__} was raised while reading the return value"
            outcome = Outcome(failure=Failure.INVALID, rule=rule, detail=detail)
    return _with_judge(outcome, call)


def _call_score(loaded: LoadedMetric, request: CallRequest) -> Any:
    """What score returned; an async score's coroutine is run to its end first, on an event loop of its own."""
    if loaded.takes_expected:
        value = loaded.score(request.input, request.output, request.expected)
    else:
        value = loaded.score(request.input, request.output)
    if inspect.iscoroutine(value):
        value = aio.run(value, request.timeout)
    return value


def _with_judge(outcome: Outcome, call: MetricCall) -> Outcome:
    if not call.judge_problems:
        return outcome
    kind, message = call.judge_problems[0]
    return replace(outcome, judge_problem=kind, judge_detail=message)


def _raised(exc: BaseException, loaded: LoadedMetric, request: CallRequest, call: MetricCall) -> Outcome:
    """The Outcome of a score that raised: the kind, the exception type, and the full story for the user."""
    kind = judge_failure(exc) or Failure.EXCEPTION
    if call.judge_problems and kind is Failure.EXCEPTION:  # the metric wrapped the judge's error in its own
        kind = call.judge_problems[0][0]
    text = exception_text(exc)
    where = raised_at(exc, loaded)
    detail = f"{where}: {text}" if where else text
    hint = _hint(exc, text, loaded, request)
    if hint:
        detail += f". {hint}"
    return _with_judge(Outcome(failure=kind, error_type=type_name(exc, loaded), detail=detail), call)


def type_name(exc: BaseException, loaded: LoadedMetric) -> str | None:
    """The exception's class name when it names code, not values, else None: the name reaches the optimizer
    (docs/contract.md#return-value), and a class made or renamed at run time may be named from the metric's values.

    A builtin is shown; so is a library's class found under its name in the module it says it comes from.
    A class of the metric's own (its file, its folder, defined inside score, sent from a script) is shown
    only when a class statement in a source file names it: all a class says of itself can be set at run
    time, a class statement cannot.
    """
    cls = type(exc)
    name, qualname, module = cls.__name__, getattr(cls, "__qualname__", None), getattr(cls, "__module__", None)
    if not (isinstance(name, str) and isinstance(qualname, str) and isinstance(module, str)):
        return None
    if qualname.rpartition(".")[2] != name:  # renamed after it was made
        return None
    if module == "builtins":
        return name if getattr(builtins, name, None) is cls else None
    owner = sys.modules.get(module)
    file = getattr(owner, "__file__", None)
    files = _metric_files(loaded)
    if _metric_class(qualname, module, owner, file, loaded, files):
        sources = ([file] if isinstance(file, str) else []) + sorted(files)
        return name if any(_class_statement(name, source) for source in sources) else None
    found: Any = owner  # a library's class: where it says it lives, under its name
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return name if found is cls else None


def _metric_files(loaded: LoadedMetric) -> set[str]:
    """The metric's source files: the one it was loaded from and its module's."""
    return {path for path in (loaded.file, getattr(loaded.module, "__file__", None)) if path}


def _in_folders(path: str, files: set[str]) -> bool:
    """Whether `path` lies in the folder of one of `files`."""
    return os.path.dirname(os.path.abspath(path)) in {os.path.dirname(os.path.abspath(name)) for name in files}


def _metric_class(
    qualname: str, module: str, owner: Any, file: Any, loaded: LoadedMetric, files: set[str]
) -> bool:
    """Whether a class is the metric's own: made inside a function, in a script, in its module or beside it."""
    return (
        "<locals>" in qualname
        or module == "__main__"
        or owner is loaded.module
        or (isinstance(file, str) and _in_folders(file, files))
    )


def _class_statement(name: str, file: str) -> bool:
    """Whether the source of `file` has a `class NAME` statement."""
    pattern = re.compile(rf"^\s*class\s+{re.escape(name)}\b")
    return any(pattern.match(line) for line in linecache.getlines(file))


def raised_at(exc: BaseException, loaded: LoadedMetric) -> str | None:
    """'metric.py, line 12: `float(expected["x"])`': the last line of the metric's own code in the traceback."""
    files = _metric_files(loaded)
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        filename = frame.filename or ""
        if filename in files or (filename.endswith(".py") and _in_folders(filename, files)):
            found = frame
    if found is None:
        return None
    code = (found.line or linecache.getline(found.filename, found.lineno or 0)).strip()
    shown = f": `{clip_words(code, 100)}`" if code else ""
    return f"{os.path.basename(found.filename)}, line {found.lineno}{shown}"


def _hint(exc: BaseException, text: str, loaded: LoadedMetric, request: CallRequest) -> str | None:
    """A sentence on a common mistake the exception points to, or None."""
    if request.expected is None and "NoneType" in text:
        return (
            "This example has no labels, so score got expected=None: handle None, or give the example label fields"
        )
    if isinstance(exc, (TypeError, KeyError, IndexError)) and not isinstance(request.output, dict):
        if "indices must be integers" in text or "not subscriptable" in text or isinstance(exc, KeyError):
            return (
                "When the program has one output field, `output` is that field's bare value, not a dict "
                "(so output == expected['label'] works); pass output_fields=[...] naming several fields "
                "(--output-fields a,b on the command line), or to_output=..., to get a dict"
            )
    if isinstance(exc, (AttributeError, TypeError)):
        return signature_hint(loaded.score)
    return None
