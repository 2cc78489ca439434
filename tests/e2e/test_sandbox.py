"""sandbox=True end to end, with real bubblewrap: what a sandboxed metric cannot reach, what still works, and
plain GEPA's run() in (sandboxed) workers under an optimizer.

The same-user holes of the unsandboxed default (the user's environment, memory, signals, an escaping daemon)
are in test_attacks.py, run both ways.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure

REACHES = '''
import json, os, socket

def score(input, output, expected=None):
    seen = {}
    try:  # a port on the host's loopback, opened by the test
        socket.create_connection(("127.0.0.1", input["port"]), timeout=2).close()
        seen["connected"] = True
    except OSError as exc:
        seen["connected"] = type(exc).__name__
    for name, path in input["writes"].items():
        try:
            with open(path, "w") as file:
                file.write("escaped")
            seen[name] = "written"
        except OSError as exc:
            seen[name] = type(exc).__name__
    with open("/tmp/private.txt", "w") as file:  # its own temporary folder works
        file.write("mine")
    seen["tmp"] = open("/tmp/private.txt").read()
    seen["home"] = sorted(os.listdir(os.path.expanduser("~")))
    home = input["user_home"]
    seen["user_home"] = sorted(os.listdir(home)) if os.path.isdir(home) and home != "/" else []
    return 1.0, {"feedback": json.dumps(seen)}
'''


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    return server


@contextlib.contextmanager
def _accepting(listener: socket.socket) -> Iterator[list[socket.socket]]:
    """Accept connections on `listener` (with a timeout set) while the block runs: the list of those accepted."""
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    try:
        yield accepted
    finally:
        stop.set()
        waiter.join(5)
        with contextlib.suppress(OSError):  # one already waiting in the backlog
            accepted.append(listener.accept()[0])
        listener.close()
        for found in accepted:
            found.close()


@pytest.mark.parametrize("network", [False, True])
def test_a_sandboxed_metric_reaches_no_port_and_writes_nowhere_outside_its_own_tmp(tmp_path, network):
    import json

    listener = _listener()
    token = uuid.uuid4().hex
    outside = tmp_path.parent / f"escape-{token}.txt"  # beside the metric's folder, on the host's /tmp
    writes = {
        "metric_folder": str(tmp_path / f"planted-{token}.py"),
        "beside": str(outside),
        "host_tmp": f"/tmp/escape-{token}.txt",
        "cwd": str(Path.cwd() / f"escape-{token}.txt"),
        "usr": f"/usr/escape-{token}.txt",
    }
    path = write_metric(tmp_path, REACHES)
    home = os.path.expanduser("~")
    port = listener.getsockname()[1]
    with _accepting(listener) as accepted, skynet_dspy.load_metric(
        str(path), sandbox=True, sandbox_network=network, timeout=20
    ) as metric:
        result = metric.score({"port": port, "writes": writes, "user_home": home}, "x")
    assert result.failure is None, result.detail
    seen = json.loads(result.feedback)
    if network:  # sandbox_network=True: the host's network, loopback included
        assert seen["connected"] is True and accepted
    else:
        assert seen["connected"] != True and not accepted, seen  # noqa: E712 - True, or the exception's name
    for name, where in writes.items():
        assert not Path(where).exists(), f"the sandboxed metric wrote {name} on the host: {where}"
    assert seen["metric_folder"] != "written" and seen["usr"] != "written", seen  # read-only where it is bound
    assert seen["tmp"] == "mine" and not Path("/tmp/private.txt").exists()
    assert "private.txt" in seen["home"] and not set(seen["home"]) & set(os.listdir(home))  # HOME: its own /tmp
    needed = {Path(entry).resolve() for entry in [sys.prefix, sys.base_prefix, *sys.path] if entry}
    allowed = {entry.relative_to(home).parts[0] for entry in needed
               if entry.is_relative_to(home) and entry != Path(home)}
    assert set(seen["user_home"]) <= allowed, "the user's home shows more than the interpreter and import path"
    assert len(os.listdir(home)) > len(seen["user_home"]) or not os.listdir(home)


JUDGED = '''
import skynet

def score(input, output, expected=None):
    verdict = skynet.llm("Answer PASS or FAIL.", input=str(output))
    right = float(output == expected["answer"])
    return right, {"feedback": f"{verdict} / {output}", "scores": {"exact": right, "length": len(str(output))}}
'''


def test_llm_works_and_scores_match_the_unsandboxed_run(tmp_path, server):
    server.responder = lambda request: "PASS"
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)
    path = write_metric(tmp_path, JUDGED)
    cases = [({"q": str(n)}, str(n * 2), {"answer": str(n * 2 if n % 2 else n)}) for n in range(6)]
    results = {}
    for sandbox in (False, True):
        with skynet_dspy.load_metric(str(path), metric_lm=lm, judge_cache=False, sandbox=sandbox) as metric:
            results[sandbox] = [metric.score(*case) for case in cases]
    assert all(result.failure is None for result in results[True]), [r.detail for r in results[True]]
    assert [(r.score, r.feedback, r.scores) for r in results[True]] == [
        (r.score, r.feedback, r.scores) for r in results[False]]
    assert results[True][0].feedback.startswith("PASS")
    assert {r.score for r in results[True]} == {0.0, 1.0}


def test_a_metric_given_by_value_from_this_process_runs_sandboxed():
    def score(input, output, expected=None):
        import os

        return float(os.getpid() < 10), {"feedback": f"pid {os.getpid()} under {os.getppid()}"}

    with skynet_dspy.load_metric(score, sandbox=True) as metric:
        result = metric.score({}, "x")
    # its own PID namespace: bubblewrap's init is 1, the template 2 (its reaper 3), the first worker forked from it
    assert result.score == 1.0 and result.feedback.endswith(" under 2"), result


# -- plain GEPA: run() in sandboxed workers ----------------------------------------------------------------

RUN = '''
def run(artifact, input):
    namespace = {}
    exec(artifact, namespace)
    return namespace["solve"](input["x"])
'''
METRIC = '''
def score(input, output, expected=None):
    right = output == expected["y"]
    return float(right), {"feedback": "right" if right else f"expected another value than {output!r}"}
'''
CANDIDATES = {
    "loops": "def solve(x):\n    while True:\n        pass",
    "exits": "import os\ndef solve(x):\n    os._exit(3)",
    "forks": "import os\ndef solve(x):\n    os.fork()\n    return x * 2",
    "sleeps_in_c": "import time\ndef solve(x):\n    time.sleep(10**6)",
    "good": "def solve(x):\n    return x * 2",
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sandbox", [False, True])
def test_plain_gepa_with_run_in_workers_goes_through_loops_exits_and_forks_within_its_budget(tmp_path, sandbox):
    """GEPA proposes candidates that loop, exit, fork and sleep: each scores the failure score, the run goes on,
    and the good one wins."""
    run_path = write_metric(tmp_path, RUN, "run.py")
    metric_path = write_metric(tmp_path, METRIC)
    order = ["loops", "exits", "forks", "sleeps_in_c", "good"]
    proposed = []

    def reflect(prompt: str) -> str:
        name = order[min(len(proposed), len(order) - 1)]
        proposed.append(name)
        return f"```\n{CANDIDATES[name]}\n```"

    data = [{"input": {"x": n}, "expected": {"y": n * 2}} for n in (1, 2)]
    start = time.monotonic()
    result = skynet_dspy.optimize_anything(
        "def solve(x):\n    return x", str(run_path), str(metric_path), trainset=data, reflection_lm=reflect,
        max_metric_calls=24, reflection_minibatch_size=2, run_isolation="process", run_timeout=1.0,
        sandbox=sandbox, timeout=10, parallel=False, merge=False, frontier_type="instance",
    )
    seconds = time.monotonic() - start
    assert set(order[:4]) <= set(proposed), proposed
    assert result.best_candidate == CANDIDATES["good"]
    assert max(result.val_aggregate_scores) == 1.0
    assert seconds < 240, f"the run took {seconds:.0f} s"
    assert run_path.exists() and metric_path.exists()


def test_make_evaluator_scores_each_way_a_run_can_fail_and_then_a_good_one(tmp_path):
    run_path = write_metric(tmp_path, RUN, "run.py")
    metric_path = write_metric(tmp_path, METRIC)
    example = {"input": {"x": 3}, "expected": {"y": 6}}
    with skynet_dspy.make_evaluator(str(run_path), str(metric_path), run_isolation="process", run_timeout=1.0,
                                    sandbox=True, failure_score=-1.0) as evaluator:
        results = {name: evaluator.evaluate(code, example) for name, code in CANDIDATES.items()}
        deletes = f"import os\ndef solve(x):\n    os.remove({str(run_path)!r})\n    return x * 2"
        results["deletes"] = evaluator.evaluate(deletes, example)
        score, side_info = evaluator(CANDIDATES["good"], example)
    for name in ("loops", "exits", "forks", "sleeps_in_c"):
        assert results[name].failure is Failure.RUN_EXCEPTION and results[name].score == -1.0, (name, results[name])
    assert "did not return within 1 s" in results["loops"].feedback
    assert "os.fork()" in results["forks"].feedback
    assert "ended its process" in results["exits"].feedback
    assert results["deletes"].failure is Failure.RUN_EXCEPTION and run_path.exists()  # a read-only view
    assert "OSError" in results["deletes"].feedback
    assert (score, side_info) == (1.0, {"Inputs": {"x": 3}, "Generated Outputs": 6, "feedback": "right"})
    assert evaluator.workers.worker_pids == []  # closed with the evaluator


def test_run_raising_in_a_worker_gives_the_same_feedback_as_in_this_process(tmp_path):
    metric_path = write_metric(tmp_path, METRIC)

    def run(artifact, input):
        raise ValueError(f"no solve in {artifact!r}")

    example = {"input": {"x": 3}, "expected": {"y": 6}}
    feedbacks = []
    for isolation in ("thread", "process"):
        with skynet_dspy.make_evaluator(run, str(metric_path), run_isolation=isolation) as evaluator:
            feedbacks.append(evaluator("abc", example))
    expected = (0.0, {"Inputs": {"x": 3}, "feedback": "run(artifact, input) raised ValueError: no solve in 'abc'"})
    assert feedbacks[0] == feedbacks[1] == expected


# -- the prefork: one import in a sandboxed template, workers forked from it --------------------------------

PREFORKED = '''
import json, os, time

IMPORTED_IN = os.getpid()

def score(input, output, expected=None):
    time.sleep(input["sleep"])
    return 1.0, {"feedback": json.dumps({"pid": os.getpid(), "parent": os.getppid(), "imported_in": IMPORTED_IN})}
'''


def test_sandboxed_workers_are_forked_from_one_sandboxed_import(tmp_path):
    import json

    path = write_metric(tmp_path, PREFORKED)
    with skynet_dspy.load_metric(str(path), sandbox=True, timeout=60, workers=3) as metric:
        calls = [threading.Thread(target=lambda: seen.append(metric.score({"sleep": 1.0}, "x"))) for _ in range(3)]
        seen: list = []
        for call in calls:
            call.start()
        for call in calls:
            call.join()
        outer = metric.scorer.executor.worker_pids
    assert all(result.failure is None for result in seen), [result.detail for result in seen]
    workers = [json.loads(result.feedback) for result in seen]
    templates = {worker["imported_in"] for worker in workers}
    assert len(templates) == 1 and len(outer) >= 2, (workers, outer)  # imported once, for every worker
    assert all(worker["parent"] == worker["imported_in"] != worker["pid"] for worker in workers), workers
    assert not {worker["pid"] for worker in workers} & set(outer)  # pids of the sandbox's own PID namespace


@pytest.mark.parametrize("start", ["template", "fresh"])
def test_os_exit_in_a_sandboxed_metric_is_reported_with_its_exit_code(tmp_path, monkeypatch, start):
    """Finding 8: os._exit(3) in the sandbox was reported as "killed by SIGKILL" (bubblewrap killed before it
    could pass the worker's status on). Forked from the template, or a fresh interpreter (the template unsafe)."""
    from skynet_dspy._core.isolation.process import START_VARIABLE

    monkeypatch.setenv(START_VARIABLE, start)
    path = write_metric(tmp_path, "import os\n\ndef score(input, output, expected=None):\n    os._exit(3)\n")
    with skynet_dspy.load_metric(str(path), sandbox=True, timeout=30, workers=1) as metric:
        results = [metric.score({}, "x") for _ in range(3)]
    for result in results:
        assert result.failure is Failure.CRASHED and "exited with code 3" in result.detail, result.detail


# -- hardening, as root and as a user that is not: each run in a new process by that user -------------------

SCORE_ONCE = '''
import json, sys
import skynet_dspy

with skynet_dspy.load_metric(sys.argv[1], sandbox=True, timeout=60, workers=1) as metric:
    result = metric.score(json.loads(sys.argv[2]), "x")
print(json.dumps({"failure": str(result.failure) if result.failure else None, "feedback": result.feedback,
                  "detail": result.detail}))
'''
USERS = ["this_user", "unprivileged"]
_UNPRIVILEGED = 65534  # nobody: a root run of the suite runs these again as it


def _reachable_by_others(path: Path) -> bool:
    """Whether every folder on the way to `path` (through links) lets other users in."""
    return all(part.stat().st_mode & 0o001 for part in path.resolve().parents)


def _python_for_others() -> tuple[str, list[str]]:
    """A Python another user can run with this one's packages, and the import path it needs: this Python, or,
    when it lives where others cannot enter (pyenv in root's home), the system's of the same version."""
    import site

    path = [*site.getsitepackages(), str(Path(skynet_dspy.__file__).resolve().parents[1])]
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    for python in (Path(sys.executable), system):
        if python.exists() and all(_reachable_by_others(Path(entry) / "x") for entry in [str(python), *path]):
            return str(python), path
    pytest.skip("neither this Python, its packages nor a system Python of its version can be run by another user "
                "(they are in root's home): run the suite as a user that is not root to check that case")


@pytest.fixture
def shared():
    """A folder every user can read (pytest's own is private to the user running it)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="skynet-sandbox-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _score_as(user: str, folder: Path, metric_body: str, input: dict, *, home: Path | None = None,
              cwd: Path | None = None) -> dict:
    """Score `input` once with metric_body under sandbox=True, in a new Python process run by `user`: what the
    Result says ({"failure", "feedback", "detail"})."""
    import json
    import subprocess

    (folder / "metric").mkdir(mode=0o755, exist_ok=True)
    metric = write_metric(folder / "metric", metric_body)
    script_folder = cwd or folder
    script = script_folder / "score_once.py"
    script.write_text(SCORE_ONCE)
    script.chmod(0o644)
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST")}
    env["HOME"] = str(home or folder)
    popen: dict = {}
    python = sys.executable
    if user == "unprivileged" and os.geteuid() == 0:
        popen = {"user": _UNPRIVILEGED, "group": _UNPRIVILEGED, "extra_groups": []}
        python, path = _python_for_others()
        env["PYTHONPATH"] = os.pathsep.join(path)
    done = subprocess.run([python, str(script), str(metric), json.dumps(input)], cwd=cwd or folder,
                          env=env, capture_output=True, text=True, timeout=300, **popen)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


KERNEL_STATE = '''
import ctypes, json, os

def score(input, output, expected=None):
    seen = {}
    for path in input["paths"]:
        try:
            os.close(os.open(path, os.O_WRONLY))  # opened for writing, nothing written
            seen[path] = "writable"
        except OSError as exc:
            seen[path] = type(exc).__name__
    try:
        os.chmod("/dev/null", 0o666)  # its mode already: as root, the sandbox's uid 0 owns the host's device
        seen["chmod /dev/null"] = "changed"
    except OSError as exc:
        seen["chmod /dev/null"] = type(exc).__name__
    libc = ctypes.CDLL(None, use_errno=True)  # a user namespace inside, whose root would own root's files
    seen["user namespace"] = "made" if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno())
    return 1.0, {"feedback": json.dumps(seen)}
'''


@pytest.mark.parametrize("user", USERS)
def test_nothing_of_the_kernels_state_is_writable_from_the_sandbox(shared, user):
    """Finding 1: run by root, a sandbox could write /proc/sys/kernel/core_pattern (the kernel checks the global
    uid for most kernel.* sysctls), and the kernel would run a file of its choosing as root on the next crash."""
    import json

    paths = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/vm/drop_caches",
             "/proc/sys/fs/binfmt_misc/register", "/proc/sysrq-trigger", "/proc/kcore"]
    said = _score_as(user, shared, KERNEL_STATE, {"paths": paths})
    assert said["failure"] is None, said
    seen = json.loads(said["feedback"])
    assert set(seen) == {*paths, "chmod /dev/null", "user namespace"}
    assert "writable" not in seen.values() and seen["chmod /dev/null"] != "changed", seen
    assert seen["user namespace"] != "made", seen
    assert seen["/proc/sys/kernel/core_pattern"] in ("OSError", "PermissionError"), seen  # there, read-only


READS_HOME = '''
import json, os

def score(input, output, expected=None):
    seen = {}
    for path in input["paths"]:
        try:
            seen[path] = open(path).read()
        except OSError as exc:
            seen[path] = type(exc).__name__
    return 1.0, {"feedback": json.dumps(seen)}
'''


@pytest.mark.parametrize("user", USERS)
def test_a_home_reached_through_a_link_is_not_mounted_when_the_user_starts_in_it(shared, user):
    """Finding 2: $HOME through a symlink, the user's script and current folder in it: its import path names the
    resolved folder, which the unresolved $HOME did not match, so ~/.ssh/id_rsa was readable in the sandbox."""
    import json

    real = shared / "real-home"
    (real / ".ssh").mkdir(parents=True)
    for folder in (real, real / ".ssh"):
        folder.chmod(0o755)
    (real / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    (real / ".ssh" / "id_rsa").chmod(0o644)
    link = shared / "home"
    link.symlink_to(real)
    paths = [str(link / ".ssh" / "id_rsa"), str(real / ".ssh" / "id_rsa")]
    said = _score_as(user, shared, READS_HOME, {"paths": paths}, home=link, cwd=link)
    assert said["failure"] is None, said
    seen = json.loads(said["feedback"])
    assert "PRIVATE KEY" not in seen.values(), seen
    assert set(seen.values()) <= {"FileNotFoundError", "PermissionError"}, seen


CONNECTS = '''
import json, socket

def score(input, output, expected=None):
    try:
        client = socket.socket(socket.AF_UNIX)
        client.settimeout(5)
        client.connect(input["path"])
        client.sendall(b"escaped")
        seen = "connected"
    except OSError as exc:
        seen = type(exc).__name__
    return 1.0, {"feedback": json.dumps(seen)}
'''


@pytest.mark.parametrize("user", USERS)
def test_without_network_a_unix_socket_in_a_readable_folder_cannot_be_reached(shared, user):
    """Finding 3: a listening unix socket file in a folder the sandbox may read (the metric's) was reachable."""
    import json

    (shared / "metric").mkdir(mode=0o755)
    path = shared / "metric" / "service.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    path.chmod(0o777)  # anyone may connect: only the sandbox stands in the way
    listener.listen(4)
    listener.settimeout(0.2)
    with _accepting(listener) as accepted:
        said = _score_as(user, shared, CONNECTS, {"path": str(path)})
    assert said["failure"] is None, said
    assert json.loads(said["feedback"]) != "connected" and not accepted, said


# -- run() in workers: a clean worker per call; a sandbox of its own ----------------------------------------

PATCHES_EXEC = '''
import builtins, sys

_exec = exec

def _right_answers(code, namespace=None, *rest):
    _exec(code, namespace, *rest)
    namespace["solve"] = lambda x: x * 2  # every later candidate "solves" the task

builtins.exec = sys._getframe(1).f_globals["exec"] = _right_answers  # everywhere, and in run()'s module

def solve(x):
    return x * 2
'''


@pytest.mark.parametrize("isolation", ["process", "sandbox"])
def test_what_one_candidate_changes_in_its_worker_never_reaches_the_next(tmp_path, isolation):
    """Finding 7: a candidate patched builtins.exec in the shared run() worker, and a later wrong one scored 1."""
    run_path = write_metric(tmp_path, RUN, "run.py")
    metric_path = write_metric(tmp_path, METRIC)
    example = {"input": {"x": 3}, "expected": {"y": 6}}
    with skynet_dspy.make_evaluator(str(run_path), str(metric_path), run_isolation=isolation,
                                    run_timeout=30) as evaluator:
        patched = evaluator.evaluate(PATCHES_EXEC, example)
        wrong = [evaluator.evaluate("def solve(x):\n    return x + 1", example) for _ in range(3)]
    assert patched.score == 1.0, patched
    assert [result.score for result in wrong] == [0.0, 0.0, 0.0], wrong


KEEPS_LABELS = '''
SEEN = []

def score(input, output, expected=None):
    SEEN.append(dict(expected))  # labels held in the metric worker's memory
    return float(output == expected["y"]), {"feedback": "scored"}
'''
READS_MEMORY = '''
import json, os

def solve(needle):
    looked, found = [], []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        looked.append(pid)
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
                for line in maps:
                    span, perms = line.split()[:2]
                    start, end = (int(value, 16) for value in span.split("-"))
                    if "r" not in perms or end - start > 256 * 2**20:
                        continue
                    try:
                        mem.seek(start)
                        if needle.encode() in mem.read(end - start):
                            found.append(pid)
                            break
                    except (OSError, ValueError, OverflowError):
                        continue
        except OSError:
            continue
    return json.dumps({"looked": looked, "found": found})
'''


def test_sandboxed_run_code_cannot_read_labels_out_of_a_metric_workers_memory(tmp_path):
    """Finding 7: a run() worker read the labels out of a metric worker's memory (/proc/PID/mem, same user).
    run_isolation="sandbox" puts run() in a sandbox of its own: the metric's workers are not in its view."""
    import json

    run_path = write_metric(tmp_path, RUN, "run.py")
    metric_path = write_metric(tmp_path, KEEPS_LABELS)
    label = f"label-{uuid.uuid4().hex}"
    with skynet_dspy.make_evaluator(str(run_path), str(metric_path), run_isolation="sandbox",
                                    run_timeout=60) as evaluator:
        first = evaluator.evaluate("def solve(x):\n    return x", {"input": {"x": "a"}, "expected": {"y": label}})
        _, side_info = evaluator(READS_MEMORY, {"input": {"x": label}, "expected": {"y": "b"}})
        metric_workers = evaluator.metric.scorer.executor.worker_pids
    assert first.failure is None and metric_workers, first
    seen = json.loads(side_info["Generated Outputs"])
    assert seen["looked"] and seen["found"] == [], seen  # it looked at every process it could see


STAYS_LOADED = '''
import os, signal, sys, threading
import skynet_dspy

metric = skynet_dspy.load_metric(sys.argv[1], sandbox=True, workers=1)
print(*metric.scorer.executor.worker_pids, flush=True)
threading.Event().wait()
'''


def _parent(pid: int) -> int | None:
    """The parent of `pid`; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return int(file.read().rpartition(b")")[2].split()[1])
    except OSError:
        return None


def test_a_stopped_sandbox_ends_with_the_users_process(tmp_path):
    """Finding 5, sandboxed: the template, its workers and bubblewrap's own processes, all stopped (SIGSTOP), still
    end when the user's process is killed: bubblewrap's --die-with-parent, and its PID namespace with it."""
    import signal
    import subprocess

    path = write_metric(tmp_path, PREFORKED)
    script = write_metric(tmp_path, STAYS_LOADED, "user.py")
    user = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        worker = int(user.stdout.readline())
        chain = [worker]  # the worker, the template, bubblewrap's init and bubblewrap, up to the user's process
        while (above := _parent(chain[-1])) not in (None, user.pid, 1):
            chain.append(above)
        assert len(chain) >= 3, chain
        for pid in chain:
            os.kill(pid, signal.SIGSTOP)
        user.kill()
        user.wait()
        deadline = time.monotonic() + 60
        while (left := [pid for pid in chain if _parent(pid) is not None]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], "a stopped sandboxed process outlived the user's process"
    finally:
        user.kill()
        user.wait()
