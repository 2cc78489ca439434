"""The worker pool under real load, in both start modes: slow imports under many threads, and no orphans."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy._core.isolation.process import START_VARIABLE


@pytest.fixture(autouse=True, params=["template", "fresh"])
def start_mode(request, monkeypatch) -> str:
    monkeypatch.setenv(START_VARIABLE, request.param)
    return request.param


SLOW_IMPORT = """
import time

# about 0.8 s of busy CPU at import, like loading a model (timed by the wall clock: on a shared 2-core machine
# 0.8 s of CPU time can take longer than the 3 s load timeout itself)
_end = time.monotonic() + 0.8
while time.monotonic() < _end:
    pass

def score(input, output, expected=None):
    return (1.0 if output == expected["label"] else 0.0), {"feedback": "ok"}
"""


class Echo(dspy.Module):
    def forward(self, question: str) -> dspy.Prediction:
        return dspy.Prediction(label="yes")


@pytest.mark.slow
def test_a_slow_importing_metric_under_12_threads_scores_every_call(tmp_path, start_mode):
    devset = [dspy.Example(question=f"q{i}", label="yes").with_inputs("question") for i in range(48)]
    with skynet_dspy.load_metric(write_metric(tmp_path, SLOW_IMPORT), timeout=3) as metric:
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=12, display_progress=False)(Echo())
        scores = [float(row[2]) for row in result.results]
        failures = {kind: count for kind, count in metric.stats.items() if count and kind not in ("calls", "memo_hits")}
    assert scores == [1.0] * 48, failures
    assert failures == {}


SPINS = """
import sys

def score(input, output, expected=None):
    sys.setswitchinterval(10000)  # a thread of the worker's own would never get the GIL again
    while True:
        pass
"""

SPINNING_USER = """
import sys, threading, time
import skynet_dspy
metric = skynet_dspy.load_metric(sys.argv[1], timeout=600, workers=2)
print("helpers", *[helper.pid for helper in metric.scorer.executor._helpers], file=sys.stderr, flush=True)
for _ in range(2):
    threading.Thread(target=metric.score, args=({}, "x"), daemon=True).start()
while len(metric.scorer.executor.worker_pids) < 2:
    time.sleep(0.01)
print("workers", *metric.scorer.executor.worker_pids, file=sys.stderr, flush=True)
threading.Event().wait()
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_no_worker_outlives_the_users_process_even_when_the_metric_hogs_the_gil(tmp_path, start_mode):
    path = write_metric(tmp_path, SPINS)
    script = write_metric(tmp_path, SPINNING_USER, "user.py")
    user = subprocess.Popen([sys.executable, str(script), str(path)], stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        pids = []
        while len(pids) < 3:
            line = user.stderr.readline()
            assert line.startswith(("workers ", "helpers ")), line
            pids += [int(word) for word in line.split()[1:]]
        time.sleep(0.3)  # both spin now
        user.kill()
        user.wait()
        deadline = time.monotonic() + 2
        while any(map(_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in pids if _running(pid)]
        for pid in left:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        assert left == [], "a worker (or the template) outlived the killed user process by 2 s"
    finally:
        user.kill()
        user.wait()
