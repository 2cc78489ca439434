"""skynet-dspy: plug a Skynet `metric.py` into DSPy and GEPA.

    metric = skynet_dspy.load_metric("metric.py")
    dspy.Evaluate(devset=dev, metric=metric)(program)
    dspy.GEPA(metric=metric, reflection_lm=lm, auto="light").compile(program, trainset=train)

Importing this package is light: it loads the DSPy-free core and the `skynet` helper module, and
registers that module as `skynet` for metric files. Everything that needs DSPy, GEPA or LiteLLM is
imported on first use of its name.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import sys as _sys
from typing import TYPE_CHECKING
from typing import Any as _Any

# LiteLLM fetches its price list from the internet at import and retries for seconds when offline; the
# bundled copy is what measurement prices with anyway. A process-wide LiteLLM setting (docs/getting-started.md):
# set LITELLM_LOCAL_MODEL_COST_MAP=False before importing skynet_dspy to keep LiteLLM's download.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from . import errors, skynet  # noqa: E402
from ._core import options as _options  # noqa: E402
from ._core.contract import validate_return  # noqa: E402
from ._core.options import *  # noqa: E402, F403 - the public option types, named in its __all__
from ._core.types import Failure, JudgeUsage, MetricInfo, Observation, ProgramUsage, Result, Usage  # noqa: E402
from .errors import *  # noqa: E402, F403 - the public exceptions, named once: in _core/errors.py's __all__

if _sys.modules.get("skynet") is not skynet:
    _sys.modules["skynet"] = skynet
helpers = _sys.modules[__name__ + ".helpers"] = skynet  # the older name of the same module

if TYPE_CHECKING:
    from ._check import CheckItem, ContractReport, check_contract
    from ._core.isolation.ray_cluster import RayCluster
    from ._dspy.metric import Metric, load_metric
    from ._dspy.optimize import gepa
    from ._dspy.score import Score
    from ._gepa import Evaluator, make_evaluator, optimize_anything, split_row
    from ._judge import Endpoint, Judge, configure_llm
    from ._results import (
        CostReceipt,
        OptimizationReport,
        log_to_mlflow,
        report,
        results_csv,
        results_frame,
        results_style,
    )

# Public names whose modules pull in DSPy, GEPA or LiteLLM: imported on first use.
_LAZY = {
    name: module
    for module, names in {
        "._check": ("CheckItem", "ContractReport", "check_contract"),
        "._dspy.metric": ("Metric", "load_metric"),
        "._dspy.score": ("Score",),
        "._dspy.optimize": ("gepa",),
        "._gepa": ("Evaluator", "make_evaluator", "optimize_anything", "split_row"),
        "._judge": ("configure_llm", "Endpoint", "Judge"),
        "._core.isolation.ray_cluster": ("RayCluster",),
        "._results": ("CostReceipt", "OptimizationReport", "log_to_mlflow", "report", "results_frame",
                      "results_style", "results_csv"),
    }.items()
    for name in names
}


def _publish(value: _Any) -> None:
    """Give a public class or function the public module as its home, as httpx does: reprs, tracebacks and the
    API reference then say `skynet_dspy.MetricLoadError`, not `skynet_dspy._core.errors.MetricLoadError`.
    Pickling still finds it: `skynet_dspy.<name>` is the same object."""
    if isinstance(value, type) or callable(value) and hasattr(value, "__code__"):
        value.__module__ = __name__


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skynet_dspy' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    # every lazy name whose module is loaded by now gets its public home, not only the one asked for
    for other, home in _LAZY.items():
        loaded = _sys.modules.get(__name__ + home)
        if loaded is not None and other in vars(loaded):
            _publish(vars(loaded)[other])
    return value


def __dir__() -> list[str]:
    """The public names (the lazy ones included), so dir() and completion show the API, not the machinery."""
    return sorted({*__all__, "__version__"})


__all__ = [
    "CheckItem", "ContractReport", "CostReceipt", "Endpoint", "Evaluator", "Failure", "Judge", "JudgeUsage", "Metric",
    "MetricInfo", "Observation", "OptimizationReport", "ProgramUsage", "RayCluster", "Result", "Score", "Usage",
    "check_contract", "configure_llm", "gepa", "helpers", "load_metric", "log_to_mlflow", "make_evaluator",
    "optimize_anything", "report", "results_csv", "results_frame", "results_style", "skynet", "split_row",
    "validate_return",
]
__all__ += errors.__all__
__all__ += _options.__all__
__version__ = "0.2.0"

for _name in __all__:
    if _name not in _LAZY:
        _publish(globals()[_name])
del _name
