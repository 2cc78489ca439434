"""What a newcomer to plain GEPA hits: optimize_anything() and make_evaluator() leave no worker process running,
and no LiteLLM banner reaches the terminal from the package's own reflection calls to an unpriced local model."""

from __future__ import annotations

import os
from pathlib import Path

import skynet_dspy
from skynet_dspy.devserver import DevServer

METRIC = Path(__file__).resolve().parents[1] / "metrics" / "exact_match.py"
DATA = [{"input": {"q": "x"}, "expected": {"label": "x"}}]


def children() -> set[int]:
    """This process's child processes (every thread's), from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found |= {int(pid) for pid in (task / "children").read_text().split()}
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _run(artifact, input):
    return artifact


def _reflect(prompt):
    return "```\nx\n```"


def test_optimize_anything_stops_every_worker_it_started(capfd):
    before = children()
    for _ in range(3):
        result = skynet_dspy.optimize_anything("y", _run, str(METRIC), DATA, reflection_lm=_reflect,
                                               max_metric_calls=4)
        assert result.best_candidate in ("x", "y")
    assert children() - before == set()
    # the control: a Metric given stays its owner's, its workers running until it is closed
    with skynet_dspy.load_metric(str(METRIC)) as metric:
        skynet_dspy.optimize_anything("y", _run, metric, DATA, reflection_lm=_reflect, max_metric_calls=4)
        assert children() - before
    assert children() - before == set()


def test_make_evaluator_stops_its_workers_on_close_and_in_a_with_block():
    before = children()
    for isolation in ("thread", "process", "process"):
        with skynet_dspy.make_evaluator(_run, str(METRIC), run_isolation=isolation) as evaluator:
            score, _ = evaluator("x", DATA[0])
            assert score == 1.0
            assert children() - before  # the metric's worker (and run()'s, with "process")
    assert children() - before == set()


def test_no_litellm_banner_from_reflection_calls_to_an_unpriced_local_model(capfd):
    with DevServer(model_name="my-local-model") as server:
        server.responder = lambda request: "```\nx\n```"
        model = {"model": "openai/my-local-model", "api_base": server.url, "api_key": "local"}
        skynet_dspy.optimize_anything("y", _run, str(METRIC), DATA, reflection_lm=model, max_metric_calls=4,
                                      isolation="thread")
        reflections = [request for request in server.requests if "```" in request.text]
    assert reflections  # the reflection model was called, unpriced
    out, err = capfd.readouterr()
    assert "Provider List" not in out + err and "Give Feedback" not in out + err
