"""skynet_dspy.gepa(): the budget checked at compile() before anything is spent; spending caps stopping dspy.GEPA."""

from __future__ import annotations

import json
import logging

import dspy

import skynet_dspy
from skynet_dspy.devserver import DevServer, dspy_reply

JUDGE_INSTRUCTIONS = "Answer PASS or FAIL, then give one sentence of reasons."
BETTER = "Reply with the capital city's name only."
CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Peru": "Lima", "Chile": "Santiago",
            "Japan": "Tokyo"}
KEY = "gepa-caps-key-7373"


def scripted(request):
    """The reflection model proposes BETTER; the judge (priced) checks capitals; the program is right under BETTER."""
    if "new_instruction" in request.text:
        return json.dumps({"new_instruction": BETTER})
    if request.system == JUDGE_INSTRUCTIONS:
        right = any(request.user.endswith(f"Answer: {capital}") for capital in CAPITALS.values())
        return {"content": "PASS: right." if right else "FAIL: name the capital.",
                "prompt_tokens": 1000, "completion_tokens": 1000}
    for country, capital in CAPITALS.items():
        if f"capital of {country}" in request.user:
            return dspy_reply(answer=capital if BETTER in request.system else f"Somewhere in {country}.")
    return dspy_reply(answer="I do not know.")


def examples():
    return [dspy.Example(question=f"What is the capital of {country}?", answer=capital).with_inputs("question")
            for country, capital in CAPITALS.items()]


class RequestsAtWarning(logging.Handler):
    """Records how many requests the server had received when the budget warning was logged."""

    def __init__(self, server):
        super().__init__()
        self.server = server
        self.seen: list[int] = []

    def emit(self, record):
        if "buys" in record.getMessage():
            self.seen.append(len(self.server.requests))


def test_compile_warns_before_spending_when_the_budget_buys_too_few_proposals(server, lm, metrics_dir, caplog):
    server.responder = scripted
    optimizer = skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=lm, max_metric_calls=12, num_threads=2)
    assert isinstance(optimizer, dspy.GEPA)
    watch = RequestsAtWarning(server)
    logging.getLogger("skynet_dspy").addHandler(watch)
    try:
        with dspy.context(lm=lm), caplog.at_level(logging.WARNING, logger="skynet_dspy"):
            optimizer.compile(dspy.Predict("question -> answer"), trainset=examples()[:3], valset=examples()[3:])
    finally:
        logging.getLogger("skynet_dspy").removeHandler(watch)
    warnings = [r.getMessage() for r in caplog.records if "buys" in r.getMessage()]
    assert len(warnings) == 1 and watch.seen == [0]  # once, before the first request
    assert "skynet_dspy.gepa(): max_metric_calls=12 buys the seed's evaluation on the valset (3 calls) and 1 " \
           "proposal;" in warnings[0]
    assert "Give max_metric_calls=21 or more for at least 3 proposals" in warnings[0]  # 3 + 3 x 2 x 3


def test_max_full_evals_is_checked_too_and_enough_is_not_warned_about(server, lm, metrics_dir, caplog):
    server.responder = scripted
    program = dspy.Predict("question -> answer")
    with dspy.context(lm=lm), caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=lm, max_full_evals=1, num_threads=2).compile(
            program, trainset=examples()[:4], valset=examples()[4:])  # 1 x (4 + 2) = 6 calls
        skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=lm, max_metric_calls=20, num_threads=2).compile(
            program, trainset=examples()[:4], valset=examples()[4:])  # 2 + 3 x 2 x 3 = 20: enough
    warnings = [r.getMessage() for r in caplog.records if "buys" in r.getMessage()]
    assert len(warnings) == 1
    assert "max_metric_calls=6 buys the seed's evaluation on the valset (2 calls) and 0 proposals" in warnings[0]
    assert "Give max_metric_calls=20 or more" in warnings[0]


def test_a_judge_cap_stops_dspy_gepa_and_keeps_the_best_program(metrics_dir, caplog):
    with DevServer(scripted, model_name="gpt-4o-mini", delay=0.02) as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
        cost = 1000 * 0.15e-6 + 1000 * 0.60e-6
        optimizer = skynet_dspy.gepa(metrics_dir / "judge.py", reflection_lm=lm, max_metric_calls=400, num_threads=8,
                                     max_judge_cost_usd=12 * cost - 1e-9)
        metric = optimizer.skynet_metric
        with dspy.context(lm=lm), caplog.at_level(logging.ERROR, logger="skynet_dspy"):
            optimized = optimizer.compile(dspy.Predict("question -> answer"), trainset=examples(), valset=examples())
        judged = [request for request in server.requests if request.system == JUDGE_INSTRUCTIONS]
    assert metric.spend_cap_reached and 12 <= len(judged) <= 12 + 8 - 1
    results = optimized.detailed_results
    assert results.total_metric_calls < 100  # stopped, far from 400
    scores = [float(score) for score in results.val_aggregate_scores]
    assert scores[0] == 0.0 and max(scores) == 1.0  # BETTER was found before the cap...
    assert optimized.predictors()[0].signature.instructions == BETTER  # ...and kept
    assert metric.spend["max_judge_cost_usd"].spent_usd >= 12 * cost - 1e-9
    errors = [r.getMessage() for r in caplog.records if r.name == "skynet_dspy" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "max_judge_cost_usd" in errors[0]


def test_caps_add_a_stop_callback_beside_the_users(metrics_dir, lm):
    def mine(state):
        return False

    optimizer = skynet_dspy.gepa(metrics_dir / "exact_match.py", reflection_lm=lm, max_metric_calls=50,
                                 max_judge_cost_usd=1.0, gepa_kwargs={"stop_callbacks": mine, "use_cloudpickle": True})
    stoppers = optimizer.gepa_kwargs["stop_callbacks"]
    assert stoppers[0] is mine and stoppers[1](None) is False and optimizer.gepa_kwargs["use_cloudpickle"] is True
    plain = skynet_dspy.gepa(metrics_dir / "exact_match.py", reflection_lm=lm, max_metric_calls=50)
    assert "stop_callbacks" not in plain.gepa_kwargs  # no cap, nothing added


def test_a_program_cap_is_in_force_during_compile_and_nowhere_else(metrics_dir):
    with DevServer(scripted, model_name="gpt-4o-mini") as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
        optimizer = skynet_dspy.gepa(metrics_dir / "exact_match.py", reflection_lm=lm, max_metric_calls=60,
                                     num_threads=2, max_program_cost_usd=0)
        metric = optimizer.skynet_metric
        program = dspy.Predict("question -> answer")
        with dspy.context(lm=lm):
            optimizer.compile(program, trainset=examples()[:3], valset=examples()[3:])
            asked_in_compile = len(server.requests)
            answer = program(question="What is the capital of Peru?").answer  # after the run: not refused
    assert metric.spend["max_program_cost_usd"].refused >= 3 and asked_in_compile == 0
    assert answer == "Somewhere in Peru." and len(server.requests) == 1
