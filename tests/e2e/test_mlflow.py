"""log_to_mlflow() against a real local MLflow tracking store (a sqlite file in a temporary folder, no server),
read back with mlflow.MlflowClient: named-score means as run metrics, the per-example table with score, feedback
and each named score, the judge usage, the cost receipt, and the contract report as artifacts."""

from __future__ import annotations

import contextlib
import io
import json

import dspy
import mlflow
import pytest
from support import write_metric

import skynet_dspy
from examples.program import load_split, make_program
from skynet_dspy.devserver.scripted import scripted_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

METRIC = '''
def score(input, output, expected=None):
    if input["question"] == "boom":
        raise ValueError("broken")
    right = output == expected["answer"]
    return (0.9 if right else 0.1), {
        "feedback": "Right." if right else "Wrong.",
        "scores": {"accuracy": float(right), "brevity": 1.0 / len(output)},
    }
'''


class Shout(dspy.Module):
    def forward(self, question):
        return dspy.Prediction(answer=question.upper())


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """One local sqlite tracking store for the module (creating its tables takes seconds)."""
    folder = tmp_path_factory.mktemp("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    try:
        yield folder
    finally:
        mlflow.set_tracking_uri(previous)


@pytest.fixture
def store(database, tmp_path):
    """A fresh experiment in the local store, its artifacts in tmp_path; no run left active after."""
    artifacts = (tmp_path / "artifacts").as_uri()
    experiment = mlflow.create_experiment(f"skynet-{tmp_path.name}", artifact_location=artifacts)
    mlflow.set_experiment(experiment_id=experiment)
    try:
        yield mlflow.MlflowClient()
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()


@pytest.fixture
def evaluated(tmp_path):
    metric = skynet_dspy.load_metric(write_metric(tmp_path, METRIC), measure=True)
    devset = [dspy.Example(question=q, answer=a).with_inputs("question")
              for q, a in [("ab", "AB"), ("cd", "XY"), ("efg", "EFG"), ("boom", "BOOM")]]
    evaluation = dspy.Evaluate(devset=devset, metric=metric, num_threads=1, display_progress=False)(Shout())
    yield metric, evaluation
    metric.close()


def _artifacts(client, run_id):
    return sorted(item.path for item in client.list_artifacts(run_id, "skynet"))


def test_an_evaluation_logs_named_score_means_and_the_table_beside_score_and_feedback(store, evaluated, tmp_path):
    metric, evaluation = evaluated
    cases = [{"input": {"question": "ab"}, "output": "AB", "expected": {"answer": "AB"}},
             {"input": {"question": "cd"}, "expected": {"answer": "CD"}}]
    contract = skynet_dspy.check_contract(metric, cases)
    with mlflow.start_run() as run:
        assert skynet_dspy.log_to_mlflow(evaluation, metric=metric, contract=contract) == run.info.run_id

    logged = store.get_run(run.info.run_id)
    metrics = logged.data.metrics
    assert metrics["score"] == pytest.approx((0.9 + 0.1 + 0.9 + 0.0) / 4)
    assert metrics["scores/accuracy"] == pytest.approx(2 / 3)  # over the calls that gave it
    assert metrics["scores/brevity"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    assert (metrics["failures"], metrics["failures/exception"], metrics["examples"]) == (1, 1, 4)
    assert metrics["run_ms"] > 0 and metrics["cost_usd"] == 0 and metrics["model_calls"] == 0
    assert metrics["judge/requests"] == 0 and metrics["judge/cache_hits"] == 0
    assert metrics["contract/ok"] == 1.0
    assert _artifacts(store, run.info.run_id) == [
        "skynet/contract.json", "skynet/contract.txt", "skynet/results.csv", "skynet/results.json"]

    table = mlflow.load_table("skynet/results.json", run_ids=[run.info.run_id])
    assert list(table.columns[:7]) == ["question", "output", "score", "accuracy", "brevity", "feedback", "failure"]
    assert table["score"].tolist() == [0.9, 0.1, 0.9, 0.0]
    assert table["accuracy"].tolist()[:3] == [1.0, 0.0, 1.0]
    assert table["feedback"].tolist()[:2] == ["Right.", "Wrong."]
    assert table["failure"].tolist() == ["", "", "", "exception"]
    assert "XY" not in json.dumps(table.to_dict())  # expected values stay out unless include_expected=True

    folder = tmp_path / "downloaded"
    store.download_artifacts(run.info.run_id, "skynet", str(folder))
    assert json.loads((folder / "skynet" / "contract.json").read_text())["ok"] is True
    assert "Contract check of" in (folder / "skynet" / "contract.txt").read_text()


NAMED_SCORE = '''
def score(input, output, expected=None):
    return 1.0, {"feedback": "ok", "scores": {"score": 0.25}}
'''


def test_a_named_score_called_score_is_logged_apart_from_the_mean_score(store, tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, NAMED_SCORE)) as metric:
        devset = [dspy.Example(question=q, answer=q).with_inputs("question") for q in ("ab", "cd")]
        evaluation = dspy.Evaluate(devset=devset, metric=metric, display_progress=False)(Shout())
    with mlflow.start_run() as run:
        skynet_dspy.log_to_mlflow(evaluation)
    metrics = store.get_run(run.info.run_id).data.metrics
    assert (metrics["score"], metrics["scores/score"]) == (1.0, 0.25)


def test_a_gepa_run_logs_its_receipt_and_report(store, tmp_path):
    with scripted_server() as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
        optimizer = skynet_dspy.gepa("examples/metric.py", lm, output_fields="label", max_metric_calls=30, seed=0,
                                     candidate_selection_strategy="current_best")
        with dspy.context(lm=lm), contextlib.redirect_stderr(io.StringIO()):
            optimizer.compile(make_program(), trainset=load_split("train"), valset=load_split("val"))
    report = skynet_dspy.report(optimizer)
    run_id = skynet_dspy.log_to_mlflow(report=optimizer, metric=optimizer.skynet_metric)  # no active run: a new one

    logged = store.get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "skynet-dspy"
    metrics = logged.data.metrics
    receipt = report.receipt
    assert metrics["receipt/program/cost_usd"] == pytest.approx(receipt.program.cost_usd)
    assert metrics["receipt/program/model_calls"] == receipt.program.model_calls
    assert metrics["receipt/reflection/calls"] == receipt.reflection.calls > 0
    assert metrics["receipt/total_usd"] == pytest.approx(receipt.total_usd)
    assert metrics["report/best_score"] == pytest.approx(report.best_candidate.score)
    assert metrics["report/seed_score"] == pytest.approx(report.seed.score)
    assert metrics["report/best/scores/accuracy"] == pytest.approx(report.named_scores["accuracy"][1])
    assert metrics["report/candidates"] == len(report.candidates)
    assert _artifacts(store, run_id) == ["skynet/candidates.png", "skynet/report.json", "skynet/report.txt"]


def test_logging_onto_a_run_named_by_id_and_what_is_refused(store, evaluated):
    metric, evaluation = evaluated
    with mlflow.start_run() as run:
        pass
    assert skynet_dspy.log_to_mlflow(evaluation, run_id=run.info.run_id) == run.info.run_id
    assert store.get_run(run.info.run_id).data.metrics["scores/accuracy"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="needs something to log"):
        skynet_dspy.log_to_mlflow()
    with pytest.raises(TypeError, match="check_contract"):
        skynet_dspy.log_to_mlflow(contract="report.txt", run_id=run.info.run_id)


def test_without_mlflow_the_error_names_the_extra(monkeypatch, evaluated):
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(skynet_dspy.MissingExtra, match=r"skynet-dspy\[mlflow\]"):
        skynet_dspy.log_to_mlflow(evaluated[1])
