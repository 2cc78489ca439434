"""check_contract(..., repeat=N): each case scored N times, the judge asked again each time (docs/trustworthy.md)."""

from __future__ import annotations

import logging
import random

import pytest
from support import returning, write_metric

from skynet_dspy import check_contract
from skynet_dspy.devserver import DevServer

QUESTIONS = ["sure: good one", "maybe: this", "sure: bad one", "maybe: that", "sure: good two", "sure: bad two"]
RANDOM_CASES = [2, 4]  # the "maybe" questions, which the judge below answers at random
CASES = [{"input": {"question": question}, "output": "an answer"} for question in QUESTIONS]


class CoinJudge:
    """A loopback judge: PASS or FAIL by the question for "sure" ones, a (seeded) coin toss for "maybe" ones."""

    def __init__(self) -> None:
        self.coin = random.Random(3)

    def __call__(self, request) -> str:
        text = request.user
        if "maybe" in text:
            return self.coin.choice(["PASS. Looks right.", "FAIL. Looks wrong."])
        return "PASS. Right." if "good" in text else "FAIL. Wrong."


@pytest.fixture
def judge_server():
    with DevServer(model_name="gpt-4o-mini", responder=CoinJudge()) as running:
        yield running


def model(server) -> dict:
    return {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": "local-test-key"}


def test_repeat_finds_exactly_the_cases_the_judge_answers_at_random(judge_server, metrics_dir, caplog):
    once = check_contract(metrics_dir / "judge.py", CASES, max_cases=None, metric_lm=model(judge_server))
    sent_once = len(judge_server.requests)
    assert sent_once == len(CASES)
    assert "Scores are stable" not in [item.name for item in once.items]  # only when asked for

    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        report = check_contract(metrics_dir / "judge.py", CASES, max_cases=None, metric_lm=model(judge_server),
                                repeat=5)
    assert len(judge_server.requests) - sent_once == 5 * sent_once  # the cache answers none of the repeats
    item = report.item("Scores are stable")
    assert item.status == "warning"
    assert "case 2:" in item.message and "case 4:" in item.message
    assert "case 1:" not in item.message and "case 3:" not in item.message
    figures = report.to_dict()["stability"]
    assert figures["unstable_cases"] == RANDOM_CASES
    assert figures["verdict_changed_share"] == pytest.approx(2 / 6)
    assert figures["judge_requests"] == 4 * len(CASES)
    for case in figures["cases"]:
        assert len(case["score"]["values"]) == 5
        expected_spread = 1.0 if case["case"] in RANDOM_CASES else 0.0
        assert case["score"]["spread"] == expected_spread
        # each run's own feedback, to read where the judge's reasons differ
        assert len(case["feedback"]) == 5 and len(set(case["feedback"])) == (2 if case["case"] in RANDOM_CASES else 1)
    # the cost was shown before the repeats ran, estimated from the first pass
    estimate = [record.getMessage() for record in caplog.records if "repeating each case" in record.getMessage()]
    assert estimate and "24 more call(s)" in estimate[0] and "about 24 judge request(s)" in estimate[0]
    assert "$" in estimate[0]
    assert "Stability (5 runs per case" in str(report)
    assert report.ok  # stability warns; it never breaks the contract


def test_a_judge_spending_cap_still_holds_over_the_repeats(judge_server, metrics_dir):
    report = check_contract(metrics_dir / "judge.py", CASES, max_cases=None, metric_lm=model(judge_server),
                            repeat=20, max_judge_cost_usd=0.0004)
    stability = report.stability
    assert stability is not None and stability.stopped is not None
    assert "max_judge_cost_usd" in stability.stopped
    assert len(judge_server.requests) < 20 * len(CASES)
    assert "stopped early" in report.item("Scores are stable").message


def test_a_metric_without_a_judge_is_stable_and_costs_no_judge_request(tmp_path, caplog):
    metric = returning(tmp_path, '(len(output) / 10, {"feedback": "ok", "scores": {"length": len(output)}})')
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        report = check_contract(metric, CASES, repeat=3)
    item = report.item("Scores are stable")
    assert item.status == "passed", item
    assert "within 0.1 over 3 runs per case" in item.message
    assert any("no llm() request" in record.getMessage() for record in caplog.records)
    assert report.stability is not None
    assert [case.scores["length"].values for case in report.stability.cases] == [(9.0, 9.0, 9.0)] * 3


def test_a_named_score_that_varies_warns_and_max_spread_is_settable(tmp_path):
    metric = write_metric(tmp_path, """
        import random

        def score(input, output, expected=None):
            return 1.0, {"feedback": "ok", "scores": {"style": random.choice([0.5, 0.7])}}
    """)
    loose = check_contract(metric, CASES[:1], repeat=12, max_spread=0.5)
    assert loose.item("Scores are stable").status == "passed"
    strict = check_contract(metric, CASES[:1], repeat=12)
    item = strict.item("Scores are stable")
    assert item.status == "warning" and "style 0.5 to 0.7" in item.message


def test_a_broken_contract_is_not_repeated(tmp_path):
    metric = returning(tmp_path, "0.5")
    report = check_contract(metric, CASES, repeat=5)
    item = report.item("Scores are stable")
    assert item.status == "not run" and "contract is broken" in item.message
    assert report.stability is None


@pytest.mark.parametrize(("options", "message"), [
    ({"repeat": 0}, "repeat must be a whole number"),
    ({"repeat": 2.5}, "repeat must be a whole number"),
    ({"repeat": 2, "max_spread": -1}, "max_spread must be 0 or more"),
    ({"repeat": 2, "max_spread": "wide"}, "max_spread must be a finite number"),
])
def test_bad_repeat_options_are_named(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        check_contract(returning(tmp_path, '(1.0, {"feedback": "ok"})'), CASES, **options)


def test_a_metric_that_does_not_load_lists_the_items_asked_for_as_not_run(tmp_path):
    broken = write_metric(tmp_path, "def score(input, output, expected=None):\n    return (\n")
    report = check_contract(broken, CASES, repeat=3, human=[1] * len(CASES))
    assert report.item("Metric loads").status == "failed"
    assert report.item("Scores are stable").status == "not run"
    assert report.item("Agrees with people").status == "not run"
    plain = check_contract(broken, CASES)
    assert "Scores are stable" not in [item.name for item in plain.items]
