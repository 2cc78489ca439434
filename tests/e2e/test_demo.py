"""`make demo` end to end (examples/demo.py), and the scripted model that plays the program, reflection and judge."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from skynet_dspy.devserver import Request
from skynet_dspy.devserver.scripted import (
    PRIOR,
    ScriptedModel,
    requests_by_role,
    role_of,
    rule_line,
    rules_in,
    scripted_server,
)

ROOT = Path(__file__).resolve().parent.parent

from examples import demo  # noqa: E402
from examples.program import load_split, make_program  # noqa: E402


def _header(request: Request, name: str) -> str:
    return next((value for key, value in request.headers.items() if key.lower() == name.lower()), "")


@pytest.fixture(scope="module")
def demo_run():
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("SKYNET_DEMO_MODEL", raising=False)
        lines: list[str] = []
        result = demo.main(budget=60, seed=0, out=lines.append)
    return result, "\n".join(lines)


def test_demo_raises_the_validation_score(demo_run):
    result, printed = demo_run
    assert result.report.ok
    assert result.optimized.score > result.baseline.score
    # Not a tie broken by timing noise: the optimized program labels more tickets right.
    assert result.optimized.accuracy >= result.baseline.accuracy + 2 / 12
    assert result.candidate_scores[0] < max(result.candidate_scores)
    assert "Tickets that mention" in result.best_instruction
    assert f"{result.baseline.score:.3f} -> {result.optimized.score:.3f}" in printed


def test_demo_prints_the_contract_check_judge_usage_and_measured_time_and_cost(demo_run):
    result, printed = demo_run
    assert "Contract check of" in printed and "Metric return value" in printed
    for evaluation in (result.baseline, result.optimized):
        assert evaluation.run_ms is not None and evaluation.run_ms > 0
        assert evaluation.cost_usd is not None and evaluation.cost_usd > 0  # the server reports gpt-4o-mini: priced
    assert "ms per ticket" in printed and "in all" in printed
    usage = result.judge_usage
    assert usage.requests > 0 and usage.total_tokens > 0
    assert f"{usage.requests} request(s)" in printed
    assert result.judge_optimized > result.judge_baseline
    assert not result.metric_stats.get("exception") and not result.metric_stats.get("invalid")


def test_demo_prints_the_cost_receipt_of_the_gepa_run(demo_run):
    result, printed = demo_run
    receipt = result.optimization.receipt
    assert "Cost receipt of the run" in printed and str(receipt) in printed
    requests = result.server.requests
    assert receipt.reflection.calls == len(requests_by_role(requests, "reflection")) > 0
    assert receipt.program.model_calls > 0 and receipt.program.cost_usd > 0
    assert receipt.total_usd > receipt.program.cost_usd
    assert [c.score for c in result.optimization.candidates] == result.candidate_scores


def test_demo_talks_only_to_its_loopback_server(demo_run):
    result, _ = demo_run
    requests = result.server.requests
    assert requests
    assert requests_by_role(requests, "task") and requests_by_role(requests, "reflection")
    assert requests_by_role(requests, "judge")
    assert all(_header(request, "Host").startswith("127.0.0.1:") for request in requests)


# -- the scripted model ----------------------------------------------------------------------------


def _request(messages: list[dict]) -> Request:
    return Request("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": messages}, {}, 0.0)


def test_task_model_follows_the_rules_its_instructions_state():
    model = ScriptedModel()
    ticket = "Please send the refund to my card."
    assert model.classify(ticket)[0] == "other"
    assert model.classify(ticket, rule_line("refund", "billing"))[0] == "billing"
    # Rules stated in the instructions win over the model's own prior.
    assert model.classify("The invoice crashed", rule_line("crash", "bug"))[0] == "bug"
    assert model.classify("The invoice is wrong")[0] == PRIOR["invoice"]


def test_a_better_instruction_gives_better_answers_through_dspy():
    with scripted_server() as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
        program = make_program()
        refund = next(example for example in load_split("val") if example.cue == "refund")
        with dspy.context(lm=lm):
            before = program(ticket=refund.ticket).label
            better = program.deepcopy()
            base = better.predict.signature.instructions
            better.predict.signature = better.predict.signature.with_instructions(
                base + "\n" + rule_line("refund", "billing"))
            after = better(ticket=refund.ticket).label
        assert [role_of(request) for request in server.requests] == ["task", "task"]
    assert (before, after) == ("other", "billing")


def test_reflection_model_learns_rules_from_feedback_only():
    model = ScriptedModel()
    current = "Classify the ticket.\n" + rule_line("invoice", "billing")
    examples = [
        {"Inputs": {"ticket": "I am locked out"}, "Generated Outputs": {"label": "other"},
         "Feedback": "Expected 'account', got 'other'. The ticket mentions 'locked out', which points to account."},
        {"Inputs": {"ticket": "where is my refund"}, "Generated Outputs": {"label": "other"},
         "Feedback": "Wrong."},  # says nothing about what right looks like: nothing to learn
    ]
    system = ("Your input fields are:\n1. `current_instruction` (str)\n2. `examples_with_feedback` (list)\n"
              "Your output fields are:\n1. `new_instruction` (str)\nAll interactions will be structured...\n"
              "Outputs will be a JSON object with the following fields.")
    user = (f"[[ ## current_instruction ## ]]\n{current}\n\n[[ ## examples_with_feedback ## ]]\n"
            f"{json.dumps(examples)}\n\n"
            "Respond with a JSON object in the following order of fields: `new_instruction`.")
    request = _request([{"role": "system", "content": system}, {"role": "user", "content": user}])
    assert role_of(request) == "reflection"
    new = json.loads(model(request))["new_instruction"]
    assert rules_in(new) == [("invoice", "billing"), ("locked out", "account")]
    assert new.startswith("Classify the ticket.")


def test_reflection_model_answers_plain_gepa_prompts_in_a_code_block():
    prompt = ("I provided an assistant with the following instructions to perform a task for me:\n"
              "```\nLabel it.\n```\n\n"
              "The following are examples ...:\n```\n# Example 1\n## Feedback\nThe ticket mentions 'dark mode', "
              "which points to how-to.\n```\n\nProvide the new instructions within ``` blocks.")
    request = _request([{"role": "user", "content": prompt}])
    assert role_of(request) == "reflection"
    reply = ScriptedModel()(request)
    assert reply.startswith("```\n") and reply.endswith("\n```")
    assert rules_in(reply) == [("dark mode", "how-to")]


def test_judge_answers_pass_or_fail_from_what_it_knows():
    model = ScriptedModel()
    system = {"role": "system", "content": "Answer PASS or FAIL, then give one sentence of reasons."}

    def ask(question: str, answer: str) -> str:
        request = _request([system, {"role": "user", "content": f"Question: {question}\nAnswer: {answer}"}])
        assert role_of(request) == "judge"
        return model(request)

    assert ask("The loading spinner never stops.", "bug").startswith("PASS")
    verdict = ask("The loading spinner never stops.", "other")
    assert verdict.startswith("FAIL") and "'spinner'" in verdict and "bug" in verdict
    assert ask("What is the capital of France?", "Paris").startswith("PASS")


def test_demo_with_a_provider_model_runs_the_same_steps_against_it(monkeypatch):
    """SKYNET_DEMO_MODEL (+ SKYNET_DEMO_API_BASE) switches the demo to a provider; here an OpenAI-compatible
    endpoint on 127.0.0.1, reached exactly as a real one would be, with the key from OPENAI_API_KEY."""
    with scripted_server() as provider:
        monkeypatch.setenv("SKYNET_DEMO_MODEL", "openai/gpt-4o-mini")
        monkeypatch.setenv("SKYNET_DEMO_API_BASE", provider.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-demo-provider-key-123")
        monkeypatch.delenv("SKYNET_DEMO_REFLECTION_MODEL", raising=False)
        lines: list[str] = []
        result = demo.main(budget=40, seed=0, out=lines.append)
    assert result.server is None  # no scripted server of its own
    assert lines[0].startswith("Model: openai/gpt-4o-mini")
    assert provider.requests
    assert {_header(request, "Authorization") for request in provider.requests} == {"Bearer sk-demo-provider-key-123"}
    assert requests_by_role(provider.requests, "reflection") and requests_by_role(provider.requests, "judge")
    assert result.optimized.accuracy > result.baseline.accuracy
    assert "sk-demo-provider-key-123" not in "\n".join(lines)
