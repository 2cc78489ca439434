"""The judge cache stores data, never code: planted pickles and damaged entries are misses, the folder is private,
and no credential setting reaches a cache file, a Redis entry, a repr or a log."""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import diskcache
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy._judge import Judge
from skynet_dspy._judge.cache import KEY_PREFIX, DiskStore, request_key

KEY = "safety-test-key-1234567"
AWS_SECRET = "aws-secret-canary-5f3e9d1c7b"
HEADER_SECRET = "header-canary-8a7b6c5d4e"


class Boom:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def judge_for(server, cache, **settings) -> Judge:
    model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY, **settings}
    return Judge(metric_lm=model, cache=cache, max_retries=0)


def the_key(judge: Judge, text: str) -> str:
    target = judge.metric_lm
    return request_key({**target.litellm_kwargs(), "messages": [{"role": "system", "content": "Grade."},
                                                                 {"role": "user", "content": text}]})


def test_a_planted_pickle_runs_nothing_and_is_a_miss_with_one_warning(server, tmp_path, caplog):
    folder = tmp_path / "cache"
    DiskStore(folder).close()  # a store the judge made, as a user's earlier run would leave it
    judge = judge_for(server, folder)
    proof = tmp_path / "code-ran"
    planted = diskcache.Cache(str(folder))  # the attacker: diskcache's default Disk pickles any object
    planted.set(the_key(judge, "one"), Boom(str(proof)))
    planted.set(the_key(judge, "two"), Boom(str(proof)))
    planted.close()
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        assert judge.complete("Grade.", "one") == "ok"
        assert judge.complete("Grade.", "two") == "ok"
    assert not proof.exists()  # nothing was unpickled
    assert len(server.requests) == 2  # each a miss, answered by the model
    warnings = [r.getMessage() for r in caplog.records if "pickled value" in r.getMessage()]
    assert len(warnings) == 1 and str(folder) in warnings[0]
    # the fresh answer replaced the planted value: a new judge reads it as a hit
    again = judge_for(server, folder)
    assert again.complete("Grade.", "one") == "ok" and len(server.requests) == 2


@pytest.mark.parametrize("damage", ["not json", '{"v": 2, "text": "forged", "key": "x", "check": "y"}',
                                    b"\x80\x04\x95 binary", '{"text": "an older entry"}'])
def test_a_damaged_or_forged_entry_is_a_miss(server, tmp_path, caplog, damage):
    folder = tmp_path / "cache"
    judge = judge_for(server, folder)
    judge.cache._cache.set(the_key(judge, "one"), damage)
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        assert judge.complete("Grade.", "one") == "ok"
    assert len(server.requests) == 1
    assert len([r for r in caplog.records if "read as a miss" in r.getMessage()]) == 1


def test_the_folder_is_created_private(tmp_path):
    folder = tmp_path / "new" / "cache"
    DiskStore(folder).close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(ValueError, match=r"belongs to another user \(uid 65534.*plant entries"):
        DiskStore(folder)


def test_a_symlink_to_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    link = tmp_path / "mine"
    link.symlink_to(folder)
    with pytest.raises(ValueError, match=r"belongs to another user"):
        DiskStore(link)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_folder_others_can_write_is_refused(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(ValueError, match=rf"can be written by other users \(mode {mode:o}\).*chmod 700"):
        DiskStore(folder)


def test_credential_settings_reach_no_cache_file_repr_or_log(server, tmp_path, caplog):
    folder = tmp_path / "cache"
    judge = judge_for(server, folder, aws_secret_access_key=AWS_SECRET, extra_headers={"api-key": HEADER_SECRET})
    with caplog.at_level(logging.DEBUG):
        judge.complete("Grade.", "one")
        try:
            server.fail_next(status=400)
            judge.complete("Grade.", "two")
        except Exception as exc:  # the error text is logged and shown: it is redacted too
            logging.getLogger("skynet_dspy").error("failed: %s", exc)
    judge.cache.close()
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert AWS_SECRET.encode() not in data and HEADER_SECRET.encode() not in data, path
    shown = repr(judge.metric_lm.settings) + repr(judge) + repr(judge.metric_lm)
    assert AWS_SECRET not in shown and HEADER_SECRET not in shown
    assert "aws_secret_access_key" not in repr(judge.metric_lm.settings)
    assert AWS_SECRET not in caplog.text and HEADER_SECRET not in caplog.text
    # the request still carried them
    assert server.requests[0].headers.get("api-key") == HEADER_SECRET


def test_credential_settings_do_not_change_the_cache_key(server, tmp_path):
    first = judge_for(server, True, aws_secret_access_key=AWS_SECRET)
    second = judge_for(server, True, aws_secret_access_key="another-secret-value-123")
    assert the_key(first, "x") == the_key(second, "x")


def test_redis_entries_are_checked_and_hold_no_credential(server, redis_url, redis_server, caplog):
    judge = judge_for(server, redis_url, aws_secret_access_key=AWS_SECRET, extra_headers={"api-key": HEADER_SECRET})
    client = redis_server.client()
    proof_key = KEY_PREFIX + the_key(judge, "planted")
    client.set(proof_key, pickle.dumps({"text": "forged"}))
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        assert judge.complete("Grade.", "planted") == "ok"
        assert judge.complete("Grade.", "fresh") == "ok"
    assert len(server.requests) == 2
    assert len([r for r in caplog.records if "read as a miss" in r.getMessage()]) == 1
    for name in client.keys("*"):
        value = client.get(name) or b""
        assert AWS_SECRET.encode() not in value and HEADER_SECRET.encode() not in value
    # a forged entry (right shape, wrong check) is a miss too
    client.set(proof_key, '{"v": 2, "key": "k", "text": "forged", "check": "0"}')
    other = judge_for(server, redis_url)
    assert other.complete("Grade.", "planted") == "ok" and len(server.requests) == 3


JUDGE_METRIC = """
from skynet import llm

def score(input, output, expected=None):
    verdict = llm("Grade.", input=str(output))
    return (1.0 if verdict.startswith("PASS") else 0.0, {"feedback": verdict})
"""


def test_swapping_the_folder_after_it_was_checked_has_no_effect(server, tmp_path):
    """Whoever owns the folder's parent renames it away and puts a folder holding forged answers in its place: the
    metric's judge keeps using the folder it checked, so no forged answer is read, even by threads that open their
    first connection after the swap (public API throughout)."""
    path, folder, forged = write_metric(tmp_path, JUDGE_METRIC), tmp_path / "cache", tmp_path / "forged"
    model = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    outputs = [f"second {n}" for n in range(4)]
    with skynet_dspy.load_metric(path, metric_lm=model, judge_cache=folder, workers=4) as metric:
        assert metric.score({"q": 1}, "first").ok  # the store is open and used
        server.responder = lambda request: "PASS: forged"  # the forger's store holds passing verdicts
        with skynet_dspy.load_metric(path, metric_lm=model, judge_cache=forged) as forger:
            assert [forger.score({"q": 2}, output).score for output in outputs] == [1.0] * 4
        folder.rename(tmp_path / "moved-away")
        forged.rename(folder)
        server.responder = lambda request: "FAIL: wrong"
        asked = len(server.requests)
        with ThreadPoolExecutor(4) as pool:  # at once: llm() answers them on new threads, with new connections
            results = list(pool.map(lambda output: metric.score({"q": 2}, output), outputs))
        assert [(result.score, result.feedback) for result in results] == [(0.0, "FAIL: wrong")] * 4
        assert len(server.requests) == asked + 4  # the judge was asked; no forged entry was read


FIGURES_RUN = """
import json, logging, sys
import dspy, skynet_dspy
folder, url, metric_path = sys.argv[1:4]
dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=False, disk_cache_dir=folder)
warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("skynet_dspy").addHandler(handler)
lm = dspy.LM("openai/gpt-4o-mini", api_base=url, api_key="figures-test-key", cache=True)
devset = [dspy.Example(text=text, label="ham").with_inputs("text") for text in ("lunch at noon?", "meeting moved")]
with dspy.context(lm=lm), skynet_dspy.load_metric(metric_path) as metric:
    result = dspy.Evaluate(devset=devset, metric=metric, num_threads=1)(dspy.Predict("text -> label"))
print(json.dumps({"scores": [float(score) for _, _, score in result.results], "warnings": warnings}))
"""


def test_a_planted_pickle_in_the_call_figures_store_runs_nothing(server, tmp_path, metrics_dir):
    """The cost/latency store kept beside DSPy's disk cache holds JSON only: in a later process, whose DSPy calls are
    cache hits measured from that store, a planted pickle is a miss with a warning, never code."""
    from skynet_dspy.devserver import dspy_reply

    server.responder = lambda request: dspy_reply(label="ham")
    dspy_cache, proof = tmp_path / "dspy-cache", tmp_path / "code-ran"

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", FIGURES_RUN, str(dspy_cache), server.url,
                               str(metrics_dir / "reward_metric.py")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()  # measured, and the figures kept beside DSPy's cache
    figures = dspy_cache / "skynet_dspy_call_figures"
    assert stat.S_IMODE(figures.stat().st_mode) == 0o700  # private to the user
    with diskcache.Cache(str(figures)) as planted:  # the attacker: diskcache's default Disk pickles any object
        keys = list(planted.iterkeys())
        assert len(keys) == 2
        for key in keys:
            planted.set(key, Boom(str(proof)))
    asked = len(server.requests)
    again = run()
    assert not proof.exists()  # nothing was unpickled
    assert len(server.requests) == asked  # DSPy's cache answered: the figures store was read
    assert [w for w in first["warnings"] if "never decoded" in w] == []
    assert len([w for w in again["warnings"] if "never decoded" in w]) == 1, again["warnings"]
    assert len(again["scores"]) == 2
