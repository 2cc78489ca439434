"""Results people look at: the per-example table, the optimization report with its cost receipt, MLflow logging,
and scoring many cases from the command line.

table.py lays out one row per example (no pandas); frame.py makes it a DataFrame (styled, or a safe CSV);
report.py, receipt.py and plot.py describe a GEPA run; mlflow.py logs all of it; scoring.py and progress.py
(tqdm) serve `skynet-dspy score`. pandas, matplotlib and mlflow are optional extras, imported on first use.
"""

from __future__ import annotations

from .frame import results_csv, results_frame, results_style
from .mlflow import log_to_mlflow
from .receipt import CostReceipt
from .report import Candidate, OptimizationReport, report

__all__ = ["Candidate", "CostReceipt", "OptimizationReport", "log_to_mlflow", "report", "results_csv", "results_frame",
           "results_style"]
