"""Plain GEPA's run(artifact, input) in worker processes (run_isolation="process"): `run` dressed as a score function
in a ProcessExecutor with max_calls=1, so each call runs in a fresh fork of a template that never ran it, and nothing
one candidate changed reaches another's. Sandboxed, that template is in a sandbox of its own. What comes back is
read by the plain GEPA evaluator (_gepa/evaluator.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import MetricLoadError
from ..values import exception_text
from .process import ProcessExecutor
from .sandbox import Sandbox

OUTPUT, ERROR, ERROR_TYPE = "run_output", "run_error", "run_error_type"  # the keys of as_score's extra
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

                from ..loading import load_file

                loaded["run"] = load_file(Path(str(path))).run
            function = loaded["run"]
        try:
            value = function(output, input)
        except Exception as exc:  # noqa: BLE001 - run's error is the candidate's feedback, as in this process
            return 0.0, {"feedback": "ran", ERROR: exception_text(exc), ERROR_TYPE: type(exc).__name__}
        return 0.0, {"feedback": "ran", OUTPUT: value}

    return score


def run_workers(run: Callable[[Any, Any], Any], timeout: float, *, path: str | None = None,
                launcher: Sandbox | None = None) -> ProcessExecutor:
    """Worker processes for run(artifact, input) (from run.py at `path` when given), each call under `timeout`
    seconds in a new worker; a run that cannot be sent to one is a MetricLoadError naming the alternatives."""
    source = as_score(None, path) if path is not None else as_score(run)
    try:
        return ProcessExecutor(source, timeout, _FEEDBACK_LIMIT, max_calls=1, launcher=launcher)
    except MetricLoadError as exc:
        raise MetricLoadError(
            f"run cannot be sent to a worker process: {exc}. Define run in a run.py and pass its path, or "
            "call it in this process with run_isolation='thread'"
        ) from None
