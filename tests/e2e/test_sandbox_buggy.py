"""Every promise of the buggy tier holds in the sandbox: test_hostile_metrics.py's in-process tests, again with
sandbox=True.

Its metric loops, hangs in C, blocks signals, crashes, exits, forks and leaves threads behind, under
dspy.Evaluate(num_threads=8), dspy.GEPA(num_threads=4) and a slow import; here each `load_metric` those tests
make starts its workers in bubblewrap, forked from a template inside it. (Its tests that start a process of
their own, the command line's and the one killed at the end, load the metric there, unsandboxed.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import skynet_dspy

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: the module beside this one, by its name
from test_hostile_metrics import (  # noqa: E402, F401 - the tests, and the fixture they take
    hostile_metric,
    test_a_module_that_hangs_at_import_fails_to_load_within_the_timeout,
    test_every_hostile_call_is_contained_under_evaluate_with_8_threads,
    test_hostile_calls_never_stop_a_gepa_run_with_4_threads,
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def start_mode(monkeypatch) -> Iterator[str]:
    """In place of test_hostile_metrics.py's (template or fresh workers): sandboxed workers, forked in the sandbox."""
    loaded: list[skynet_dspy.Metric] = []

    def load_metric(*args: Any, **options: Any) -> skynet_dspy.Metric:
        loaded.append(original(*args, sandbox=True, **options))
        return loaded[-1]

    original = skynet_dspy.load_metric
    monkeypatch.setattr(skynet_dspy, "load_metric", load_metric)
    yield "sandbox"
    assert all(metric.scorer.sandbox is not None for metric in loaded)
