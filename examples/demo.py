"""The main job (`make demo`): GEPA improves a DSPy support-ticket router with a Skynet metric, end to end.

With no API key it starts the scripted model server on 127.0.0.1 (skynet_dspy.devserver.scripted_server) and runs
everything against it. With SKYNET_DEMO_MODEL set (any LiteLLM model, e.g. openai/gpt-4o-mini, with
the provider's usual key such as OPENAI_API_KEY), the same steps run against that model:

    SKYNET_DEMO_MODEL             the program's model (LiteLLM string); unset: the local scripted server
    SKYNET_DEMO_REFLECTION_MODEL  the model that writes new instructions and judges (default: SKYNET_DEMO_MODEL)
    SKYNET_DEMO_API_BASE          an OpenAI-compatible base URL for both models (optional): a local server such as
                                  llama.cpp, vLLM or Ollama (model e.g. openai/qwen2.5-0.5b-instruct)
    SKYNET_DEMO_CONCURRENCY       model requests at a time: program threads, GEPA's threads and the judge's
                                  judge_max_concurrency (default 4; 1 with SKYNET_DEMO_API_BASE, as a local server
                                  answers one request at a time)
    SKYNET_DEMO_BUDGET            GEPA's max_metric_calls (default 120)

Every model call is sent with temperature=0. A local model has no LiteLLM price: its time is measured and shown,
its cost is shown as unknown.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-list download at import

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import dspy  # noqa: E402

import skynet_dspy  # noqa: E402
from examples.program import load_split, make_program  # noqa: E402
from skynet_dspy.devserver import scripted_server  # noqa: E402

HERE = Path(__file__).parent
METRIC = HERE / "metric.py"
JUDGE_METRIC = HERE / "judge_metric.py"
CASES = HERE / "cases.jsonl"
DEFAULT_BUDGET = 120
DEFAULT_CONCURRENCY = 4
SEED = 0


@dataclass
class Evaluation:
    """A program's run over the validation set, as the metric scored it."""

    score: float  # mean metric score (the reward: accuracy, speed and cost combined)
    accuracy: float  # mean of the named score "accuracy"
    run_ms: float | None  # mean measured wall time of the program per ticket
    cost_usd: float | None  # total measured model cost of the program over the set (None: the model has no price)
    unmeasured: str | None = None  # why time is missing, when it is

    def describe(self) -> str:
        time_text = f"{self.run_ms:.1f} ms per ticket" if self.run_ms is not None else "time not measured"
        cost_text = (f"${self.cost_usd:.6f} in all" if self.cost_usd is not None
                     else "cost unknown (the model has no LiteLLM price)")
        why = f" ({self.unmeasured})" if self.unmeasured else ""
        return f"score {self.score:.3f}, accuracy {self.accuracy:.0%}, {time_text}, {cost_text}{why}"


@dataclass
class DemoResult:
    """What the demo measured: the validation numbers before and after GEPA, and the judge's view."""

    report: Any
    baseline: Evaluation
    optimized: Evaluation
    candidate_scores: list[float]
    best_instruction: str
    judge_baseline: float
    judge_optimized: float
    judge_usage: Any
    metric_stats: dict[str, int] = field(default_factory=dict)
    server: Any = None  # the scripted server when running locally (its .requests are every model call)
    optimization: Any = None  # skynet_dspy.report(optimizer): GEPA's candidates and the run's cost receipt


def _models(api_base: str | None) -> tuple[dspy.LM, dspy.LM, str]:
    """(task model, reflection model, description) from the SKYNET_DEMO_* variables."""
    task = os.environ["SKYNET_DEMO_MODEL"].strip()
    reflection = os.environ.get("SKYNET_DEMO_REFLECTION_MODEL", "").strip() or task
    extra: dict[str, Any] = {"api_base": api_base} if api_base else {}
    if api_base and task.startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
        extra["api_key"] = "local"  # a local OpenAI-compatible server takes any key; LiteLLM wants one
    # Uncached, so each run's time and cost are real and a rerun starts from scratch; temperature 0 so a small
    # local model answers the same prompt the same way.
    task_lm = dspy.LM(task, cache=False, temperature=0.0, **extra)
    reflection_lm = dspy.LM(reflection, cache=False, temperature=0.0, **extra)
    return task_lm, reflection_lm, f"{task} (reflection and judge: {reflection})"


def _evaluate(program: dspy.Module, devset: list, metric: Any, threads: int) -> Evaluation:
    """Run `program` on `devset` under `metric`: mean score and accuracy, measured time and cost (each alone:
    a model without a price has its time measured all the same)."""
    evaluator = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads, display_progress=False)
    scored = [row[2] for row in evaluator(program).results]
    results = [score.result for score in scored if hasattr(score, "result")]
    times = [result.extra.get("run_ms") for result in results]
    costs = [result.extra.get("cost_usd") for result in results]
    timed = bool(results) and None not in times
    unmeasured = None
    if not timed:  # reward() wrote why into the feedback
        lines = [line for result in results for line in result.feedback.splitlines() if "not measured" in line]
        unmeasured = lines[0].strip() if lines else "no measured run was found"
    return Evaluation(
        score=statistics.fmean(float(score) for score in scored) if scored else 0.0,
        accuracy=statistics.fmean((r.scores or {}).get("accuracy", 0.0) for r in results) if results else 0.0,
        run_ms=statistics.fmean(times) if timed else None,
        cost_usd=sum(costs) if results and None not in costs else None,
        unmeasured=unmeasured,
    )


def _warm_up(program: dspy.Module, example: dspy.Example, where: str) -> None:
    """One call before measuring, so the baseline's time is not the connection's setup; fails clearly."""
    try:
        program(**example.inputs())
    except Exception as exc:
        from skynet_dspy._core.secrets import redact

        raise SystemExit(f"Could not run the program on {where}: {redact(f'{type(exc).__name__}: {exc}')}") from None


def _judge_score(program: dspy.Module, devset: list, judge: Any, threads: int) -> float:
    rows = dspy.Evaluate(devset=devset, metric=judge, num_threads=threads, display_progress=False)(program).results
    return statistics.fmean(float(row[2]) for row in rows) if rows else 0.0


def _describe_usage(usage: Any) -> str:
    if usage is None:
        return "not available"
    cost = f"${usage.cost_usd:.6f}" if usage.cost_usd is not None else "cost unknown"
    return (f"{usage.requests} request(s), {usage.cache_hits} cache hit(s), {usage.total_tokens} tokens, {cost}, "
            f"{usage.seconds:.2f} s")


def main(budget: int | None = None, seed: int = SEED, out: Callable[[str], Any] = print) -> DemoResult:
    """Run the demo: contract check, baseline, GEPA, optimized program, judge; print as it goes."""
    budget = budget or int(os.environ.get("SKYNET_DEMO_BUDGET") or DEFAULT_BUDGET)
    for name in ("dspy", "gepa", "LiteLLM", "litellm", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)

    server = None
    api_base = os.environ.get("SKYNET_DEMO_API_BASE", "").strip() or None
    threads = int(os.environ.get("SKYNET_DEMO_CONCURRENCY") or (1 if api_base else DEFAULT_CONCURRENCY))
    if os.environ.get("SKYNET_DEMO_MODEL", "").strip():
        task_lm, reflection_lm, where = _models(api_base)
    else:
        server = scripted_server()
        # Any key string will do for the loopback server; a real provider's key is never needed here.
        task_lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-demo", cache=False)
        reflection_lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-demo", cache=False)
        where = f"the scripted model server at {server.url} (set SKYNET_DEMO_MODEL to use a real model)"
    try:
        return _run(task_lm, reflection_lm, where, budget, seed, out, server, threads)
    finally:
        if server is not None:
            server.stop()


def _run(task_lm: dspy.LM, reflection_lm: dspy.LM, where: str, budget: int, seed: int,
         out: Callable[[str], Any], server: Any, threads: int = DEFAULT_CONCURRENCY) -> DemoResult:
    train, val = load_split("train"), load_split("val")
    out(f"Model: {where}, {threads} request(s) at a time")
    out(f"Data: {len(train)} training and {len(val)} validation tickets\n")

    with CASES.open(encoding="utf-8") as handle:
        cases = [json.loads(line) for line in handle if line.strip()]
    report = skynet_dspy.check_contract(METRIC, cases, output_fields="label")
    out(str(report))
    if not report.ok:
        raise SystemExit("The metric breaks the contract; fix it before optimizing.")

    optimizer = skynet_dspy.gepa(
        METRIC,
        reflection_lm,
        output_fields="label",
        max_metric_calls=budget,
        seed=seed,
        num_threads=threads,
        track_stats=True,  # keeps every candidate's scores in .detailed_results
        # With a budget this small, keep refining the best candidate rather than exploring the Pareto front.
        candidate_selection_strategy="current_best",
    )
    metric = optimizer.skynet_metric
    program = make_program()
    with dspy.context(lm=task_lm):
        _warm_up(program, train[0], where)
        baseline = _evaluate(program, val, metric, threads)
        out(f"\nBaseline on validation:  {baseline.describe()}")
        out(f"Running GEPA (max_metric_calls={budget}, seed={seed}) ...")
        # Progress bars (DSPy's per batch on stdout, GEPA's on stderr) would bury the summary.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            optimized_program = optimizer.compile(program, trainset=train, valset=val)
        optimized = _evaluate(optimized_program, val, metric, threads)
        out(f"Optimized on validation: {optimized.describe()}")

        details = optimized_program.detailed_results
        candidate_scores = [float(s) for s in details.val_aggregate_scores]
        out("\nGEPA's candidates (mean validation score): "
            + ", ".join(f"#{i} {s:.3f}" for i, s in enumerate(candidate_scores)))
        instruction = optimized_program.predict.signature.instructions
        out("Best instruction:\n  " + instruction.replace("\n", "\n  "))
        optimization = skynet_dspy.report(optimizer)  # what GEPA found, and what the run cost
        out(f"\n{optimization.receipt}")

        judge = skynet_dspy.load_metric(JUDGE_METRIC, reflection_lm=reflection_lm, output_fields="label",
                                        judge_max_concurrency=threads)
        judge_baseline = _judge_score(program, val, judge, threads)
        judge_optimized = _judge_score(optimized_program, val, judge, threads)
    out(f"\nJudge (second opinion via skynet.llm): baseline {judge_baseline:.0%}, optimized {judge_optimized:.0%}")
    out(f"Judge usage: {_describe_usage(judge.judge_usage)}")
    out(f"GEPA's metric: {metric.stats['calls']} score() calls, {metric.stats['memo_hits']} answered from memory "
        "(DSPy asks twice per reflected example)")
    verdict = "raised" if optimized.score > baseline.score else "did NOT raise"
    out(f"\nGEPA {verdict} the validation score: {baseline.score:.3f} -> {optimized.score:.3f} "
        f"(accuracy {baseline.accuracy:.0%} -> {optimized.accuracy:.0%})")
    return DemoResult(report, baseline, optimized, candidate_scores, instruction, judge_baseline, judge_optimized,
                      judge.judge_usage, metric.stats, server, optimization)


def cli() -> int:
    result = main()
    return 0 if result.optimized.score > result.baseline.score else 1


if __name__ == "__main__":
    sys.exit(cli())
