"""One process hammering a shared judge cache: run by test_cache_stores.py as `python hammer.py SPEC URL ...`.

It asks every request of the list twice, in its own shuffled order, on 8 threads, once the start file
exists (so two such processes start together), and prints what it saw as one JSON line.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from skynet_dspy._judge import Judge  # noqa: E402


def main(spec: str, url: str, requests: int, seed: int, start_file: str) -> None:
    judge = Judge(metric_lm={"model": "openai/gpt-4o-mini", "api_base": url, "api_key": "hammer-key-1234"},
                  cache=spec, max_retries=0)
    judge.complete("warm-up")  # LiteLLM's import and first connection, before the start
    asks = [f"question {number}" for number in range(requests)] * 2
    random.Random(seed).shuffle(asks)
    while not Path(start_file).exists():
        time.sleep(0.01)
    errors: list[str] = []

    def ask(text: str) -> bool:
        try:
            return judge.complete("Answer in one word.", text) == f"answer to {text}"
        except Exception as exc:  # reported, not raised: the test asserts there are none
            errors.append(f"{type(exc).__name__}: {exc}")
            return False

    with ThreadPoolExecutor(8) as pool:
        right = sum(pool.map(ask, asks))
    usage = judge.usage
    print(json.dumps({"right": right, "asked": len(asks), "errors": errors, "calls": usage.requests,
                      "cache_hits": usage.cache_hits}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
