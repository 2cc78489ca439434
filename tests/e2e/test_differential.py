"""Differential: the same DSPy and GEPA runs with a native metric and with the same logic as a Skynet score.

dspy.Evaluate, BootstrapFewShot, dspy.GEPA (also built by skynet_dspy.gepa()) and plain GEPA each run
twice against the deterministic scripted model, once per loopback server (which records every request):
with a native DSPy/GEPA metric, and with `score(input, output, expected)` through load_metric. The native
metric and the Skynet score share one `verdict` function (LOGIC), so any difference is the adapter's.

The runs must match: scores, demos, candidates, final instructions, the files and table Evaluate writes,
and every model request. The one documented difference is the memo: GEPA's second call for the same
example and prediction reuses the first result (fewer score calls), and identical judge requests are paid
once, so a judge metric sends each distinct judge request once where the native metric repeats it.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
import litellm
import pytest
from conftest import ROOT

import skynet_dspy
from skynet_dspy.devserver import Request, requests_by_role, scripted_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# The one scoring logic, run natively (exec'd here) and as a Skynet metric file (written below it).
LOGIC = '''
def answer(value):
    """The label in what the program returned: a label, or [(label, ...)] from a program returning a list."""
    return value if isinstance(value, str) else value[0][0]


def verdict(got, want, cue):
    got = str(got).strip().strip("'\\".").lower()
    why = f"The ticket mentions '{cue}', which points to {want}."
    if got == want:
        return 1.0, f"Correct: '{want}'. {why}"
    return 0.0, f"Expected '{want}', got '{got}'. {why}"
'''
SKYNET_SCORE = LOGIC + '''

def score(input, output, expected=None):
    value, feedback = verdict(answer(output), expected["label"], expected["cue"])
    return value, {"feedback": feedback, "scores": {"exact": value}}
'''
JUDGE_INSTRUCTIONS = (
    "You review how support tickets are routed to teams (billing, bug, how-to, account, other). "
    "Answer PASS or FAIL, then give one sentence of reasons."
)
SKYNET_JUDGE = f'''
from skynet import llm


def score(input, output, expected=None):
    verdict = llm({JUDGE_INSTRUCTIONS!r}, input=f"Question: {{input['ticket']}}\\nAnswer: {{output}}")
    passed = verdict.strip().upper().startswith("PASS")
    return (1.0 if passed else 0.0), {{"feedback": verdict}}
'''
_shared: dict[str, Any] = {}
exec(LOGIC, _shared)
answer: Callable[[Any], str] = _shared["answer"]
verdict: Callable[[Any, str, str], tuple[float, str]] = _shared["verdict"]


class RouteTicket(dspy.Signature):
    """Classify the support ticket into one of these labels: billing, bug, how-to, account, other."""

    ticket: str = dspy.InputField(desc="the customer's message")
    label: str = dspy.OutputField(desc="one of: billing, bug, how-to, account, other")


def load(name: str) -> list[dspy.Example]:
    with open(ROOT / "examples" / f"{name}.jsonl", encoding="utf-8") as handle:
        return [dspy.Example(**json.loads(line)).with_inputs("ticket") for line in handle if line.strip()]


TRAIN, VAL = load("train"), load("val")


@pytest.fixture
def skynet_file(tmp_path) -> Path:
    """The Skynet score as a file named metric.py, so Evaluate's column is `metric`, as the native function's."""
    path = tmp_path / "metric_file" / "metric.py"
    path.parent.mkdir()
    path.write_text(SKYNET_SCORE, encoding="utf-8")
    return path


@pytest.fixture
def judge_file(tmp_path) -> Path:
    path = tmp_path / "judge.py"
    path.write_text(SKYNET_JUDGE, encoding="utf-8")
    return path


# -- the native metrics ----------------------------------------------------------------------


class Counted:
    """A native metric that counts its calls."""

    def __init__(self, function: Callable[..., Any]):
        self.function = function
        self.calls = 0
        self.__name__ = function.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.function(*args, **kwargs)


def metric(gold, pred, trace=None):
    """The native float metric of Evaluate and BootstrapFewShot (named like the file, for Evaluate's column)."""
    got = pred.label if isinstance(pred, dspy.Prediction) else pred
    return verdict(answer(got), gold.label, gold.cue)[0]


def feedback_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    """The native GEPA feedback metric."""
    value, feedback = verdict(pred.label, gold.label, gold.cue)
    return dspy.Prediction(score=value, feedback=feedback, objective_scores={"exact": value})


def native_judge(url: str) -> Callable[..., Any]:
    """The native GEPA metric asking the scripted judge, with no memo and no cache."""

    def judged(gold, pred, trace=None, pred_name=None, pred_trace=None):
        reply = litellm.completion(
            model="openai/gpt-4o-mini", api_base=url, api_key="local",
            messages=[{"role": "system", "content": JUDGE_INSTRUCTIONS},
                      {"role": "user", "content": f"Question: {gold.ticket}\nAnswer: {pred.label}"}],
        )
        text = reply.choices[0].message.content
        return dspy.Prediction(score=1.0 if text.strip().upper().startswith("PASS") else 0.0, feedback=text)

    return judged


# -- runs ------------------------------------------------------------------------------------


@dataclass
class World:
    """One run's loopback server and the dspy.LM reaching it."""

    url: str
    lm: dspy.LM
    requests: list[Request]


@contextlib.contextmanager
def world() -> Iterator[World]:
    with scripted_server() as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local", cache=False)
        with dspy.context(lm=lm):
            yield World(server.url, lm, server.requests)


def bodies(requests: list[Request]) -> list[dict[str, Any]]:
    return [request.body for request in requests]


def assert_same_requests(native: list[Request], skynet: list[Request]) -> None:
    assert len(native) == len(skynet) and len(native) > 0
    for number, (one, other) in enumerate(zip(native, skynet, strict=True)):
        assert one.body == other.body, f"request {number} differs"


# -- dspy.Evaluate ---------------------------------------------------------------------------


def _programs() -> dict[str, Callable[[], Any]]:
    def returning_label() -> Any:
        predict = dspy.Predict(RouteTicket)
        return lambda ticket: predict(ticket=ticket).label  # a str, not a Prediction

    def returning_pairs() -> Any:
        predict = dspy.Predict(RouteTicket)
        return lambda ticket: [(predict(ticket=ticket).label, 6)]  # a list of tuples

    return {"prediction": lambda: dspy.ChainOfThought(RouteTicket), "str": returning_label, "pairs": returning_pairs}


def _evaluate(program: Any, scorer: Any, folder: Path) -> dict[str, Any]:
    folder.mkdir()
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        result = dspy.Evaluate(
            devset=VAL, metric=scorer, num_threads=1, display_table=len(VAL), display_progress=False,
            save_as_csv=str(folder / "results.csv"), save_as_json=str(folder / "results.json"),
        )(program)
    return {
        "score": result.score,
        "scores": [float(score) for _, _, score in result.results],
        "csv": (folder / "results.csv").read_text(encoding="utf-8"),
        "json": json.loads((folder / "results.json").read_text(encoding="utf-8")),
        "table": shown.getvalue(),
    }


@pytest.mark.parametrize("returns", ["prediction", "str", "pairs"])
def test_evaluate_scores_files_table_and_requests_match(tmp_path, skynet_file, returns):
    make = _programs()[returns]
    with world() as native_world:
        native = _evaluate(make(), metric, tmp_path / "native")
    skynet_metric = skynet_dspy.load_metric(skynet_file)
    with world() as skynet_world:
        skynet = _evaluate(make(), skynet_metric, tmp_path / "skynet")

    assert 0 < native["score"] < 100  # some tickets routed right, some wrong: the comparison can tell
    assert skynet == native
    assert "metric" in native["json"][0] and "metric" in native["csv"].splitlines()[0].split(",")
    assert_same_requests(native_world.requests, skynet_world.requests)
    assert skynet_metric.stats["calls"] == len(VAL)


# -- BootstrapFewShot ------------------------------------------------------------------------


def _demos(program: dspy.Module) -> list[dict[str, Any]]:
    return [dict(demo) for predictor in program.predictors() for demo in predictor.demos]


@pytest.mark.parametrize("threshold", [None, 1.0])
def test_bootstrap_picks_the_same_demos_with_the_same_requests(skynet_file, threshold):
    runs = []
    for scorer in (metric, skynet_dspy.load_metric(skynet_file)):
        with world() as each:
            optimizer = dspy.BootstrapFewShot(metric=scorer, metric_threshold=threshold, max_bootstrapped_demos=4,
                                              max_labeled_demos=0, max_rounds=1)
            compiled = optimizer.compile(dspy.ChainOfThought(RouteTicket), trainset=TRAIN)
            after = dspy.Evaluate(devset=VAL, metric=scorer, num_threads=1, display_progress=False)(compiled)
        runs.append((_demos(compiled), after.score, each.requests))
    (native_demos, native_score, native_requests), (skynet_demos, skynet_score, skynet_requests) = runs
    assert native_demos and native_demos == skynet_demos
    assert native_score == skynet_score
    assert_same_requests(native_requests, skynet_requests)


# -- dspy.GEPA -------------------------------------------------------------------------------


def _gepa_run(build: Callable[[World], Any]) -> dict[str, Any]:
    with world() as each:
        optimizer = build(each)
        optimized = optimizer.compile(dspy.ChainOfThought(RouteTicket), trainset=TRAIN, valset=VAL)
    results = optimized.detailed_results
    return {
        "scores": list(results.val_aggregate_scores),
        "subscores": [dict(parts) for parts in results.val_aggregate_subscores or []],
        "per_example": [list(scores) for scores in results.val_subscores],
        "candidates": [{name: predictor.signature.instructions for name, predictor in candidate.named_predictors()}
                       for candidate in results.candidates],
        "parents": results.parents,
        "best": results.best_idx,
        "instructions": optimized.predict.signature.instructions,
        "requests": each.requests,
    }


def _gepa_settings() -> dict[str, Any]:
    return {"max_metric_calls": 120, "track_stats": True, "seed": 0, "num_threads": 1}


def _assert_same_gepa(native: dict[str, Any], skynet: dict[str, Any]) -> None:
    for key in ("scores", "subscores", "per_example", "candidates", "parents", "best", "instructions"):
        assert skynet[key] == native[key], key


def test_dspy_gepa_runs_the_same_with_the_skynet_metric(skynet_file):
    native_metric = Counted(feedback_metric)
    native = _gepa_run(lambda each: dspy.GEPA(metric=native_metric, reflection_lm=each.lm, **_gepa_settings()))
    skynet_metric = skynet_dspy.load_metric(skynet_file, output_fields="label")
    skynet = _gepa_run(lambda each: dspy.GEPA(metric=skynet_metric, reflection_lm=each.lm, **_gepa_settings()))

    assert len(native["candidates"]) > 2 and native["scores"][native["best"]] > native["scores"][0]  # it learned
    assert "Tickets that mention" in native["instructions"]
    _assert_same_gepa(native, skynet)
    assert_same_requests(native["requests"], skynet["requests"])
    # the memo: GEPA's second call for the same example and prediction is not scored again
    assert skynet_metric.stats["memo_hits"] > 0
    assert skynet_metric.stats["calls"] + skynet_metric.stats["memo_hits"] == native_metric.calls


def test_skynet_gepa_builds_the_same_run(skynet_file):
    native = _gepa_run(lambda each: dspy.GEPA(metric=feedback_metric, reflection_lm=each.lm, **_gepa_settings()))
    skynet = _gepa_run(lambda each: skynet_dspy.gepa(skynet_file, reflection_lm=each.lm, output_fields="label",
                                                     **_gepa_settings()))
    _assert_same_gepa(native, skynet)
    assert_same_requests(native["requests"], skynet["requests"])


def _judge_requests(requests: list[Request]) -> list[list[dict[str, Any]]]:
    return [request.messages for request in requests_by_role(requests, "judge")]


def _others(requests: list[Request]) -> list[Request]:
    judged = {id(request) for request in requests_by_role(requests, "judge")}
    return [request for request in requests if id(request) not in judged]


def test_dspy_gepa_with_a_judge_runs_the_same_and_pays_each_judge_request_once(judge_file):
    holder: dict[str, Any] = {}

    def native_optimizer(each: World) -> Any:
        holder["native"] = Counted(native_judge(each.url))
        return dspy.GEPA(metric=holder["native"], reflection_lm=each.lm, **_gepa_settings())

    native = _gepa_run(native_optimizer)

    def skynet_optimizer(each: World) -> Any:
        holder["metric"] = skynet_dspy.load_metric(judge_file, metric_lm=each.lm, output_fields="label")
        return dspy.GEPA(metric=holder["metric"], reflection_lm=each.lm, **_gepa_settings())

    skynet = _gepa_run(skynet_optimizer)
    _assert_same_gepa(native, skynet)
    assert native["scores"][native["best"]] > native["scores"][0]
    # the task model's and the reflection model's requests are the same, one for one
    assert_same_requests(_others(native["requests"]), _others(skynet["requests"]))
    # the judge: each distinct request once (the memo and the judge cache), in the order the native run first sent it
    native_judged, skynet_judged = _judge_requests(native["requests"]), _judge_requests(skynet["requests"])
    first_seen = [messages for number, messages in enumerate(native_judged) if messages not in native_judged[:number]]
    assert skynet_judged == first_seen
    assert len(native_judged) > len(skynet_judged)
    usage = holder["metric"].judge_usage
    assert usage.requests == len(skynet_judged)
    assert holder["metric"].stats["calls"] + holder["metric"].stats["memo_hits"] == holder["native"].calls


# -- plain GEPA ------------------------------------------------------------------------------

SEED = "Classify the support ticket into one of: billing, bug, how-to, account, other.\nTicket: {ticket}\nLabel:"


class Quiet:
    """GEPA's logger protocol: the test output stays clean."""

    def log(self, message: str) -> None:
        pass


def _rows(examples: list[dspy.Example]) -> list[dict[str, Any]]:
    return [{"input": example.inputs().toDict(), "expected": example.labels().toDict()} for example in examples]


def _plain_run(optimize: Callable[[Callable[[str, dict[str, Any]], str], Callable[[str], str]], Any]) -> Any:
    with world() as each:

        def run(template: str, input: dict[str, Any]) -> str:
            reply = litellm.completion(model="openai/gpt-4o-mini", api_base=each.url, api_key="local",
                                       messages=[{"role": "user", "content": template.format(**input)}])
            return reply.choices[0].message.content.strip()

        def reflect(prompt: str) -> str:
            reply = litellm.completion(model="openai/gpt-4o-mini", api_base=each.url, api_key="local",
                                       messages=[{"role": "user", "content": prompt}])
            return reply.choices[0].message.content

        result = optimize(run, reflect)
    return result, each.requests


def test_plain_gepa_runs_the_same_with_the_skynet_metric(skynet_file):
    """Both runs with GEPA's evaluation cache off: skynet_dspy.optimize_anything() turns it on by default (a
    repeated candidate and example then costs no run and no budget), which changes the search itself."""
    from gepa import optimize_anything as oa

    def native(run: Any, reflect: Any) -> Any:
        def evaluator(candidate: str, example: dict[str, Any]) -> tuple[float, dict[str, Any]]:
            output = run(candidate, example["input"])
            value, feedback = verdict(output, example["expected"]["label"], example["expected"]["cue"])
            # what skynet-dspy shows the reflection model, as DSPy GEPA's reflective dataset does
            return value, {"Inputs": dict(example["input"]), "Generated Outputs": output, "feedback": feedback,
                           "scores": {"exact": value}}

        config = oa.GEPAConfig(
            engine=oa.EngineConfig(seed=0, max_metric_calls=80, parallel=False, cache_evaluation=False),
            reflection=oa.ReflectionConfig(reflection_lm=reflect),
            tracking=oa.TrackingConfig(logger=Quiet()),
        )
        return oa.optimize_anything(seed_candidate=SEED, evaluator=evaluator, dataset=_rows(TRAIN),
                                    valset=_rows(VAL), config=config)

    def skynet(run: Any, reflect: Any) -> Any:
        return skynet_dspy.optimize_anything(
            SEED, run, skynet_file, trainset=_rows(TRAIN), valset=_rows(VAL), reflection_lm=reflect,
            max_metric_calls=80, rng_seed=0, parallel=False, cache_evaluation=False, logger=Quiet(),
        )

    native_result, native_requests = _plain_run(native)
    skynet_result, skynet_requests = _plain_run(skynet)
    assert native_result.val_aggregate_scores[native_result.best_idx] > native_result.val_aggregate_scores[0]
    assert skynet_result.candidates == native_result.candidates
    assert skynet_result.val_aggregate_scores == native_result.val_aggregate_scores
    assert skynet_result.val_subscores == native_result.val_subscores
    assert skynet_result.best_candidate == native_result.best_candidate
    assert_same_requests(native_requests, skynet_requests)
