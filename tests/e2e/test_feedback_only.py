"""Proof that only feedback reaches the reflection model, over a whole DSPy GEPA run.

The promise: docs/contract.md#what-the-optimizer-sees.

The bundled example runs under GEPA against the scripted server, which records every request. The
metric returns, besides its feedback, extra side-information keys holding unique markers and a
copy of the expected values; the dataset's `gold_id` label is an expected value the metric never
writes into feedback. None of them may appear in any reflection request, while the reflection
requests must carry the metric's own feedback texts, verbatim.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import dspy
import pytest

import skynet_dspy
from examples import metric as example_metric
from examples.program import load_split, make_program
from skynet_dspy.devserver import scripted_server
from skynet_dspy.devserver.scripted import requests_by_role

EXTRA_KEYS = ("private_marker", "expected_copy")


class RecordingMetric:
    """The example's score, plus extra side-information keys with unique marker values; records all it returns."""

    def __init__(self):
        self.lock = threading.Lock()
        self.feedback: set[str] = set()
        self.markers: list[str] = []

    def __call__(self, input, output, expected=None):
        total, info = example_metric.score(input, output, expected)
        marker = f"SIDE-INFO-{uuid.uuid4().hex}"
        info["private_marker"] = marker
        info["expected_copy"] = dict(expected)
        with self.lock:
            self.feedback.add(info["feedback"])
            self.markers.append(marker)
        return total, info


def _examples_shown(request) -> list[dict]:
    """The reflective examples DSPy's instruction proposer put in one reflection request."""
    user = [m for m in request.messages if m.get("role") == "user"][-1]["content"]
    start = user.index("[[ ## examples_with_feedback ## ]]") + len("[[ ## examples_with_feedback ## ]]")
    rest = user[start:]
    end = rest.find("[[ ##")
    body = rest[:end] if end >= 0 else rest
    body = body.rsplit("Respond with", 1)[0] if end < 0 else body
    return json.loads(body.strip())


@pytest.fixture(scope="module")
def gepa_run():
    server = scripted_server()
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    recorder = RecordingMetric()
    train, val = load_split("train"), load_split("val")
    optimizer = skynet_dspy.gepa(
        recorder,
        lm,
        # The recorder keeps what score returned in this process, so score runs here, not in a worker.
        metric_options={"output_fields": "label", "isolation": "thread"},
        max_metric_calls=60,
        seed=0,
        num_threads=2,
        track_stats=True,
        candidate_selection_strategy="current_best",
    )
    try:
        with dspy.context(lm=lm):
            optimized = optimizer.compile(make_program(), trainset=train, valset=val)
    finally:
        server.stop()
    return server, recorder, train + val, optimized


def test_reflection_requests_carry_the_metrics_feedback_verbatim(gepa_run):
    server, recorder, dataset, _ = gepa_run
    reflections = requests_by_role(server.requests, "reflection")
    assert len(reflections) >= 2, "GEPA should have asked the reflection model for new instructions"
    tickets = {example.ticket for example in dataset}
    for request in reflections:
        shown = _examples_shown(request)
        assert shown, "a reflection request without examples"
        for example in shown:
            assert set(example) == {"Inputs", "Generated Outputs", "Feedback"}
            assert set(example["Inputs"]) == {"ticket"}
            assert example["Inputs"]["ticket"] in tickets
            assert set(example["Generated Outputs"]) <= {"reasoning", "label"}
            assert example["Feedback"] in recorder.feedback, "feedback the metric did not write reached reflection"
    shown_feedback = {example["Feedback"] for request in reflections for example in _examples_shown(request)}
    # Feedback the metric wrote (expected label and cue included, by its own choice) does reach the model.
    assert any(text.startswith("Expected '") for text in shown_feedback)


def test_no_expected_value_or_extra_key_reaches_the_reflection_model(gepa_run):
    server, recorder, dataset, _ = gepa_run
    gold_ids = [example.gold_id for example in dataset]
    assert len(set(gold_ids)) == len(dataset) and recorder.markers, "the run must have produced markers to look for"
    # The markers were really returned by the metric: the contract keeps them as extra keys.
    assert len(recorder.markers) >= len(dataset)
    forbidden = [*gold_ids, *recorder.markers, *EXTRA_KEYS, "gold_id", "run_ms", "cost_usd", "objective_scores"]
    source = Path(example_metric.__file__).read_text()
    forbidden += ["REWARD_SPEC", "def score", source.splitlines()[0]]
    reflections = requests_by_role(server.requests, "reflection")
    assert reflections
    for request in reflections:
        raw = json.dumps(request.body)
        leaked = [value for value in forbidden if value in raw or value in request.text]
        assert not leaked, f"reached the reflection model: {leaked[:5]}"
    # The program's own requests (the task model) never see labels either.
    for request in requests_by_role(server.requests, "task"):
        raw = json.dumps(request.body)
        assert not [value for value in gold_ids + recorder.markers if value in raw]


def test_feedback_lines_of_every_reflected_example_come_from_one_metric_call(gepa_run):
    """Each example's feedback names its own ticket's cue: feedback is matched to the right example."""
    server, _, dataset, _ = gepa_run
    by_ticket = {example.ticket: example for example in dataset}
    for request in requests_by_role(server.requests, "reflection"):
        for shown in _examples_shown(request):
            example = by_ticket[shown["Inputs"]["ticket"]]
            assert f"mentions '{example.cue}', which points to {example.label}" in shown["Feedback"]
            assert example.gold_id not in shown["Feedback"]


def test_the_run_improved_the_program(gepa_run):
    _, _, _, optimized = gepa_run
    scores = optimized.detailed_results.val_aggregate_scores
    assert max(scores) > scores[0]
