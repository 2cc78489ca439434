"""sandbox.py: the clear errors of sandbox=True, the bubblewrap command line, its memory limit, a user that is not
root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import WorkerError
from skynet_dspy._core.call import CallRequest
from skynet_dspy._core.isolation.process import ProcessExecutor
from skynet_dspy._core.isolation.sandbox import Sandbox

OK = "def score(input, output, expected=None):\n    return 1.0, {'feedback': 'ok'}\n"


def test_without_bubblewrap_on_path_sandbox_true_is_a_clear_error_at_load_metric(tmp_path, monkeypatch):
    path = write_metric(tmp_path, OK)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(WorkerError, match=r"`bwrap` is not on PATH; install bubblewrap \(Debian/Ubuntu: apt-get "
                                          r"install bubblewrap"):
        skynet_dspy.load_metric(str(path), sandbox=True)


def test_a_bwrap_that_cannot_create_namespaces_is_a_clear_error_naming_user_namespaces(tmp_path, monkeypatch):
    # A bwrap that fails as the real one does where user namespaces are off (its own message, verbatim).
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(WorkerError, match="bubblewrap could not start a sandbox here .*No permissions.*"
                                          "needs user namespaces: enable them"):
        skynet_dspy.load_metric(str(write_metric(tmp_path, OK)), sandbox=True)


@pytest.mark.parametrize("options, error, message", [
    ({"sandbox": True, "isolation": "thread"}, ValueError, "cannot be combined with isolation='thread'"),
    ({"sandbox": True, "isolation": "ray"}, ValueError, "cannot be combined with isolation='ray'.*Ray cluster"),
    ({"sandbox_network": True}, ValueError, "needs sandbox=True"),
    ({"sandbox": "yes"}, TypeError, "True or False"),
])
def test_options_that_cannot_hold_are_clear_errors(tmp_path, options, error, message):
    with pytest.raises(error, match=message):
        skynet_dspy.load_metric(str(write_metric(tmp_path, OK)), **options)


def test_the_command_line_holds_no_environment_and_cuts_the_network_unless_asked(tmp_path):
    env = {"PATH": "/usr/bin", "HOME": "/home/someone", "CANARY": "canary-value"}
    argv, inside_env, cwd = Sandbox(read_only=(str(tmp_path),)).wrap([sys.executable, "-c", "pass"], env, "/nowhere")
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert "canary-value" not in " ".join(argv)  # bwrap gets the environment itself: /proc/<pid>/cmdline is public
    assert inside_env["CANARY"] == "canary-value" and inside_env["HOME"] == "/tmp"
    assert argv[argv.index("--chdir") + 1] == "/tmp" and cwd == "/"  # a folder it cannot see is not its cwd
    assert ["--ro-bind", str(tmp_path), str(tmp_path)] == argv[argv.index(str(tmp_path)) - 1:][:3]
    assert os.path.expanduser("~") not in argv  # never the whole home
    argv, _, _ = Sandbox(network=True).wrap([sys.executable], env, "/")
    assert "--unshare-net" not in argv


def test_the_memory_limit_stops_an_allocation_past_it_and_not_below(tmp_path):
    path = write_metric(tmp_path, "def score(input, output, expected=None):\n"
                                  "    block = bytearray(input['mb'] << 20)\n"
                                  "    return 1.0, {'feedback': str(len(block))}\n")
    sandbox = Sandbox(read_only=(str(tmp_path),), max_memory=600 << 20)
    executor = ProcessExecutor(str(path), 20.0, 1000, 1, launcher=sandbox)
    try:
        small = executor.run(CallRequest(input={"mb": 20}, output="x", expected=None), None)
        big = executor.run(CallRequest(input={"mb": 2000}, output="x", expected=None), None)
    finally:
        executor.close()
    assert small.result is not None and small.result.feedback == str(20 << 20)
    assert big.result is None and big.error_type == "MemoryError", big


NOT_ROOT = """
import subprocess, sys
from skynet_dspy._core.isolation.sandbox import Sandbox
sandbox = Sandbox()
argv, env, cwd = sandbox.wrap([sys.executable, "-c", "import os; print(os.getuid(), os.getpid())"], {}, "/")
print(subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
                    reason="needs root to become another user (setpriv), and a system Python that user can run")
def test_the_same_sandbox_starts_for_a_user_that_is_not_root():
    """Where user namespaces are allowed (user.max_user_namespaces > 0), bwrap needs no privilege: `nobody`,
    with the system's Python (this one may live in root's home), starts the same sandbox."""
    package = str(Path(skynet_dspy.__file__).resolve().parents[1])
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           NOT_ROOT], env={"PATH": os.environ["PATH"], "PYTHONPATH": package}, capture_output=True,
                          text=True, timeout=60, cwd="/")
    assert done.returncode == 0 and done.stdout.split() == ["65534", "2"], done.stderr[-800:]


def test_a_sandboxed_worker_started_on_a_thread_that_ends_lives_on(tmp_path):
    """bwrap's --die-with-parent follows the thread that started it: DSPy's and GEPA's threads come and go."""
    import threading
    import time

    box: dict = {}
    starter = threading.Thread(target=lambda: box.update(metric=skynet_dspy.load_metric(
        str(write_metric(tmp_path, OK)), sandbox=True)))
    starter.start()
    starter.join()
    metric = box["metric"]
    try:
        time.sleep(0.3)
        before = metric.scorer.executor.worker_pids
        assert metric.score({}, "x").failure is None
        assert metric.scorer.executor.worker_pids == before  # the same worker took the call: it was not killed
    finally:
        metric.close()
