"""Pieces the benchmarks share: timing summaries, the loopback judge, and the hand-written baseline metric."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from benchmarks.timing import percentile, summarize_ns  # noqa: E402, F401  (shared by the benchmarks)
from skynet_dspy.devserver import DevServer, Request  # noqa: E402

METRICS = Path(__file__).parent / "metrics"
ROOT = Path(__file__).resolve().parent.parent
# The loopback server takes any key; a user's real key would go here.
KEY = "local-bench-key"
MODEL = "openai/gpt-4o-mini"


def bare_score(path: Path) -> Any:
    """The metric file's own `score`, loaded in this process: the baseline the adapter's calls are timed against."""
    from skynet_dspy._core.loading import load

    return load(path).score


_FIELD = re.compile(r"^(Expected|Answer): (.*)$", re.MULTILINE)


def judge_responder(request: Request) -> str:
    """The judge: PASS when the answer equals the expected value (or when none is given), else FAIL."""
    fields = dict(_FIELD.findall(request.user))
    answer = fields.get("Answer", "").strip()
    if "Expected" not in fields or fields["Expected"].strip() == answer:
        return "PASS. The answer matches what was asked."
    return f"FAIL. The answer {answer!r} is wrong; the right answer is {fields['Expected'].strip()!r}."


def judge_server(delay: float = 0.0) -> DevServer:
    """A started loopback judge that reports a model LiteLLM can price."""
    return DevServer(judge_responder, model_name="gpt-4o-mini", delay=delay).start()


def server_lm(url: str) -> dspy.LM:
    """A dspy.LM reaching the loopback server at `url` through LiteLLM, as a user's provider; no DSPy cache."""
    return dspy.LM(MODEL, api_base=url, api_key=KEY, cache=False)


class HandWrittenJudge:
    """The baseline: what a user writes without this package.

    A GEPA feedback metric that calls the judge with `litellm.completion` on every metric call,
    with the same messages as benchmarks/metrics/judge.py, and counts its calls.
    """

    def __init__(self, url: str):
        from benchmarks.metrics import judge

        self.url = url
        self.judge = judge
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None):
        import litellm

        with self._lock:
            self.calls += 1
        labels = {key: gold[key] for key in gold.labels().keys()}
        messages = [
            {"role": "system", "content": self.judge.JUDGE_INSTRUCTIONS},
            {"role": "user", "content": self.judge.judge_input(dict(gold.inputs()), pred.answer, labels or None)},
        ]
        reply = litellm.completion(model=MODEL, api_base=self.url, api_key=KEY, messages=messages)
        verdict = reply.choices[0].message.content or ""
        return dspy.Prediction(score=1.0 if verdict.strip().upper().startswith("PASS") else 0.0, feedback=verdict)


class Echo(dspy.Module):
    """A program that costs nothing: it answers by echoing the question, so the metric's work is all there is."""

    def forward(self, question: str) -> dspy.Prediction:
        return dspy.Prediction(answer=f"An answer to: {question}")


def echo_devset(tag: str, size: int) -> list[dspy.Example]:
    """`size` distinct questions (tagged, so no two runs share a cache entry), each answered right by Echo."""
    examples = []
    for i in range(size):
        question = f"[{tag}] question {i}"
        examples.append(dspy.Example(question=question, answer=f"An answer to: {question}").with_inputs("question"))
    return examples


def timed_evaluate(metric: Any, devset: list[dspy.Example], threads: int) -> dict[str, Any]:
    """dspy.Evaluate of Echo with `metric`: wall seconds, examples/s, this process's CPU ms per example, score."""
    evaluate = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads, display_progress=False)
    start, cpu = time.perf_counter(), time.process_time()
    result = evaluate(Echo())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "seconds": seconds,
        "examples_per_s": len(devset) / seconds,
        "cpu_ms_per_example": cpu / len(devset) * 1000,  # this process only: workers and judges run in their own
        "score": float(result.score),
    }


def on_another_thread(work: Callable[[], Any], name: str = "bench-dspy-worker") -> Any:
    """`work()` run on a thread of its own (as DSPy's workers call a metric); its exception is raised here."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:  # reported below, on the calling thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
