"""Plain GEPA spends its budget on new evaluations: GEPA's evaluation cache, example ids, the budget check, caps."""

from __future__ import annotations

import logging
import math
import re
import threading

import skynet_dspy
from skynet_dspy._gepa import example_loaders
from skynet_dspy.devserver import DevServer

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
KEY = "gepa-budget-key-3131"
COST = 1000 * 0.15e-6 + 1000 * 0.60e-6  # one gpt-4o-mini judge answer of 1000 + 1000 tokens


class QuietLogger:
    def log(self, message: str) -> None:
        pass


def mention_words(input, output, expected=None):
    """The share of the example's words the output mentions; the feedback names the first one missing."""
    missing = [word for word in expected["need"] if word not in output]
    return 1 - len(missing) / len(expected["need"]), {"feedback": f"mention {missing[0]}" if missing else "good"}


def reflect(prompt: str) -> str:
    """Adds the word the feedback asks for; every third proposal changes nothing (as a model sometimes does)."""
    reflect.proposals = getattr(reflect, "proposals", 0) + 1
    current = re.search(r"```\n(.*?)\n```", prompt, re.S).group(1)
    wanted = re.search(r"mention (\w+)", prompt)
    if wanted is None or reflect.proposals % 3 == 0:
        return f"```\n{current}\n```"
    return f"```\n{current} {wanted.group(1)}\n```"


def word_examples(count: int = 8) -> list[dict]:
    return [{"input": {"q": f"q{n}"}, "expected": {"need": WORDS[n % 8:n % 8 + 3] or WORDS[:3]}} for n in range(count)]


def run_counting(budget: int, **options):
    runs: list[tuple[str, str]] = []
    lock = threading.Lock()

    def run(template, input):
        with lock:
            runs.append((template, input["q"]))
        return template

    reflect.proposals = 0
    result = skynet_dspy.optimize_anything("Say", run, mention_words, reflection_lm=reflect, max_metric_calls=budget,
                                           parallel=False, logger=QuietLogger(), **options)
    return result, runs


def test_a_repeated_evaluation_costs_no_run_no_metric_call_and_no_budget():
    """The same max_metric_calls reaches more distinct (candidate, example) evaluations than GEPA without its
    cache, and never runs one twice (figures for this setup: 32 vs 24 at 40 calls, 56 vs 48 at 80)."""
    for budget in (40, 80):
        result, runs = run_counting(budget, trainset=word_examples())
        uncached, uncached_runs = run_counting(budget, trainset=word_examples(), cache_evaluation=False)
        assert len(runs) == len(set(runs))  # no (candidate, example) ran twice
        assert len(set(runs)) > len(set(uncached_runs))  # the budget bought more new evaluations
        assert len(uncached_runs) > len(set(uncached_runs))  # without the cache, repeats ran (and cost budget)
        assert result.total_metric_calls <= budget + 8 and max(result.val_aggregate_scores) >= max(
            uncached.val_aggregate_scores)


def test_a_separate_valset_is_scored_on_itself_never_on_training_examples():
    """gepa 0.1.4's cache keys (candidate, example id) and numbers a separate valset from 0 like the trainset
    (gepa-ai/gepa#424): without distinct ids, a valset score would be read from a training example."""
    def score(input, output, expected=None):  # training examples reward longer templates; valset ones never score
        return (min(1.0, len(output.split()) / 5) if expected["train"] else 0.0), {"feedback": "longer"}

    def grow(prompt):
        current = re.search(r"```\n(.*?)\n```", prompt, re.S).group(1)
        return f"```\n{current} more\n```"

    train = [{"input": {"q": f"t{n}"}, "expected": {"train": True}} for n in range(3)]
    val = [{"input": {"q": f"v{n}"}, "expected": {"train": False}} for n in range(3)]
    result = skynet_dspy.optimize_anything("s", lambda artifact, input: artifact, score, trainset=train, valset=val,
                                           reflection_lm=grow, max_metric_calls=30, reflection_minibatch_size=3,
                                           parallel=False, logger=QuietLogger())
    assert len(result.candidates) > 1  # children were accepted on the training minibatches...
    assert set(result.val_aggregate_scores) == {0.0}  # ...and scored on the valset, where nothing scores


def test_an_example_in_both_sets_shares_one_id_and_others_never_do():
    shared = {"input": {"q": "both"}, "expected": None}
    train = [{"input": {"q": "t0"}, "expected": None}, shared, dict(shared), {"input": {"q": "t3"}, "expected": None}]
    val = [{"input": {"q": "v0"}, "expected": None}, shared]
    train_loader, val_loader = example_loaders(train, val)
    assert val_loader.all_ids() == [0, 1]
    assert train_loader.all_ids() == [2, 1, 4, 5]  # the first copy shares the valset's id; the rest are new
    assert train_loader.fetch([1]) == [shared] and val_loader.fetch([1]) == [shared]


def test_too_small_a_budget_is_warned_about_before_anything_runs(caplog):
    runs_at_warning = []
    runs = []

    class Watch(logging.Handler):
        def emit(self, record):
            if "buys" in record.getMessage():
                runs_at_warning.append(len(runs))

    watch = Watch()
    logging.getLogger("skynet_dspy").addHandler(watch)
    try:
        with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
            skynet_dspy.optimize_anything("Say", lambda artifact, input: runs.append(1) or artifact, mention_words,
                                          trainset=word_examples(6), reflection_lm=reflect, max_metric_calls=5,
                                          parallel=False, logger=QuietLogger())
            skynet_dspy.optimize_anything("Say", lambda artifact, input: artifact, mention_words,
                                          trainset=word_examples(6), valset=word_examples(2), reflection_lm=reflect,
                                          max_metric_calls=10, reflection_minibatch_size=2, parallel=False,
                                          logger=QuietLogger())
    finally:
        logging.getLogger("skynet_dspy").removeHandler(watch)
    warnings = [r.getMessage() for r in caplog.records if "buys" in r.getMessage()]
    assert runs_at_warning[0] == 0  # said before the first run
    assert "max_metric_calls=5 buys not even the seed's evaluation on the valset (6 calls)" in warnings[0]
    assert "Give max_metric_calls=24 or more for at least 3 proposals" in warnings[0]  # 6 + 3 x 2 x 3
    assert "max_metric_calls=10 buys the seed's evaluation on the valset (2 calls) and 2 proposals" in warnings[1]
    assert "Give max_metric_calls=14 or more" in warnings[1]  # 2 + 3 x 2 x 2


def test_a_budget_that_buys_a_few_proposals_is_not_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        run_counting(24, trainset=word_examples(6))
    assert not [r for r in caplog.records if "buys" in r.getMessage()]


# -- a spending cap reached mid-run ---------------------------------------------------------------

JUDGED = """
from skynet import llm

def score(input, output, expected=None):
    verdict = llm("Say PASS when the text mentions the word, else FAIL and the word.",
                  input=f"text: {output} | word: {expected['word']} | example: {input['q']}")
    return (1.0 if verdict.startswith("PASS") else 0.0), {"feedback": verdict}
"""


def judge(request):
    text, word = re.match(r"text: (.*) \| word: (\w+) \|", request.user).groups()
    verdict = "PASS." if word in text.split() else f"FAIL: mention {word}"
    return {"content": verdict, "prompt_tokens": 1000, "completion_tokens": 1000}


def add_word(prompt: str) -> str:
    current = re.search(r"```\n(.*?)\n```", prompt, re.S).group(1)
    wanted = re.search(r"mention (\w+)", prompt)
    return f"```\n{current} {wanted.group(1) if wanted else 'again'}\n```"


def test_a_judge_cap_reached_mid_run_under_8_threads_stops_gepa_and_keeps_the_best(tmp_path, caplog):
    (tmp_path / "judged.py").write_text(JUDGED, encoding="utf-8")
    data = [{"input": {"q": f"q{n}"}, "expected": {"word": WORDS[n % 4]}} for n in range(16)]
    limit = 40 * COST - 1e-9  # seed: 16 judge calls; each accepted proposal: 3 + 13; so reached in the 2nd
    with DevServer(judge, model_name="gpt-4o-mini", delay=0.02) as server, \
            caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        result = skynet_dspy.optimize_anything(
            "Say", lambda artifact, input: artifact, tmp_path / "judged.py", trainset=data, reflection_lm=add_word,
            metric_lm={"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY},
            max_judge_cost_usd=limit, max_metric_calls=400, max_workers=8, logger=QuietLogger(),
        )
        sent = len(server.requests)
    reached_at = math.ceil(limit / COST)
    assert reached_at <= sent <= reached_at + 8 - 1  # overshoot: at most the calls in flight on 8 threads
    assert result.total_metric_calls < 120  # stopped after the iteration the cap was reached in, far from 400
    scores = result.val_aggregate_scores
    assert scores[0] == 0.0 and max(scores) >= 0.25  # proposals before the cap improved on the seed...
    assert result.best_idx == scores.index(max(scores)) and result.best_candidate != "Say"  # ...and the best is kept
    errors = [r.getMessage() for r in caplog.records if r.name == "skynet_dspy" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "max_judge_cost_usd" in errors[0]


def test_a_program_cap_refuses_run_and_scores_spend_cap(server):
    import litellm

    server.responder = lambda request: {"content": "out", "prompt_tokens": 1000, "completion_tokens": 1000}

    def run(artifact, input):
        reply = litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key=KEY,
                                   messages=[{"role": "user", "content": f"{artifact} {input['q']}"}])
        return reply.choices[0].message.content

    evaluator = skynet_dspy.make_evaluator(run, lambda input, output: (1.0, {"feedback": "ok"}),
                                         max_program_cost_usd=1.5 * COST)
    try:
        scores = [evaluator("A", {"input": {"q": f"q{n}"}, "expected": None}) for n in range(4)]
    finally:
        evaluator.metric.close()
    assert [value for value, _ in scores] == [1.0, 1.0, 0.0, 0.0] and len(server.requests) == 2
    assert scores[2][1] == {"Inputs": {"q": "q2"},  # run() was refused: no output to show
                            "feedback": "Not scored: a spending cap was reached, so no more model calls are made.",
                            "_gepa_transient_failure": True}  # GEPA's cache does not keep it
    assert evaluator.stats["spend_cap"] == 2 and evaluator.metric.stop_callback(None) is True
