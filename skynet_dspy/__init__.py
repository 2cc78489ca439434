"""skynet-dspy: plug a Skynet `metric.py` into DSPy and GEPA.

    metric = skynet_dspy.load_metric("metric.py")
    dspy.Evaluate(devset=dev, metric=metric)(program)
    dspy.GEPA(metric=metric, reflection_lm=lm, auto="light").compile(program, trainset=train)
"""

import os as _os

# LiteLLM fetches its price list from the internet at import and retries for seconds when
# offline; the bundled copy is what we price with anyway.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from . import helpers  # noqa: E402
from ._adapter import Metric, Score, load_metric  # noqa: E402
from ._check import CheckItem, ContractReport, check_contract  # noqa: E402
from ._contract import ContractViolation, Result, validate_return  # noqa: E402
from ._loading import MetricLoadError  # noqa: E402
from ._measure import Observation  # noqa: E402
from ._models import JudgeUsage, LLMCallError, ModelNotConfigured, configure_llm  # noqa: E402
from ._reward import RewardSpecError  # noqa: E402

helpers.register()

# Entry points whose modules pull in GEPA / LiteLLM load on first use, keeping `import skynet_dspy` fast.
_LAZY = {
    "gepa": "._optimize",
    "optimize_anything": "._anything",
    "split_row": "._anything",
    "make_evaluator": "._anything",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'skynet_dspy' has no attribute {name!r}")


__all__ = [
    "check_contract",
    "CheckItem",
    "configure_llm",
    "ContractReport",
    "ContractViolation",
    "gepa",
    "helpers",
    "JudgeUsage",
    "LLMCallError",
    "load_metric",
    "make_evaluator",
    "Metric",
    "MetricLoadError",
    "ModelNotConfigured",
    "Observation",
    "optimize_anything",
    "Result",
    "RewardSpecError",
    "Score",
    "split_row",
    "validate_return",
]
__version__ = "0.1.0"
