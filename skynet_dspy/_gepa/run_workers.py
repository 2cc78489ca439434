"""Plain GEPA's run(artifact, input) in worker processes (run_isolation="process" or "sandbox"): `run` dressed as a
score function in a ProcessExecutor with max_calls=1, so each call runs in a fresh fork of a template that never ran
it, and nothing one candidate changed reaches another's. Sandboxed, that template is in a sandbox of its own.

The dressed score is sent to the workers by value (cloudpickle), so a worker runs it without importing this module
(nor DSPy): it imports only the core, as for any metric.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from .._core.errors import MetricLoadError
from .._core.isolation.process import ProcessExecutor
from .._core.isolation.sandbox import Sandbox, folders_of, sandbox_for
from .._core.types import Failure, Outcome
from .._core.values import exception_text

_OUTPUT, _ERROR, _ERROR_TYPE = "run_output", "run_error", "run_error_type"  # the keys of as_score's extra
_FEEDBACK_LIMIT = 20_000  # the adapter's own feedback is empty: this bounds nothing of run's


def as_score(run: Callable[[Any, Any], Any] | None, path: str | None = None) -> Callable[..., Any]:
    """A score(input, output, expected=None) that calls run(output, input): `run` itself, or `run` from the
    run.py at `path` (loaded once per worker). Its extra carries run's output, or its exception as text."""
    loaded: dict[str, Callable[[Any, Any], Any]] = {}

    def score(input: Any, output: Any, expected: Any = None) -> tuple[float, dict[str, Any]]:
        function = run
        if function is None:
            if "run" not in loaded:
                from pathlib import Path

                from skynet_dspy._core.loading import load_file  # absolute: in the worker, no _gepa is imported

                loaded["run"] = load_file(Path(str(path))).run
            function = loaded["run"]
        try:
            value = function(output, input)
        except Exception as exc:  # noqa: BLE001 - run's error is the candidate's feedback, as in this process
            return 0.0, {"feedback": "ran", _ERROR: exception_text(exc), _ERROR_TYPE: type(exc).__name__}
        return 0.0, {"feedback": "ran", _OUTPUT: value}

    return score


def start(run: Callable[[Any, Any], Any], timeout: float, *, path: str | None, sandbox: Sandbox | None,
          sandboxed: bool) -> ProcessExecutor:
    """Worker processes for run(artifact, input) (from run.py at `path` when given), each call under `timeout`
    seconds in a new worker; sandboxed when asked or when the metric's workers are (`sandbox`), with the run
    file's folder readable. A run that cannot be sent to one is a MetricLoadError naming the alternatives."""
    if sandbox is None and sandboxed:
        sandbox = sandbox_for(path or run, True, False)
    if sandbox is not None:
        sandbox = dataclasses.replace(sandbox, read_only=folders_of(path or run))
    source = as_score(None, path) if path is not None else as_score(run)
    try:
        return ProcessExecutor(source, timeout, _FEEDBACK_LIMIT, max_calls=1, launcher=sandbox)
    except MetricLoadError as exc:
        raise MetricLoadError(
            f"run cannot be sent to a worker process: {exc}. Define run in a run.py and pass its path, or "
            "call it in this process with run_isolation='thread'"
        ) from None


class Ran(NamedTuple):
    """What run(artifact, input) in a worker gave: its output, or the failure and the feedback the reflection model
    reads (run's own error, else built from nothing the candidate chose)."""

    output: Any = None
    failed: Outcome | None = None
    feedback: str = ""


def ran(outcome: Outcome, timeout: float) -> Ran:
    """The worker's outcome of one run(artifact, input), read as a Ran."""
    extra = outcome.result.extra if outcome.result is not None else {}
    if _ERROR in extra:
        text = f"run(artifact, input) raised {extra[_ERROR]}"
        return Ran(failed=Outcome(failure=Failure.RUN_EXCEPTION, error_type=str(extra.get(_ERROR_TYPE)), detail=text),
                   feedback=text)
    if outcome.result is not None:
        return Ran(output=extra.get(_OUTPUT))
    failure = outcome.failure
    # no worker could load run(): a setup problem, not this candidate's fault (GEPA's cache must not keep it)
    detail = str(outcome.detail).replace("score()", "run()")
    failed = Outcome(failure=Failure.LOAD if failure is Failure.LOAD else Failure.RUN_EXCEPTION,
                     error_type=outcome.error_type or str(failure),
                     detail=f"run(artifact, input) in its worker process: {detail}")
    if failure is Failure.TIMEOUT:
        said = f"did not return within {timeout:g} s, so it was stopped"
    elif failure is Failure.CRASHED and outcome.error_type == "fork":
        said = "started a process with os.fork(), which is not allowed, so it was stopped"
    elif failure is Failure.INVALID:
        said = "returned a value that could not be passed on to the metric"
    elif failure is Failure.LOAD:
        said = "could not be loaded in a worker process; this is a setup problem, not a fault of the candidate"
    else:
        said = "ended its process (an exit, a crash or a signal) before returning"
    return Ran(failed=failed, feedback=f"run(artifact, input) {said}")
