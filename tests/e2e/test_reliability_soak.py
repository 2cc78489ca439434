"""Concurrency soak (issue 9): dspy.Evaluate(num_threads=16) over many examples with a metric that
uses llm(), observation() and reward(); every example's result equals the single-threaded result,
and no observation() ever reports another example's figures.

Each example's program run is made distinguishable: example i makes 1 + i % 2 model calls, whose
answers the loopback server reports as 10 + i prompt and 1000 + i completion tokens, and every
seventh example's calls are slowed by a server-side delay. The judge's answers report 999,999
tokens each, so a judge call counted as the program's shows at once. The metric, a metric.py scored in
worker processes (the default isolation), checks that observation() gives exactly its own example's
figures and sends back every mismatch on its result.

Size: SOAK_EXAMPLES examples, each run twice (16 threads, then 1 thread): 2.5 requests per example
and run through LiteLLM to the loopback server, about 4 ms of LiteLLM's CPU each. The default, 400
(2,000 requests), keeps the suite short; SKYNET_SOAK_EXAMPLES=2000 (10,000 requests, ~85 s on 2 cores)
passes too. The 1,000-call soak with faults is tests/e2e/test_fault_soak.py.
"""

from __future__ import annotations

import os
import re
import threading

import dspy
import litellm
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure
from skynet_dspy._dspy import steady
from skynet_dspy._judge import Judge as Models
from skynet_dspy.devserver import DevServer, dspy_reply

SOAK_EXAMPLES = int(os.environ.get("SKYNET_SOAK_EXAMPLES", "400"))
THREADS = 16
JUDGE = "You judge answers. Reply PASS or FAIL."
JUDGE_TOKENS = 999_999
SLOW_EVERY, SLOW_SECONDS = 7, 0.02
QUESTION = re.compile(r"item (\d+) of soak")

REWARD_SPEC = {
    "weights": {"accuracy": 0.6, "speed": 0.0, "cost": 0.4},  # speed weight 0: wall time differs between runs
    "accuracy": {},
    "speed": {"reference": 2000},
    "cost": {"reference": 0.0001},
}


def calls_for(index: int) -> int:
    return 1 + index % 2


def respond(request):
    """Program requests: tokens that name the example; judge requests: PASS for the right answer."""
    if request.system.startswith(JUDGE):
        match = QUESTION.search(request.user)
        right = match is not None and request.user.endswith(f"answer {match.group(1)}")
        return {"content": "PASS: right item." if right else "FAIL: wrong item.",
                "prompt_tokens": JUDGE_TOKENS, "completion_tokens": JUDGE_TOKENS}
    match = QUESTION.search(request.user)
    if match is None:
        return dspy_reply(answer="no item")
    index = int(match.group(1))
    if index % SLOW_EVERY == 0:
        threading.Event().wait(SLOW_SECONDS)
    # every fifth example answers wrong, so the judge's verdicts differ
    answer = f"answer {index}" if index % 5 else f"answer {index + 1}"
    return {"content": dspy_reply(answer=answer), "prompt_tokens": 10 + index, "completion_tokens": 1000 + index}


class Repeat(dspy.Module):
    """Asks the model 1 + i % 2 times for example i; returns the last answer."""

    def __init__(self):
        super().__init__()
        self.step = dspy.Predict("question -> answer")

    def forward(self, question):
        index = int(QUESTION.search(question).group(1))
        for _ in range(calls_for(index)):
            prediction = self.step(question=question)
        return prediction


PRICE_IN = litellm.model_cost["gpt-4o-mini"]["input_cost_per_token"]
PRICE_OUT = litellm.model_cost["gpt-4o-mini"]["output_cost_per_token"]


def own_figures(index: int) -> tuple[int, int, int, float]:
    calls = calls_for(index)
    prompt, completion = calls * (10 + index), calls * (1000 + index)
    return calls, prompt, completion, prompt * PRICE_IN + completion * PRICE_OUT


# The metric, as a user writes it: a metric.py file, scored in worker processes (the default isolation). It
# checks that observation() gives exactly its own example's figures and sends back, as side information,
# the figures it saw, every mismatch, and the process it ran in.
METRIC = """
import os

from skynet import llm, observation, reward

JUDGE = {judge!r}
SLOW_EVERY, SLOW_SECONDS = {slow_every!r}, {slow_seconds!r}
# a slow call up to the noise band above its kind's anchor is reported as the anchor (steady.py): an anchor set by
# a fast call made under load (16 threads starting at once) may be up to the band below a slow call's 20 ms
BAND_MS = {band_ms!r}
PRICE_IN, PRICE_OUT = {price_in!r}, {price_out!r}
REWARD_SPEC = {reward_spec!r}


def own_figures(index):
    calls = 1 + index % 2
    prompt, completion = calls * (10 + index), calls * (1000 + index)
    return calls, prompt, completion, prompt * PRICE_IN + completion * PRICE_OUT


def score(input, output, expected=None):
    index = expected["index"]
    seen = observation()
    calls, prompt, completion, cost = own_figures(index)
    figures = (seen.model_calls, seen.prompt_tokens, seen.completion_tokens)
    problems = []
    if figures != (calls, prompt, completion):
        problems.append(f"calls/prompt/completion {{figures}} instead of {{(calls, prompt, completion)}}")
    if seen.cost_usd is None or abs(seen.cost_usd - cost) > 1e-12:
        problems.append(f"cost {{seen.cost_usd!r}} instead of {{cost!r}}")
    if seen.run_ms is None or (index % SLOW_EVERY == 0 and seen.run_ms < calls * (SLOW_SECONDS * 1000 - BAND_MS) - 1):
        problems.append(f"run_ms {{seen.run_ms!r}} misses the {{calls}} x {{SLOW_SECONDS}} s server delay")
    verdict = llm(JUDGE, input=f"Question: {{input['question']}}\\nAnswer: {{output}}")
    after = observation()
    if after != seen:
        problems.append("observation() changed after the judge's llm() call")
    accuracy = 1.0 if verdict.startswith("PASS") else 0.0
    total, side = reward(REWARD_SPEC, accuracy, f"{{verdict}} calls={{seen.model_calls}} tokens={{seen.total_tokens}}")
    seen_by = {{"index": index, "figures": [*figures, seen.cost_usd], "problems": problems, "pid": os.getpid()}}
    return total, {{**side, "seen": seen_by}}
"""


def write_soak_metric(folder) -> object:
    return write_metric(folder, METRIC.format(
        judge=JUDGE, slow_every=SLOW_EVERY, slow_seconds=SLOW_SECONDS, price_in=PRICE_IN, price_out=PRICE_OUT,
        band_ms=steady.CALL.floor_ms,
        reward_spec=REWARD_SPEC,
    ))


class Recorder:
    """What each metric call saw (sent back on its result), and every time observation() gave figures that
    are not its example's."""

    def __init__(self, results):
        self.seen: dict[int, list[tuple]] = {}
        self.wrong: list[str] = []
        self.pids: set[int] = set()
        for _, _, score in results:
            seen = score.result.extra.get("seen")
            if seen is None:  # a failed call: counted in the metric's stats, and checked there
                continue
            self.seen.setdefault(seen["index"], []).append(tuple(seen["figures"]))
            self.wrong.extend(f"example {seen['index']}: {problem}" for problem in seen["problems"])
            self.pids.add(seen["pid"])


@pytest.fixture
def soak_server():
    with DevServer(model_name="gpt-4o-mini") as running:
        running.responder = respond
        yield running


def _without_speed(score) -> tuple:
    """A result, minus the wall-time figures (speed), which no two runs share."""
    lines = [line for line in score.feedback.splitlines() if not line.startswith("speed ")]
    named = {name: value for name, value in (score.get("objective_scores") or {}).items() if name != "speed"}
    return float(score), tuple(lines), tuple(sorted(named.items())), score.result.failure


def _evaluate(soak_server, metric_file, devset, threads: int):
    judge = dspy.LM("openai/gpt-4o-mini", api_base=soak_server.url, api_key="local-test-key", cache=False)
    metric = skynet_dspy.load_metric(metric_file, metric_lm=judge, timeout=60)  # isolation: worker processes
    # the judge's settings, as a Judge of its own would have them
    reference = Models(metric_lm=judge, timeout=30, max_retries=2, retry_base_delay=0.01)
    for name in ("timeout", "max_retries", "retry_base_delay"):
        setattr(metric.judge, name, getattr(reference, name))
    assert metric.isolation == "process" and metric.measuring
    program_lm = dspy.LM("openai/gpt-4o-mini", api_base=soak_server.url, api_key="local-test-key", cache=False)
    try:
        with dspy.context(lm=program_lm):
            evaluation = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads, display_progress=False,
                                       max_errors=len(devset) + 1, provide_traceback=False)(Repeat())
    finally:
        metric.close()
    return evaluation, Recorder(evaluation.results), metric


@pytest.mark.slow
def test_sixteen_threads_give_the_single_threaded_results_and_each_example_its_own_figures(soak_server, tmp_path):
    metric_file = write_soak_metric(tmp_path)
    devset = [
        dspy.Example(question=f"What is item {index} of soak?", index=index).with_inputs("question")
        for index in range(SOAK_EXAMPLES)
    ]

    parallel, parallel_seen, parallel_metric = _evaluate(soak_server, metric_file, devset, THREADS)
    serial, serial_seen, serial_metric = _evaluate(soak_server, metric_file, devset, 1)

    assert parallel_seen.wrong == [], f"{len(parallel_seen.wrong)} wrong observations: {parallel_seen.wrong[:5]}"
    assert serial_seen.wrong == [], f"{len(serial_seen.wrong)} wrong observations: {serial_seen.wrong[:5]}"
    for seen in (parallel_seen, serial_seen):
        assert sorted(seen.seen) == list(range(SOAK_EXAMPLES)), "every example was scored"
        assert all(len(calls) == 1 for calls in seen.seen.values()), "every example was scored once"
        assert os.getpid() not in seen.pids, "scored in worker processes, not in this one"
        for index, ((calls, prompt, completion, cost),) in seen.seen.items():
            assert (calls, prompt, completion) == own_figures(index)[:3], f"example {index}"
            assert cost == pytest.approx(own_figures(index)[3], rel=1e-9, abs=1e-15), f"example {index}"
    assert len(parallel_seen.pids) > 1, "sixteen threads were scored by more than one worker process"
    assert parallel_seen.seen == serial_seen.seen, "each example saw the same figures under threads"

    assert len(parallel.results) == len(serial.results) == SOAK_EXAMPLES
    for (example, _, fast), (same, _, slow) in zip(parallel.results, serial.results, strict=True):
        assert example is same
        assert isinstance(fast, skynet_dspy.Score) and isinstance(slow, skynet_dspy.Score)
        assert _without_speed(fast) == _without_speed(slow), f"example {example.index} differs under threads"
    passed = sum(1 for _, _, score in serial.results if score.feedback.startswith("PASS"))
    assert passed == SOAK_EXAMPLES - len(range(0, SOAK_EXAMPLES, 5))
    assert parallel.score == serial.score

    for metric in (parallel_metric, serial_metric):
        stats = metric.stats
        assert stats["calls"] == SOAK_EXAMPLES
        assert sum(stats[str(kind)] for kind in Failure) == 0, stats
        usage = metric.judge_usage
        assert usage.requests == SOAK_EXAMPLES and usage.retries == usage.failed == 0
        assert usage.completion_tokens == JUDGE_TOKENS * SOAK_EXAMPLES
    judged = [request for request in soak_server.requests if request.system.startswith(JUDGE)]
    assert len(judged) == 2 * SOAK_EXAMPLES
