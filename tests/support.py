"""Helpers shared by the tests: writing small metric files."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_metric(folder: Path, body: str, name: str = "metric.py") -> Path:
    """Write a metric file (dedented) into `folder` and return its path."""
    path = folder / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def returning(folder: Path, value: str, params: str = "input, output, expected=None") -> Path:
    """A metric file whose score returns the Python expression `value`."""
    numpy = "import numpy as np\n" if "np." in value else ""  # a worker importing NumPy costs ~0.1 s
    return write_metric(folder, f"import math\n{numpy}\ndef score({params}):\n    return {value}\n")
