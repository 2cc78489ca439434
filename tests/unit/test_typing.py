"""A user's type checker catches a misspelt or mistyped option (tests/typing/misuses.py), and the public
option types, Metric's signature and the docs' option table agree on every name, type and default."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import typing

import pytest
from conftest import ROOT

import skynet_dspy
from skynet_dspy._core import options as option_types

MISUSES = ROOT / "tests" / "typing" / "misuses.py"


def _expected_errors() -> set[tuple[int, str]]:
    expected = set()
    for number, line in enumerate(MISUSES.read_text().splitlines(), 1):
        found = re.search(r"# E: ([a-z-]+)$", line)
        if found:
            expected.add((number, found.group(1)))
    return expected


def test_mypy_rejects_each_misused_option_and_nothing_else():
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary", "--show-error-codes",
         str(MISUSES.relative_to(ROOT))],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )
    errors = set()
    for line in done.stdout.splitlines():
        found = re.match(r"tests/typing/misuses\.py:(\d+): error: .*\[([a-z-]+)\]$", line)
        if found:
            errors.add((int(found.group(1)), found.group(2)))
    assert errors == _expected_errors(), done.stdout + done.stderr
    assert len(errors) >= 8  # the 8 misuses, at least
    assert 'did you mean "timeout"?' in done.stdout  # mypy names the closest option too


@pytest.mark.parametrize("misspelt, closest", [("timout", "timeout"), ("isolaton", "isolation")])
def test_a_misspelt_option_is_still_a_type_error_naming_the_closest_at_run_time(misspelt, closest):
    with pytest.raises(TypeError, match=f"did you mean {closest!r}"):
        skynet_dspy.load_metric(str(ROOT / "examples" / "metric.py"), **{misspelt: 5})
    with pytest.raises(TypeError, match=f"did you mean {closest!r}"):
        skynet_dspy.check_contract(str(ROOT / "examples" / "metric.py"), [], **{misspelt: 5})


def _metric_keywords() -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(skynet_dspy.Metric).parameters.items() if name != "source"}


def test_metric_options_are_metrics_keywords_with_the_same_types():
    # the annotations as written (the same aliases: Isolation, ModelSpec, JudgeCache), so they cannot drift apart
    hints = {name: _written(annotation) for name, annotation in skynet_dspy.MetricOptions.__annotations__.items()}
    keywords = _metric_keywords()
    assert set(hints) == set(keywords)
    assert {name: _written(keywords[name].annotation) for name in hints} == hints


def _written(annotation: object) -> str:
    return annotation.__forward_arg__ if isinstance(annotation, typing.ForwardRef) else str(annotation)


def test_the_options_of_every_entry_point_are_metric_options():
    metric = option_types.names(skynet_dspy.MetricOptions)
    assert option_types.names(skynet_dspy.ScoringOptions) <= metric
    dspy_gepa = option_types.names(skynet_dspy.DspyGEPAOptions)
    gepa_metric = option_types.names(skynet_dspy.GEPAOptions) - dspy_gepa
    assert gepa_metric == metric - {"metric_lm", "reflection_lm"} - dspy_gepa
    assert option_types.names(skynet_dspy.OptimizeAnythingOptions) - option_types.names(
        skynet_dspy.GEPAConfigOptions) == option_types.names(skynet_dspy.ScoringOptions)


def test_dspy_gepa_options_are_dspy_gepas_keywords():
    import dspy

    keywords = set(inspect.signature(dspy.GEPA.__init__).parameters) - {"self", "metric", "reflection_lm"}
    assert option_types.names(skynet_dspy.DspyGEPAOptions) == keywords


def test_plain_gepa_options_are_gepas_config_fields():
    import dataclasses

    from gepa import optimize_anything as oa

    fields = {f.name for config in (oa.EngineConfig, oa.ReflectionConfig, oa.TrackingConfig, oa.GEPAConfig)
              for f in dataclasses.fields(config)}
    own = {"seed", "max_metric_calls", "reflection_lm", "engine", "reflection", "tracking", "capture_stdio"}
    assert option_types.names(skynet_dspy.GEPAConfigOptions) == fields - own


def test_judge_options_are_judges_keywords():
    keywords = set(inspect.signature(skynet_dspy.Judge).parameters) - {"metric_lm", "reflection_lm", "cache"}
    assert option_types.names(skynet_dspy.JudgeOptions) == keywords
