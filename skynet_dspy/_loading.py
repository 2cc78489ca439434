"""Turning a metric source (a path to metric.py, a module, or a callable) into a `score` to call."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from . import helpers

_module_numbers = itertools.count(1)


class MetricLoadError(Exception):
    """The metric could not be loaded; `item` is the contract-check item it fails."""

    def __init__(self, message: str, item: str = "Metric loads"):
        self.item = item
        super().__init__(message)


@dataclass(frozen=True)
class LoadedMetric:
    """A `score` function and what was found beside it."""

    score: Callable[..., Any]
    takes_expected: bool
    name: str
    reward_spec: dict | None = None
    module: ModuleType | None = None


def load(source: Any) -> LoadedMetric:
    """Load `source`: a path (str or Path) to a metric file, an imported module, or a `score` callable."""
    if isinstance(source, (str, Path)):
        module = _load_file(Path(source))
        return _from_module(module, str(source))
    if isinstance(source, ModuleType):
        return _from_module(source, getattr(source, "__file__", None) or source.__name__)
    if callable(source):
        name = getattr(source, "__qualname__", None) or type(source).__name__
        owner = inspect.getmodule(source)
        spec = getattr(owner, "REWARD_SPEC", None) if owner is not None else None
        return LoadedMetric(source, _takes_expected(source, name), name, spec, owner)
    raise TypeError(
        f"load_metric() takes a path to metric.py, a module, or a score function; got {type(source).__name__}"
    )


def _from_module(module: ModuleType, name: str) -> LoadedMetric:
    score = getattr(module, "score", None)
    if score is None:
        raise MetricLoadError(
            f"{name} defines no function named `score`. "
            "Add `def score(input, output, expected=None):` returning (score, {'feedback': ...})."
        )
    if not callable(score):
        raise MetricLoadError(
            f"{name}: `score` is a {type(score).__name__}, not a function. "
            "Define `def score(input, output, expected=None): ...`."
        )
    spec = getattr(module, "REWARD_SPEC", None)
    return LoadedMetric(score, _takes_expected(score, name), name, spec, module)


def _load_file(path: Path) -> ModuleType:
    """Run a metric file as a fresh module of its own, so two files (or a changed file) never mix."""
    if not path.is_file():
        raise FileNotFoundError(f"metric file not found: {path}")
    helpers.register()
    module_name = f"skynet_metric_{next(_module_numbers)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise MetricLoadError(f"{path} cannot be loaded as a Python file; name it metric.py")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)  # so the metric can import modules beside it
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        where = f", line {exc.lineno}" if exc.lineno else ""
        raise MetricLoadError(
            f"{path}{where}: syntax error: {exc.msg}. Fix the syntax of the file and load it again."
        ) from None
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        line = _line_in(path, exc)
        where = f", line {line}" if line else ""
        raise MetricLoadError(
            f"{path}{where}: importing the file raised {type(exc).__name__}: {exc}. "
            "Fix the module-level code so the file imports cleanly."
        ) from None
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def _line_in(path: Path, exc: BaseException) -> int | None:
    """The last line of `path` in the traceback of `exc`, if the file appears there."""
    resolved = str(path.resolve())
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename and Path(frame.filename).resolve().as_posix() == Path(resolved).as_posix():
            line = frame.lineno
    return line


def _takes_expected(score: Callable[..., Any], name: str) -> bool:
    """True for score(input, output, expected), False for score(input, output); else MetricLoadError."""
    try:
        params = inspect.signature(score).parameters.values()
    except (TypeError, ValueError) as exc:
        raise MetricLoadError(f"{name}: cannot read the signature of score: {exc}", "Metric signature") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    required_keywords = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    shown = f"score{inspect.signature(score)}"
    if required_keywords:
        raise MetricLoadError(
            f"{name}: {shown} needs keyword-only argument(s) {', '.join(required_keywords)} that are never "
            "passed. Use `def score(input, output, expected=None)`.",
            "Metric signature",
        )
    if has_varargs and len(positional) <= 3:
        return True
    if len(positional) == 2:
        return False
    if len(positional) == 3:
        return True
    raise MetricLoadError(
        f"{name}: {shown} takes {len(positional)} positional parameter(s); score must take two "
        "(input, output) or three (input, output, expected). Use `def score(input, output, expected=None)`.",
        "Metric signature",
    )
