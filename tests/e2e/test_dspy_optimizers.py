"""End to end: one loaded metric passed as metric= to dspy.Evaluate, BootstrapFewShot, MIPROv2 and dspy.GEPA.

Real DSPy programs (dspy.Predict and dspy.ChainOfThought, one and two output fields) call the
loopback model server through LiteLLM. The scripted world: the model knows the capital of France,
writes Japan's in lower case, and says "I am not sure" for the rest, unless its instructions tell
it to "Answer with the capital city", which the reflection model (GEPA) and the instruction
proposer (MIPROv2) suggest.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import cloudpickle
import dspy
import pytest

import skynet_dspy
from skynet_dspy.devserver import Request, dspy_reply

pytestmark = pytest.mark.timeout(240)

# The score callables below go to metric worker processes (the default isolation) by value, as a script's or
# a notebook's would: a worker then never imports this module (nor, through it, dspy), and loads the metric well
# within even a 0.5 s timeout.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi", "Chile": "Santiago",
            "Egypt": "Cairo"}
HINT = "Answer with the capital city"
NEW_INSTRUCTION = f"{HINT} of the country named in the question."
LABEL_SENTINEL = "RUBRIC-SENTINEL-5d1e"
EXTRA_SENTINEL = "EXTRA-SENTINEL-a04c"
FEEDBACK_MARK = "FEEDBACK-MARK"
_FIELDS = re.compile(r"^\s*\d+\.\s+`(\w+)`", re.MULTILINE)
_COUNTRY = re.compile(r"capital of (\w+)")


def output_fields(request: Request) -> list[str]:
    """The output fields a DSPy adapter asks for, from the system message's field list."""
    system = request.system
    start = system.find("Your output fields are:")
    if start < 0:
        return []
    end = system.find("All interactions will be structured", start)
    return _FIELDS.findall(system[start:end if end > 0 else None])


def reply(request: Request, values: dict[str, str]) -> str:
    """An answer in the format of the DSPy adapter that asked (JSONAdapter or ChatAdapter)."""
    chosen = {name: values.get(name, f"Some {name.replace('_', ' ')}.") for name in output_fields(request)}
    if "Outputs will be a JSON object" in request.system:
        return json.dumps(chosen)
    return dspy_reply(**chosen)


def world(request: Request) -> str:
    fields = output_fields(request)
    if "new_instruction" in fields or "proposed_instruction" in fields:  # GEPA's reflection / MIPROv2's proposer
        return reply(request, {"new_instruction": NEW_INSTRUCTION, "proposed_instruction": NEW_INSTRUCTION})
    question = request.user.rsplit("[[ ## question ## ]]", 1)[-1]
    found = _COUNTRY.search(question)
    country = found.group(1) if found else ""
    if HINT in request.system or country == "France":
        answer = CAPITALS.get(country, "unknown")
    elif country == "Japan":
        answer = "tokyo"
    else:
        answer = "I am not sure"
    return reply(request, {"answer": answer, "reasoning": f"The question is about {country}.",
                           "confidence": "high" if answer in CAPITALS.values() else "low"})


@pytest.fixture
def world_lm(server, lm):
    server.responder = world
    return lm


def dataset(*countries: str) -> list[dspy.Example]:
    return [
        dspy.Example(question=f"What is the capital of {country}?", answer=CAPITALS[country],
                     rubric=LABEL_SENTINEL).with_inputs("question")
        for country in countries or CAPITALS
    ]


class Recorder:
    """A score function: 1.0 exact, 0.5 right but wrongly cased, 0.0 else; records what it was given.

    score runs in metric worker processes (the default isolation), so each call leaves its record as a
    file in `folder`, which the test reads back in this process.
    """

    def __init__(self, folder: Path, named_scores: bool = True):
        self.folder = folder
        self.named_scores = named_scores

    @property
    def seen(self) -> list[tuple]:
        records = [json.loads(path.read_text()) for path in sorted(self.folder.glob("*.json"))]
        return [(r["input"], r["output"], r["expected"], r["output_type"], r["pid"]) for r in records]

    def __call__(self, input, output, expected):
        record = {"input": input, "output": output, "expected": expected, "output_type": type(output).__name__,
                  "pid": os.getpid()}
        (self.folder / f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))
        answer = output["answer"] if isinstance(output, dict) else output
        want = expected["answer"]
        score = 1.0 if answer == want else 0.5 if answer.lower() == want.lower() else 0.0
        feedback = "Correct." if score == 1.0 else f"{FEEDBACK_MARK}: {answer!r} is not the capital asked for."
        side_info = {"feedback": feedback, "debug": EXTRA_SENTINEL, "labels": dict(expected)}
        if self.named_scores:
            side_info["scores"] = {"exact": float(score == 1.0), "brief": float(len(answer) < 10)}
        return score, side_info


@pytest.fixture
def recorder(tmp_path_factory):
    """A new Recorder (with its own record folder) for each call."""

    def make(named_scores: bool = True) -> Recorder:
        return Recorder(tmp_path_factory.mktemp("calls"), named_scores)

    return make


PROGRAMS = {
    "predict-one-field": lambda: dspy.Predict("question -> answer"),
    "predict-two-fields": lambda: dspy.Predict("question -> answer, confidence"),
    "cot-one-field": lambda: dspy.ChainOfThought("question -> answer"),
    "cot-two-fields": lambda: dspy.ChainOfThought("question -> answer, confidence"),
}


# -- dspy.Evaluate ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_evaluate_gives_per_example_scores_and_their_average(world_lm, recorder, name):
    runs = []
    for threads in (1, 8):
        score = recorder()
        metric = skynet_dspy.load_metric(score)
        with dspy.context(lm=world_lm):
            result = dspy.Evaluate(devset=dataset(), metric=metric, num_threads=threads)(PROGRAMS[name]())
        per_example = [(example.question, float(s), s.feedback) for example, _pred, s in result.results]
        runs.append((result.score, per_example))
        seen = score.seen
        assert len(seen) == 6
        assert os.getpid() not in {pid for *_, pid in seen}  # score ran in worker processes, the default
        if name.endswith("two-fields"):
            assert all(kind == "dict" and set(output) == {"answer", "confidence"} for _i, output, _e, kind, _p in seen)
        else:
            assert all(kind == "str" for _i, _output, _e, kind, _p in seen)  # one column: the bare value
        assert all(expected == {"answer": CAPITALS[i["question"].split()[-1].rstrip("?")], "rubric": LABEL_SENTINEL}
                   for i, _output, expected, _kind, _p in seen)
        assert metric.stats["calls"] == 6 and metric.stats["exception"] == 0
    # France exact (1.0), Japan lower case (0.5), the other four wrong: 1.5 / 6
    assert runs[0][0] == 25.0
    assert [s for _q, s, _f in runs[0][1]] == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert runs[0] == runs[1]  # eight threads, the same scores


# -- BootstrapFewShot --------------------------------------------------------------------------


def _demo_questions(program: dspy.Module) -> set[str]:
    return {demo.question for predictor in program.predictors() for demo in predictor.demos}


@pytest.mark.parametrize("threshold", [None, 0.75])
def test_bootstrap_takes_only_demos_whose_score_passes(world_lm, recorder, threshold):
    metric = skynet_dspy.load_metric(recorder())
    optimizer = dspy.BootstrapFewShot(metric=metric, metric_threshold=threshold, max_bootstrapped_demos=6,
                                      max_labeled_demos=0, max_rounds=1)
    with dspy.context(lm=world_lm):
        compiled = optimizer.compile(dspy.ChainOfThought("question -> answer"), trainset=dataset())
    expected = {"What is the capital of France?"}
    if threshold is None:
        expected.add("What is the capital of Japan?")  # 0.5 is truthy; the zeros never are
    assert _demo_questions(compiled) == expected
    assert metric.stats["calls"] == 6


def test_bootstrap_never_takes_a_failed_call_even_with_a_positive_failure_score(world_lm):
    def broken(input, output, expected):
        raise RuntimeError("the judge is down")

    metric = skynet_dspy.load_metric(broken, failure_score=0.5)
    optimizer = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=6, max_labeled_demos=0, max_rounds=1)
    with dspy.context(lm=world_lm):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=dataset())
    assert _demo_questions(compiled) == set()
    assert metric.stats["exception"] == 6


# -- MIPROv2 ---------------------------------------------------------------------------------


def test_mipro_v2_optimizes_with_the_metric_as_with_a_float_metric(world_lm, server, recorder):
    metric = skynet_dspy.load_metric(recorder())
    optimizer = dspy.MIPROv2(metric=metric, prompt_model=world_lm, task_model=world_lm, auto=None, num_candidates=2,
                             num_threads=2, max_bootstrapped_demos=1, max_labeled_demos=0, verbose=False, seed=0)
    data = dataset()
    with dspy.context(lm=world_lm):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=data[:4], valset=data[2:],
                                     num_trials=3, minibatch=False)
    assert HINT in compiled.signature.instructions
    assert compiled.score == 100.0
    stats = metric.stats
    assert stats["calls"] > 0 and stats["exception"] == stats["invalid"] == stats["timeout"] == 0
    assert any("proposed_instruction" in output_fields(request) for request in server.requests)


# -- dspy.GEPA -------------------------------------------------------------------------------


class CountingCalls:
    """Passes GEPA's calls through to the metric, noting which were the per-predictor feedback calls."""

    def __init__(self, metric: skynet_dspy.Metric):
        self.metric = metric
        self.calls: Counter = Counter()
        self.lock = threading.Lock()

    def __call__(self, gold, pred, trace=None, pred_name=None, pred_trace=None):
        with self.lock:
            self.calls["feedback" if pred_name is not None else "first"] += 1
        return self.metric(gold, pred, trace, pred_name, pred_trace)


def _gepa(lm, metric, *, threads: int = 4, calls: int = 30):
    return dspy.GEPA(metric=metric, max_metric_calls=calls, reflection_lm=lm, num_threads=threads,
                     track_stats=True, seed=0, reflection_minibatch_size=2)


@pytest.mark.parametrize("name", ["predict-one-field", "cot-two-fields"])
def test_gepa_improves_the_program_scoring_each_prediction_once(world_lm, server, caplog, recorder, name):
    score = recorder()
    metric = skynet_dspy.load_metric(score)
    counting = CountingCalls(metric)
    data = dataset()
    with dspy.context(lm=world_lm), caplog.at_level(logging.WARNING):
        compiled = _gepa(world_lm, counting).compile(PROGRAMS[name](), trainset=data[:3], valset=data[3:])
    results = compiled.detailed_results
    assert results.val_aggregate_scores[0] == 0.0 and max(results.val_aggregate_scores) == 1.0
    assert all(HINT in predictor.signature.instructions for predictor in compiled.predictors())
    # the per-predictor feedback calls reused the first result: score() ran once per first call
    assert counting.calls["feedback"] >= 1
    assert len(score.seen) == metric.stats["calls"] == counting.calls["first"]
    assert metric.stats["memo_hits"] == counting.calls["feedback"]
    assert "different from the overall metric score" not in caplog.text
    # the named scores reach GEPA's result as objective scores
    subscores = results.val_aggregate_subscores
    assert subscores is not None and len(subscores) == len(results.candidates)
    assert subscores[0] == {"exact": 0.0, "brief": 0.0} and {"exact": 1.0, "brief": 1.0} in subscores


def test_gepa_reflection_sees_the_feedback_and_nothing_else_of_the_metric(world_lm, server, recorder):
    metric = skynet_dspy.load_metric(recorder())
    data = dataset()
    with dspy.context(lm=world_lm):
        _gepa(world_lm, metric).compile(dspy.Predict("question -> answer"), trainset=data[:3], valset=data[3:])
    reflection = [request for request in server.requests if "new_instruction" in output_fields(request)]
    assert reflection, "GEPA asked the reflection model for a new instruction"
    assert any(FEEDBACK_MARK in request.text for request in reflection)
    everything = "\n".join(request.text for request in server.requests)
    assert LABEL_SENTINEL not in everything and EXTRA_SENTINEL not in everything
    assert "def __call__" not in everything and "named_scores" not in everything  # no metric source


def test_gepa_without_named_scores_has_no_objective_scores(world_lm, recorder):
    metric = skynet_dspy.load_metric(recorder(named_scores=False))
    data = dataset()
    with dspy.context(lm=world_lm):
        compiled = _gepa(world_lm, metric).compile(dspy.Predict("question -> answer"), trainset=data[:3],
                                                    valset=data[3:])
    assert compiled.detailed_results.val_aggregate_subscores is None
    assert max(compiled.detailed_results.val_aggregate_scores) == 1.0


def test_gepa_with_eight_threads_gives_the_same_run_as_one(world_lm, recorder):
    runs = []
    for threads in (1, 8):
        metric = skynet_dspy.load_metric(recorder())
        data = dataset()
        with dspy.context(lm=world_lm):
            compiled = _gepa(world_lm, metric, threads=threads).compile(
                dspy.ChainOfThought("question -> answer"), trainset=data[:3], valset=data[3:])
        results = compiled.detailed_results
        runs.append((results.val_aggregate_scores, results.val_subscores, results.val_aggregate_subscores,
                     [c.predictors()[0].signature.instructions for c in results.candidates], metric.stats))
    assert runs[0] == runs[1]


class StuckOnKenya:
    """The Recorder's score, except that a call about Kenya waits (up to a minute) for a release file."""

    def __init__(self, score: Recorder, release: Path):
        self.score = score
        self.release = release

    def __call__(self, input, output, expected):
        if "Kenya" in input["question"]:
            deadline = time.monotonic() + 60
            while not self.release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.score(input, output, expected)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_gepa_finishes_past_a_stuck_metric(world_lm, recorder, tmp_path, isolation):
    release = tmp_path / "release"
    metric = skynet_dspy.load_metric(StuckOnKenya(recorder(), release), timeout=0.5, isolation=isolation)
    data = dataset()
    try:
        with dspy.context(lm=world_lm):
            compiled = _gepa(world_lm, metric, calls=12).compile(dspy.Predict("question -> answer"),
                                                                 trainset=data[:3], valset=data[3:])
        assert not release.exists()
        assert metric.stats["timeout"] >= 1
        kenya = [example.question for example in data[3:]].index("What is the capital of Kenya?")
        assert all(subscores[kenya] == 0.0 for subscores in compiled.detailed_results.val_subscores)
    finally:
        release.touch()
        metric.close()
