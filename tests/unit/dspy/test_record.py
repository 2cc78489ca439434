"""The record of an optimization run (_dspy/record.py): differences across the run, the reflection model's calls
read from its dspy.LM history or counted on gepa's LM, and a shared model told apart from the program."""

from __future__ import annotations

import re
from types import SimpleNamespace

import dspy
import pytest

import skynet_dspy
from skynet_dspy._core.types import Observation
from skynet_dspy._dspy.record import CountingLM, Recorder
from skynet_dspy.devserver import DevServer


def _metric():
    return skynet_dspy.load_metric(lambda input, output: (1.0, {"feedback": "ok"}), isolation="thread")


def _entry(cost, prompt=10, completion=5, cached=False):
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}, "cost": cost,
            "response": SimpleNamespace(cache_hit=cached)}


def test_the_reflection_models_history_gained_during_the_run_is_what_it_used():
    lm = dspy.LM("openai/gpt-4o-mini", api_key="unused")
    lm.history.append(_entry(5.0))  # before the run: not counted
    with _metric() as metric, Recorder(metric, lm) as recorder:
        lm.history.extend([_entry(0.25), _entry(0.5, 20, 10), _entry(9.0, cached=True)])
    usage = recorder.record.reflection
    assert (usage.calls, usage.cache_hits, usage.prompt_tokens, usage.completion_tokens) == (2, 1, 30, 15)
    assert usage.cost_usd == pytest.approx(0.75) and usage.note is None


def test_an_unknown_price_or_a_trimmed_history_is_said_not_hidden():
    lm = dspy.LM("openai/gpt-4o-mini", api_key="unused")
    lm.history.append(_entry(1.0))
    with _metric() as metric, Recorder(metric, lm) as recorder:
        lm.history.pop(0)  # dspy.settings.max_history_size dropped the entry the run started after
        lm.history.extend([_entry(None), _entry(0.5)])
    usage = recorder.record.reflection
    assert usage.calls == 2 and usage.cost_usd is None
    assert "price is unknown" in usage.note and "trimmed" in usage.note


def test_a_model_shared_with_an_unmeasured_program_is_not_split_by_guesswork():
    lm = dspy.LM("openai/gpt-4o-mini", api_key="unused")
    with _metric() as metric, Recorder(metric, lm, [lm]) as recorder:
        lm.history.extend([_entry(0.1), _entry(0.1), _entry(0.1)])
    usage = recorder.record.reflection
    assert usage.calls is None and usage.cost_usd is None
    assert "cannot be told apart: 3 calls and $0.3 together" in usage.note
    assert recorder.record.program is None


def test_a_model_shared_with_a_measured_program_has_the_programs_calls_taken_out():
    lm = dspy.LM("openai/gpt-4o-mini", api_key="unused")
    metric = skynet_dspy.load_metric(lambda input, output: (1.0, {"feedback": "ok"}), isolation="thread",
                                     measure=True)
    run = Observation(run_ms=3.0, cost_usd=0.1, model_calls=2, prompt_tokens=20, completion_tokens=10)
    with metric, Recorder(metric, lm, [lm]) as recorder:
        metric.score({"q": 1}, "a", observation=run)
        lm.history.extend([_entry(0.05), _entry(0.05), _entry(0.25, 100, 50)])  # two of the program's, one not
    record = recorder.record
    assert (record.program.runs, record.program.model_calls, record.program.cost_usd) == (1, 2, 0.1)
    assert (record.reflection.calls, record.reflection.prompt_tokens) == (1, 100)
    assert record.reflection.cost_usd == pytest.approx(0.25)
    assert record.metric_calls == 1 and record.failures == {}


def test_the_record_holds_differences_and_the_error_that_ended_the_run():
    metric = _metric()
    metric.score({"q": 1}, "before the run")
    with pytest.raises(RuntimeError), metric, Recorder(metric, None) as recorder:
        metric.score({"q": 2}, "during the run")
        raise RuntimeError("spending cap reached")
    record = recorder.record
    assert record.metric_calls == 1
    assert record.error == "RuntimeError: spending cap reached"
    assert record.reflection.calls is None and "function" in record.reflection.note


def test_gepas_litellm_model_counts_its_calls(server):
    server.responder = lambda request: "an answer"
    lm = CountingLM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key")
    with _metric() as metric, Recorder(metric, lm) as recorder:
        assert lm("hello") == "an answer"
        assert lm([{"role": "user", "content": "again"}]) == "an answer"
    usage = recorder.record.reflection
    assert usage.calls == 2 == len(server.requests)
    assert usage.cost_usd > 0 and usage.prompt_tokens > 0


def test_the_record_of_a_plain_gepa_run_is_kept_beside_its_result_never_written_into_it():
    import dataclasses

    data = [{"input": {"q": f"q{n}"}, "expected": {"want": "better"}} for n in range(2)]
    result = skynet_dspy.optimize_anything(
        "Say", lambda artifact, input: artifact,
        lambda input, output, expected: (float(expected["want"] in output), {"feedback": "say better"}),
        trainset=data, reflection_lm=lambda prompt: "```\nSay better\n```", max_metric_calls=20, parallel=False,
        logger=QuietLogger(), isolation="thread",
    )
    assert "skynet_run" not in vars(result)  # GEPA's frozen GEPAResult is left as GEPA made it
    receipt = skynet_dspy.report(result).receipt
    assert receipt is not None and receipt.metric_calls > 0
    assert skynet_dspy.report(dataclasses.replace(result)).receipt is None  # an equal result, not this run's


def test_a_plain_gepa_reflection_model_without_a_price_costs_unknown_not_zero():
    def reflect(request):
        current = re.search(r"```\n(.*?)\n```", request.text, re.S).group(1)
        return f"```\n{current} better\n```"

    data = [{"input": {"q": f"q{n}"}, "expected": {"want": "better"}} for n in range(2)]
    with DevServer(reflect) as server:  # answers as the model asked for, which LiteLLM has no price for
        result = skynet_dspy.optimize_anything(
            "Say", lambda artifact, input: artifact,
            lambda input, output, expected: (float(expected["want"] in output), {"feedback": "say better"}),
            trainset=data, reflection_lm={"model": "openai/house-model-without-a-price", "api_base": server.url,
                                          "api_key": "local-test-key"},
            max_metric_calls=20, parallel=False, logger=QuietLogger(), isolation="thread",
        )
        asked = len(server.requests)
    receipt = skynet_dspy.report(result).receipt
    assert receipt.reflection.calls == asked > 0 and receipt.reflection.prompt_tokens > 0
    assert receipt.reflection.cost_usd is None and receipt.total_usd is None
    assert "no price known for model openai/house-model-without-a-price" in receipt.reflection.note
    assert any(note.startswith("reflection: no price known") for note in receipt.notes)
    assert "cost unknown" in str(receipt)


def test_a_model_litellm_prices_at_zero_costs_zero():
    import litellm

    litellm.register_model({"openai/free-house-model": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                                                        "litellm_provider": "openai", "mode": "chat"}})
    with DevServer(lambda request: "an answer") as server:  # answers as the model asked for
        lm = CountingLM("openai/free-house-model", api_base=server.url, api_key="local-test-key")
        with _metric() as metric, Recorder(metric, lm) as recorder:
            lm("hello")
    assert recorder.record.reflection.cost_usd == 0.0 and recorder.record.reflection.note is None


class QuietLogger:
    def log(self, message: str) -> None:
        pass
