"""Path and import safety (issue 9): each metric file runs in its own module namespace; two
metric.py files never see each other's globals (or helper modules); a changed file reloads.

By default a metric runs in worker processes, so its module state is observed through what score
returns; the tests that look at the loaded module itself use isolation="thread" (loaded here)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import skynet_dspy

ISOLATIONS = ["process", "thread"]

@pytest.fixture(autouse=True)
def _restore_import_state():
    """Undo what the metric files import, so same-named helper modules do not leak between tests."""
    modules, path = set(sys.modules), list(sys.path)
    yield
    for name in set(sys.modules) - modules:
        if not name.startswith(("skynet_dspy", "dspy", "litellm", "openai", "numpy", "gepa")):
            del sys.modules[name]
    sys.path[:] = path


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def _feedback(metric: skynet_dspy.Metric, output: str = "x") -> str:
    result = metric.score({"question": "q"}, output, {"answer": "x"})
    assert result.ok, result.feedback
    return result.feedback


GLOBALS_METRIC = """
    NAME = {name!r}
    CALLS = []

    def score(input, output, expected=None):
        CALLS.append(output)
        others = sorted(key for key in globals() if key.startswith("ONLY_"))
        return 1.0, {{"feedback": f"{{NAME}} calls={{len(CALLS)}} module={{__name__}} only={{others}}"}}

    ONLY_{name} = True
"""


def _loaded(metric: skynet_dspy.Metric):
    """The metric as loaded in this process (isolation="thread" only)."""
    assert metric.isolation == "thread"
    return metric.scorer.executor.loaded


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_two_metric_files_with_the_same_name_keep_their_own_globals(tmp_path, isolation):
    first = skynet_dspy.load_metric(_write(tmp_path / "a" / "metric.py", GLOBALS_METRIC.format(name="A")),
                                    isolation=isolation)
    second = skynet_dspy.load_metric(_write(tmp_path / "b" / "metric.py", GLOBALS_METRIC.format(name="B")),
                                     isolation=isolation)

    one, two, three = _feedback(first), _feedback(first), _feedback(second)

    assert one.startswith("A calls=1 ") and "only=['ONLY_A']" in one
    assert two.startswith("A calls=2 ")
    assert three.startswith("B calls=1 ") and "only=['ONLY_B']" in three, "B sees none of A's globals"
    module_name = lambda text: text.split(" module=")[1].split(" ")[0]  # noqa: E731
    if isolation == "process":  # each metric has worker processes of its own
        pids_a, pids_b = first.scorer.executor.worker_pids, second.scorer.executor.worker_pids
        assert pids_a and pids_b and not set(pids_a) & set(pids_b)
    else:
        module_a, module_b = _loaded(first).module, _loaded(second).module
        assert module_a is not module_b and module_a.__name__ != module_b.__name__
        assert module_a.__name__ == module_name(one) and module_b.__name__ == module_name(three)
        assert module_a.NAME == "A" and module_b.NAME == "B"
        assert module_a.CALLS == ["x", "x"] and module_b.CALLS == ["x"]
        assert _loaded(first).score.__globals__ is vars(module_a)
    first.close()
    second.close()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_metric_file_runs_in_its_own_namespace_not_the_callers(tmp_path, isolation):
    path = _write(tmp_path / "metric.py", """
        import sys
        LEAK = "from the metric"
        RUN_AS = __name__

        def score(input, output, expected=None):
            main = vars(sys.modules["__main__"])
            return 1.0, {"feedback": f"{RUN_AS} {'LEAK' in main}"}
    """)
    main_globals = dict(vars(sys.modules["__main__"]))
    metric = skynet_dspy.load_metric(path, isolation=isolation)

    assert "LEAK" not in globals() and "LEAK" not in vars(sys.modules["__main__"])
    assert dict(vars(sys.modules["__main__"])).keys() == main_globals.keys()
    name, leaked = _feedback(metric).split(" ")
    assert leaked == "False", "the metric's globals are not the __main__ module's where it runs"
    assert name not in ("__main__", "metric", "builtins")
    if isolation == "thread":
        assert name == _loaded(metric).module.__name__
    assert "metric" not in sys.modules or getattr(sys.modules["metric"], "__file__", None) != str(path)
    metric.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_loading_the_same_file_twice_gives_independent_metrics(tmp_path, isolation):
    path = _write(tmp_path / "metric.py", GLOBALS_METRIC.format(name="S"))
    first = skynet_dspy.load_metric(path, isolation=isolation)
    second = skynet_dspy.load_metric(path, isolation=isolation)
    assert _feedback(first).startswith("S calls=1 ")
    assert _feedback(first).startswith("S calls=2 ")
    assert _feedback(second).startswith("S calls=1 "), "a second load starts from fresh module state"


CHANGING = """
    def score(input, output, expected=None):
        return {value}, {{"feedback": "version {value}"}}
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_reloading_a_changed_file_picks_up_the_change(tmp_path, isolation):
    path = _write(tmp_path / "metric.py", CHANGING.format(value="0.25"))
    old = skynet_dspy.load_metric(path, isolation=isolation)
    assert _feedback(old) == "version 0.25"

    # Rewritten at once (same second, same size): a bytecode cache keyed on mtime would serve the stale copy.
    _write(path, CHANGING.format(value="0.75"))
    new = skynet_dspy.load_metric(path, isolation=isolation)

    assert _feedback(new) == "version 0.75"
    assert new.score({"question": "q"}, "x", None).score == 0.75
    assert _feedback(old) == "version 0.25", "the metric loaded before keeps the code it was loaded with"


HELPER_METRIC = """
    import {helper}

    def score(input, output, expected=None):
        return 1.0, {{"feedback": {helper}.describe(output)}}
"""
HELPER = """
    def describe(output):
        return "{tag}:" + str(output)
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_metric_imports_a_helper_module_beside_it(tmp_path, isolation):
    helper = f"helper_{uuid.uuid4().hex[:8]}"
    _write(tmp_path / f"{helper}.py", HELPER.format(tag="beside"))
    path_before = list(sys.path)
    metric = skynet_dspy.load_metric(_write(tmp_path / "metric.py", HELPER_METRIC.format(helper=helper)),
                                     isolation=isolation)
    assert _feedback(metric, "out") == "beside:out"
    assert sys.path == path_before, "loading leaves sys.path as it was"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_metric_imports_a_helper_module_inside_score(tmp_path, isolation):
    helper = f"helper_{uuid.uuid4().hex[:8]}"
    _write(tmp_path / f"{helper}.py", HELPER.format(tag="lazy"))
    metric = skynet_dspy.load_metric(_write(tmp_path / "metric.py", f"""
        def score(input, output, expected=None):
            import {helper}
            return 1.0, {{"feedback": {helper}.describe(output)}}
    """), isolation=isolation)
    assert _feedback(metric, "out") == "lazy:out"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_two_metrics_with_same_named_helper_modules_each_use_their_own(tmp_path, isolation):
    _write(tmp_path / "a" / "rel_shared_helper.py", HELPER.format(tag="helper of A"))
    _write(tmp_path / "b" / "rel_shared_helper.py", HELPER.format(tag="helper of B"))
    source = HELPER_METRIC.format(helper="rel_shared_helper")
    first = skynet_dspy.load_metric(_write(tmp_path / "a" / "metric.py", source), isolation=isolation)
    second = skynet_dspy.load_metric(_write(tmp_path / "b" / "metric.py", source), isolation=isolation)
    assert _feedback(first, "1") == "helper of A:1"
    assert _feedback(second, "2") == "helper of B:2", "metric B ran metric A's helper module"
    assert _feedback(first, "3") == "helper of A:3"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_reloading_picks_up_a_changed_helper_module(tmp_path, isolation):
    helper = f"helper_{uuid.uuid4().hex[:8]}"
    _write(tmp_path / f"{helper}.py", HELPER.format(tag="old"))
    path = _write(tmp_path / "metric.py", HELPER_METRIC.format(helper=helper))
    assert _feedback(skynet_dspy.load_metric(path, isolation=isolation), "x") == "old:x"
    _write(tmp_path / f"{helper}.py", HELPER.format(tag="new"))
    assert _feedback(skynet_dspy.load_metric(path, isolation=isolation), "x") == "new:x"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_file_named_skynet_beside_the_metric_does_not_shadow_the_helpers(tmp_path, isolation):
    _write(tmp_path / "skynet.py", """
        def llm(*args, **kwargs):
            return "the decoy"
        reward = observation = service_cost = llm
    """)
    metric = skynet_dspy.load_metric(_write(tmp_path / "metric.py", """
        from skynet import observation

        def score(input, output, expected=None):
            return 1.0, {"feedback": observation.__module__ + "." + observation.__name__}
    """), isolation=isolation)
    assert _feedback(metric) == "skynet_dspy.skynet.observation"
    import skynet

    assert skynet is skynet_dspy.skynet and skynet_dspy.helpers is skynet_dspy.skynet


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_odd_file_names_and_folders_load(tmp_path, isolation):
    path = _write(tmp_path / "my folder (v2)" / "my metric-v2.final.py", CHANGING.format(value="0.5"))
    assert _feedback(skynet_dspy.load_metric(path, isolation=isolation)) == "version 0.5"
    assert _feedback(skynet_dspy.load_metric(str(path), isolation=isolation)) == "version 0.5"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_failed_load_leaves_no_module_or_path_behind(tmp_path, isolation):
    path = _write(tmp_path / "metric.py", """
        GLOBAL = 1
        raise RuntimeError("broken at import")
    """)
    modules, path_before = set(sys.modules), list(sys.path)
    with pytest.raises(skynet_dspy.MetricLoadError, match="broken at import"):
        skynet_dspy.load_metric(path, isolation=isolation)
    assert set(sys.modules) == modules
    assert sys.path == path_before
