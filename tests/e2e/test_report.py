"""skynet_dspy.report(): a real dspy.GEPA run (and a plain-GEPA run) against the loopback scripted server, with a
receipt whose every figure is checked against what the server saw and what the metric was shown."""

from __future__ import annotations

import contextlib
import io
import json
import re

import dspy
import litellm
import pytest
from support import write_metric

import skynet_dspy
from examples.program import load_split, make_program
from skynet_dspy.devserver import DevServer
from skynet_dspy.devserver.scripted import requests_by_role, scripted_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

KEY = "local-test-key"
# The bundled example's metric, plus a model judge (llm()) as a second named score, and a log of every
# measured run the metric is shown, to check the receipt's program figures against.
METRIC = '''
import json
from skynet import llm, observation

LOG = {log!r}


def score(input, output, expected=None):
    want, cue = expected["label"], expected["cue"]
    got = str(output).strip().strip("'\\".").lower()
    verdict = llm(
        "You review how support tickets are routed to teams (billing, bug, how-to, account, other). "
        "Answer PASS or FAIL, then give one sentence of reasons.",
        input=f"Question: {{input['ticket']}}\\nAnswer: {{output}}",
    )
    run = observation()
    with open(LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({{"cost": run.cost_usd, "calls": run.model_calls, "tokens": run.total_tokens}}) + "\\n")
    why = f"The ticket mentions '{{cue}}', which points to {{want}}."
    right = got == want
    feedback = f"Correct: '{{want}}'. {{why}}" if right else f"Expected '{{want}}', got '{{got}}'. {{why}}"
    judged = 1.0 if str(verdict).strip().upper().startswith("PASS") else 0.0
    return float(right), {{"feedback": feedback, "scores": {{"accuracy": float(right), "judge": judged}}}}
'''


def _lm(server):
    return dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)


def _compile(tmp_path, server, *, shared: bool):
    log = tmp_path / "runs.jsonl"
    metric = write_metric(tmp_path, METRIC.format(log=str(log)))
    task = _lm(server)
    reflection = task if shared else _lm(server)
    optimizer = skynet_dspy.gepa(metric, reflection, output_fields="label", max_metric_calls=40, seed=0,
                                 num_threads=2, candidate_selection_strategy="current_best")
    with dspy.context(lm=task), contextlib.redirect_stderr(io.StringIO()):
        program = optimizer.compile(make_program(), trainset=load_split("train"), valset=load_split("val"))
    runs = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return optimizer, program, runs


def test_a_gepa_run_reports_its_candidates_and_a_receipt_that_adds_up(tmp_path):
    with scripted_server() as server:
        optimizer, program, runs = _compile(tmp_path, server, shared=False)
        requests = list(server.requests)
    metric = optimizer.skynet_metric
    report = skynet_dspy.report(optimizer)
    receipt = report.receipt

    # the judge's figures are the metric's own judge usage (the metric did nothing but this run)
    assert receipt.judge == metric.judge_usage
    assert receipt.judge.requests == len(requests_by_role(requests, "judge")) > 0
    assert receipt.judge.cache_hits > 0  # the same (ticket, answer) is judged once
    # the program's cost is the sum of the measured runs the metric was shown
    assert receipt.program.runs == len(runs) == metric.stats["calls"]
    assert receipt.program.cost_usd == pytest.approx(sum(run["cost"] for run in runs)) and receipt.program.cost_usd > 0
    assert receipt.program.model_calls == sum(run["calls"] for run in runs) == len(requests_by_role(requests, "task"))
    assert receipt.program.total_tokens == sum(run["tokens"] for run in runs)
    # the reflection model's calls are the reflection requests the server answered
    assert receipt.reflection.calls == len(requests_by_role(requests, "reflection")) > 0
    assert receipt.reflection.cost_usd > 0 and receipt.reflection.note is None
    assert receipt.total_usd == pytest.approx(receipt.program.cost_usd + receipt.judge.cost_usd
                                              + receipt.reflection.cost_usd)
    assert receipt.seconds > 0 and receipt.metric_calls == metric.stats["calls"]

    # the candidates are GEPA's own
    details = program.detailed_results
    assert [c.score for c in report.candidates] == [float(s) for s in details.val_aggregate_scores]
    assert [c.metric_calls for c in report.candidates] == list(details.discovery_eval_counts)
    assert report.best == details.best_idx and report.best > 0
    assert report.total_metric_calls == details.total_metric_calls
    seed, best = report.named_scores["accuracy"]
    assert best > seed
    assert set(report.named_scores) == {"accuracy", "judge"}
    assert report.seed.texts["predict"] == make_program().predict.signature.instructions
    assert report.best_candidate.texts["predict"] == program.predict.signature.instructions
    assert re.search(r"^\+Tickets that mention '.+' are \w", report.diff(), re.M)

    text = str(report)
    assert "Cost receipt of the run" in text and f"{receipt.reflection.calls} call(s)" in text
    assert f"{report.best} best" in text
    page = report._repr_html_()
    assert "<img src='data:image/png;base64," in page and "Cost receipt" in page
    # the compiled program carries the same record
    assert skynet_dspy.report(program).receipt == receipt
    assert json.loads(json.dumps(report.to_dict()))["receipt"]["judge"]["requests"] == receipt.judge.requests

    png = tmp_path / "run.png"
    report.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_a_reflection_model_that_is_also_the_programs_model_is_counted_apart_from_it(tmp_path):
    with scripted_server() as server:
        optimizer, _, runs = _compile(tmp_path, server, shared=True)
        requests = list(server.requests)
    receipt = skynet_dspy.report(optimizer).receipt
    assert receipt.reflection.calls == len(requests_by_role(requests, "reflection")) > 0
    assert receipt.program.model_calls == len(requests_by_role(requests, "task"))
    assert receipt.reflection.note is None  # GEPA reflects through a copy of the model, with its own history


def test_a_run_not_yet_made_or_not_recorded_is_refused_clearly():
    optimizer = skynet_dspy.gepa(lambda input, output: (1.0, {"feedback": "ok"}), "openai/gpt-4o-mini",
                                 max_metric_calls=10, isolation="thread")
    with pytest.raises(ValueError, match="compile"):
        skynet_dspy.report(optimizer)
    plain = dspy.GEPA(metric=optimizer.skynet_metric, reflection_lm=optimizer.reflection_lm, max_metric_calls=10)
    with pytest.raises(ValueError, match="not built by skynet_dspy.gepa"):
        skynet_dspy.report(plain)
    with pytest.raises(ValueError, match="track_stats=True"):
        skynet_dspy.report(make_program())
    with pytest.raises(TypeError, match="optimize_anything"):
        skynet_dspy.report("run.json")


# -- plain GEPA ----------------------------------------------------------------------------------------

HINT = "routing code"
REFLECTION_MARK = "I am optimizing a parameter"


def ticket_metric(input, output, expected=None):
    from skynet import observation

    observation()  # read, so the runs are measured
    right = output == expected["code"]
    feedback = "Correct." if right else f"Wrong answer: the instructions must mention the phrase '{HINT}'."
    return float(right), {"feedback": feedback, "scores": {"exact": float(right)}}


class QuietLogger:
    def log(self, message: str) -> None:
        pass


def test_an_optimize_anything_run_reports_the_same_way(tmp_path):
    words = ("amber", "basil", "cedar", "dune")
    tickets = [f"Ticket {word}: the order arrived damaged" for word in words]
    codes = {ticket: f"RC-{index}" for index, ticket in enumerate(tickets)}

    def responder(request):
        text = request.text
        if REFLECTION_MARK in text:
            current = re.search(r"```\n(.*?)\n```", text, re.S).group(1)
            return f"```\n{current} Answer with the {HINT}.\n```"
        ticket = next(ticket for ticket in tickets if ticket in text)
        return codes[ticket] if HINT in text else "general"

    with DevServer(model_name="gpt-4o-mini") as server:
        server.responder = responder

        def run(template, input):
            response = litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key=KEY,
                                          messages=[{"role": "user", "content": template.format(**input)}])
            return response.choices[0].message.content.strip()

        data = [skynet_dspy.split_row({"ticket": t, "code": codes[t]}, inputs=["ticket"], outputs=["code"])
                for t in tickets]
        result = skynet_dspy.optimize_anything(
            "Classify the ticket: {ticket}", run, ticket_metric, trainset=data[:2], valset=data[2:],
            reflection_lm={"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY},
            max_metric_calls=16, max_workers=1, logger=QuietLogger(), isolation="thread",
        )
        requests = list(server.requests)
    report = skynet_dspy.report(result)
    reflections = [request for request in requests if REFLECTION_MARK in request.text]
    assert report.source == "optimize_anything"
    assert [c.score for c in report.candidates] == [float(s) for s in result.val_aggregate_scores]
    assert report.best == result.best_idx and HINT in next(iter(report.best_candidate.texts.values()))
    receipt = report.receipt
    assert receipt.reflection.calls == len(reflections) > 0  # gepa's LiteLLM model, counted
    assert receipt.reflection.cost_usd > 0
    assert receipt.program.model_calls == len(requests) - len(reflections) == receipt.program.runs
    assert receipt.program.cost_usd > 0
    assert receipt.judge.requests == 0
    assert "Answer with the routing code" in report.diff()
