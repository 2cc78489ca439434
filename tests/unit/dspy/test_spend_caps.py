"""max_program_cost_usd=: the program's measured model dollars against a cap, under dspy.Evaluate's threads."""

from __future__ import annotations

import logging
import math

import dspy
import pytest

import skynet_dspy
from skynet_dspy.devserver import DevServer, dspy_reply

KEY = "program-cap-key-5151"
COST = 1000 * 0.15e-6 + 1000 * 0.60e-6  # one gpt-4o-mini answer of 1000 + 1000 tokens
THREADS = 8


def answering(request):
    return {"content": dspy_reply(answer="yes"), "prompt_tokens": 1000, "completion_tokens": 1000}


def exact(input, output, expected=None):
    return float(output == expected["answer"]), {"feedback": "compared"}


def test_the_program_cap_refuses_the_programs_model_calls_once_reached(caplog):
    examples = [dspy.Example(question=f"q{n}", answer="yes").with_inputs("question") for n in range(40)]
    limit = 5 * COST - 1e-9
    with DevServer(answering, model_name="gpt-4o-mini", delay=0.05) as server, \
            caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
        with skynet_dspy.load_metric(exact, max_program_cost_usd=limit) as metric, dspy.context(lm=lm):
            assert metric.measuring  # a program cap turns measurement on
            with metric.capping():  # a hand-built dspy.Evaluate: its runs are capped inside the block
                result = dspy.Evaluate(devset=examples, metric=metric, num_threads=THREADS, display_progress=False,
                                       max_errors=100)(dspy.Predict("question -> answer"))
            spend = metric.spend["max_program_cost_usd"]
            stopped = metric.stop_callback(None)
        sent = len(server.requests)
    reached_at = math.ceil(limit / COST)
    assert reached_at <= sent <= reached_at + THREADS - 1  # the calls in flight when it was reached, no more
    assert spend.spent_usd == pytest.approx(sent * COST) and spend.refused == 40 - sent
    assert stopped is True
    assert result.score == pytest.approx(100 * sent / 40)  # the refused runs raised, and scored nothing
    errors = [r.getMessage() for r in caplog.records if r.name == "skynet_dspy" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "the program's measured model spend" in errors[0]


def test_a_program_cap_governs_only_the_runs_of_its_own_metric():
    examples = [dspy.Example(question=f"q{n}", answer="yes").with_inputs("question") for n in range(4)]
    program = dspy.Predict("question -> answer")
    with DevServer(answering, model_name="gpt-4o-mini") as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
        with skynet_dspy.load_metric(exact, max_program_cost_usd=0) as spent, \
                skynet_dspy.load_metric(exact, max_program_cost_usd=1.0) as other, dspy.context(lm=lm):
            assert spent.spend_cap_reached
            assert program(question="outside any optimization").answer == "yes"  # never refused
            with other.capping():  # another metric's run: the first metric's cap is not in force
                result = dspy.Evaluate(devset=examples, metric=other, num_threads=2, display_progress=False)(program)
            with spent.capping(), pytest.raises(skynet_dspy.SpendCapReached):
                program(question="inside the capped metric's run")
            assert program(question="after it").answer == "yes"
            figures = spent.spend["max_program_cost_usd"], other.spend["max_program_cost_usd"]
        sent = len(server.requests)
    assert result.score == 100.0 and sent == 1 + 4 + 1
    assert (figures[0].spent_usd, figures[0].refused) == (0.0, 1)
    assert figures[1].spent_usd == pytest.approx(4 * COST) and figures[1].refused == 0  # its own runs only


def test_a_capped_metric_says_once_when_it_scores_runs_made_outside_its_optimization(caplog):
    examples = [dspy.Example(question=f"q{n}", answer="yes").with_inputs("question") for n in range(3)]
    with DevServer(answering, model_name="gpt-4o-mini") as server, \
            caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
        with skynet_dspy.load_metric(exact, max_program_cost_usd=COST / 2) as metric, dspy.context(lm=lm):
            result = dspy.Evaluate(devset=examples, metric=metric, display_progress=False)(
                dspy.Predict("question -> answer"))
            spend = metric.spend["max_program_cost_usd"]
    assert result.score == 100.0 and spend.spent_usd == 0.0 and spend.refused == 0  # not capped, not counted
    warnings = [r.getMessage() for r in caplog.records if "made outside its optimization" in r.getMessage()]
    assert len(warnings) == 1 and "with metric.capping():" in warnings[0]


def test_a_program_cap_needs_measurement(metrics_dir):
    with pytest.raises(ValueError, match="max_program_cost_usd= caps the program's measured model cost, and "
                                         "measure=False turns measurement off"):
        skynet_dspy.load_metric(metrics_dir / "exact_match.py", max_program_cost_usd=1.0, measure=False)
