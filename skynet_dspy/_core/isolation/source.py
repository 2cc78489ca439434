"""How a worker process finds the metric: a file path, an importable module name, or `score` sent by value."""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import MetricLoadError
from ..values import exception_text
from . import wire


def source_spec(source: Any) -> dict[str, Any]:
    """How a worker finds the metric: a file path, an importable module name, or the pickled `score`.

    A callable cloudpickle cannot send is a MetricLoadError naming isolation="thread".
    """
    if isinstance(source, (str, Path)):
        # "path" as the user wrote it (for messages); "file", resolved, is what the worker reads: a sandboxed
        # worker neither starts in this folder nor sees through a link to the metric's folder
        return {"path": str(source), "file": os.path.realpath(os.fspath(source))}
    if isinstance(source, ModuleType):
        name = source.__name__
        if _importable_as(source):
            return {"module": name}
        file = getattr(source, "__file__", None)
        if file:
            return {"path": file, "file": os.path.realpath(file)}
        source = getattr(source, "score", None)
        if not callable(source):
            raise MetricLoadError(f"the module {name} defines no function named `score`")
    elif not callable(source):
        from ..loading import load

        load(source)  # raises the TypeError naming what a source may be, here rather than in a worker
    import cloudpickle

    try:
        pickled = cloudpickle.dumps(source, protocol=wire.PROTOCOL)
    except Exception as exc:
        shown = getattr(source, "__qualname__", type(source).__name__)
        raise MetricLoadError(
            f"{shown} cannot be sent to a metric worker process ({exception_text(exc)}). Define score in a "
            "metric.py and load that file, make it a plain module-level function, or run it in this process "
            "with load_metric(..., isolation='thread')"
        ) from None
    owner = inspect.getmodule(source)
    spec = getattr(owner, "REWARD_SPEC", None) if owner is not None else None
    file = getattr(getattr(source, "__code__", None), "co_filename", None)
    lines = linecache.getlines(file) if file else []  # a notebook cell's source lives only in this process
    return {
        "pickled": pickled,
        "reward_spec": wire.to_plain(spec) if isinstance(spec, dict) else None,
        "file": file,
        "source": lines if sum(map(len, lines)) < 1_000_000 else [],
    }


def _importable_as(module: ModuleType) -> bool:
    """Whether a fresh interpreter importing `module.__name__` gets this same file (not so for __main__, a
    file loaded by path, or a module imported from a folder the worker's path lacks)."""
    name = module.__name__
    if name == "__main__" or name.startswith("skynet_metric_") or getattr(module, "__spec__", None) is None:
        return False
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if found is None or found.origin is None:
        return False
    file = getattr(module, "__file__", None)
    return file is not None and os.path.samefile(found.origin, file)
