"""Benchmark 2: how many judge requests a dspy.GEPA run pays, with the adapter and without it.

The bundled example (examples/: the ChainOfThought ticket router, its train/val splits and
judge_metric.py, an llm() judge) runs under dspy.GEPA twice with the same budget and seed
against the scripted loopback server (task model, reflection model and judge in one):

- **skynet**: `load_metric("examples/judge_metric.py", metric_lm=...)`, the adapter;
- **hand-written**: the DSPy feedback metric a user writes without this package, calling
  `litellm.completion` on every metric call with the very same judge messages.

The server records every request; the judge's are counted. Both metrics are wrapped in the
same counter of metric calls and distinct (example, output) pairs.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from typing import Any

import dspy

import skynet_dspy
from benchmarks.common import KEY, MODEL
from examples.program import HERE as EXAMPLES
from examples.program import load_split, make_program
from skynet_dspy.devserver import requests_by_role, scripted_server

SEED = 0


class CountingMetric:
    """Passes DSPy's calls through to `metric`, counting calls and distinct (example, output) pairs."""

    def __init__(self, metric: Any):
        self.metric = metric
        self.calls = 0
        self.pairs: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None):
        with self._lock:
            self.calls += 1
            self.pairs.add((gold.ticket, str(pred.get("label"))))
        return self.metric(gold, pred, trace, pred_name, pred_trace)


class HandWrittenTicketJudge:
    """examples/judge_metric.py as a user writes it without this package: litellm.completion on every call."""

    def __init__(self, url: str, instructions: str):
        self.url = url
        self.instructions = instructions

    def __call__(self, gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None):
        import litellm

        messages = [
            {"role": "system", "content": self.instructions},
            {"role": "user", "content": f"Question: {gold.ticket}\nAnswer: {pred.get('label')}"},
        ]
        reply = litellm.completion(model=MODEL, api_base=self.url, api_key=KEY, messages=messages)
        verdict = reply.choices[0].message.content or ""
        return dspy.Prediction(score=1.0 if verdict.strip().upper().startswith("PASS") else 0.0, feedback=verdict)


def _gepa(metric: Any, server: Any, budget: int, train: list, val: list, threads: int) -> dict[str, Any]:
    task_lm = dspy.LM(MODEL, api_base=server.url, api_key=KEY, cache=False)
    reflection_lm = dspy.LM(MODEL, api_base=server.url, api_key=KEY, cache=False)
    counting = CountingMetric(metric)
    before = len(server.requests)
    optimizer = dspy.GEPA(
        metric=counting,
        reflection_lm=reflection_lm,
        max_metric_calls=budget,
        seed=SEED,
        num_threads=threads,
        track_stats=True,
    )
    start = time.perf_counter()
    with dspy.context(lm=task_lm), contextlib.redirect_stdout(io.StringIO()):
        optimized = optimizer.compile(make_program(), trainset=train, valset=val)
    seconds = time.perf_counter() - start
    judged = requests_by_role(server.requests[before:], "judge")
    scores = [float(s) for s in optimized.detailed_results.val_aggregate_scores]
    return {
        "metric_calls": counting.calls,
        "distinct_pairs": len(counting.pairs),
        "judge_requests": len(judged),
        "distinct_judge_requests": len({(r.system, r.user) for r in judged}),
        "duplicate_judge_requests": len(judged) - len({(r.system, r.user) for r in judged}),
        "candidates": len(scores),
        "baseline_val_score": scores[0] if scores else None,
        "best_val_score": max(scores) if scores else None,
        "seconds": seconds,
        "_instructions": judged[0].system if judged else None,
    }


def run(budget: int = 120, train_size: int | None = None, val_size: int | None = None, threads: int = 4) -> dict:
    """Two GEPA runs with the same budget and seed: the adapter's judge metric, then the hand-written one."""
    train, val = load_split("train")[:train_size], load_split("val")[:val_size]
    server = scripted_server()
    try:
        # LiteLLM's import and first connection take seconds: pay them before the first timed run.
        dspy.LM(MODEL, api_base=server.url, api_key=KEY, cache=False)("warm-up")
        metric = skynet_dspy.load_metric(EXAMPLES / "judge_metric.py", metric_lm=dspy.LM(
            MODEL, api_base=server.url, api_key=KEY, cache=False), output_fields="label")
        skynet = _gepa(metric, server, budget, train, val, threads)
        instructions = skynet.pop("_instructions")
        if instructions is None:
            raise RuntimeError("the skynet GEPA run sent no judge request; is examples/judge_metric.py an llm() judge?")
        usage = metric.judge_usage
        skynet["judge_cache_hits"] = usage.cache_hits if usage is not None else None
        skynet["adapter_memo_hits"] = metric.stats.get("memo_hits")
        skynet["score_calls"] = metric.stats.get("calls")
        skynet["isolation"] = metric.isolation
        metric.close()
        hand_written = _gepa(HandWrittenTicketJudge(server.url, instructions), server, budget, train, val, threads)
        hand_written.pop("_instructions")
    finally:
        server.stop()
    return {
        "budget": budget,
        "seed": SEED,
        "threads": threads,
        "train": len(train),
        "val": len(val),
        "skynet": skynet,
        "hand_written": hand_written,
        "saved_judge_requests": hand_written["judge_requests"] - skynet["judge_requests"],
        "target_met": skynet["duplicate_judge_requests"] == 0
        and skynet["judge_requests"] == skynet["distinct_pairs"],
    }
