"""In-flight markers name their owner: a killed peer's marker does not hold another process (disk and Redis), while
a live peer's marker is waited for (up to its expiry, MARKER_TTL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from skynet_dspy._judge import Judge
from skynet_dspy._judge.cache import request_key

KEY = "marker-test-key-11223"

PEER = textwrap.dedent("""
    import sys, time
    from skynet_dspy._judge.cache import make_cache
    spec, key, hold, answer = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    cache = make_cache(spec)
    assert cache.lead_or_wait(key, 1.0) is None  # it leads: it holds the in-flight marker
    print("held", flush=True)
    time.sleep(hold)
    cache.put(key, answer, {"model": "m", "messages": []})
    cache.release(key)
    print("answered", flush=True)
""")


def judge_for(server, cache) -> Judge:
    model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    return Judge(metric_lm=model, cache=cache, max_retries=0, timeout=30)


def key_of(judge: Judge, text: str) -> str:
    messages = [{"role": "system", "content": "Grade."}, {"role": "user", "content": text}]
    return request_key({**judge.metric_lm.litellm_kwargs(), "messages": messages})


def peer(spec: str, key: str, hold: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", PEER, spec, key, str(hold), "from the peer"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.fixture(params=["disk", "redis"])
def spec(request, tmp_path):
    if request.param == "disk":
        return str(tmp_path / "cache")
    return request.getfixturevalue("redis_url")


def test_a_killed_peers_marker_does_not_hold_another_process(server, spec):
    judge = judge_for(server, spec)
    holder = peer(spec, key_of(judge, "shared"), hold=60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    assert judge.complete("Grade.", "shared") == "ok"
    assert time.monotonic() - started < 3  # taken over at once, not after the judge's 30 s timeout
    assert len(server.requests) == 1


def test_a_live_peers_marker_is_waited_for(server, spec):
    judge = judge_for(server, spec)
    holder = peer(spec, key_of(judge, "shared"), hold=2)
    try:
        assert judge.complete("Grade.", "shared") == "from the peer"  # waited for it: not sent twice
        assert not server.requests
    finally:
        holder.wait(30)


def test_a_marker_names_its_owner(tmp_path):
    from skynet_dspy._judge.cache import IN_FLIGHT_PREFIX, DiskStore

    store = DiskStore(tmp_path / "cache")
    assert store.lead_or_wait("k", 1.0) is None
    owner = json.loads(store._cache.get(IN_FLIGHT_PREFIX + "k"))
    assert owner["pid"] == os.getpid() and owner["host"] and owner["token"] and owner["start"]
    store.release("k")
    assert store._cache.get(IN_FLIGHT_PREFIX + "k") is None
