"""Every exception skynet-dspy raises, under `SkynetDspyError`, each with its builtin base (a ContractViolation is
still a ValueError) and a redacted message: no credential reaches a traceback, a log line or a notebook cell."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from .secrets import redact
from .types import Failure, Item
from .values import exception_text

__all__ = [
    "ContractViolation", "DataError", "LLMCallError", "MetricLoadError", "MissingExtra", "ModelNotConfigured",
    "OutsideMetricCall", "RewardSpecError", "SkynetDspyError", "SpendCapReached", "WorkerError",
]


class SkynetDspyError(Exception):
    """The base of every exception this package raises; its message never holds a credential."""

    def __init__(self, message: str = "", *args: Any):
        super().__init__(redact(str(message)), *args)

    def __str__(self) -> str:
        return redact(super().__str__())


class MetricLoadError(SkynetDspyError):
    """The metric could not be loaded; `item` is the contract-check item it fails."""

    def __init__(self, message: str, item: Item = Item.LOADS):
        super().__init__(message)
        self.item = Item(item)


class RewardSpecError(SkynetDspyError, ValueError):
    """A REWARD_SPEC that breaks a rule; the message names the bad field."""

    item = Item.REWARD_SPEC


class ContractViolation(SkynetDspyError, ValueError):
    """A metric's return value broke a rule of docs/contract.md#return-value.

    `rule` names the rule in words that hold nothing the metric chose (it may reach an optimizer as
    feedback, and the value may hold expected values); the message adds the value, shortened.
    """

    def __init__(self, rule: str, value: Any = None, message: str | None = None):
        self.rule = rule
        self.value = value
        super().__init__(message if message is not None else rule)


class ModelNotConfigured(SkynetDspyError, RuntimeError):
    """llm() was called with neither a metric model nor a reflection model set."""


class LLMCallError(SkynetDspyError, RuntimeError):
    """The judge model could not answer: a refused key, a bad request, or retries used up.

    `status` is the HTTP status when there was one; `refused` is True for a refused or missing key; `unreachable`
    is True when the judge could not be reached or kept failing after its retries (not a setup error).
    """

    def __init__(self, message: str, status: int | None = None, *, refused: bool = False, unreachable: bool = False):
        super().__init__(message)
        self.status = status
        self.refused = refused
        self.unreachable = unreachable


class SpendCapReached(SkynetDspyError, RuntimeError):
    """A spending cap (max_judge_cost_usd= or max_program_cost_usd=) was reached; no more is spent."""


class OutsideMetricCall(SkynetDspyError, RuntimeError):
    """A `skynet` helper that reads the example being scored was called outside a metric call."""


class WorkerError(SkynetDspyError, RuntimeError):
    """The metric's worker processes could not be started or could not run the metric."""


class DataError(SkynetDspyError, ValueError):
    """A case or a data file that cannot be used; the message says where and why."""


class MissingExtra(SkynetDspyError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require_extra(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise MissingExtra saying which extra of skynet-dspy brings it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{purpose} needs {module.partition('.')[0]}, which is not installed ({exc}); it comes with "
            f"skynet-dspy's [{extra}] extra: pip install 'skynet-dspy[{extra}]'"
        ) from None


def installed_version(distribution: str) -> str:
    """The installed version of `distribution` (from its package metadata), or "unknown" (run from a source
    checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


NO_JUDGE_MODEL = (
    "skynet.llm() has no model to call: neither a metric model nor a reflection model is set. Set one with "
    "skynet_dspy.load_metric(..., metric_lm='openai/gpt-4o-mini') (or reflection_lm=lm), or build the optimizer "
    "with skynet_dspy.gepa(metric, reflection_lm=lm), which routes llm() to the reflection model; to try a metric "
    "by hand, skynet_dspy.configure_llm(metric_lm=...). A model is a LiteLLM model string, a dict "
    "{'model': ..., 'api_base': ..., 'api_key': ...} or a dspy.LM."
)


_JUDGE_ERRORS: dict[Failure, type[SkynetDspyError]] = {
    Failure.JUDGE_NOT_CONFIGURED: ModelNotConfigured,
    Failure.SPEND_CAP: SpendCapReached,
}


def judge_failure(exc: BaseException) -> Failure | None:
    """The failure kind of an error llm() raised (no model, a spending cap, a failed call), or None for others."""
    if isinstance(exc, LLMCallError):
        return Failure.JUDGE_UNREACHABLE if exc.unreachable else Failure.JUDGE_ERROR
    return next((kind for kind, error in _JUDGE_ERRORS.items() if isinstance(exc, error)), None)


def judge_error_to_plain(exc: BaseException) -> dict[str, Any]:
    """An error llm() raised in the user's process, as plain values for the worker that asked (judge_error)."""
    kind = judge_failure(exc)
    called = exc if isinstance(exc, LLMCallError) else None  # a failed call says its HTTP status
    return {"failure": str(kind or Failure.JUDGE_ERROR), "message": str(exc) if kind else exception_text(exc),
            "status": called.status if called else None, "refused": called.refused if called else False}


def judge_error(error: dict[str, Any]) -> SkynetDspyError:
    """The error llm() raises in a worker for the plain values judge_error_to_plain gave."""
    kind, message = Failure(error["failure"]), error["message"]
    if kind in _JUDGE_ERRORS:
        return _JUDGE_ERRORS[kind](message)
    unreachable = kind is Failure.JUDGE_UNREACHABLE
    return LLMCallError(message, error["status"], refused=error["refused"], unreachable=unreachable)
