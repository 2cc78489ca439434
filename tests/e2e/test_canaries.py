"""Canaries (issue 14): only the feedback a metric wrote reaches any model, even when the metric fails.

Each example's labels hold unique canary values (an id, a note, an answer). A metric file reads them and
leaks them every way a metric can: in extra side-information keys (names and values), in exception
messages (ValueError from float(), KeyError, RuntimeError, SystemExit), as invalid return values, and
as named-score names (not a number, too long, too many); one example calls llm() with no judge model
configured. Real `dspy.GEPA` and `skynet_dspy.optimize_anything` runs then go against the loopback
model server, which records every request: no canary may appear in any of them.

The positive control: on a successful call the metric writes a "SHOWN-..." marker of its own into the
feedback; those markers must reach the reflection model, so a search that finds nothing is a real
finding, not a blind one. A last run returns 3,000 named scores of 90 characters on every call: the
reflection prompt stays small and every call is scored as invalid.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from examples.program import load_split
from skynet_dspy.devserver import DevServer, Request, ScriptedModel, requests_by_role, scripted_server

pytestmark = pytest.mark.timeout(240)

METRIC = """
    import sys
    from skynet import llm

    def score(input, output, expected):
        mode = expected["mode"]
        right = str(output).strip().strip("'\\".").lower() == expected["label"]
        why = f"The ticket mentions '{expected['cue']}', which points to {expected['label']}."
        if mode == "ok":
            verdict = "Correct" if right else f"Expected '{expected['label']}'"
            info = {"feedback": f"{verdict}. {why} [{expected['shown']}]", "scores": {"accuracy": float(right)}}
            info["extra_" + expected["gold_id"]] = expected["note"]  # an extra key: its name and value are canaries
            info["expected_copy"] = dict(expected)
            return float(right), info
        if mode == "raise_value":
            return float(expected["answer"]), {"feedback": why}  # ValueError: could not convert string to float
        if mode == "raise_key":
            return 1.0, {"feedback": {}[expected["note"]]}  # KeyError holding the canary
        if mode == "raise_runtime":
            raise RuntimeError(f"no rule for {expected['gold_id']} ({expected['note']}); {why}")
        if mode == "exit":
            sys.exit(expected["note"])
        if mode == "bad_score":
            return expected["note"], {"feedback": why}
        if mode == "bad_feedback":
            return 0.5, {"feedback": [expected["note"], why]}
        if mode == "bad_named_value":
            return 0.5, {"feedback": why, "scores": {"accuracy": expected["note"]}}
        if mode == "bad_named_name":
            return 0.5, {"feedback": why, "scores": {expected["gold_id"]: "high"}}
        if mode == "long_name":
            return 0.5, {"feedback": why, "scores": {expected["gold_id"] * 3: 1.0}}
        if mode == "many_names":
            return 0.5, {"feedback": why, "scores": {f"{expected['gold_id']}-{i}": 1.0 for i in range(40)}}
        if mode == "judge":
            verdict = llm(f"Is '{output}' right? The answer is {expected['note']}.", input=why)
            return 1.0, {"feedback": verdict}
        raise AssertionError(mode)
"""

MODES = ("ok", "raise_value", "raise_key", "raise_runtime", "exit", "bad_score", "bad_feedback",
         "bad_named_value", "bad_named_name", "long_name", "many_names", "judge", "ok")
# What each failing mode's feedback must say (it names the failure, never the metric's values).
NEUTRAL = {
    "raise_value": "Not scored: the metric raised ValueError while scoring this output.",
    "raise_key": "Not scored: the metric raised KeyError while scoring this output.",
    "raise_runtime": "Not scored: the metric raised RuntimeError while scoring this output.",
    "exit": "Not scored: the metric raised SystemExit while scoring this output.",
    "bad_score": "breaks the metric contract (score is a string)",
    "bad_feedback": "breaks the metric contract (no feedback string)",
    "bad_named_value": "breaks the metric contract (named score is not a number)",
    "bad_named_name": "breaks the metric contract (named score is not a number)",
    "long_name": "breaks the metric contract (named score name is too long)",
    "many_names": "breaks the metric contract (too many named scores)",
    "judge": "Not scored: the metric's judge model is not configured; this is a setup problem",
}
# Text of the setup error that must stay in the log: the reflection model must not be told to fix the setup.
SETUP_ADVICE = ("has no model to call", "load_metric(", "metric_lm=", "configure_llm")


@dataclass
class Canaries:
    """The canary values planted in the examples' labels, and the positive-control markers."""

    secret: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)


def _examples() -> tuple[list[dict], Canaries]:
    """One example per mode (the bundled tickets), each with canary labels; as split dicts."""
    canaries = Canaries()
    rows = []
    for number, (mode, example) in enumerate(zip(MODES, load_split("train"), strict=False)):
        tag = uuid.uuid4().hex[:12]
        labels = {
            "label": example.label, "cue": example.cue, "mode": mode,
            "gold_id": f"CANARY-ID-{tag}", "note": f"CANARY-NOTE-{tag}", "answer": f"CANARY-ANSWER-{tag}",
            "shown": f"SHOWN-{number}-{tag}",
        }
        canaries.secret += [labels["gold_id"], labels["note"], labels["answer"]]
        canaries.shown.append(labels["shown"])
        rows.append({"input": {"ticket": example.ticket}, "expected": labels})
    return rows, canaries


def _leaks(requests, canaries: Canaries) -> list[str]:
    """Canary values found in any recorded request: its whole body, JSON-encoded, and the text a model reads."""
    found = []
    for request in requests:
        raw = json.dumps(request.body, ensure_ascii=False) + "\n" + request.text + "\n" + request.path
        found += [value for value in canaries.secret if value in raw]
        found += [text for text in SETUP_ADVICE if text in raw]
    return found


def _shown(requests, canaries: Canaries) -> set[str]:
    text = "\n".join(json.dumps(request.body) for request in requests)
    return {marker for marker in canaries.shown if marker in text}


def _metric_file(folder: Path) -> Path:
    return write_metric(folder, METRIC)


def _setup_errors(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The error records of the missing judge model (not the "last N calls all failed" ones)."""
    return [record for record in records
            if record.levelno == logging.ERROR and "judge_not_configured: " in record.getMessage()
            and "calls all failed" not in record.getMessage()]


@dataclass
class Run:
    server: DevServer
    canaries: Canaries
    metric: skynet_dspy.Metric
    errors: list[logging.LogRecord]


# -- dspy.GEPA -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dspy_gepa_run(tmp_path_factory):
    rows, canaries = _examples()
    train = [dspy.Example(**row["input"], **row["expected"]).with_inputs("ticket") for row in rows]
    metric = skynet_dspy.load_metric(_metric_file(tmp_path_factory.mktemp("dspy_gepa")), output_fields="label",
                                     timeout=20)
    server = scripted_server()
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    optimizer = dspy.GEPA(metric=metric, reflection_lm=lm, max_metric_calls=3 * len(train), num_threads=2,
                          reflection_minibatch_size=len(train), seed=0, track_stats=False)
    handler = _Records()
    logging.getLogger("skynet_dspy").addHandler(handler)
    try:
        with dspy.context(lm=lm):
            optimizer.compile(dspy.Predict("ticket -> label"), trainset=train, valset=train)
    finally:
        logging.getLogger("skynet_dspy").removeHandler(handler)
        server.stop()
        metric.close()
    return Run(server, canaries, metric, [r for r in handler.records if r.levelno == logging.ERROR])


class _Records(logging.Handler):
    """Keeps the package's log records of a module-scoped run (caplog is per test)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_dspy_gepa_sends_no_canary_to_any_model(dspy_gepa_run):
    run = dspy_gepa_run
    reflections = requests_by_role(run.server.requests, "reflection")
    assert reflections, "GEPA asked the reflection model for a new instruction"
    assert len(run.server.requests) > len(reflections), "the program's own calls were recorded too"
    assert _leaks(run.server.requests, run.canaries) == []


def test_dspy_gepa_reflection_reads_the_metrics_own_feedback_and_neutral_failures(dspy_gepa_run):
    run = dspy_gepa_run
    reflections = requests_by_role(run.server.requests, "reflection")
    # The positive control: markers the metric wrote into successful feedback do reach the model.
    assert _shown(reflections, run.canaries), "no SHOWN marker reached the reflection model: the search is blind"
    text = "\n".join(json.dumps(request.body) for request in reflections)
    missing = [mode for mode, sentence in NEUTRAL.items() if sentence not in text]
    assert not missing, f"the failed calls of these modes were not shown with their neutral feedback: {missing}"


def test_dspy_gepa_logs_the_missing_judge_model_once_as_an_error_and_counts_every_failure(dspy_gepa_run):
    run = dspy_gepa_run
    errors = _setup_errors(run.errors)
    assert len(errors) == 1, [record.getMessage() for record in run.errors]
    assert "metric_lm=" in errors[0].getMessage()  # the fix is told to the user, in the log
    stats = run.metric.stats
    for kind in ("exception", "invalid", "judge_not_configured"):
        assert stats[kind] >= 1, stats


# -- skynet_dspy.optimize_anything --------------------------------------------------------------


def _run(artifact: str, input: dict) -> str:
    """The program: the scripted task model's labelling, driven by the artifact's rules (no model call)."""
    return ScriptedModel().classify(input["ticket"], artifact)[0]


@pytest.fixture(scope="module")
def plain_gepa_run(tmp_path_factory):
    rows, canaries = _examples()
    server = scripted_server()
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)

    def reflect(prompt):  # a bare callable: GEPA's alone, so llm() in the metric has no model
        return lm(messages=[{"role": "user", "content": prompt}])[0]

    metric = skynet_dspy.load_metric(_metric_file(tmp_path_factory.mktemp("plain_gepa")), timeout=20)
    handler = _Records()
    logging.getLogger("skynet_dspy").addHandler(handler)
    try:
        result = skynet_dspy.optimize_anything(
            "Classify the support ticket as billing, bug, how-to, account or other.", _run, metric,
            trainset=rows, reflection_lm=reflect, max_metric_calls=3 * len(rows),
            reflection_minibatch_size=len(rows), max_workers=2, logger=_Quiet(),
        )
    finally:
        logging.getLogger("skynet_dspy").removeHandler(handler)
        server.stop()
        metric.close()
    assert result.val_aggregate_scores
    return Run(server, canaries, metric, [r for r in handler.records if r.levelno == logging.ERROR])


class _Quiet:
    def log(self, message: str) -> None:
        pass


def test_optimize_anything_sends_no_canary_to_any_model(plain_gepa_run):
    run = plain_gepa_run
    assert run.server.requests, "GEPA asked the reflection model"
    assert _leaks(run.server.requests, run.canaries) == []


def test_optimize_anything_reflection_reads_the_metrics_own_feedback_and_neutral_failures(plain_gepa_run):
    run = plain_gepa_run
    assert _shown(run.server.requests, run.canaries), "no SHOWN marker reached the reflection model"
    text = "\n".join(request.text for request in run.server.requests)
    missing = [mode for mode, sentence in NEUTRAL.items() if sentence not in text]
    assert not missing, f"the failed calls of these modes were not shown with their neutral feedback: {missing}"
    assert "### accuracy" in text  # valid named scores reach GEPA (names the metric chose on a valid call)


def test_optimize_anything_logs_the_missing_judge_model_once(plain_gepa_run):
    errors = _setup_errors(plain_gepa_run.errors)
    assert len(errors) == 1, [record.getMessage() for record in plain_gepa_run.errors]
    assert "metric_lm=" in errors[0].getMessage()


def test_the_search_finds_a_canary_that_did_leak(plain_gepa_run):
    """The control of the control: _leaks() reports a canary placed in a request."""
    run = plain_gepa_run
    forged = Request(path="/v1/chat/completions", at=0.0, headers={},
                     body={"messages": [{"role": "user", "content": run.canaries.secret[4]}]})
    assert _leaks([forged], run.canaries) == [run.canaries.secret[4]]


# -- named scores past the limits ---------------------------------------------------------------


HUGE_NAMES = """
    def score(input, output, expected):
        names = {f"{expected['gold_id']}-" + f"{i:05d}".rjust(90 - len(expected['gold_id']) - 1, "n"): 1.0
                 for i in range(3000)}
        return 0.5, {"feedback": "Close.", "scores": names}
"""


def test_thousands_of_long_named_scores_keep_the_reflection_prompt_small(tmp_path):
    rows, canaries = _examples()
    rows = rows[:3]
    server = scripted_server()
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    try:
        with skynet_dspy.load_metric(write_metric(tmp_path, HUGE_NAMES), timeout=20) as metric:
            skynet_dspy.optimize_anything(
                "Classify the support ticket.", _run, metric, trainset=rows, reflection_lm=lm,
                max_metric_calls=9, reflection_minibatch_size=3, logger=_Quiet(),
            )
            stats = metric.stats
    finally:
        server.stop()
    assert server.requests, "GEPA reflected on the invalid calls"
    longest = max(len(json.dumps(request.body)) for request in server.requests)
    assert longest < 10_000, f"a reflection request of {longest:,} characters"  # 613,424 before the limit
    assert stats["calls"] >= 3 and stats["invalid"] == stats["calls"], stats
    assert _leaks(server.requests, canaries) == []
    text = "\n".join(request.text for request in server.requests)
    assert NEUTRAL["many_names"] in text
