"""Plain GEPA (optimize_anything) with the same metric.py: the evaluator, examples, models, end to end."""

from __future__ import annotations

import json
import re
import time
import uuid

import dspy
import litellm
import pytest

import skynet_dspy
from skynet_dspy._dspy import measure as _measure

KEY = "local-test-key"


class QuietLogger:
    """GEPA's logger protocol, keeping the test output clean."""

    def __init__(self):
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def example(input_values, expected=None):
    return {"input": input_values, "expected": expected}


def echo_run(artifact, input):
    return f"{artifact}|{input['q']}"


# -- side_info -----------------------------------------------------------------------------


def test_side_info_holds_inputs_output_feedback_and_named_scores_never_expected():
    secret = f"EXP-{uuid.uuid4().hex}"

    def score(input, output, expected=None):
        return 0.25, {
            "feedback": "Too short.",
            "scores": {"length": 0.5, "format": 1},
            "expected_seen": expected["label"],
            "debug": "internal",
        }

    evaluator = skynet_dspy.make_evaluator(echo_run, score)
    value, side_info = evaluator("A", example({"q": "x"}, {"label": secret}))
    assert value == 0.25
    # what the reflection model reads: the input fields, run()'s return value, the feedback and the named scores
    assert side_info == {"Inputs": {"q": "x"}, "Generated Outputs": "A|x", "feedback": "Too short.",
                         "scores": {"length": 0.5, "format": 1.0}}
    assert secret not in repr(side_info)
    # The extra keys are still the user's, on the full Result.
    assert evaluator.evaluate("A", example({"q": "x"}, {"label": secret})).extra["expected_seen"] == secret


def test_side_info_inputs_and_output_are_bounded_like_the_feedback_and_redacted():
    key = "sk-" + "a1B2c3D4" * 6  # shaped like an OpenAI key: redacted wherever the package shows text
    fields = {f"f{n}": "word " * 5_000 for n in range(30)}  # 30 fields of 25,000 characters each

    def run(artifact, input):
        return {"answer": "x " * 50_000, "key": key, "nested": [1, 2, {"deep": None}]}

    evaluator = skynet_dspy.make_evaluator(run, lambda i, o: (1.0, {"feedback": "ok"}), feedback_limit=1_000)
    _, side_info = evaluator("A", example(fields))
    shown = side_info["Generated Outputs"]
    assert isinstance(shown, str) and len(shown) <= 1_000 and "[feedback cut:" in shown  # JSON text, cut
    assert key not in repr(side_info)
    assert all(len(value) <= max(100, 1_000 // 30) for value in side_info["Inputs"].values())
    assert len(json.dumps(side_info["Inputs"])) < 30 * 200  # the fields share the limit
    # plain scalars stay as they are
    _, plain = skynet_dspy.make_evaluator(lambda a, i: 3, lambda i, o: (1.0, {"feedback": "ok"}))(
        "A", example({"n": 7, "flag": True}))
    assert plain["Inputs"] == {"n": 7, "flag": True} and plain["Generated Outputs"] == 3


def test_side_info_without_named_scores_is_feedback_alone():
    evaluator = skynet_dspy.make_evaluator(echo_run, lambda input, output: (1.0, {"feedback": "Fine."}))
    assert evaluator("A", example({"q": "x"})) == (
        1.0, {"Inputs": {"q": "x"}, "Generated Outputs": "A|x", "feedback": "Fine."})


def test_output_is_what_run_returned_and_expected_reaches_the_metric(metrics_dir):
    def run(artifact, input):
        return artifact.format(**input)

    evaluator = skynet_dspy.make_evaluator(run, metrics_dir / "exact_match.py")
    assert evaluator("{q}", example({"q": "yes"}, {"label": "yes"})) == (
        1.0, {"Inputs": {"q": "yes"}, "Generated Outputs": "yes", "feedback": "Correct."})
    value, side_info = evaluator("not {q}", example({"q": "yes"}, {"label": "yes"}))
    assert value == 0.0 and side_info["feedback"] == "Expected 'yes', got 'not yes'."
    assert side_info["Generated Outputs"] == "not yes"


def test_str_and_dict_candidates_reach_run_as_given():
    seen = []

    def run(artifact, input):
        seen.append(artifact)
        if isinstance(artifact, dict):
            artifact["system"] = "changed by run"  # must not change GEPA's candidate
        return "out"

    evaluator = skynet_dspy.make_evaluator(run, lambda i, o: (1.0, {"feedback": "ok"}))
    evaluator("plain text", example({"q": 1}))
    candidate = {"system": "S", "user": "U"}
    evaluator(candidate, example({"q": 1}))
    assert seen[0] == "plain text" and isinstance(seen[0], str)
    assert isinstance(seen[1], dict) and set(seen[1]) == {"system", "user"}
    assert candidate == {"system": "S", "user": "U"}


def test_run_cannot_change_the_dataset():
    def run(artifact, input):
        input["q"] = "mutated"
        return input["q"]

    def score(input, output, expected=None):
        return 1.0, {"feedback": f"metric saw {input['q']}"}  # what the metric got, told through its feedback

    item = example({"q": "original"}, {"label": "x"})
    value, side_info = skynet_dspy.make_evaluator(run, score)("A", item)
    assert (value, side_info["feedback"], side_info["Inputs"]) == (1.0, "metric saw original", {"q": "original"})
    assert item["input"]["q"] == "original"


# -- failures ------------------------------------------------------------------------------


def test_a_run_that_raises_scores_the_failure_score_and_the_run_goes_on():
    def run(artifact, input):
        if input["q"] == "bad":
            raise ZeroDivisionError("division by zero in the template")
        return "fine"

    def score(input, output, expected=None):
        return 1.0, {"feedback": f"Good: {output}."}

    evaluator = skynet_dspy.make_evaluator(run, score, failure_score=-1.0)
    value, side_info = evaluator("A", example({"q": "bad"}))
    assert value == -1.0
    # run() is the program, not the metric: its own error is the feedback the reflection model can act on
    # run() raised: nothing it returned to show, the input still is
    assert side_info == {"Inputs": {"q": "bad"},
                         "feedback": "run(artifact, input) raised ZeroDivisionError: division by zero in the template"}
    assert evaluator.stats["run_exception"] == 1 and evaluator.stats["calls"] == 0  # the metric was not called
    assert evaluator("A", example({"q": "good"}))[1]["feedback"] == "Good: fine."
    assert evaluator.stats["run_exception"] == 1 and evaluator.stats["calls"] == 1


def test_a_metric_that_raises_gives_failure_feedback():
    def score(input, output, expected=None):
        raise KeyError("label")

    evaluator = skynet_dspy.make_evaluator(echo_run, score)
    value, side_info = evaluator("A", example({"q": "x"}))
    assert value == 0.0 and set(side_info) == {"Inputs", "Generated Outputs", "feedback"}
    # the reflection model reads a neutral sentence: the exception type, never its message
    assert side_info["feedback"] == "Not scored: the metric raised KeyError while scoring this output."
    result = evaluator.evaluate("A", example({"q": "x"}))
    assert result.failure == "exception" and "KeyError: 'label'" in result.detail  # the full story is the user's
    assert evaluator.stats["exception"] == 2  # each call scores: repeats are for GEPA's evaluation cache to skip


def test_an_invalid_return_gives_failure_feedback():
    evaluator = skynet_dspy.make_evaluator(echo_run, lambda i, o: 0.8)
    value, side_info = evaluator("A", example({"q": "x"}))
    assert value == 0.0
    assert "breaks the metric contract (no side information)" in side_info["feedback"]
    assert "0.8" not in side_info["feedback"]  # the offending value stays out of the feedback
    assert evaluator.stats["invalid"] == 1


def test_a_metric_past_its_timeout_scores_the_failure_and_does_not_hold_up_the_run():
    def score(input, output, expected=None):
        if input["q"] == "stuck":
            time.sleep(60)  # far past the timeout: its worker process is stopped
        return 1.0, {"feedback": "Done."}

    evaluator = skynet_dspy.make_evaluator(echo_run, score, timeout=0.3)
    try:
        started = time.monotonic()
        value, side_info = evaluator("A", example({"q": "stuck"}))
        assert time.monotonic() - started < 30  # cut at the timeout, not after the minute of sleep
        assert value == 0.0
        assert side_info["feedback"] == "Not scored: the metric timed out after 0.3 s on this output."
        assert evaluator("A", example({"q": "next"}))[1]["feedback"] == "Done."
        assert evaluator.stats["timeout"] == 1 and evaluator.stats["calls"] == 2
    finally:
        evaluator.metric.close()


# -- repeats -------------------------------------------------------------------------------


def test_the_evaluator_keeps_no_memo_of_its_own():
    """Repeats are GEPA's to skip (optimize_anything turns its evaluation cache on): each call runs and scores."""
    runs = []

    def run(artifact, input):
        runs.append((artifact, input["q"]))
        return artifact

    def score(input, output, expected=None):
        return 0.5, {"feedback": f"Scored {output}.", "scores": {"a": 0.5}}

    evaluator = skynet_dspy.make_evaluator(run, score)
    first = evaluator("A", example({"q": "x"}, {"label": 1}))
    again = evaluator("A", example({"q": "x"}, {"label": 1}))
    assert first == again and len(runs) == 2 and evaluator.stats["calls"] == 2
    assert evaluator.stats["memo_hits"] == 0
    again[1]["scores"]["a"] = 99  # GEPA may keep and change what it gets; no later result changes with it
    assert evaluator("A", example({"q": "x"}, {"label": 1}))[1]["scores"] == {"a": 0.5}


# -- examples ------------------------------------------------------------------------------


def test_split_row_splits_by_column_roles():
    row = {"ticket": "My card was charged twice", "label": "billing", "id": 7}
    assert skynet_dspy.split_row(row, inputs=["ticket"], outputs=["label"]) == {
        "input": {"ticket": "My card was charged twice"},
        "expected": {"label": "billing"},
    }
    assert skynet_dspy.split_row(row, inputs="ticket") == {"input": {"ticket": "My card was charged twice"},
                                                           "expected": None}


def test_split_row_names_a_missing_column_and_the_columns_present():
    with pytest.raises(ValueError, match=r"no column 'lable' \(columns present: 'ticket', 'label'\)"):
        skynet_dspy.split_row({"ticket": "t", "label": "l"}, inputs=["ticket"], outputs=["lable"])
    with pytest.raises(ValueError, match="both inputs and outputs"):
        skynet_dspy.split_row({"ticket": "t"}, inputs=["ticket"], outputs=["ticket"])
    with pytest.raises(ValueError, match="at least one input column"):
        skynet_dspy.split_row({"ticket": "t"}, inputs=[])
    with pytest.raises(TypeError, match="list of column names"):
        skynet_dspy.split_row({"ticket": "t"}, inputs=[1])


def test_split_row_copies_values():
    row = {"q": {"nested": [1]}, "a": ["x"]}
    split = skynet_dspy.split_row(row, inputs=["q"], outputs=["a"])
    split["input"]["q"]["nested"].append(2)
    assert row["q"] == {"nested": [1]}


def test_a_dspy_example_gives_inputs_as_input_and_labels_as_expected():
    seen = {}

    def run(artifact, input):
        seen["run"] = input
        return "Paris"

    def score(input, output, expected=None):
        seen = {"input": input, "output": output, "expected": expected}
        return float(output == expected["answer"]), {"feedback": "checked", "seen": seen}

    item = dspy.Example(question="Capital of France?", answer="Paris", note="geo").with_inputs("question")
    evaluator = skynet_dspy.make_evaluator(run, score)
    assert evaluator("Answer: {question}", item) == (
        1.0, {"Inputs": {"question": "Capital of France?"}, "Generated Outputs": "Paris", "feedback": "checked"})
    assert seen["run"] == {"question": "Capital of France?"}
    assert evaluator.evaluate("Answer: {question}", item).extra["seen"] == {
        "input": {"question": "Capital of France?"}, "output": "Paris", "expected": {"answer": "Paris", "note": "geo"}
    }


def test_a_flat_row_or_a_bad_example_is_a_clear_error():
    evaluator = skynet_dspy.make_evaluator(echo_run, lambda i, o: (1.0, {"feedback": "ok"}))
    with pytest.raises(ValueError, match=r"needs an 'input' key.*split_row"):
        evaluator("A", {"q": "x", "label": "y"})
    with pytest.raises(ValueError, match="also has 'label'"):
        evaluator("A", {"input": {"q": "x"}, "label": "y"})
    with pytest.raises(TypeError, match="'input' must be a dict"):
        evaluator("A", {"input": "x"})
    with pytest.raises(TypeError, match="'expected' must be a dict"):
        evaluator("A", {"input": {"q": "x"}, "expected": "y"})
    with pytest.raises(ValueError, match="needs an example"):
        evaluator("A")


# -- run -----------------------------------------------------------------------------------


def test_run_can_come_from_a_run_py(tmp_path):
    (tmp_path / "helper_words.py").write_text("PREFIX = 'run.py says'\n")
    (tmp_path / "run.py").write_text(
        "from helper_words import PREFIX\n\n"
        "def run(artifact, input):\n    return f'{PREFIX} {artifact} {input[\"q\"]}'\n"
    )
    evaluator = skynet_dspy.make_evaluator(tmp_path / "run.py", lambda i, o: (1.0, {"feedback": o}))
    assert evaluator("A", example({"q": "x"}))[1]["feedback"] == "run.py says A x"


def test_a_bad_run_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="cannot be called as run\\(artifact, input\\)"):
        skynet_dspy.make_evaluator(lambda artifact: artifact, lambda i, o: (1.0, {"feedback": "ok"}))
    with pytest.raises(FileNotFoundError, match="run file not found"):
        skynet_dspy.make_evaluator(tmp_path / "missing.py", lambda i, o: (1.0, {"feedback": "ok"}))
    (tmp_path / "run.py").write_text("def execute(artifact, input):\n    return 1\n")
    with pytest.raises(ImportError, match="defines no function named `run`"):
        skynet_dspy.make_evaluator(tmp_path / "run.py", lambda i, o: (1.0, {"feedback": "ok"}))


def test_a_built_metric_is_used_as_is_and_keeps_its_stats(metrics_dir):
    metric = skynet_dspy.load_metric(metrics_dir / "exact_match.py")
    evaluator = skynet_dspy.make_evaluator(lambda a, i: a, metric)
    evaluator("yes", example({"q": 1}, {"label": "yes"}))
    assert evaluator.metric is metric and metric.stats["calls"] == 1
    with pytest.raises(TypeError, match="Metric already loaded, and options \\(timeout\\)"):
        skynet_dspy.make_evaluator(lambda a, i: a, metric, timeout=5)


# -- measurement ---------------------------------------------------------------------------


def observed(result):
    """The observation() a metric sent back in its side information (it runs in a worker process)."""
    assert result.ok, result.detail
    return skynet_dspy.Observation(**result.extra["observation"])


def observing_score(input, output, expected=None):
    from skynet import observation, service_cost

    obs = observation()
    fields = ("run_ms", "cost_usd", "model_calls", "prompt_tokens", "completion_tokens", "unmeasured_reason")
    return 1.0, {"feedback": "ok", "observation": {name: getattr(obs, name) for name in fields},
                 "service_cost": service_cost()}


def test_observation_measures_the_run_of_this_example():
    def run(artifact, input):
        time.sleep(input["sleep"])
        return "done"

    evaluator = skynet_dspy.make_evaluator(run, observing_score)
    assert evaluator.metric.measuring  # the metric's code uses observation()
    slow_result = evaluator.evaluate("A", example({"sleep": 0.12}))
    fast = observed(evaluator.evaluate("A", example({"sleep": 0.0})))
    slow, cost = observed(slow_result), slow_result.extra["service_cost"]
    assert slow.run_ms >= 120 and slow.model_calls == 0 and cost == 0  # no model call: nothing to pay
    assert fast.run_ms < slow.run_ms


def test_a_measure_function_when_present_supplies_the_observation(monkeypatch, metrics_dir):
    measured = skynet_dspy.Observation(run_ms=1000.0, cost_usd=0.01, model_calls=2, prompt_tokens=30,
                                    completion_tokens=5)
    calls = []

    def measure(fn, *args):
        calls.append(args)
        return fn(*args), measured

    monkeypatch.setattr(_measure, "measure", measure)
    evaluator = skynet_dspy.make_evaluator(lambda a, i: "yes", metrics_dir / "reward_metric.py")
    value, side_info = evaluator("A", example({"q": 1}, {"label": "yes"}))
    assert calls == [("A", {"q": 1})]
    # REWARD_SPEC: accuracy 1, speed 2000/(2000+1000), cost 0.01/(0.01+0.01); weights 0.7/0.2/0.1.
    assert side_info["scores"] == pytest.approx({"accuracy": 1.0, "speed": 2 / 3, "cost": 0.5})
    assert value == pytest.approx(0.7 + 0.2 * 2 / 3 + 0.1 * 0.5)
    assert set(side_info) == {"Inputs", "Generated Outputs", "feedback", "scores"}


def test_llm_in_the_metric_falls_back_to_the_reflection_model(server, metrics_dir):
    server.responder = lambda request: "PASS. The answer names the right city." if "Paris" in request.user else "FAIL."
    reflection = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    evaluator = skynet_dspy.make_evaluator(lambda a, i: a, metrics_dir / "judge.py", reflection_lm=reflection)
    assert evaluator("Paris", example({"question": "Capital of France?"})) == (
        1.0, {"Inputs": {"question": "Capital of France?"}, "Generated Outputs": "Paris",
              "feedback": "PASS. The answer names the right city."})
    assert evaluator("Lyon", example({"question": "Capital of France?"}))[0] == 0.0
    assert len(server.requests) == 2 and "Capital of France?" in server.requests[0].user


# -- the reflection model ------------------------------------------------------------------


@pytest.mark.parametrize("form", ["dict", "dspy.LM"])
def test_the_reflection_model_is_a_callable_reaching_the_given_server(server, form):
    from skynet_dspy._gepa import reflection_callable

    server.responder = lambda request: "```\nnew text\n```"
    if form == "dict":
        model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    else:
        model = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
    lm = reflection_callable(model)
    assert lm("Improve this.") == "```\nnew text\n```"
    assert lm([{"role": "user", "content": "Again."}]) == "```\nnew text\n```"
    assert [request.user for request in server.requests] == ["Improve this.", "Again."]
    assert KEY not in repr(lm)


# -- optimize_anything arguments -----------------------------------------------------------


def test_optimize_anything_refuses_what_would_leak_or_cannot_run():
    data = [example({"q": "x"}, {"label": "y"})]
    common = dict(run=echo_run, metric=lambda i, o: (1.0, {"feedback": "ok"}), trainset=data,
                  reflection_lm="openai/gpt-4o-mini")
    with pytest.raises(ValueError, match="seedless mode shows dataset examples"):
        skynet_dspy.optimize_anything(None, max_metric_calls=5, **common)
    with pytest.raises(TypeError, match="capture_stdio="):
        skynet_dspy.optimize_anything("A", max_metric_calls=5, capture_stdio=True, **common)
    with pytest.raises(TypeError, match="unknown option 'max_calls'.*Options: .*max_workers"):
        skynet_dspy.optimize_anything("A", max_calls=5, **common)
    with pytest.raises(TypeError, match="'max_metric_cals' \\(did you mean 'max_metric_calls'\\?\\)") as caught:
        skynet_dspy.optimize_anything("A", max_metric_cals=5, **common)
    assert "capture_stdio" not in str(caught.value)  # refused, so never offered
    with pytest.raises(ValueError, match="budget"):
        skynet_dspy.optimize_anything("A", **common)
    with pytest.raises(ValueError, match=r"trainset\[0\]: an example dict needs an 'input' key"):
        skynet_dspy.optimize_anything("A", max_metric_calls=5, **(common | {"trainset": [{"q": "x"}]}))
    with pytest.raises(ValueError, match="trainset is empty"):
        skynet_dspy.optimize_anything("A", max_metric_calls=5, **(common | {"trainset": []}))


# -- end to end ----------------------------------------------------------------------------

HINT = "routing code"
REFLECTION_MARK = "I am optimizing a parameter"


def ticket_metric(input, output, expected=None):
    """Right only on the exact code; the feedback tells how to fix the template, never the code."""
    right = output == expected["code"]
    feedback = "Correct." if right else f"Wrong answer: the instructions must mention the phrase '{HINT}'."
    return float(right), {"feedback": feedback, "scores": {"exact": float(right)}, "code_seen": expected["code"]}


def test_plain_gepa_improves_a_prompt_template_seeing_inputs_outputs_and_feedback(server):
    words = ("amber", "basil", "cedar", "dune", "elm", "fig")
    tickets = [f"Ticket {word}: the order arrived damaged" for word in words]
    codes = {ticket: f"RC-{uuid.uuid4().hex[:12]}" for ticket in tickets}  # cannot occur by accident

    def responder(request):
        text = request.text
        if REFLECTION_MARK in text:
            # A reflection model that edits the current template by what the feedback says.
            current = re.search(r"```\n(.*?)\n```", text, re.S).group(1)
            wanted = re.search(r"must mention the phrase '([^']+)'", text)
            return f"```\n{current} Answer with the {wanted.group(1)}.\n```" if wanted else f"```\n{current}\n```"
        ticket = next(ticket for ticket in tickets if ticket in text)
        return codes[ticket] if HINT in text else "general"

    server.responder = responder

    def run(template, input):
        response = litellm.completion(
            model="openai/gpt-4o-mini",
            api_base=server.url,
            api_key=KEY,
            messages=[{"role": "user", "content": template.format(**input)}],
        )
        return response.choices[0].message.content.strip()

    rows = [{"ticket": ticket, "code": codes[ticket]} for ticket in tickets]
    data = [skynet_dspy.split_row(row, inputs=["ticket"], outputs=["code"]) for row in rows]
    metric = skynet_dspy.load_metric(ticket_metric)
    seed = "Classify the ticket: {ticket}"
    result = skynet_dspy.optimize_anything(
        seed,
        run,
        metric,
        trainset=data[:3],
        valset=data[3:],
        reflection_lm=dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False),
        max_metric_calls=24,
        max_workers=2,
        logger=QuietLogger(),
    )

    assert result.val_aggregate_scores[0] == 0.0  # the seed
    assert max(result.val_aggregate_scores) == 1.0
    assert isinstance(result.best_candidate, str) and HINT in result.best_candidate
    assert result.best_candidate.startswith(seed)

    reflections = [request.text for request in server.requests if REFLECTION_MARK in request.text]
    assert reflections and f"must mention the phrase '{HINT}'" in reflections[0]  # the seed's feedback
    for text in reflections:
        # Each example shows its input fields, what run() returned, the feedback and the named scores, as GEPA
        # renders them (as DSPy GEPA's reflective dataset does), and no other key.
        assert set(re.findall(r"^## (.+)$", text, re.M)) == {
            "Inputs", "Generated Outputs", "feedback", "Scores (Higher is Better)"}
        assert "### exact" in text and "### ticket" in text
        assert any(ticket in text for ticket in tickets)  # the input run() was given
        # no expected value, even from code_seen: a code shows only where the program itself returned it
        unprompted = re.sub(r"^## Generated Outputs\n+RC-[0-9a-f]{12}$", "", text, flags=re.M)
        assert not any(code in unprompted for code in codes.values())
        assert "code_seen" not in text and "ticket_metric" not in text
    assert re.search(r"^## Generated Outputs\n+general$", reflections[0], re.M)  # what the seed's run() returned
    # GEPA's evaluation cache (on by default) spares the runs and metric calls of repeated evaluations:
    # every (template, ticket) reached the task model once, and was scored once.
    task_requests = [request for request in server.requests if REFLECTION_MARK not in request.text]
    assert metric.stats["calls"] == len(task_requests) == len({request.text for request in task_requests}) >= 12
    assert metric.stats["exception"] == metric.stats["timeout"] == metric.stats["invalid"] == 0


def test_a_dict_artifact_with_a_callable_reflection_model_and_gepa_settings():
    secret = f"EXP-{uuid.uuid4().hex}"
    prompts = []

    def reflect(prompt):
        prompts.append(prompt)
        current = re.search(r"```\n(.*?)\n```", prompt, re.S).group(1)
        return f"```\n{current} please\n```"

    def run(artifact, input):
        assert set(artifact) == {"greeting", "closing"}
        return f"{artifact['greeting']} {input['name']} {artifact['closing']}"

    def score(input, output, expected=None):
        polite = output.count("please")
        return min(1.0, polite / 2), {"feedback": f"{polite} of 2 courtesy words.", "hidden": expected["token"]}

    data = [example({"name": name}, {"token": secret}) for name in ("Ann", "Bob")]
    result = skynet_dspy.optimize_anything(
        {"greeting": "Hi", "closing": "Bye"},
        run,
        score,
        trainset=data,
        reflection_lm=reflect,
        objective="Make the messages polite.",
        max_metric_calls=14,
        frontier_type="instance",
        reflection_minibatch_size=2,
        parallel=False,
        merge=False,
        logger=QuietLogger(),
    )
    assert isinstance(result.best_candidate, dict) and set(result.best_candidate) == {"greeting", "closing"}
    assert max(result.val_aggregate_scores) > result.val_aggregate_scores[0] == 0.0
    assert prompts and all("Make the messages polite." in prompt for prompt in prompts)
    assert not any(secret in prompt or "hidden" in prompt for prompt in prompts)


def test_observation_counts_the_model_calls_run_made_and_not_the_judges(server):
    server.responder = lambda request: "PASS. Fine." if request.system else "an answer"

    def run(artifact, input):
        for _ in range(2):
            litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key=KEY,
                               messages=[{"role": "user", "content": f"{artifact} {input['q']}"}])
        return "done"

    def score(input, output, expected=None):
        from skynet import llm, observation

        verdict = llm("Answer PASS or FAIL.", input=output)  # the judge's call: not the run's
        obs = observation()
        fields = ("run_ms", "cost_usd", "model_calls", "prompt_tokens", "completion_tokens")
        return 1.0, {"feedback": verdict, "observation": {name: getattr(obs, name) for name in fields}}

    reflection = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    evaluator = skynet_dspy.make_evaluator(run, score, reflection_lm=reflection)
    assert evaluator("Say", example({"q": "hello"})) == (
        1.0, {"Inputs": {"q": "hello"}, "Generated Outputs": "done", "feedback": "PASS. Fine."})
    measured = observed(evaluator.evaluate("Say", example({"q": "hello"})))  # run and measured again
    assert evaluator.stats["calls"] == 2
    assert measured.model_calls == 2 and measured.prompt_tokens > 0 and measured.completion_tokens > 0
    assert measured.cost_usd is not None and measured.cost_usd > 0  # gpt-4o-mini has a LiteLLM price
    assert measured.run_ms > 0
    assert len(server.requests) == 5  # two runs of two calls, one judge call (the second was a cache hit)
