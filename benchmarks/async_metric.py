"""Benchmark 14: a rubric metric asking 8 judge questions per output, one after another vs at once.

The same rubric against the loopback judge answering in 100 ms, in worker processes (the default), the judge's
cache off (every call asks anew):

- **sync**: `def score` calling `llm()` eight times in a row (the baseline);
- **async**: `async def score` gathering eight `await allm(...)`;
- **one request**: a metric asking the judge once, the floor an async call is measured against.

Reported: the median time of one `metric.score(...)` call, and the wall time of `dspy.Evaluate(num_threads=4)`
over the same examples, with this process's CPU per example (it sends every judge request through LiteLLM).
Target: the async call within 1.5x one judge request's call.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import skynet_dspy
from benchmarks.common import KEY, MODEL, echo_devset, timed_evaluate
from skynet_dspy.devserver import DevServer

QUESTIONS = 8
DELAY = 0.1  # seconds the judge takes per answer
THREADS = 4
TARGET = 1.5  # the async call, in calls of one judge request

SYNC = f'''
from skynet import llm

def score(input, output, expected=None):
    verdicts = [llm(f"Criterion {{n}}: is the answer right? Reply YES or NO.", input=str(output))
                for n in range({QUESTIONS})]
    met = sum(verdict.startswith("YES") for verdict in verdicts)
    return met / {QUESTIONS}, {{"feedback": f"{{met}} of {QUESTIONS} criteria met."}}
'''
ASYNC = f'''
import asyncio
from skynet import allm

async def score(input, output, expected=None):
    verdicts = await asyncio.gather(*(allm(f"Criterion {{n}}: is the answer right? Reply YES or NO.",
                                           input=str(output)) for n in range({QUESTIONS})))
    met = sum(verdict.startswith("YES") for verdict in verdicts)
    return met / {QUESTIONS}, {{"feedback": f"{{met}} of {QUESTIONS} criteria met."}}
'''
ONE = '''
from skynet import llm

def score(input, output, expected=None):
    verdict = llm("Criterion 0: is the answer right? Reply YES or NO.", input=str(output))
    return float(verdict.startswith("YES")), {"feedback": verdict}
'''


def _per_call(metric: Any, tag: str, calls: int) -> dict[str, Any]:
    metric.score({"question": "warm-up"}, f"{tag} warm-up")  # the worker's start and first connection
    seconds = []
    for n in range(calls):
        started = time.perf_counter()
        result = metric.score({"question": f"question {n}"}, f"{tag} answer {n}")
        seconds.append(time.perf_counter() - started)
        if not result.ok:
            raise RuntimeError(f"benchmark 14: the {tag} metric failed: {result.detail}")
    return {"median_ms": statistics.median(seconds) * 1000, "max_ms": max(seconds) * 1000}


def one(body: str, tag: str, url: str, calls: int, examples: int, folder: Path) -> dict[str, Any]:
    path = folder / f"{tag}.py"
    path.write_text(body, encoding="utf-8")
    judge = {"model": MODEL, "api_base": url, "api_key": KEY}
    with skynet_dspy.load_metric(path, metric_lm=judge, judge_cache=False, output_fields="answer") as metric:
        found = _per_call(metric, tag, calls)
        evaluated = timed_evaluate(metric, echo_devset(f"async-bench-{tag}", examples), THREADS)
        found["evaluate_s"] = evaluated["seconds"]
        found["evaluate_cpu_ms_per_example"] = evaluated["cpu_ms_per_example"]  # this process's: the judge's side
        found["judge_requests"] = metric.judge_usage.requests
    return found


def run(calls: int = 10, examples: int = 20) -> dict[str, Any]:
    """The three metrics' per-call times and Evaluate wall times against one 100 ms judge."""
    with DevServer(lambda request: "YES", model_name="gpt-4o-mini", delay=DELAY) as server, \
            tempfile.TemporaryDirectory(prefix="skynet-bench-async-") as folder:
        found = {tag: one(body, tag, server.url, calls, examples, Path(folder))
                 for tag, body in (("one_request", ONE), ("sync", SYNC), ("async", ASYNC))}
    ratio = found["async"]["median_ms"] / found["one_request"]["median_ms"]
    return {"questions": QUESTIONS, "delay_s": DELAY, "threads": THREADS, "calls": calls, "examples": examples,
            **found, "async_vs_one_request": ratio, "target_met": ratio <= TARGET}


def rows(found: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The benchmark's row for the table of benchmarks/run.py."""
    mine, base, floor = found["async"], found["sync"], found["one_request"]

    def text(part: dict[str, Any]) -> str:
        return (f"call: median {part['median_ms']:,.0f} ms; `Evaluate(num_threads={found['threads']})` of "
                f"{found['examples']} examples: {part['evaluate_s']:.2f} s "
                f"({part['evaluate_cpu_ms_per_example']:.0f} ms CPU per example in this process)")

    return [(
        f"14. A rubric metric asking {found['questions']} judge questions per output, judge answers in "
        f"{found['delay_s'] * 1000:g} ms: `async def score` with `asyncio.gather(allm(...))` vs `llm()` one by one",
        text(mine), text(base) + f"; one judge request's call: median {floor['median_ms']:,.0f} ms",
        f"call {base['median_ms'] / max(mine['median_ms'], 1e-9):.1f}× faster, Evaluate "
        f"{base['evaluate_s'] / max(mine['evaluate_s'], 1e-9):.1f}× faster",
        f"async call ≤ {TARGET:g}× one judge request's call ({found['async_vs_one_request']:.2f}×): "
        + ("met" if found["target_met"] else "**missed**"),
    )]


if __name__ == "__main__":
    import json

    print(json.dumps(run(5, 8), indent=2))
