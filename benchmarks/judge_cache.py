"""Benchmark 8: what a judge cache that outlives the process saves, on disk and in Redis.

The bundled example (examples/: the ticket router and judge_metric.py, an llm() judge) runs under
dspy.GEPA with the same budget and seed against the scripted loopback server, which prices its
answers as gpt-4o-mini:

a. twice in sequence in this process, each run with a fresh metric on one `judge_cache="<folder>"`:
   the judge requests and dollars of each run (the second should pay nothing);
b. twice at once, in two processes sharing one `judge_cache="redis://..."` on a redis-server this
   benchmark starts on 127.0.0.1: the requests and dollars of each against the distinct requests of
   one run (each should be paid once, by one of the two).

    .venv/bin/python -m benchmarks.run --only 8
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import KEY, MODEL

SEED = 0
REDIS_MISSING = "redis-server is not installed (apt-get install -y redis-server); row 8b not run"


def gepa_run(url: str, cache: str, budget: int, train_size: int | None, val_size: int | None,
             threads: int) -> dict[str, Any]:
    """One dspy.GEPA run of the bundled example with a fresh metric on `cache`: what its judge used."""
    import dspy

    import skynet_dspy
    from examples.program import HERE as EXAMPLES
    from examples.program import load_split, make_program

    train, val = load_split("train")[:train_size], load_split("val")[:val_size]
    task_lm = dspy.LM(MODEL, api_base=url, api_key=KEY, cache=False)
    reflection_lm = dspy.LM(MODEL, api_base=url, api_key=KEY, cache=False)
    metric = skynet_dspy.load_metric(EXAMPLES / "judge_metric.py", output_fields="label", judge_cache=cache,
                                     metric_lm=dspy.LM(MODEL, api_base=url, api_key=KEY, cache=False))
    optimizer = dspy.GEPA(metric=metric, reflection_lm=reflection_lm, max_metric_calls=budget, seed=SEED,
                          num_threads=threads, track_stats=True)
    started = time.perf_counter()
    with metric, dspy.context(lm=task_lm), contextlib.redirect_stdout(io.StringIO()):
        optimized = optimizer.compile(make_program(), trainset=train, valset=val)
        usage = metric.judge_usage
    scores = [float(score) for score in optimized.detailed_results.val_aggregate_scores]
    return {
        "judge_requests": usage.requests,
        "judge_cache_hits": usage.cache_hits,
        "judge_errors": usage.failed,
        "dollars": usage.cost_usd,
        "best_val_score": max(scores) if scores else None,
        "candidates": len(scores),
        "seconds": time.perf_counter() - started,
    }


def _judged(server: Any, since: int = 0) -> list[Any]:
    from skynet_dspy.devserver import requests_by_role

    return requests_by_role(server.requests[since:], "judge")


def disk(budget: int, train_size: int | None, val_size: int | None, threads: int) -> dict[str, Any]:
    """8a: two identical runs in sequence on one disk cache."""
    from skynet_dspy.devserver import scripted_server

    folder = Path(tempfile.mkdtemp(prefix="skynet-bench-judge-cache-"))
    server = scripted_server()
    try:
        runs = []
        for _ in range(2):
            before = len(server.requests)
            found = gepa_run(server.url, str(folder / "cache"), budget, train_size, val_size, threads)
            judged = _judged(server, before)
            found["server_judge_requests"] = len(judged)
            found["distinct_judge_requests"] = len({(r.system, r.user) for r in judged})
            runs.append(found)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    first, second = runs
    return {
        "budget": budget, "seed": SEED, "threads": threads, "first": first, "second": second,
        "same_result": first["best_val_score"] == second["best_val_score"]
        and first["candidates"] == second["candidates"],
        "target_met": first["server_judge_requests"] > 0 and second["server_judge_requests"] == 0,
    }


def redis(budget: int, train_size: int | None, val_size: int | None, threads: int) -> dict[str, Any]:
    """8b: the same run in two processes at once, sharing one Redis cache."""
    from skynet_dspy.devserver import scripted_server

    binary = shutil.which("redis-server")
    try:
        import redis as _client  # noqa: F401
    except ImportError:
        return {"skipped": "the redis client is not installed (pip install 'skynet-dspy[redis]'); row 8b not run"}
    if binary is None:
        return {"skipped": REDIS_MISSING}
    folder = Path(tempfile.mkdtemp(prefix="skynet-bench-redis-"))
    server = scripted_server()
    redis_process, url = _start_redis(binary, folder)
    try:
        start = folder / "start"
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.judge_cache", "--worker", server.url, url, str(budget),
                 json.dumps(train_size), json.dumps(val_size), str(threads), str(start)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(Path(__file__).parent.parent),
            )
            for _ in range(2)
        ]
        time.sleep(1.0)  # both import DSPy meanwhile, then wait for the start file: they run at once
        start.touch()
        runs = []
        for worker in workers:
            out, err = worker.communicate(timeout=1800)
            if worker.returncode != 0:
                raise RuntimeError(f"a benchmark worker failed:\n{err[-2000:]}")
            runs.append(json.loads(out.strip().splitlines()[-1]))
        judged = _judged(server)
    finally:
        server.stop()
        redis_process.kill()
        redis_process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    distinct = len({(r.system, r.user) for r in judged})
    paid = sum(run["judge_requests"] for run in runs)
    return {
        "budget": budget, "seed": SEED, "threads": threads, "processes": runs,
        "server_judge_requests": len(judged), "distinct_judge_requests": distinct,
        "paid_requests": paid, "dollars": sum(run["dollars"] or 0.0 for run in runs),
        "target_met": len(judged) == distinct == paid and distinct > 0,
    }


def _start_redis(binary: str, folder: Path) -> tuple[subprocess.Popen, str]:
    import redis as client

    for _ in range(5):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
             str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            try:
                client.Redis.from_url(url, socket_timeout=1).ping()
                return process, url
            except client.RedisError:
                time.sleep(0.05)
        process.kill()
        process.wait(timeout=10)
    raise RuntimeError("redis-server did not start on 127.0.0.1")


def run(budget: int, train_size: int | None, val_size: int | None, threads: int) -> dict[str, Any]:
    """Both rows."""
    return {"disk": disk(budget, train_size, val_size, threads), "redis": redis(budget, train_size, val_size, threads)}


def _worker(argv: list[str]) -> None:
    url, cache, budget, train_size, val_size, threads, start = argv
    import logging

    import dspy  # noqa: F401  (dspy sets its loggers' levels on import; quiet them after)

    for name in ("dspy", "gepa", "LiteLLM", "litellm", "httpx", "skynet_dspy"):
        logging.getLogger(name).setLevel(logging.ERROR)
    while not Path(start).exists():
        time.sleep(0.01)
    found = gepa_run(url, cache, int(budget), json.loads(train_size), json.loads(val_size), int(threads))
    print(json.dumps(found))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2:])
    else:
        print(json.dumps(run(20, 6, 4, 2), indent=2))
