"""Loading a metric: a path, a module or a callable; the `skynet` helper module; clear load errors."""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import subprocess
import sys

import pytest
from support import write_metric as write

import skynet_dspy
from skynet_dspy import MetricLoadError, OutsideMetricCall, load_metric
from skynet_dspy._core.loading import load

HELPERS = ("llm", "reward", "observation", "service_cost")


@pytest.mark.parametrize("name", ["exact_match.py", "json_fields.py", "judge.py", "reward_metric.py"])
def test_every_seed_metric_loads(metrics_dir, name):
    metric = load_metric(metrics_dir / name)
    assert metric.info.takes_expected is True
    assert metric.info.name == metric.name == name.removesuffix(".py")  # the file's stem
    assert metric.info.label == str(metrics_dir / name)  # the path as given
    assert (metric.info.reward_spec is not None) == (name == "reward_metric.py")
    loaded = load(metrics_dir / name)  # the same facts when loaded in this process
    assert loaded.info() == metric.info


def test_the_seed_metrics_score_plain_values(metrics_dir):
    exact = load_metric(metrics_dir / "exact_match.py")
    assert exact.score({"q": 1}, "a", {"label": "a"}).score == 1.0
    wrong = exact.score({"q": 1}, "b", {"label": "a"})
    assert wrong.score == 0.0 and wrong.feedback == "Expected 'a', got 'b'."

    fields = load_metric(metrics_dir / "json_fields.py").score({}, '{"a": 1}', {"fields": ["a", "b"]})
    assert fields.score == 0.75 and fields.scores == {"format": 1.0, "fields": 0.5}
    assert fields.feedback == "Missing fields: b."


def test_skynet_helpers_import_inside_a_metric_file(tmp_path):
    path = write(tmp_path, """
        from skynet import llm, reward, observation, service_cost
        import skynet

        NAMES = (llm, reward, observation, service_cost, skynet)

        def score(input, output, expected=None):
            return 1.0, {"feedback": "ok"}
        """)
    module = load(path).module
    llm, reward, observation, service_cost, skynet = module.NAMES
    assert skynet is skynet_dspy.helpers
    assert (llm, reward, observation, service_cost) == tuple(getattr(skynet_dspy.helpers, n) for n in HELPERS)


def test_skynet_helpers_import_inside_a_metric_file_in_its_worker_process(tmp_path):
    path = write(tmp_path, """
        import os
        import sys
        from skynet import llm, reward, observation, service_cost
        import skynet

        def score(input, output, expected=None):
            same = skynet is sys.modules["skynet_dspy.skynet"] and reward is skynet.reward
            light = "dspy" not in sys.modules and "litellm" not in sys.modules
            return 1.0, {"feedback": f"{same} {light}", "pid": os.getpid()}
        """)
    with load_metric(path) as metric:  # isolation="process", the default
        result = metric.score({}, "x")
    assert result.ok and result.feedback == "True True"
    assert result.extra["pid"] != os.getpid()


def test_skynet_imports_after_import_skynet_dspy_as_in_a_notebook():
    code = (
        "import sys\n"
        "import skynet_dspy\n"
        "from skynet import llm, reward, observation, service_cost\n"
        "import skynet\n"
        "assert skynet is skynet_dspy.helpers\n"
        "try:\n"
        "    observation()\n"
        "except RuntimeError as exc:\n"
        "    print('outside:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "outside: skynet.observation() was called outside a metric call" in done.stdout


def test_helpers_called_outside_a_metric_fail_clearly():
    import skynet

    assert issubclass(OutsideMetricCall, RuntimeError)
    with pytest.raises(OutsideMetricCall, match=r"skynet.reward\(\) was called outside a metric call"):
        skynet.reward({}, 1.0, "x")
    with pytest.raises(OutsideMetricCall, match=r"skynet.service_cost\(\) was called outside a metric call"):
        skynet.service_cost()


def test_llm_without_a_model_says_how_to_set_one(tmp_path, caplog):
    path = write(tmp_path, """
        from skynet import llm

        def score(input, output, expected=None):
            return 1.0, {"feedback": llm("Say hi")}
        """)
    with caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        result = load_metric(path, timeout=30).score({}, "x", None)
    assert result.failure == skynet_dspy.Failure.JUDGE_NOT_CONFIGURED == "judge_not_configured"
    assert "judge model is not configured" in result.feedback  # what an optimizer sees: a setup problem
    assert "ModelNotConfigured" in result.detail  # the full story is the user's
    assert "metric_lm" in result.detail and "reflection_lm" in result.detail
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert errors and "judge_not_configured" in errors[0].getMessage()  # logged as an error at once
    assert "metric_lm" in errors[0].getMessage()


def test_two_metric_files_do_not_share_globals(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write(tmp_path / "a", """
        LABEL = "first"
        def score(input, output, expected=None):
            return 1.0, {"feedback": LABEL}
        """)
    second = write(tmp_path / "b", """
        LABEL = "second"
        def score(input, output, expected=None):
            return 0.0, {"feedback": LABEL}
        """)
    a, b = load(first), load(second)
    assert a.module is not b.module and a.module.__name__ != b.module.__name__
    assert a.score({}, "x") == (1.0, {"feedback": "first"})
    assert b.score({}, "x") == (0.0, {"feedback": "second"})
    a.module.LABEL = "changed"
    assert b.score({}, "x") == (0.0, {"feedback": "second"})


def test_the_same_file_loaded_twice_gives_separate_modules(tmp_path):
    path = write(tmp_path, """
        CALLS = []
        def score(input, output, expected=None):
            CALLS.append(output)
            return float(len(CALLS)), {"feedback": "n"}
        """)
    one, two = load(path), load(path)
    one.score({}, "a")
    one.score({}, "b")
    assert two.score({}, "c")[0] == 1.0
    assert one.module.CALLS == ["a", "b"] and two.module.CALLS == ["c"]


def test_reloading_a_changed_file_picks_up_the_change(tmp_path, monkeypatch):
    # The import system's bytecode cache keys on whole-second mtimes and the size: an edit of the same
    # length within the same second would run the stale copy. Writing bytecode is on, as for most users.
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    body = 'def score(input, output, expected=None):\n    return {}, {{"feedback": "{}"}}\n'
    path = tmp_path / "metric.py"
    path.write_text(body.format("1.0", "one"))
    before = load_metric(path)
    stat = path.stat()
    path.write_text(body.format("0.0", "two"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    after = load_metric(path)
    assert before.score({}, "x").feedback == "one"
    assert after.score({}, "x").feedback == "two" and after.score({}, "x").score == 0.0
    assert not (tmp_path / "__pycache__").exists()


def test_a_metric_can_import_a_module_beside_it(tmp_path):
    write(tmp_path, "def normalise(text):\n    return text.strip().lower()\n", name="metric_tools_b7.py")
    path = write(tmp_path, """
        from metric_tools_b7 import normalise

        def score(input, output, expected=None):
            ok = normalise(output) == normalise(expected["label"])
            return float(ok), {"feedback": "ok" if ok else "no"}
        """)
    assert load_metric(path).score({}, " Yes ", {"label": "yes"}).score == 1.0
    assert str(tmp_path) not in sys.path  # the folder is on sys.path only while the file runs


def test_load_accepts_a_module_and_a_callable(tmp_path):
    write(tmp_path, """
        REWARD_SPEC = {"weights": {"accuracy": 1, "speed": 0, "cost": 0},
                       "speed": {"reference": 1000}, "cost": {"reference": 0.01}}
        def score(input, output):
            return 1.0, {"feedback": "ok"}
        """, name="metric_as_module_q3.py")
    # While the folder is on sys.path (a worker process imports the module by name, with this import path)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("metric_as_module_q3")
        from_module = load(module)
        assert from_module.score is module.score and from_module.takes_expected is False
        assert from_module.reward_spec is module.REWARD_SPEC

        from_callable = load(module.score)
        assert from_callable.name == "score" and from_callable.reward_spec is module.REWARD_SPEC
        with load_metric(module.score) as by_function, load_metric(module) as by_module:
            assert by_function.score({}, "x").score == 1.0 and by_function.info.reward_spec == module.REWARD_SPEC
            assert by_module.score({}, "x").score == 1.0 and by_module.info.takes_expected is False
            assert by_module.info.reward_spec == module.REWARD_SPEC
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("metric_as_module_q3", None)
    thread = load_metric(module.score, isolation="thread")  # in this process, the import path no longer matters
    assert thread.score({}, "x").score == 1.0


def test_signature_detection():
    def two(input, output):
        return 1.0, {"feedback": "2"}

    def three(input, output, expected):
        return 1.0, {"feedback": "3"}

    def defaulted(input, output, expected=None):
        return 1.0, {"feedback": "3"}

    def star(*args):
        return 1.0, {"feedback": str(len(args))}

    def two_and_star(input, output, *rest):
        return 1.0, {"feedback": str(len(rest))}

    def optional_keywords(input, output, *, strict=False):
        return 1.0, {"feedback": str(strict)}

    class Scorer:
        def __call__(self, input, output):
            return 1.0, {"feedback": "object"}

        def method(self, input, output, expected):
            return 1.0, {"feedback": "method"}

    expectations = {
        two: False, three: True, defaulted: True, star: True, two_and_star: True, optional_keywords: False,
        Scorer(): False, Scorer().method: True, functools.partial(three, {"fixed": 1}): False,
    }
    for fn, takes_expected in expectations.items():
        assert load(fn).takes_expected is takes_expected, fn
    assert load_metric(star).score({}, "x", {"label": "x"}).feedback == "3"
    assert load_metric(two).score({}, "x", {"label": "x"}).feedback == "2"


@pytest.mark.parametrize(
    ("params", "count"),
    [("input", "1 parameter"), ("a, b, c, d", "4 parameters"), ("", "0 parameters"),
     ("input, output, expected, extra=None", "4 parameters")],
)
def test_wrong_parameter_counts_fail_at_metric_signature(tmp_path, params, count):
    path = write(tmp_path, f"def score({params}):\n    return 1.0, {{'feedback': 'x'}}\n")
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    assert caught.value.item == "Metric signature"
    message = str(caught.value)
    assert str(path) in message and f"score({params}) takes {count}" in message
    assert "two, (input, output), or three, (input, output, expected)" in message


def test_a_required_keyword_only_parameter_fails_at_metric_signature():
    def score(input, output, *, mode):
        return 1.0, {"feedback": "x"}

    with pytest.raises(MetricLoadError, match="needs keyword-only argument") as caught:
        load(score)
    assert caught.value.item == "Metric signature" and "mode" in str(caught.value)


def test_a_keyword_only_expected_fails_at_metric_signature():
    def score(input, output, *, expected=None):
        return 1.0, {"feedback": "x"}

    with pytest.raises(MetricLoadError, match="`expected` as keyword-only") as caught:
        load(score)
    assert caught.value.item == "Metric signature"
    assert "def score(input, output, expected=None)" in str(caught.value)


def test_a_misspelt_module_beside_the_metric_is_blamed_on_the_metric_not_on_skynet_dspy(tmp_path):
    (tmp_path / "helpers_beside.py").write_text("X = 1\n")
    path = write(tmp_path, "import helpers_besdie\n" + "def score(input, output):\n    return 1.0, {'feedback': 'x'}\n")
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert "line 1" in message and "helpers_besdie" in message and "_loading.py" not in message
    assert "check its name" in message


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            return (1.0, {"feedback": "x"}
        """)
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert caught.value.item == "Metric loads"
    assert message.startswith(f"{path}, line 3: syntax error: ")
    assert "was never closed" in message and 'return (1.0, {"feedback": "x"}' in message
    # no chained SyntaxError traceback on top of the clear message
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__ or caught.value.__context__ is None
    with pytest.raises(MetricLoadError) as in_process:
        load(path)
    assert str(in_process.value) == message
    assert in_process.value.__cause__ is None and in_process.value.__suppress_context__


def test_an_indentation_error_is_a_syntax_error_with_its_line(tmp_path):
    path = tmp_path / "metric.py"
    path.write_text("def score(input, output):\nreturn 1.0, {'feedback': 'x'}\n")
    with pytest.raises(MetricLoadError, match=r"metric.py, line 2: syntax error: expected an indented block"):
        load_metric(path)


def test_an_exception_at_import_names_the_file_line_and_exception(tmp_path):
    path = write(tmp_path, """
        import json

        TABLE = json.loads("{not json")

        def score(input, output, expected=None):
            return 1.0, {"feedback": "x"}
        """)
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line 4 (`TABLE = json.loads(\"{{not json\")`): importing the file raised ")
    assert "JSONDecodeError" in message
    assert "Fix the module-level code" in message


def test_an_exit_at_import_is_a_load_error_not_an_exit(tmp_path):
    path = write(tmp_path, "import sys\nsys.exit(3)\n")
    with pytest.raises(MetricLoadError, match=r"line 2 \(`sys.exit\(3\)`\): importing the file called exit \(3\)"):
        load_metric(path)


def test_a_missing_package_says_to_install_it(tmp_path):
    path = write(tmp_path, "import package_that_is_not_installed_x9\n")
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert "line 1" in message and "No module named 'package_that_is_not_installed_x9'" in message
    assert "install it into this Python environment" in message and sys.executable in message


def test_a_wrong_skynet_name_lists_what_skynet_provides(tmp_path):
    path = write(tmp_path, "from skynet import judge\n")
    with pytest.raises(MetricLoadError, match="provides llm, reward, observation and service_cost"):
        load_metric(path)


def test_a_syntax_error_in_an_imported_sibling_names_that_file(tmp_path):
    write(tmp_path, "def broken(:\n", name="broken_sibling_k2.py")
    path = write(tmp_path, "import broken_sibling_k2\n")
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert f"{path}, line 1" in message and "broken_sibling_k2.py, line 1" in message


def test_no_score_function_says_what_to_add_and_what_was_found(tmp_path):
    path = write(tmp_path, """
        def scorer(input, output):
            return 1.0, {"feedback": "x"}
        """)
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert caught.value.item == "Metric loads"
    assert f"{path} defines no function named `score` (it defines scorer)" in message
    assert "def score(input, output, expected=None):" in message


def test_score_that_is_not_callable(tmp_path):
    path = write(tmp_path, "score = 0.5\n")
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    assert f"{path}: `score` is a float, not a function" in str(caught.value)
    assert caught.value.item == "Metric loads"


def test_a_missing_file_and_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="metric file not found: .*nope.py"):
        load_metric(tmp_path / "nope.py")
    with pytest.raises(MetricLoadError, match="is a folder; give the path of the metric file"):
        load_metric(tmp_path)


def test_null_bytes_are_a_clear_load_error(tmp_path):
    path = tmp_path / "metric.py"
    path.write_bytes(b"def score(i, o):\x00\n")
    with pytest.raises(MetricLoadError, match=str(path)):
        load_metric(path)


def test_a_source_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="takes a path to metric.py, an imported module, or a score function"):
        load_metric(42)


def test_timeout_option_default_and_bounds(tmp_path, metrics_dir):
    path = metrics_dir / "exact_match.py"
    assert load_metric(path).timeout == 60.0
    assert load_metric(path, timeout=600).timeout == 600.0
    assert load_metric(path, timeout=0.5).timeout == 0.5
    for bad in (0, -1, 600.5, math.nan, math.inf, "10"):
        with pytest.raises(ValueError, match=r"timeout must be a number of seconds in \(0, 600\]"):
            load_metric(path, timeout=bad)


def test_tracebacks_show_the_loaded_version_of_the_file(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            raise ValueError("first version")
        """)
    loaded = load(path)
    path.write_text("# edited after loading\n" * 5)
    with pytest.raises(ValueError) as caught:
        loaded.score({}, "x")
    assert 'raise ValueError("first version")' in "".join(caught.traceback[-1].statement.lines)


def test_modules_beside_the_metric_import_in_every_form(tmp_path):
    write(tmp_path, "from words_f4 import clean\n\ndef same(a, b):\n    return clean(a) == clean(b)\n",
          name="compare_f4.py")
    write(tmp_path, "def clean(text):\n    return text.strip().lower()\n", name="words_f4.py")
    (tmp_path / "pkg_f4").mkdir()
    write(tmp_path / "pkg_f4", "from .inner import TAG\n", name="__init__.py")
    write(tmp_path / "pkg_f4", "TAG = 'inner'\n", name="inner.py")
    path = write(tmp_path, """
        import compare_f4
        import pkg_f4.inner
        from pkg_f4 import TAG
        from . import words_f4

        def score(input, output, expected=None):
            import compare_f4 as again   # an import inside score, at call time
            ok = again.same(output, expected["label"])
            return float(ok), {"feedback": f"{pkg_f4.inner.TAG} {TAG} {words_f4.clean(' X ')}"}
        """)
    metric = load_metric(path)
    result = metric.score({}, " Yes", {"label": "yes"})
    assert result.ok and result.score == 1.0 and result.feedback == "inner inner x"
    assert "compare_f4" not in sys.modules and "pkg_f4" not in sys.modules  # private to this metric
    assert str(tmp_path) not in sys.path


def test_a_standard_library_name_beside_the_metric_does_not_shadow_it(tmp_path):
    write(tmp_path, "def loads(text):\n    return 'the decoy'\n", name="json.py")
    path = write(tmp_path, """
        import json

        def score(input, output, expected=None):
            return 1.0, {"feedback": str(json.loads('[1]'))}
        """)
    assert load_metric(path).score({}, "x").feedback == "[1]"


def test_an_exception_in_a_helper_at_import_names_both_files(tmp_path):
    write(tmp_path, "SETTINGS = {}\nLIMIT = SETTINGS['limit']\n", name="settings_r8.py")
    path = write(tmp_path, "import settings_r8\n")
    with pytest.raises(MetricLoadError) as caught:
        load_metric(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line 1 (`import settings_r8`): importing the file raised KeyError: 'limit'")
    assert f"(in {tmp_path / 'settings_r8.py'}, line 2)" in message
    assert not [name for name in sys.modules if "settings_r8" in name]  # the failed load left nothing behind


def test_a_module_loaded_from_a_path_is_a_source_in_worker_processes_too(tmp_path):
    """A module imported by path (not importable by name in a fresh interpreter) is sent by its file."""
    import importlib.util

    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "ticket_metric.py").write_text(
        "def score(input, output, expected=None):\n    return 0.5, {'feedback': 'from the file'}\n"
    )
    spec = importlib.util.spec_from_file_location("ticket_metric", folder / "ticket_metric.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with skynet_dspy.load_metric(module) as metric:
        result = metric.score({}, "x")
    assert result.ok and result.feedback == "from the file", result.detail
