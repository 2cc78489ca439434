"""log_to_mlflow(): named scores, judge usage, the cost receipt, the contract report and the per-example table on
an MLflow run, beside what mlflow.dspy.autolog() logs. Explicit: autolog opens a run per evaluation, so the user
says which run. Every file written is safe to open (_core/safe_text.py).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from .._core import safe_text
from .._core.errors import require_extra

if TYPE_CHECKING:
    import dspy
    from dspy.evaluate import EvaluationResult
    from gepa.core.result import GEPAResult

    from .._check import ContractReport
    from .._dspy.metric import Metric
    from .report import OptimizationReport

ARTIFACTS = "skynet"  # the artifact folder everything is logged under
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. :/]")


def log_to_mlflow(
    evaluation: EvaluationResult | None = None,
    *,
    metric: Metric | None = None,
    report: OptimizationReport | dspy.GEPA | dspy.Module | GEPAResult | None = None,
    contract: ContractReport | None = None,
    run_id: str | None = None,
    include_expected: bool = False,
) -> str:
    """Log results on an MLflow run and return its run id.

    Args:
        evaluation: What dspy.Evaluate returned (metrics `score`, `scores/NAME`, `failures`, `failures/KIND`;
            the table `skynet/results.json` and `skynet/results.csv`).
        metric: A loaded Metric, for its judge usage (`judge/requests`, `judge/cache_hits`, `judge/tokens`,
            `judge/cost_usd`, `judge/seconds`).
        report: An OptimizationReport or what skynet_dspy.report() takes (`report/...` and `receipt/...`
            metrics; `skynet/report.txt`, `.json`, `candidates.png`).
        contract: A ContractReport (`contract/ok`; `skynet/contract.txt`, `.json`).
        run_id: The MLflow run to log on; None: the active run, else a new run (ended after).
        include_expected: Log the expected values in the results table too.

    Returns:
        The run's id.
    """
    mlflow = require_extra("mlflow", "mlflow", "skynet_dspy.log_to_mlflow()")
    if all(given is None for given in (evaluation, metric, report, contract)):
        raise ValueError("log_to_mlflow() needs something to log: an evaluation, metric=, report= or contract=")
    if not isinstance(run_id, (str, type(None))):
        raise TypeError(f"run_id must be an MLflow run id (a str), got {type(run_id).__name__}")
    active = mlflow.active_run()
    started: Any = None
    if run_id is None and active is None:
        started = mlflow.start_run(run_name="skynet-dspy")
    target = run_id or (active or started).info.run_id
    try:
        metrics: dict[str, float] = {}
        if evaluation is not None:
            metrics |= _log_evaluation(mlflow, evaluation, target, include_expected)
        if report is not None:
            metrics |= _log_report(mlflow, report, target)
        if metric is not None:
            judge = metric.judge_usage.to_dict()
            judge["tokens"] = judge.pop("total_tokens")
            metrics |= _flat("judge", judge)
        if contract is not None:
            metrics |= _log_contract(mlflow, contract, target)
        _log_finite(mlflow, metrics, target)
    finally:
        if started is not None:
            mlflow.end_run()
    return target


def _log_finite(mlflow: Any, metrics: dict[str, float], run_id: str) -> None:
    """The finite figures, each under a key MLflow takes (a character it refuses becomes '_')."""
    finite = {_UNSAFE.sub("_", name)[:250]: value for name, value in metrics.items() if math.isfinite(value)}
    if finite:
        mlflow.log_metrics(finite, run_id=run_id)


def _log_evaluation(mlflow: Any, evaluation: Any, run_id: str, include_expected: bool) -> dict[str, float]:
    from . import table
    from .frame import _text_cells, results_csv, results_frame

    rows = table.rows_of(evaluation)
    frame = results_frame(evaluation, include_expected=include_expected)
    plain = _text_cells(frame, _cell)  # every cell one MLflow's JSON table can hold
    plain.columns = [safe_text.valid_utf8(str(name)) for name in plain.columns]
    mlflow.log_table(data=plain, artifact_file=f"{ARTIFACTS}/results.json", run_id=run_id)
    mlflow.log_text(results_csv(frame, index=False), f"{ARTIFACTS}/results.csv", run_id=run_id)
    failures = table.failure_counts(rows)
    metrics = {"examples": float(len(rows)), "failures": float(sum(failures.values())), **table.score_means(rows)}
    metrics |= {f"failures/{kind}": float(count) for kind, count in failures.items()}
    if "run_ms" in frame:  # the measured runs' mean time, model calls and total cost (when every one is known)
        runs = frame[frame["run_ms"].notna()]
        metrics |= {"run_ms": runs["run_ms"].mean(), "model_calls": float(runs["model_calls"].sum())}
        if runs["cost_usd"].notna().all():
            metrics["cost_usd"] = runs["cost_usd"].sum()
    return metrics


def _log_report(mlflow: Any, given: Any, run_id: str) -> dict[str, float]:
    from .report import OptimizationReport, report

    found = given if isinstance(given, OptimizationReport) else report(given)
    mlflow.log_text(str(found), f"{ARTIFACTS}/report.txt", run_id=run_id)
    mlflow.log_dict(found.to_dict(), f"{ARTIFACTS}/report.json", run_id=run_id)
    try:
        mlflow.MlflowClient().log_figure(run_id, found.plot(), f"{ARTIFACTS}/candidates.png")
    except ImportError:  # no matplotlib: the text and JSON only
        pass
    metrics: dict[str, float] = {"report/candidates": float(len(found.candidates))}
    for which, candidate in (("seed", found.seed), ("best", found.best_candidate)):
        if candidate is not None:
            metrics |= {f"report/{which}_score": candidate.score, **_flat(f"report/{which}/scores", candidate.scores)}
    if found.receipt is not None:
        metrics |= _flat("receipt", found.receipt.to_dict())
    return metrics


def _log_contract(mlflow: Any, contract: Any, run_id: str) -> dict[str, float]:
    if not all(hasattr(contract, name) for name in ("ok", "items", "to_dict")):  # a ContractReport
        raise TypeError(f"contract= takes what skynet_dspy.check_contract() returns, got {type(contract).__name__}")
    mlflow.log_text(str(contract), f"{ARTIFACTS}/contract.txt", run_id=run_id)
    mlflow.log_dict(contract.to_dict(), f"{ARTIFACTS}/contract.json", run_id=run_id)
    return {"contract/ok": 1.0 if contract.ok else 0.0}


def _flat(prefix: str, values: Any) -> dict[str, float]:
    """Every number in `values` (dicts nested), named prefix/key/...; None, bools and text left out."""
    if isinstance(values, dict):
        flat: dict[str, float] = {}
        for key, inner in values.items():
            flat |= _flat(f"{prefix}/{key}", inner)
        return flat
    return {prefix: float(values)} if isinstance(values, (int, float)) and not isinstance(values, bool) else {}


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):  # results_frame's text is valid UTF-8 already
        return value
    try:
        return safe_text.json_text(value, default=str)
    except (TypeError, ValueError):
        return safe_text.valid_utf8(str(value))
