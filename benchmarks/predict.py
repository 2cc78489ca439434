"""Benchmark 5: what loading a metric costs the user's own program, a `dspy.Predict` on `dspy.utils.DummyLM`.

Three variants, each in a fresh interpreter (`python -m benchmarks.predict --variant V`, printing
JSON), since measurement, once installed, is process-wide (a wrapper around dspy.Module's call, hooks on
DSPy's LM execution and LiteLLM):

- **native**: DSPy alone; skynet_dspy is not even imported;
- **plain**: `load_metric("exact_match.py")`, a metric that uses none of reward(), observation(),
  service_cost(): nothing is installed, so the program should run at native speed;
- **measuring**: `load_metric("reward_match.py")`, a reward() metric: its runs are measured.

And a reference, no skynet_dspy either: **noop_callback**, DSPy with one do-nothing callback
(`dspy.configure(callbacks=[BaseCallback()])`): the least a measurement through DSPy's public
callbacks would cost, since DSPy's callback machinery runs as soon as one callback is set (why
measurement wraps the module call instead).

Each process times `calls` calls of the same Predict (after a warm-up) and reports the median. The
three run in turn `rounds` times, in a rotating order so a change in the machine's load falls on
all alike; each variant's least disturbed round (the lowest median) counts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from time import perf_counter_ns
from typing import Any

VARIANTS = ("native", "plain", "measuring", "noop_callback")
METRIC_FILES = {"plain": "exact_match.py", "measuring": "reward_match.py"}
TARGET_RATIO = {"plain": 1.05, "measuring": 1.3}
QUESTION = "What color is the sky?"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def measure(variant: str, calls: int, warmup: int) -> dict[str, Any]:
    """In this process: load the variant's metric (if any), then time `calls` Predict calls on DummyLM."""
    import dspy
    from dspy.utils import DummyLM

    from benchmarks.timing import summarize_ns  # the standard library only: native imports no skynet_dspy

    dspy.configure(lm=DummyLM({QUESTION: {"answer": "blue"}}))
    program = dspy.Predict("question -> answer")
    metric = None
    if variant == "noop_callback":
        from dspy.utils.callback import BaseCallback

        dspy.configure(callbacks=[BaseCallback()])
    elif variant != "native":
        import skynet_dspy
        from benchmarks.common import METRICS

        metric = skynet_dspy.load_metric(METRICS / METRIC_FILES[variant])
    try:
        for _ in range(warmup):
            program(question=QUESTION)
        samples = []
        answers_ok = 0
        gc.collect()
        for _ in range(calls):
            t0 = perf_counter_ns()
            prediction = program(question=QUESTION)
            samples.append(perf_counter_ns() - t0)
            answers_ok += prediction.answer == "blue"
        # the metric is loaded but never called here: the cost measured is what loading it does to DSPy
        expected = {"label": "blue", "answer": "blue"}  # exact_match.py reads label, reward_match.py answer
        scored = metric.score({"question": QUESTION}, "blue", expected) if metric is not None else None
    finally:
        if metric is not None:
            metric.close()
    return {
        "variant": variant,
        "calls": calls,
        "warmup": warmup,
        **summarize_ns(samples),
        "answers_ok": answers_ok,
        "skynet_dspy_imported": "skynet_dspy" in sys.modules,
        "measuring": metric.measuring if metric is not None else None,
        "dspy_callbacks": len(dspy.settings.callbacks or ()),
        "module_calls_wrapped": _module_calls_wrapped(),
        "metric_ok": scored.ok if scored is not None else None,
    }


def _module_calls_wrapped() -> bool:
    if "skynet_dspy" not in sys.modules:
        return False
    from skynet_dspy._dspy import hooks

    return hooks.module_calls_wrapped()


def _one(variant: str, calls: int, warmup: int) -> dict[str, Any]:
    from benchmarks.common import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.predict", "--variant", variant, "--calls", str(calls),
         "--warmup", str(warmup)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Predict benchmark ({variant}) failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(calls: int = 3000, rounds: int = 3, warmup: int = 200) -> dict[str, Any]:
    """Each variant `rounds` times, each time in a fresh process; the lowest median per variant counts."""
    tries: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    for i in range(rounds):
        order = VARIANTS[i % len(VARIANTS):] + VARIANTS[: i % len(VARIANTS)]
        for variant in order:
            tries[variant].append(_one(variant, calls, warmup))
    out: dict[str, Any] = {"calls": calls, "rounds": rounds, "warmup": warmup}
    for variant, done in tries.items():
        best = dict(min(done, key=lambda entry: entry["median_us"]))
        best["rounds_median_us"] = [round(entry["median_us"], 1) for entry in done]
        out[variant] = best
    native = out["native"]["median_us"]
    out["ratio"] = {variant: out[variant]["median_us"] / native for variant in VARIANTS if variant != "native"}
    out["target_ratio"] = dict(TARGET_RATIO)
    out["target_met"] = {variant: out["ratio"][variant] <= TARGET_RATIO[variant] for variant in METRIC_FILES}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--calls", type=int, default=3000, help="Predict calls timed")
    parser.add_argument("--warmup", type=int, default=200, help="Predict calls before the timed ones")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.warmup < 0:
        parser.error("--calls must be at least 1 and --warmup at least 0")
    print(json.dumps(measure(args.variant, args.calls, args.warmup)))


if __name__ == "__main__":
    main()
