"""Plain GEPA's run(artifact, input) in worker processes (run_isolation="process"): `run` dressed as a score function
(`as_score`) in a ProcessExecutor with max_calls=1, so each call runs in a fresh fork of a template that never ran
it, and nothing one candidate changed reaches another's. Sandboxed, that template is in a sandbox of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..call import CallRequest
from ..errors import MetricLoadError
from ..types import Failure, Outcome
from ..values import exception_text
from .process import ProcessExecutor
from .sandbox import Sandbox

_OUTPUT, _ERROR, _ERROR_TYPE = "run_output", "run_error", "run_error_type"
_FEEDBACK_LIMIT = 20_000  # the adapter's own feedback is empty: this bounds nothing of run's


def as_score(run: Callable[[Any, Any], Any] | None, path: str | None = None) -> Callable[..., Any]:
    """A score(input, output, expected=None) that calls run(output, input): `run` itself, or `run` from the
    run.py at `path` (loaded once per worker). Its return carries run's output, or its exception as text."""
    loaded: dict[str, Callable[[Any, Any], Any]] = {}

    def score(input: Any, output: Any, expected: Any = None) -> tuple[float, dict[str, Any]]:
        function = run
        if function is None:
            if "run" not in loaded:
                from pathlib import Path

                from ..loading import load_file

                loaded["run"] = load_file(Path(str(path))).run
            function = loaded["run"]
        try:
            value = function(output, input)
        except Exception as exc:  # noqa: BLE001 - run's error is the candidate's feedback, as in this process
            return 0.0, {"feedback": "ran", _ERROR: exception_text(exc), _ERROR_TYPE: type(exc).__name__}
        return 0.0, {"feedback": "ran", _OUTPUT: value}

    return score


@dataclass(frozen=True)
class Ran:
    """One run(artifact, input) in a worker: its output, or why it gave none (failure, error_type, feedback)."""

    output: Any = None
    failure: Failure | None = None
    error_type: str | None = None
    feedback: str = ""
    detail: str = ""


class RunWorkers:
    """run(artifact, input) in worker processes, each call under `timeout` seconds in a new worker."""

    def __init__(self, run: Callable[[Any, Any], Any], timeout: float, *, path: str | None = None,
                 launcher: Sandbox | None = None):
        self.timeout = timeout
        source = as_score(None, path) if path is not None else as_score(run)
        try:
            self.executor = ProcessExecutor(source, timeout, _FEEDBACK_LIMIT, max_calls=1, launcher=launcher)
        except MetricLoadError as exc:
            raise MetricLoadError(
                f"run cannot be sent to a worker process: {exc}. Define run in a run.py and pass its path, or "
                "call it in this process with run_isolation='thread'"
            ) from None

    def __call__(self, artifact: Any, input_values: Any) -> Ran:
        outcome = self.executor.run(CallRequest(input=input_values, output=artifact, expected=None), None)
        result = outcome.result
        if result is not None and _ERROR in result.extra:
            text = f"run(artifact, input) raised {result.extra[_ERROR]}"
            return Ran(failure=Failure.RUN_EXCEPTION, error_type=str(result.extra.get(_ERROR_TYPE)), feedback=text,
                       detail=text)
        if result is not None:
            return Ran(output=result.extra.get(_OUTPUT))
        detail = str(outcome.detail).replace("score()", "run()")
        # no worker could load run(): a setup problem, not this candidate's fault (GEPA's cache must not keep it)
        failure = Failure.LOAD if outcome.failure is Failure.LOAD else Failure.RUN_EXCEPTION
        return Ran(failure=failure, error_type=outcome.error_type or str(outcome.failure),
                   feedback=_failure_feedback(outcome, self.timeout),
                   detail=f"run(artifact, input) in its worker process: {detail}")

    def close(self) -> None:
        self.executor.close()


def _failure_feedback(outcome: Outcome, timeout: float) -> str:
    """What the reflection model reads of a run that gave no output: built from nothing the candidate chose."""
    if outcome.failure is Failure.TIMEOUT:
        return f"run(artifact, input) did not return within {timeout:g} s, so it was stopped"
    if outcome.failure is Failure.CRASHED and outcome.error_type == "fork":
        return "run(artifact, input) started a process with os.fork(), which is not allowed, so it was stopped"
    if outcome.failure is Failure.INVALID:
        return "run(artifact, input) returned a value that could not be passed on to the metric"
    if outcome.failure is Failure.LOAD:
        return ("run(artifact, input) could not be loaded in a worker process; this is a setup problem, not a fault "
                "of the candidate")
    return "run(artifact, input) ended its process (an exit, a crash or a signal) before returning"
