"""Safe output end to end: results_frame's HTML in a real Jupyter kernel (the stored text/html holds no live
markup), log_to_mlflow with hostile named-score names and feedback against a real local MLflow store, and a
6-character password that never shows in a Score, a report, an error, a log record or a worker's environment."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import sys

import dspy
import mlflow
import nbformat
import pytest
from gepa.core.result import GEPAResult
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from support import write_metric

import skynet_dspy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MARKUP_METRIC = '''
def score(input, output, expected=None):
    return 0.5, {
        "feedback": "<img src=x onerror=alert(1)> " + input["question"] + " <script>alert(2)</script>",
        "scores": {"<svg onload=alert(3)>": 1.0, "=HYPERLINK(1)": -0.25, "cost in $\\\\usd$": 0.5},
    }
'''
STYLER_TAGS = {"style", "table", "thead", "tbody", "tr", "th", "td", "caption"}


def _live_tags(html: str) -> set[str]:
    return {tag.lower() for tag in re.findall(r"<\s*/?\s*([a-zA-Z][a-zA-Z0-9]*)", html)} - STYLER_TAGS


def test_results_frame_html_in_a_real_kernel_holds_no_live_markup(tmp_path, monkeypatch):
    metric = write_metric(tmp_path, MARKUP_METRIC)
    source = f'''
import dspy, skynet_dspy

class Echo(dspy.Module):
    def forward(self, question, **fields):
        return dspy.Prediction(answer="<iframe src=javascript:alert(4)>", note="<b onmouseover=alert(5)>x</b>")

devset = [dspy.Example(question=q, **{{"<th>field": "<u>x</u>"}}).with_inputs("question", "<th>field")
          for q in ["<svg/onload=alert(6)>", "\\x1b]52;c;eA==\\x07", "half \\ud83d", "<i>" * 100_000]]
metric = skynet_dspy.load_metric({str(metric)!r})
evaluation = dspy.Evaluate(devset=devset, metric=metric, num_threads=1, display_progress=False)(Echo())
metric.close()
frame = skynet_dspy.results_frame(evaluation)
display(frame)
skynet_dspy.results_style(frame)
'''
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    monkeypatch.setenv("MPLBACKEND", "Agg")
    manager = KernelManager(kernel_name="python3")
    assert manager.format_kernel_cmd()[0] == sys.executable, manager.kernel_spec.argv
    NotebookClient(notebook, km=manager, timeout=180, allow_errors=False,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [output for output in notebook.cells[0].outputs if "text/html" in output.get("data", {})]
    assert len(outputs) == 2, notebook.cells[0].outputs  # the plain frame, and results_style(frame)
    for output in outputs:
        html = output["data"]["text/html"]
        assert _live_tags(html) <= {"div"}, _live_tags(html)  # pandas wraps its own table in a div
        for shown in ("&lt;img src=x onerror=alert(1)&gt;", "&lt;svg onload=alert(3)&gt;", "&lt;th&gt;field",
                      "&lt;iframe src=javascript:alert(4)&gt;", "&lt;b onmouseover=alert(5)&gt;", "\\ud83d"):
            assert shown in html, shown
    nbformat.writes(notebook).encode("utf-8")  # the notebook saves


def _report_result() -> GEPAResult:
    names = ["$$", "cost in $\\usd$", "$" + "{" * 500 + "$", "<img src=x onerror=alert(1)>"]
    return GEPAResult(
        candidates=[{"prompt": "Answer."}, {"prompt": "Answer =HYPERLINK(1) \ud83d."}],
        parents=[[None], [0]], val_aggregate_scores=[0.25, 0.75], val_subscores=[{0: 0.25}, {0: 0.75}],
        per_val_instance_best_candidates={0: {1}}, discovery_eval_counts=[2, 8],
        val_aggregate_subscores=[{name: 0.25 for name in names}, {name: 0.75 for name in names}],
        total_metric_calls=10,
    )


@pytest.fixture
def store(tmp_path):
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("safe-output", artifact_location=(tmp_path / "artifacts").as_uri())
    mlflow.set_experiment(experiment_id=experiment)
    try:
        yield mlflow.MlflowClient()
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)


class Shout(dspy.Module):
    def forward(self, question):
        return dspy.Prediction(answer=question)


def test_log_to_mlflow_with_hostile_names_and_feedback_writes_safe_files(store, tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, MARKUP_METRIC)) as metric:
        questions = ['=HYPERLINK("http://evil.example","x")', "@SUM(1)", "+1+cmd", "-1+cmd", "a\rb", "\ud83d"]
        devset = [dspy.Example(question=q, answer=q).with_inputs("question") for q in questions]
        evaluation = dspy.Evaluate(devset=devset, metric=metric, display_progress=False)(Shout())
        contract = skynet_dspy.check_contract(metric, [{"input": {"question": "\ud83d"}, "output": "x"}])
    run_id = skynet_dspy.log_to_mlflow(evaluation, report=_report_result(), contract=contract)

    folder = tmp_path / "downloaded"
    store.download_artifacts(run_id, "skynet", str(folder))
    names = sorted(path.name for path in (folder / "skynet").iterdir())
    assert "candidates.png" in names and "results.csv" in names and "report.json" in names
    text = (folder / "skynet" / "results.csv").read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert len(rows) == len(questions) + 1
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell
            assert not cell.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", cell), cell
    json.loads((folder / "skynet" / "report.json").read_text(encoding="utf-8"))
    json.loads((folder / "skynet" / "contract.json").read_text(encoding="utf-8"))
    metrics = store.get_run(run_id).data.metrics
    assert metrics["report/best_score"] == 0.75 and metrics["report/best/scores/__"] == 0.75  # "$$" as a key


PASSWORD = "hunt3r"  # six characters: masked although it is short
LATE = "zq9x2w"
CANARY = '''
import os

def score(input, output, expected=None):
    if input["question"] == "boom":
        raise ValueError("login failed for " + output)
    has = "MY_SERVICE_PASSWORD" in os.environ or "hunt3r" in repr(dict(os.environ))
    return 0.5, {"feedback": f"you said {output}; worker has it: {has}", "scores": {"acc": 1.0},
                 "note": "the password is " + output}
'''


def test_a_six_character_password_never_shows(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MY_SERVICE_PASSWORD", PASSWORD)  # set after the package was imported
    caplog.set_level(logging.INFO, logger="skynet_dspy")
    with skynet_dspy.load_metric(write_metric(tmp_path, CANARY)) as metric:
        devset = [dspy.Example(question=q, answer=PASSWORD).with_inputs("question") for q in ("hi", "boom")]

        class Leak(dspy.Module):
            def forward(self, question):
                return dspy.Prediction(answer=f"pw={PASSWORD} {LATE}")

        monkeypatch.setenv("OTHER_SERVICE_PASSWORD", LATE)  # set after the metric was loaded
        evaluation = dspy.Evaluate(devset=devset, metric=metric, display_progress=False)(Leak())
        contract = skynet_dspy.check_contract(metric, [{"input": {"question": "hi"}, "output": PASSWORD},
                                                       {"input": {"question": "boom"}, "output": PASSWORD}])
        scores = [score for _, _, score in evaluation.results]
        texts = [repr(score) for score in scores] + [repr(score.result) for score in scores] + [str(score.result)
                                                                                               for score in scores]
    texts += [str(contract), contract._repr_html_(), contract.to_json(), repr(contract)]
    frame = skynet_dspy.results_frame(evaluation)
    texts += [frame._repr_html_(), repr(frame), frame.to_csv(), skynet_dspy.results_style(frame).to_html(),
              skynet_dspy.results_csv(frame)]
    texts += [record.getMessage() for record in caplog.records] + [caplog.text]
    broken = write_metric(tmp_path, f'raise RuntimeError("cannot log in with {PASSWORD}")\n', name="broken.py")
    with pytest.raises(skynet_dspy.errors.MetricLoadError) as raised:
        skynet_dspy.load_metric(broken)
    texts += [str(raised.value), repr(raised.value)]
    everything = "\n".join(texts)
    assert PASSWORD not in everything and LATE not in everything
    assert "you said pw=*** ***" in everything and "worker has it: False" in everything
    assert "login failed for" in everything and "cannot log in with ***" in everything
