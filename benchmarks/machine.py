"""The machine a benchmark ran on: CPU, cores, Python and the library versions, for the table's caption."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{' (uncommitted changes)' if dirty else ''}" if head else None


def describe() -> dict[str, Any]:
    """CPU model, cores, OS, Python and the versions of skynet-dspy, dspy, gepa and litellm."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "skynet_dspy": _version("skynet-dspy"),
        "dspy": _version("dspy"),
        "gepa": _version("gepa"),
        "litellm": _version("litellm"),
        "commit": _commit(),
        "load_average_at_start": load,
    }


def caption(info: dict[str, Any]) -> str:
    """One line: 'AMD EPYC, 2 cores, Linux ..., Python 3.11.7, dspy 3.4.1, gepa 0.1.4, litellm 1.110.2'."""
    load = info.get("load_average_at_start")
    busy = f"; load average {load[0]:g} at start" if load else ""
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['os']}, Python {info['python']}, "
        f"skynet-dspy {info['skynet_dspy']}, dspy {info['dspy']}, gepa {info['gepa']}, litellm {info['litellm']}{busy}"
    )
