"""The judge under real traffic, end to end: a wrong --api-base fails fast and quietly, and 10,000 llm() requests
from 16 threads leave threads and open files flat (a bounded pool, reused cache connections)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ROOT
from support import write_metric

import skynet_dspy
from skynet_dspy._core.context import llm_pool
from skynet_dspy.devserver import DevServer

BANNER = "Give Feedback"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wrong_base(kind: str) -> str:
    """A base URL nothing answers at: a closed port (refused), or a name that does not resolve."""
    return f"http://127.0.0.1:{_closed_port()}/v1" if kind == "refused" else "http://no-such-host.invalid/v1"


def _check_argv(api_base: str) -> list[str]:
    return ["check", str(ROOT / "examples" / "judge_metric.py"), "--data", str(ROOT / "examples" / "cases.jsonl"),
            "--metric-lm", "openai/gpt-4o-mini", "--api-base", api_base]


@pytest.mark.parametrize("kind", ["refused", "unresolved"])
def test_check_with_a_wrong_api_base_fails_fast_without_retries_or_litellms_banner(kind, capfd, monkeypatch, caplog):
    """The first refused connection (or unresolved name) opens the endpoint's breaker: no request is retried, the
    other calls fail at once (v0.3 retried each, and ended well over 10 s after a working check)."""
    from skynet_dspy._cli import main

    api_base = _wrong_base(kind)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-base-test-000000")
    import litellm  # noqa: F401 - imported before the clock starts: on a busy machine importing it alone takes seconds

    with caplog.at_level(logging.INFO, logger="skynet_dspy"):
        code = main(_check_argv(api_base))
    out, err = capfd.readouterr()
    assert "retrying" not in caplog.text  # the first failure opened the breaker; the other calls failed at once
    assert BANNER not in out and BANNER not in err
    assert code != 0 and "cannot be reached" in out + err
    assert api_base.split("//")[1].split("/")[0] in out + err  # the endpoint is named


@pytest.mark.slow
def test_check_with_a_wrong_api_base_prints_no_banner_from_a_fresh_process():
    env = {**os.environ, "OPENAI_API_KEY": "sk-wrong-base-test-000000"}
    done = subprocess.run([sys.executable, "-m", "skynet_dspy", *_check_argv(_wrong_base("refused"))],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and "cannot be reached" in done.stdout
    assert BANNER not in done.stdout and BANNER not in done.stderr


def test_the_banner_is_silenced_for_skynet_dspys_calls_only(server):
    import litellm

    from skynet_dspy._judge import Judge
    from skynet_dspy.errors import LLMCallError

    before = litellm.suppress_debug_info
    judge = Judge(metric_lm={"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": "k-123456789"},
                  max_retries=0)
    server.fail_next(status=400)
    with pytest.raises(LLMCallError):
        judge.complete("Grade.", "x")
    assert litellm.suppress_debug_info is before  # the user's setting, as it was


FOUR_ASKS = """
from skynet import llm

def score(input, output, expected=None):
    return (1.0, {"feedback": " ".join(llm("Grade.", input=f"{output} part {n}") for n in range(4))})
"""


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    """Threads of the process but the test server's (one per request) and the llm() pool's, which grows to the
    work at once up to its fixed size (checked on its own)."""
    return len([thread for thread in threading.enumerate()
                if "process_request_thread" not in thread.name and thread.name != "skynet-llm-pool"])


def _pool_threads() -> int:
    return len([thread for thread in threading.enumerate() if thread.name == "skynet-llm-pool"])


@pytest.mark.slow
@pytest.mark.alone  # counts the process's threads: another test's load changes how many the pools start
def test_threads_and_open_files_stay_flat_over_10000_requests_from_16_threads(tmp_path):
    path = write_metric(tmp_path, FOUR_ASKS)
    with DevServer(lambda request: "PASS") as server:
        model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": "k-flat-test-123456"}
        with skynet_dspy.load_metric(path, metric_lm=model, judge_cache=tmp_path / "cache", workers=4) as metric, \
                ThreadPoolExecutor(16) as pool:
            warm = list(pool.map(lambda n: metric.score({"q": n}, f"answer {n}"), range(500)))
            threads, files = _threads(), _open_files()
            rest = list(pool.map(lambda n: metric.score({"q": n}, f"answer {n}"), range(500, 2500)))
            later_threads, later_files = _threads(), _open_files()
            deadline = time.monotonic() + 30  # threads started while others waited (a retry's backoff) end
            while _pool_threads() > llm_pool.size and time.monotonic() < deadline:
                time.sleep(0.05)
            pool_threads = _pool_threads()
        assert len(server.requests) == 10_000
    assert all(result.ok for result in warm + rest)
    assert later_threads <= threads + 2, (threads, later_threads)
    # the pool may have grown after the warm-up (a busier moment), but only to its fixed size (more only while
    # requests wait for their turn, a pause or a backoff)
    assert 0 < pool_threads <= llm_pool.size, pool_threads
    assert later_files <= files + 8, (files, later_files)
