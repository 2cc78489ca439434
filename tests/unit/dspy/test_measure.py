"""Measured speed and cost of the program's run, per example (docs/contract.md#reward), end to end on the loopback."""

from __future__ import annotations

import asyncio
import gc
import re
import threading
import time
import uuid
from collections import Counter

import dspy
import pytest

import skynet_dspy
from skynet_dspy import Observation
from skynet_dspy._core.context import judging as _judging
from skynet_dspy._dspy import measure as _measure
from skynet_dspy.devserver import DevServer, dspy_reply

DELAY = 0.2  # seconds the server waits before every answer
PROMPT, COMPLETION = 1000, 200  # tokens per call the server reports (plus the example's number, below)


@pytest.fixture(scope="module")
def litellm():
    """LiteLLM itself, to price calls independently of the code under test (slow to import: once)."""
    import litellm as module

    return module


def price(litellm, model: str, calls: list[tuple[int, int]]) -> float:
    """LiteLLM's USD price of these (prompt, completion) token counts for `model`."""
    total = 0.0
    for prompt, completion in calls:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model, prompt_tokens=prompt, completion_tokens=completion
        )
        total += prompt_cost + completion_cost
    return total


def number_in(text: str) -> int:
    """The example number written into a question ("... #7 ..."), 0 when there is none."""
    found = re.search(r"#(\d+)", text)
    return int(found.group(1)) if found else 0


def reply_for(request) -> dict:
    """An answer in DSPy's format whose token counts name the example: prompt = PROMPT + its number."""
    n = number_in(request.user)
    if "draft" in request.user:  # the second predictor (ChainOfThought) of TwoStep
        content = dspy_reply(reasoning="checked the draft", answer=f"final {n}")
    else:
        content = dspy_reply(answer=f"draft {n}")
    return {"content": content, "prompt_tokens": PROMPT + n, "completion_tokens": COMPLETION}


class TwoStep(dspy.Module):
    """One model call for most questions; a second, checking call for questions that ask for it."""

    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("question -> answer")
        self.check = dspy.ChainOfThought("question, draft -> answer")

    def forward(self, question):
        draft = self.draft(question=question)
        if "check" in question:
            return self.check(question=question, draft=draft.answer)
        return draft


def questions(count: int, checked: set[int]) -> list[dspy.Example]:
    return [
        dspy.Example(question=f"question #{n}" + (" check it" if n in checked else ""), answer="x").with_inputs(
            "question"
        )
        for n in range(1, count + 1)
    ]


OBSERVED = ("run_ms", "cost_usd", "model_calls", "prompt_tokens", "completion_tokens", "cost_unknown_reason",
            "unmeasured_reason")


def recording_metric(**options):
    """A metric whose score sends back what observation() and service_cost() gave it (side information).

    It observes through its return value, so it works in the metric's worker process (the default) too.
    """

    def score(input, output, expected):
        from skynet import observation, service_cost

        obs = observation()
        seen = {name: getattr(obs, name) for name in OBSERVED}
        return 1.0, {"feedback": "ok", "observation": seen, "service_cost": service_cost()}

    return skynet_dspy.load_metric(score, **options)


def recorded(score) -> tuple[Observation, float | None]:
    """The (Observation, service_cost()) a recording metric's score saw, from its Score or Result."""
    result = getattr(score, "result", score)
    assert result.ok, result.detail
    return Observation(**result.extra["observation"]), result.extra["service_cost"]


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_each_example_under_four_threads_sees_its_own_delay_calls_tokens_and_cost(server, lm, litellm, isolation):
    server.responder = reply_for
    server.delay = DELAY
    devset = questions(8, checked={2, 5, 7})
    metric = recording_metric(isolation=isolation)
    assert metric.measuring  # its code uses observation() and service_cost()
    with dspy.context(lm=lm):
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=4)(TwoStep())

    assert result.score == 100.0
    seen = {example.question: recorded(returned) for example, _, returned in result.results}
    assert len(seen) == 8
    assert len(server.requests) == 8 + 3
    for example in devset:
        n = number_in(example.question)
        calls = 2 if "check" in example.question else 1
        obs, cost = seen[example.question]
        assert obs.model_calls == calls
        # every call this example made (and no other example's) carries its own number in the token count
        assert obs.prompt_tokens == calls * (PROMPT + n)
        assert obs.completion_tokens == calls * COMPLETION
        assert obs.total_tokens == obs.prompt_tokens + obs.completion_tokens
        assert obs.run_ms >= calls * DELAY * 1000
        assert obs.run_ms < 60_000  # a duration in ms, not a timestamp or seconds
        expected_cost = price(litellm, "gpt-4o-mini", [(PROMPT + n, COMPLETION)] * calls)
        assert obs.cost_usd == pytest.approx(expected_cost, rel=1e-9)
        assert cost == obs.cost_usd
        assert obs.cost_unknown_reason is None and obs.unmeasured_reason is None
        assert obs.measured


def test_a_model_with_no_known_price_gives_cost_none_and_reward_says_why(litellm):
    def score(input, output, expected):
        from skynet import observation, reward

        spec = {
            "weights": {"accuracy": 1, "speed": 1, "cost": 1},
            "speed": {"reference": 2000},
            "cost": {"reference": 0.01},
        }
        obs = observation()
        total, side = reward(spec, 1.0, "Right.")
        return total, {**side, "observation": {name: getattr(obs, name) for name in OBSERVED}}

    with DevServer(reply_for, model_name="my-private-model") as server:
        private = dspy.LM("openai/my-private-model", api_base=server.url, api_key="local-test-key", cache=False)
        devset = questions(3, checked=set())
        with dspy.context(lm=private):
            result = dspy.Evaluate(devset=devset, metric=skynet_dspy.load_metric(score), num_threads=2)(TwoStep())

    assert len(result.results) == 3
    for example, _, returned in result.results:
        obs = Observation(**returned.result.extra["observation"])
        assert obs.model_calls == 1 and obs.prompt_tokens == PROMPT + number_in(example.question)
        assert obs.cost_usd is None
        assert "no price known for model" in obs.cost_unknown_reason
        assert "my-private-model" in obs.cost_unknown_reason
        feedback = returned.feedback
        assert feedback.startswith("Right.\n")
        assert "cost not measured: no price known for model" in feedback
        assert returned.result.scores["cost"] == 0.0
        assert returned.result.scores["accuracy"] == 1.0
        assert returned.result.scores["speed"] == pytest.approx(2000 / (2000 + obs.run_ms))
        assert float(returned) == pytest.approx((1.0 + returned.result.scores["speed"] + 0.0) / 3)


def test_the_seed_reward_metric_runs_unchanged_on_measured_figures(server, lm, metrics_dir, litellm):
    server.responder = lambda request: {
        "content": dspy_reply(label="spam" if "win" in request.user else "ham"),
        "prompt_tokens": PROMPT,
        "completion_tokens": COMPLETION,
    }
    server.delay = DELAY
    metric = skynet_dspy.load_metric(metrics_dir / "reward_metric.py")
    devset = [
        dspy.Example(text="win money now", label="spam").with_inputs("text"),
        dspy.Example(text="lunch at noon?", label="ham").with_inputs("text"),
        dspy.Example(text="meeting moved", label="spam").with_inputs("text"),  # the program gets this wrong
    ]
    with dspy.context(lm=lm):
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=3)(dspy.Predict("text -> label"))

    one_call = price(litellm, "gpt-4o-mini", [(PROMPT, COMPLETION)])
    for example, _, returned in result.results:
        right = example.label != "spam" or "win" in example.text
        scores = returned.result.scores
        assert set(scores) == {"accuracy", "speed", "cost"}
        assert scores["accuracy"] == (1.0 if right else 0.0)
        lines = returned.feedback.splitlines()
        assert lines[0] == ("Correct." if right else "Wrong label.")
        speed = re.fullmatch(r"speed (\d\.\d\d) \((\d+) ms vs reference 2000 ms\)", lines[2])
        assert speed is not None, lines
        run_ms = int(speed.group(2))
        assert run_ms >= DELAY * 1000
        assert scores["speed"] == pytest.approx(2000 / (2000 + run_ms), abs=0.001)
        assert scores["cost"] == pytest.approx(0.01 / (0.01 + one_call))
        assert lines[3].startswith(f"cost {scores['cost']:.2f} ($")
        total = 0.7 * scores["accuracy"] + 0.2 * scores["speed"] + 0.1 * scores["cost"]
        assert float(returned) == pytest.approx(total)


def test_the_judges_calls_are_never_counted_as_the_programs(server, lm, litellm):
    server.responder = reply_for
    seen = {}
    from skynet import observation

    def judge_call():
        litellm.completion(
            model="openai/gpt-4o-mini",
            api_base=server.url,
            api_key="local-test-key",
            messages=[{"role": "user", "content": "judge #99"}],
        )

    def score(input, output, expected):
        with _judging():
            judge_call()  # as llm() does it
        judge_call()  # any model call made while a metric is scored is the metric's
        judge = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
        judge("judge #99 through DSPy")
        seen[input["question"]] = observation()
        return 1.0, {"feedback": "ok"}

    devset = questions(4, checked={3})
    with dspy.context(lm=lm):
        # in this process (the calls a worker process makes could never reach this process's runs)
        metric = skynet_dspy.load_metric(score, isolation="thread")
        dspy.Evaluate(devset=devset, metric=metric, num_threads=4)(TwoStep())

    judged = [request for request in server.requests if "#99" in request.user]
    assert len(judged) == 3 * 4
    for example in devset:
        calls = 2 if "check" in example.question else 1
        assert seen[example.question].model_calls == calls
        assert seen[example.question].prompt_tokens == calls * (PROMPT + number_in(example.question))


def test_a_metric_scored_inside_the_run_keeps_its_judge_calls_out_of_it(server, lm, litellm):
    """Modules like dspy.Refine score inside forward(): that metric's model calls are still not the program's."""
    server.responder = reply_for

    def score(input, output):
        litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key",
                           messages=[{"role": "user", "content": "judge #99"}])
        return 1.0, {"feedback": "ok"}

    judge_metric = skynet_dspy.load_metric(score, isolation="thread")  # its calls run in this process

    class SelfChecking(dspy.Module):
        def __init__(self):
            super().__init__()
            self.step = dspy.Predict("question -> answer")

        def forward(self, question):
            prediction = self.step(question=question)
            judge_metric.score({"question": question}, prediction.answer)
            return prediction

    def run():
        with dspy.context(lm=lm):
            return SelfChecking()(question="question #8")

    _, obs = _measure.measure(run)
    assert len(server.requests) == 2
    assert (obs.model_calls, obs.prompt_tokens) == (1, PROMPT + 8)


def test_measure_a_plain_function_calling_litellm(server, litellm):
    server.responder = lambda request: {"content": "an answer", "prompt_tokens": 300, "completion_tokens": 40}
    server.delay = 0.05

    def run(text):
        for _ in range(2):
            litellm.completion(
                model="openai/gpt-4o-mini",
                api_base=server.url,
                api_key="local-test-key",
                messages=[{"role": "user", "content": text}],
            )
        with _judging():
            litellm.completion(
                model="openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key",
                messages=[{"role": "user", "content": "not counted"}],
            )
        return text.upper()

    value, obs = _measure.measure(run, "hello")
    assert value == "HELLO"
    assert isinstance(obs, Observation)
    assert obs.model_calls == 2
    assert (obs.prompt_tokens, obs.completion_tokens) == (600, 80)
    assert obs.cost_usd == pytest.approx(price(litellm, "gpt-4o-mini", [(300, 40)] * 2))
    assert obs.run_ms >= 2 * 50
    assert len(server.requests) == 3

    with pytest.raises(ZeroDivisionError):
        _measure.measure(lambda: 1 / 0)
    # a call made after measure() returned belongs to no run
    _, idle = _measure.measure(lambda: None)
    assert idle.model_calls == 0 and idle.cost_usd == 0.0


def _ask(litellm, server) -> None:
    litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key",
                       messages=[{"role": "user", "content": "hello"}])


def test_the_same_model_at_another_endpoint_keeps_an_anchor_of_its_own(litellm):
    """A fast endpoint and a slower one serving the same model name (a local server, then the provider): calls to
    the slower one are steadied against an anchor of their own, so identical runs there measure the same (with one
    anchor per model name they were all beyond the fast one's band, and reported with their noise)."""
    def reply(request):
        return {"content": "an answer", "prompt_tokens": 30, "completion_tokens": 4}


    with DevServer(responder=reply) as fast, DevServer(responder=reply, delay=0.1) as slow:
        for _ in range(4):
            _measure.measure(_ask, litellm, fast)
        slow_runs = [_measure.measure(_ask, litellm, slow)[1].run_ms for _ in range(6)]
    assert min(slow_runs) >= 100
    assert Counter(slow_runs).most_common(1)[0][1] >= 4, slow_runs  # a busy moment may still show past the band


def test_a_collection_on_another_thread_does_not_shorten_a_call_waiting_for_its_answer(server, litellm):
    """Garbage collection stops only threads running Python: a call waiting for the model's answer is not delayed
    by collections, so its latency keeps that time (a call never measures faster than its provider answered)."""
    server.responder = lambda request: {"content": "an answer", "prompt_tokens": 30, "completion_tokens": 4}
    server.delay = DELAY
    heap = [[] for _ in range(100_000)]  # with LiteLLM's own objects, a full collection takes a while

    def collect():  # while the server (in this process) sleeps DELAY before it answers: no thread waits for it
        while not server.requests:
            time.sleep(0.001)
        end = time.perf_counter() + DELAY * 0.4
        while time.perf_counter() < end:
            gc.collect()

    _ask(litellm, server)  # LiteLLM's first call in a process sets up its client
    server.clear()
    collector = threading.Thread(target=collect)
    collector.start()
    _, observation = _measure.measure(_ask, litellm, server)
    collector.join()
    del heap
    assert observation.run_ms >= DELAY * 1000, observation


def test_measure_counts_a_dspy_call_through_litellm_once(server, litellm):
    server.responder = lambda request: {"content": dspy_reply(answer="4"), "prompt_tokens": 50, "completion_tokens": 5}
    through_litellm = dspy.LM(
        "openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False, engine="litellm"
    )
    program = dspy.Predict("question -> answer")

    def run():
        with dspy.context(lm=through_litellm):
            return program(question="2 + 2?")

    prediction, obs = _measure.measure(run)
    assert prediction.answer == "4"
    assert len(server.requests) == 1
    assert (obs.model_calls, obs.prompt_tokens, obs.completion_tokens) == (1, 50, 5)
    assert obs.cost_usd == pytest.approx(price(litellm, "gpt-4o-mini", [(50, 5)]))


def test_runs_under_gepa_trace_capture_are_measured(server, lm):
    """GEPA's trace capture makes forward return (prediction, trace); the metric still finds the run."""
    from dspy.teleprompt.bootstrap_trace import bootstrap_trace_data

    server.responder = reply_for
    metric = recording_metric()
    devset = questions(4, checked={1, 4})
    with dspy.context(lm=lm):
        data = bootstrap_trace_data(TwoStep(), devset, metric=metric, num_threads=2)

    assert len(data) == 4
    seen = {entry["example"].question: recorded(entry["score"])[0] for entry in data}
    assert len(seen) == 4
    for example in devset:
        calls = 2 if "check" in example.question else 1
        obs = seen[example.question]
        assert obs.model_calls == calls
        assert obs.prompt_tokens == calls * (PROMPT + number_in(example.question))


def test_calls_in_threads_dspy_parallel_starts_belong_to_the_run(server, lm):
    server.responder = reply_for

    class Fan(dspy.Module):
        def __init__(self):
            super().__init__()
            self.left = dspy.Predict("question -> answer")
            self.right = dspy.Predict("question -> answer")

        def forward(self, question):
            pairs = [(self.left, dspy.Example(question=question).with_inputs("question")),
                     (self.right, dspy.Example(question=question + " again").with_inputs("question"))]
            return dspy.Parallel(num_threads=2, disable_progress_bar=True)(pairs)[0]

    _measure.install()  # before the program is built and run, as load_metric does
    with dspy.context(lm=lm):
        prediction = Fan()(question="question #3")
    obs, reason = _measure.observation_for(prediction)
    assert reason is None
    assert obs.model_calls == 2 and obs.prompt_tokens == 2 * (PROMPT + 3)


def test_async_program_runs_are_measured(server, lm):
    server.responder = reply_for

    class AsyncTwoStep(TwoStep):
        async def aforward(self, question):
            draft = await self.draft.acall(question=question)
            if "check" in question:
                return await self.check.acall(question=question, draft=draft.answer)
            return draft

    program = AsyncTwoStep()
    _measure.install()

    async def both():
        with dspy.context(lm=lm):
            return await asyncio.gather(
                program.acall(question="question #4 check"), program.acall(question="question #6")
            )

    checked, plain = asyncio.run(both())
    first, _ = _measure.observation_for(checked)
    second, _ = _measure.observation_for(plain)
    assert (first.model_calls, first.prompt_tokens) == (2, 2 * (PROMPT + 4))
    assert (second.model_calls, second.prompt_tokens) == (1, PROMPT + 6)


def test_a_cache_hit_is_measured_as_the_call_it_replays(server, monkeypatch):
    from dspy.clients.cache import Cache

    monkeypatch.setattr(dspy, "cache", Cache(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir=None))
    server.responder = reply_for
    monkeypatch.setattr(server, "delay", 0.05)  # the call takes at least 50 ms: its replay must be measured so too
    cached = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=True)
    program = dspy.Predict("question -> answer")
    question = f"question #5 {uuid.uuid4().hex}"

    def run():
        with dspy.context(lm=cached):
            return program(question=question)

    _, first = _measure.measure(run)
    _, again = _measure.measure(run)
    assert len(server.requests) == 1
    assert first.model_calls == 1 and first.cost_usd > 0 and first.cached_calls == 0
    # the hit made no request, and is measured with the tokens, cost and latency the call had when first made
    assert (again.model_calls, again.cached_calls) == (1, 1)
    assert (again.prompt_tokens, again.completion_tokens, again.cost_usd) == (
        first.prompt_tokens, first.completion_tokens, first.cost_usd)
    assert again.cached_cost_usd == first.cost_usd and again.cached_prompt_tokens == first.prompt_tokens
    # not "instant": the replayed latency counts (a bound from below, set by the server's delay, never a speed)
    assert first.run_ms >= 50 and again.run_ms >= 50


def test_a_prediction_no_measured_run_returned_is_reported_unmeasured():
    _measure.install()
    made_by_hand = dspy.Prediction(answer="x")
    obs, reason = _measure.observation_for(made_by_hand)
    assert obs is None
    assert "no measured program run returned this prediction" in reason
    assert _measure.observation_for(None) == (None, "the program returned no prediction")


def test_a_failed_run_files_nothing_and_leaves_no_run_behind(server, lm):
    server.responder = reply_for

    class Broken(dspy.Module):
        def __init__(self):
            super().__init__()
            self.step = dspy.Predict("question -> answer")

        def forward(self, question):
            self.step(question=question)
            raise RuntimeError("boom")

    _measure.install()
    with dspy.context(lm=lm), pytest.raises(RuntimeError):
        Broken()(question="question #1")
    # the next run in this thread starts afresh: only its own call is counted
    with dspy.context(lm=lm):
        prediction = dspy.Predict("question -> answer")(question="question #2")
    obs, _ = _measure.observation_for(prediction)
    assert (obs.model_calls, obs.prompt_tokens) == (1, PROMPT + 2)


def test_the_contract_check_scores_reward_metrics_without_measurements(metrics_dir):
    report = skynet_dspy.check_contract(
        metrics_dir / "reward_metric.py", [{"input": {"text": "hi"}, "output": "ham", "expected": {"label": "ham"}}]
    )
    assert report.ok, str(report)
    feedback = report.cases[0].result.feedback
    assert "speed 0.00 (speed not measured:" in feedback
    assert "cost 0.00 (cost not measured:" in feedback


def test_install_is_idempotent_and_adds_no_dspy_callback():
    from skynet_dspy._dspy import hooks

    before = list(dspy.settings.callbacks)
    _measure.install()
    wrapped = dspy.Module.__dict__["__call__"]
    _measure.install()
    assert dspy.Module.__dict__["__call__"] is wrapped and hooks.module_calls_wrapped()
    assert list(dspy.settings.callbacks) == before  # measurement never slows DSPy's callback path


def test_observations_are_read_only():
    obs = Observation(run_ms=1.0, cost_usd=0.0, model_calls=0, prompt_tokens=0, completion_tokens=0)
    with pytest.raises(AttributeError):
        obs.run_ms = 2.0  # type: ignore[misc]
    assert Observation.unmeasured("why").total_tokens is None
    assert not Observation.unmeasured("why").measured


FAKE_LITELLM = '''
class Usage:
    prompt_tokens, completion_tokens = 3, 2


class Response:
    usage = Usage()
    model = "fake-model"
    _hidden_params = {"response_cost": 0.5}


def completion(model, **kwargs):
    return Response()
'''

IMPORTED_AFTER_INSTALL = '''
import sys
import skynet_dspy
from skynet_dspy._dspy import measure as _measure

_measure.install()
assert "litellm" not in sys.modules, "install() must not import LiteLLM"
from litellm import completion  # bound by name before any call: the wrapper must already be in place

assert getattr(completion, "_skynet_wrapped", False)
assert not any(type(hook).__name__ == "_LiteLLMImportHook" for hook in sys.meta_path)
_, obs = _measure.measure(lambda: completion(model="fake-model"))
print(obs.model_calls, obs.prompt_tokens, obs.completion_tokens, obs.cost_usd)
'''


def test_litellm_imported_after_install_is_wrapped_at_import(tmp_path):
    """LiteLLM is slow to import, so install() never imports it; it is wrapped the moment it is imported."""
    import os
    import subprocess
    import sys

    (tmp_path / "litellm").mkdir()
    (tmp_path / "litellm" / "__init__.py").write_text(FAKE_LITELLM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED_AFTER_INSTALL], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "3", "2", "0.5"]


INSTALLED_ONLY_WHEN_USED = '''
import sys
import dspy
import skynet_dspy
from skynet_dspy._dspy import hooks, measure
from dspy.clients import execution

def state(metric):
    return [
        metric.measuring,
        measure.installed(),
        hooks.module_calls_wrapped(),
        bool(getattr(execution.execute, "_skynet_wrapped", False)),
        len(dspy.settings.callbacks) == 0,  # never a DSPy callback, measuring or not
    ]

exact, reward, isolation = sys.argv[1:]
with skynet_dspy.load_metric(exact, isolation=isolation) as plain:
    print(*state(plain))
    assert plain.score({"text": "hi"}, "ham", {"label": "ham"}).score == 1.0
    print(*state(plain))  # scoring it installs nothing either
with skynet_dspy.load_metric(reward, isolation=isolation) as rewarded:
    print(*state(rewarded))
'''


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_measurement_is_installed_only_for_a_metric_that_uses_it(metrics_dir, isolation):
    """A plain exact-match metric costs the program nothing: no wrapped module or LM calls. A reward() metric
    installs the measurement, still without a DSPy callback. In a fresh process, as no other test installed it."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", INSTALLED_ONLY_WHEN_USED, str(metrics_dir / "exact_match.py"),
         str(metrics_dir / "reward_metric.py"), isolation],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert lines == [
        ["False", "False", "False", "False", "True"],
        ["False", "False", "False", "False", "True"],
        ["True", "True", "True", "True", "True"],
    ]


def test_a_program_whose_inputs_are_named_module_or_args_runs_measured():
    _measure.install()

    class Echo(dspy.Module):
        def forward(self, **fields):
            return dspy.Prediction(**fields)

    prediction = Echo()(module="m", args="a", kwargs="k")  # (DSPy itself refuses an input named self)
    assert (prediction.module, prediction.args, prediction.kwargs) == ("m", "a", "k")
    observed, reason = _measure.observation_for(prediction)
    assert reason is None and observed.model_calls == 0 and observed.run_ms >= 0
