"""Failed metric calls under real optimizers (issue 15, items 3 and 6): never a success, one failure score for
the metric and for GEPA, and a judge metric with no model says so at once, naming the fix.

BootstrapFewShot, dspy.GEPA and skynet_dspy.gepa() run against the scripted model on the loopback server.
"""

from __future__ import annotations

import logging

import dspy
import pytest
from conftest import ROOT
from support import write_metric

import skynet_dspy
from examples.program import RouteTicket, load_split
from skynet_dspy.devserver import ScriptedModel, requests_by_role, scripted_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRAIN, VAL = load_split("train"), load_split("val")

# Right labels score 1.0; a wrong label raises, so that call fails and scores the failure score.
FAILS_WHEN_WRONG = """
    def score(input, output, expected=None):
        if str(output).strip().lower() != expected["label"]:
            raise ValueError("wrong label")
        return 1.0, {"feedback": "Correct."}
    """
ALWAYS_FAILS = """
    def score(input, output, expected=None):
        raise RuntimeError("the judge is down")
    """
JUDGE = str(ROOT / "examples" / "judge_metric.py")


@pytest.fixture
def lm():
    with scripted_server() as server:
        model = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local", cache=False)
        model.server = server
        with dspy.context(lm=model):
            yield model


def _demo_tickets(program: dspy.Module) -> set[str]:
    return {demo.ticket for predictor in program.predictors() for demo in predictor.demos}


# -- 3. failures are never successes ----------------------------------------------------------


@pytest.mark.parametrize("threshold", [None, -1.0, 0.0, 0.4, 0.5, 1.0])
def test_bootstrap_never_takes_a_failed_call_as_a_demo_whatever_the_threshold(lm, tmp_path, threshold):
    metric = skynet_dspy.load_metric(write_metric(tmp_path, FAILS_WHEN_WRONG), failure_score=0.5, output_fields="label")
    optimizer = dspy.BootstrapFewShot(metric=metric, metric_threshold=threshold, max_bootstrapped_demos=16,
                                      max_labeled_demos=0, max_rounds=1)
    compiled = optimizer.compile(dspy.ChainOfThought(RouteTicket), trainset=TRAIN)
    taken = _demo_tickets(compiled)
    untold = ScriptedModel()  # what the scripted task model answers with the instructions given no rules
    right = {example.ticket for example in TRAIN if untold.classify(example.ticket)[0] == example.label}
    assert metric.stats["exception"] == len(TRAIN) - len(right) > 0  # the scripted model gets the rest wrong
    assert taken == right  # every success, and not one of the failures (each scored 0.5)
    metric.close()


def _val_scores(optimizer: dspy.GEPA) -> list[float]:
    program = optimizer.compile(dspy.ChainOfThought(RouteTicket), trainset=TRAIN[:3], valset=VAL[:3])
    return list(program.detailed_results.val_aggregate_scores)


def test_skynet_gepa_gives_one_failure_score_to_the_metric_and_to_gepa(lm, tmp_path):
    path = write_metric(tmp_path, ALWAYS_FAILS)
    optimizer = skynet_dspy.gepa(path, reflection_lm=lm, failure_score=-5, max_metric_calls=12, track_stats=True,
                                 num_threads=1)
    assert optimizer.failure_score == optimizer.skynet_metric.failure_score == -5
    assert _val_scores(optimizer) == [-5.0]  # GEPA records the failure score it was given, not 0.0
    assert optimizer.skynet_metric.stats["exception"] > 0


def test_dspy_gepa_built_by_hand_records_the_metrics_failure_score(lm, tmp_path):
    """docs/dspy.md's rule: give dspy.GEPA the metric's failure_score: GEPA records what it returns."""
    path = write_metric(tmp_path, ALWAYS_FAILS)
    matched = skynet_dspy.load_metric(path, failure_score=-5)
    assert _val_scores(dspy.GEPA(metric=matched, reflection_lm=lm, failure_score=-5, max_metric_calls=12,
                                 track_stats=True, num_threads=1)) == [-5.0]
    unmatched = skynet_dspy.load_metric(path)  # failure_score 0.0 while GEPA is told -5
    assert _val_scores(dspy.GEPA(metric=unmatched, reflection_lm=lm, failure_score=-5, max_metric_calls=12,
                                 track_stats=True, num_threads=1)) == [0.0]


# -- 6. a judge metric under plain dspy.GEPA ---------------------------------------------------


class StatsAtEmit(logging.Handler):
    """Records each ERROR of the package with the metric's call count at the moment it was logged."""

    def __init__(self, metric: skynet_dspy.Metric):
        super().__init__(logging.ERROR)
        self.metric = metric
        self.seen: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((self.metric.stats["calls"], record.getMessage()))


def test_a_judge_metric_with_no_model_logs_an_error_naming_the_fix_at_its_first_call(lm):
    metric = skynet_dspy.load_metric(JUDGE, output_fields="label")
    handler = StatsAtEmit(metric)
    package = logging.getLogger("skynet_dspy")
    package.addHandler(handler)
    try:
        dspy.GEPA(metric=metric, reflection_lm=lm, max_metric_calls=30, num_threads=1).compile(
            dspy.ChainOfThought(RouteTicket), trainset=TRAIN[:4], valset=VAL[:4])
    finally:
        package.removeHandler(handler)
    assert handler.seen, "no error was logged"
    calls, message = handler.seen[0]
    assert calls <= 1  # at once: while the first call is being scored, not after a streak
    assert "judge_not_configured" in message and "no model to call" in message
    assert "reflection_lm=" in message and "skynet_dspy.gepa(" in message  # the two fixes
    assert metric.stats["judge_not_configured"] == metric.stats["calls"] > 0
    assert not requests_by_role(lm.server.requests, "judge")
    metric.close()


@pytest.mark.parametrize("pattern", ["load_metric(reflection_lm=lm)", "skynet_dspy.gepa()"])
def test_with_either_fix_llm_reaches_the_reflection_model_and_gepa_improves(lm, pattern):
    if pattern == "skynet_dspy.gepa()":
        optimizer = skynet_dspy.gepa(JUDGE, reflection_lm=lm, output_fields="label", max_metric_calls=60,
                                     track_stats=True, num_threads=1)
        metric = optimizer.skynet_metric
    else:
        metric = skynet_dspy.load_metric(JUDGE, reflection_lm=lm, output_fields="label")
        optimizer = dspy.GEPA(metric=metric, reflection_lm=lm, max_metric_calls=60, track_stats=True, num_threads=1)
    program = optimizer.compile(dspy.ChainOfThought(RouteTicket), trainset=TRAIN, valset=VAL[:6])
    scores = program.detailed_results.val_aggregate_scores
    assert metric.stats["judge_not_configured"] == 0 and metric.stats["calls"] > 0
    assert len(requests_by_role(lm.server.requests, "judge")) == metric.judge_usage.requests > 0
    assert max(scores) > scores[0]
    metric.close()
