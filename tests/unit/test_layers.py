"""The layout's promises: a DSPy-free core, a light `import skynet_dspy`, a small public surface."""

from __future__ import annotations

import subprocess
import sys

import skynet_dspy


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_core_imports_neither_dspy_nor_litellm():
    done = _python(
        "import skynet_dspy._core, skynet_dspy._core.scorer, skynet_dspy._core.isolation.worker, sys\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('dspy', 'litellm', 'gepa'))\n"
        "assert not heavy, heavy\n"
    )
    assert done.returncode == 0, done.stderr


def test_importing_the_package_loads_no_dspy_until_a_dspy_name_is_used():
    done = _python(
        "import sys, skynet_dspy\n"
        "assert 'dspy' not in sys.modules and 'litellm' not in sys.modules\n"
        "import skynet\n"
        "assert skynet is skynet_dspy.skynet and skynet_dspy.helpers is skynet\n"
        "skynet_dspy.load_metric\n"
        "assert 'dspy' in sys.modules\n"
    )
    assert done.returncode == 0, done.stderr


def test_metric_worker_processes_run_without_dspy_or_litellm(tmp_path):
    path = tmp_path / "metric.py"
    path.write_text(
        "import sys\n"
        "def score(input, output, expected=None):\n"
        "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('dspy', 'litellm', 'gepa'))\n"
        "    return 1.0, {'feedback': 'ok', 'heavy': heavy}\n"
    )
    with skynet_dspy.load_metric(path) as metric:
        result = metric.score({"q": 1}, "a", {"a": "a"})
    assert result.ok, result.detail
    assert result.extra["heavy"] == []


def test_every_public_name_resolves_and_dir_lists_them():
    names = set(dir(skynet_dspy))
    for name in skynet_dspy.__all__:
        assert name in names, name
        assert getattr(skynet_dspy, name) is not None
    errors = [getattr(skynet_dspy, name) for name in skynet_dspy.__all__ if name.endswith(("Error", "Violation"))]
    assert errors and all(issubclass(error, skynet_dspy.SkynetDspyError) for error in errors)
    assert issubclass(skynet_dspy.ModelNotConfigured, skynet_dspy.SkynetDspyError)
    assert issubclass(skynet_dspy.ContractViolation, ValueError)


def test_failure_kinds_compare_equal_to_their_strings():
    assert skynet_dspy.Failure.TIMEOUT == "timeout"
    assert {str(kind) for kind in skynet_dspy.Failure} >= {"exception", "timeout", "invalid", "missing_field"}
