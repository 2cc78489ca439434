"""max_judge_cost_usd=: the judge's measured dollars against a cap, under threads, through a metric."""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest

import skynet_dspy
from skynet_dspy._judge import Judge
from skynet_dspy._judge.spend import SpendCap
from skynet_dspy.errors import SpendCapReached

KEY = "spend-test-key-4242"
# gpt-4o-mini's LiteLLM price: $0.15 per million prompt tokens, $0.60 per million completion tokens
COST = 1000 * 0.15e-6 + 1000 * 0.60e-6  # one answer of 1000 + 1000 tokens: $0.00075
THREADS = 8


def priced(request):
    return {"content": f"PASS. {request.user}", "prompt_tokens": 1000, "completion_tokens": 1000}


def test_a_cap_refuses_once_reached_and_counts_the_refusals(caplog):
    cap = SpendCap("max_judge_cost_usd", 0.002, "the judge")
    cap.check()
    cap.charge(0.0015)
    cap.check()  # $0.0015 < $0.002: still open
    with caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        cap.charge(0.001)
        for _ in range(3):
            with pytest.raises(SpendCapReached, match=r"the judge's measured model spend \$0\.002500 reached "
                                                      r"max_judge_cost_usd=0\.002"):
                cap.check()
    figures = cap.snapshot()
    assert figures.reached and figures.refused == 3 and figures.spent_usd == pytest.approx(0.0025)
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1  # logged once


@pytest.mark.parametrize("bad", [-1, "5", float("nan"), float("inf"), True])
def test_a_bad_cap_is_refused_naming_the_option(bad, metrics_dir):
    with pytest.raises(ValueError, match=r"max_judge_cost_usd must be a number of US dollars, 0 or more"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", max_judge_cost_usd=bad)
    with pytest.raises(ValueError, match=r"max_program_cost_usd must be a number of US dollars"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", max_program_cost_usd=bad)


def test_an_unpriced_request_is_refused_under_a_cap_with_the_reason_and_never_sent(server):
    server.responder = priced
    server.model_name = None
    judge = Judge(metric_lm={"model": "openai/no-such-priced-model", "api_base": server.url, "api_key": KEY},
                  max_cost_usd=0.001, max_retries=0)
    for number in range(3):
        with pytest.raises(SpendCapReached, match=r"cost cannot be known \(no price known for model "
                                                  r"openai/no-such-priced-model\).*cannot be counted as free"):
            judge.complete("Grade.", f"answer {number}")
    assert not server.requests
    assert judge.spend_cap.snapshot().refused == 3 and not judge.spend_cap.reached


def test_an_unpriced_answer_without_a_cap_is_cost_unknown_never_zero(server):
    server.responder = priced
    server.model_name = None
    judge = Judge(metric_lm={"model": "openai/no-such-priced-model", "api_base": server.url, "api_key": KEY},
                  max_retries=0)
    judge.complete("Grade.", "answer")
    assert judge.usage.cost_usd is None and judge.usage.requests == 1


def test_the_judge_cap_holds_under_threads_with_bounded_overshoot(caplog):
    from skynet_dspy.devserver import DevServer

    limit = 4 * COST - 1e-9  # reached by the 4th answer
    with DevServer(priced, model_name="gpt-4o-mini", delay=0.05) as server:
        judge = Judge(metric_lm={"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY},
                      max_cost_usd=limit, max_retries=0)
        refused, answered = [], []
        lock = threading.Lock()

        def ask(number: int) -> None:
            try:
                text = judge.complete("Grade.", f"answer {number}")
            except SpendCapReached:
                with lock:
                    refused.append(number)
            else:
                with lock:
                    answered.append(text)

        with caplog.at_level(logging.ERROR, logger="skynet_dspy"), ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(ask, range(80)))
        sent = len(server.requests)
    spend = judge.spend_cap.snapshot()
    reached_at = math.ceil(limit / COST)
    # the calls sent before the cap was reached, plus at most the others already in flight then
    assert reached_at <= sent <= reached_at + THREADS - 1
    assert len(answered) == sent and len(refused) == 80 - sent == spend.refused
    assert spend.spent_usd == pytest.approx(sent * COST)  # so the overshoot is at most THREADS - 1 answers
    assert judge.usage.cost_usd == pytest.approx(spend.spent_usd)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "max_judge_cost_usd" in errors[0]


def test_cache_hits_still_answer_once_the_cap_is_reached(server):
    server.responder = priced
    judge = Judge(metric_lm={"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY},
                  max_cost_usd=COST / 2, max_retries=0)
    first = judge.complete("Grade.", "kept")
    assert judge.spend_cap.reached
    assert judge.complete("Grade.", "kept") == first  # free: from the cache
    with pytest.raises(SpendCapReached):
        judge.complete("Grade.", "new")
    assert len(server.requests) == 1


JUDGE_METRIC = """
from skynet import llm

def score(input, output, expected=None):
    verdict = llm("Answer PASS or FAIL.", input=output)
    return (1.0 if verdict.startswith("PASS") else 0.0), {"feedback": verdict}
"""


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_metric_past_its_judge_cap_fails_calls_with_neutral_feedback(tmp_path, isolation, caplog):
    from skynet_dspy.devserver import DevServer

    (tmp_path / "judge_metric.py").write_text(JUDGE_METRIC, encoding="utf-8")
    examples = [dspy.Example(question=f"q{n}", answer=f"a{n}").with_inputs("question") for n in range(40)]
    program = dspy.Predict("question -> answer")
    program.forward = lambda question: dspy.Prediction(answer=f"a-{question}")
    with DevServer(priced, model_name="gpt-4o-mini", delay=0.02) as server, \
            caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
        with skynet_dspy.load_metric(tmp_path / "judge_metric.py", metric_lm=model, isolation=isolation,
                                     max_judge_cost_usd=3 * COST - 1e-9) as metric:
            result = dspy.Evaluate(devset=examples, metric=metric, num_threads=THREADS, display_progress=False)(program)
            stats, spend, stopped = metric.stats, metric.spend["max_judge_cost_usd"], metric.stop_callback(None)
        sent = len(server.requests)
    assert 3 <= sent <= 3 + THREADS - 1
    assert stats["calls"] == 40 and stats["spend_cap"] == 40 - sent == spend.refused
    assert stopped is True and metric.spend_cap_reached
    capped = [score for _, _, score in result.results if not score.ok]
    assert len(capped) == 40 - sent
    assert {score.feedback for score in capped} == {"Not scored: a spending cap was reached, so no more model "
                                                    "calls are made."}
    assert all(score.result.failure == "spend_cap" and "max_judge_cost_usd" in score.result.detail for score in capped)
    records = [r for r in caplog.records if r.name == "skynet_dspy"]
    assert len([r for r in records if r.levelno >= logging.ERROR]) == 1  # the cap, once; no failure-streak alarm
    assert not [r for r in records if "spend_cap" in r.getMessage() and r.levelno == logging.WARNING]


# a metric that starts 16 threads of its own, each asking the judge again and again, swallowing refusals
SIXTEEN_THREADS = """
import contextvars, threading
from skynet import llm

def score(input, output, expected=None):
    def ask(n):
        for attempt in range(10):
            try:
                llm("Answer PASS or FAIL.", input=f"{output} {n} {attempt}")
            except Exception:
                pass
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask, n)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (1.0, {"feedback": "asked"})
"""


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_16_metric_threads_cannot_overshoot_the_cap_by_more_than_the_requests_in_flight(tmp_path, isolation):
    from skynet_dspy.devserver import DevServer

    (tmp_path / "sixteen.py").write_text(SIXTEEN_THREADS, encoding="utf-8")
    limit = 3 * COST - 1e-9
    with DevServer(priced, model_name="gpt-4o-mini", delay=0.05) as server:
        model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
        with skynet_dspy.load_metric(tmp_path / "sixteen.py", metric_lm=model, isolation=isolation,
                                     judge_cache=False, max_judge_cost_usd=limit, timeout=60) as metric:
            metric.score({"q": 1}, "out")
            spend = metric.spend["max_judge_cost_usd"]
        sent = len(server.requests)
    # each request reserves its estimate before it is sent: once the spend and the reservations reach the cap no
    # request starts, so what is spent past the cap is at most the requests in flight then (16 threads at most)
    assert sent <= 3 + 16 and spend.spent_usd == pytest.approx(sent * COST)
    assert spend.spent_usd - limit <= 16 * COST
    assert spend.refused >= 16 * 10 - sent


def test_usage_less_replies_are_priced_from_counted_tokens_never_zero():
    from skynet_dspy.devserver import DevServer

    with DevServer(lambda request: "PASS, because " + "the answer is right " * 50, model_name="gpt-4o",
                   usage=False) as server:
        judge = Judge(metric_lm={"model": "openai/gpt-4o", "api_base": server.url, "api_key": KEY},
                      max_cost_usd=10.0, max_retries=0)
        for number in range(5):
            judge.complete("Grade this long answer.", f"answer {number} " + "word " * 300)
    usage = judge.usage
    assert usage.prompt_tokens > 5 * 300 and usage.completion_tokens > 5 * 150
    assert usage.cost_usd is not None and usage.cost_usd > 0
    assert judge.spend_cap.snapshot().spent_usd == pytest.approx(usage.cost_usd)


def test_usage_less_unpriced_replies_are_cost_unknown_in_the_receipt():
    from skynet_dspy._core.values import usd
    from skynet_dspy.devserver import DevServer

    with DevServer(lambda request: "PASS", usage=False) as server:
        judge = Judge(metric_lm={"model": "openai/some-unpriced-model", "api_base": server.url, "api_key": KEY},
                      max_retries=0)
        judge.complete("Grade.", "x")
    assert judge.usage.cost_usd is None and usd(judge.usage.cost_usd) == "cost unknown"
