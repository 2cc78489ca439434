"""Results people look at: the per-example table (table.py, frame.py), a GEPA run's report and receipt, MLflow
logging, and `skynet-dspy score` (scoring.py, progress.py). pandas, matplotlib and mlflow are optional extras.
"""

from __future__ import annotations

from .frame import results_csv, results_frame, results_style
from .mlflow import log_to_mlflow
from .receipt import CostReceipt
from .report import Candidate, OptimizationReport, report

__all__ = ["Candidate", "CostReceipt", "OptimizationReport", "log_to_mlflow", "report", "results_csv", "results_frame",
           "results_style"]
