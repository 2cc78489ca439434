"""Soak (issue 13): 1,000 calls at 16 threads, about 1% of them faulting, lose no result and give the
scores one thread gives. Faults: score raises, its worker process exits, it hangs past the timeout, it
returns a value that breaks the contract; every other call scores normally on a healthy worker.
"""

from __future__ import annotations

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure

CALLS = 1000
FAULTS = {13: Failure.EXCEPTION, 137: Failure.CRASHED, 261: Failure.TIMEOUT, 389: Failure.INVALID}  # index % 400

METRIC = """
import os, time

def score(input, output, expected=None):
    fault = input["index"] % 400
    if fault == 13:
        raise ValueError("a fault")
    if fault == 137:
        os._exit(1)
    if fault == 261:
        time.sleep(60)
    if fault == 389:
        return "not a pair"
    right = output == expected["label"]
    return (1.0 if right else 0.25), {"feedback": "right" if right else "wrong", "scores": {"right": float(right)}}
"""


class Echo(dspy.Module):
    """Answers right on most examples and wrong on every seventh, with no model."""

    def forward(self, index: int) -> dspy.Prediction:
        return dspy.Prediction(label="yes" if index % 7 else "no")


def _run(metric: skynet_dspy.Metric, threads: int) -> dict[int, tuple[float, str | None]]:
    devset = [dspy.Example(index=index, label="yes").with_inputs("index") for index in range(CALLS)]
    result = dspy.Evaluate(devset=devset, metric=metric, num_threads=threads, display_progress=False)(Echo())
    assert len(result.results) == CALLS
    return {example.index: (float(score), score.result.failure) for example, _, score in result.results}


@pytest.mark.slow
def test_a_thousand_calls_at_sixteen_threads_with_one_percent_faulting_lose_nothing(tmp_path):
    path = write_metric(tmp_path, METRIC)
    with skynet_dspy.load_metric(path, timeout=1) as parallel_metric, \
            skynet_dspy.load_metric(path, timeout=1) as serial_metric:
        parallel = _run(parallel_metric, 16)
        serial = _run(serial_metric, 1)
    assert sorted(parallel) == list(range(CALLS)), "no result lost"
    assert parallel == serial, "the same score and failure kind for every example under 16 threads"
    faulted = {index: kind for index, (_, kind) in parallel.items() if kind is not None}
    assert faulted == {index: FAULTS[index % 400] for index in range(CALLS) if index % 400 in FAULTS}
    assert len(faulted) / CALLS == pytest.approx(0.01, abs=0.002)
    for index, (score, kind) in parallel.items():
        if kind is None:
            assert score == (1.0 if index % 7 else 0.25)
        else:
            assert score == 0.0
    for metric in (parallel_metric, serial_metric):
        counts = metric.stats
        assert counts["calls"] == CALLS
        assert {kind: counts[kind] for kind in FAULTS.values()} == {
            kind: sum(1 for found in faulted.values() if found is kind) for kind in FAULTS.values()
        }
