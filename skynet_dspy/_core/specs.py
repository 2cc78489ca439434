"""The types of what users hand the public API, for its annotations (a value of another type is refused)."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeAlias

MetricSource: TypeAlias = str | os.PathLike[str] | ModuleType | Callable[..., Any]
"""A metric: a path to metric.py, an imported module defining `score`, a `score` function, or a loaded Metric."""
