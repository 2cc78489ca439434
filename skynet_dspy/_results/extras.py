"""The optional dependencies of results tables, reports and MLflow logging, and the error naming their extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtra


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise MissingExtra saying which extra of skynet-dspy brings it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{purpose} needs {module.partition('.')[0]}, which is not installed ({exc}); it comes with "
            f"skynet-dspy's [{extra}] extra: pip install 'skynet-dspy[{extra}]'"
        ) from None
