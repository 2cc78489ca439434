"""The public API: every public name lives at `skynet_dspy` (reprs, tracebacks, pickles) and has a typed signature."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import textwrap
import traceback

import cloudpickle
import pytest
from conftest import ROOT

import skynet_dspy

METRIC = str(ROOT / "examples" / "metric.py")
ERRORS = [getattr(skynet_dspy, name) for name in skynet_dspy.__all__ if name.endswith(("Error", "Violation", "Extra",
                                                                                      "Configured", "Reached", "Call"))]
PUBLIC = [getattr(skynet_dspy, name) for name in skynet_dspy.__all__ if name not in ("skynet", "helpers")]


def test_the_names_the_issue_names_live_at_skynet_dspy():
    assert skynet_dspy.Metric.__module__ == "skynet_dspy"
    assert skynet_dspy.MetricLoadError.__module__ == "skynet_dspy"
    with skynet_dspy.load_metric(METRIC) as metric:
        assert type(metric) is skynet_dspy.Metric  # one class, no subclass built per load
        assert metric.__class__.__name__ == "metric"  # what dspy.Evaluate names its column: the metric file's stem
        assert isinstance(metric, skynet_dspy.Metric)


@pytest.mark.parametrize("value", PUBLIC, ids=lambda value: value.__name__)
def test_every_public_class_and_function_lives_at_skynet_dspy(value):
    assert value.__module__ == "skynet_dspy"
    assert getattr(skynet_dspy, value.__name__) is value  # so pickle, which looks it up there, finds it


def test_a_fresh_process_sees_public_homes_whichever_name_it_reaches_first():
    # The lazy names are published when their module loads: Metric and Score too, although only
    # load_metric was asked for.
    script = textwrap.dedent(f"""
        import skynet_dspy
        metric = skynet_dspy.load_metric({METRIC!r})
        import sys
        print([type(metric).__module__, sys.modules["skynet_dspy._dspy.metric"].Score.__module__])
        metric.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['skynet_dspy', 'skynet_dspy']"


def test_reprs_and_tracebacks_name_the_public_class(tmp_path):
    assert repr(skynet_dspy.MetricLoadError) == "<class 'skynet_dspy.MetricLoadError'>"
    assert repr(skynet_dspy.Failure.TIMEOUT) == "<Failure.TIMEOUT: 'timeout'>"
    broken = tmp_path / "metric.py"
    broken.write_text("def score(input):\n    return 1.0, {'feedback': ''}\n")
    with pytest.raises(skynet_dspy.MetricLoadError) as raised:
        skynet_dspy.load_metric(str(broken))
    line = traceback.format_exception_only(raised.value)[-1]
    assert line.startswith("skynet_dspy.MetricLoadError: ") and "score must take two" in line


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: error.__name__)
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_exceptions_survive_pickle_at_their_public_home(error, dumps):
    message = "boom with sk-live-0123456789abcdef"
    made = error(message)
    again = pickle.loads(dumps(made))
    assert type(again) is error and str(again) == str(made) and "0123456789abcdef" not in str(again)


def test_a_worker_like_process_unpickles_public_exceptions_without_dspy():
    # Metric worker processes import only the DSPy-free core: unpickling an exception at skynet_dspy must not
    # pull DSPy in (skynet_dspy's exceptions are imported eagerly, never through a lazy name).
    data = pickle.dumps([error("x") for error in ERRORS] + [skynet_dspy.Failure.CRASHED])
    script = textwrap.dedent("""
        import pickle, sys
        import skynet_dspy._core
        values = pickle.loads(sys.stdin.buffer.read())
        assert "dspy" not in sys.modules and "litellm" not in sys.modules, "DSPy was imported"
        print(sorted(type(value).__module__ for value in values)[0], len(values))
    """)
    done = subprocess.run([sys.executable, "-c", script], input=data, capture_output=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["skynet_dspy", str(len(ERRORS) + 1)]


def test_plain_values_and_scores_survive_pickle():
    result = skynet_dspy.validate_return((0.5, {"feedback": "half", "scores": {"a": 1.0}}))
    assert type(result).__module__ == "skynet_dspy"
    assert pickle.loads(pickle.dumps(result)) == result
    usage = skynet_dspy.JudgeUsage()
    assert pickle.loads(cloudpickle.dumps(usage)) == usage
    score = skynet_dspy.Score(result)
    assert float(pickle.loads(pickle.dumps(score))) == 0.5


def test_a_loaded_metric_class_survives_cloudpickle():
    with skynet_dspy.load_metric(METRIC) as metric:
        cls = cloudpickle.loads(cloudpickle.dumps(type(metric)))
    assert cls is skynet_dspy.Metric  # found by name at skynet_dspy: sent by reference


def _untyped(qualname: str, function) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    missing = [f"{qualname}({name})" for name, parameter in signature.parameters.items()
               if name not in ("self", "cls") and parameter.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty and not qualname.endswith("__init__"):
        missing.append(f"{qualname} -> ?")
    return missing


def test_every_public_signature_is_typed():
    # mypy checks the public modules with --strict; the classes and functions they re-export from private
    # modules (checked with the package's baseline) must still show complete signatures to a user's type checker.
    missing = []
    for name in ("llm", "reward", "observation", "service_cost"):
        missing += _untyped(f"skynet.{name}", getattr(skynet_dspy.skynet, name))
    for value in PUBLIC:
        if not isinstance(value, type):
            missing += _untyped(value.__name__, value)
            continue
        for attribute, member in vars(value).items():
            if attribute.startswith("_") and attribute not in ("__init__", "__call__"):
                continue
            function = member.fget if isinstance(member, property) else member
            if inspect.isfunction(function):
                missing += _untyped(f"{value.__name__}.{attribute}", function)
    assert missing == []
