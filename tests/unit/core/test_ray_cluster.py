"""isolation="ray": metric calls on a real local Ray, with the promises of local worker processes.

One Ray per test run: the tests that need Ray share a session fixture and the xdist group "ray" (make test
runs pytest with --dist loadgroup, so they run in one xdist worker). The package's own local Ray, two
simulated nodes (ray.cluster_utils.Cluster) each run in a subprocess of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import Failure
from skynet_dspy._core.isolation.ray_cluster import RayCluster, check_runtime_env

ROOT = Path(__file__).resolve().parents[3]
CANARY = "sk-canary-ray-0123456789abcdefXYZ"

ENV_METRIC = """
import os
def score(input, output, expected=None):
    values = "\\0".join(os.environ.values())
    return 1.0, {"feedback": "ok", "env": sorted(os.environ), "canary_seen": "sk-canary" in values,
                 "pid": os.getpid(), "parent": os.getppid()}
"""

HOSTILE_METRIC = """
import os, time
def score(input, output, expected=None):
    case = input["case"]
    if case == "c_loop":
        sum(range(3 * 10**9))  # one C-level call holding the GIL: no signal handler runs inside it
    if case == "os_exit":
        with open(input["log"], "a") as log:
            log.write("called\\n")
        os._exit(3)
    if case == "sleep":
        time.sleep(input["seconds"])
    return 1.0, {"feedback": "fine", "parent": os.getppid()}
"""


@pytest.fixture(scope="session")
def local_ray():
    """A real local Ray for the session (small), started the way a user would: ray.init() in this process.

    A canary key is in the environment while it starts, so Ray's own workers inherit it: the metric must not see it.
    """
    ray = pytest.importorskip("ray")
    os.environ["SKYNET_TEST_RAY_API_KEY"] = CANARY
    try:
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, object_store_memory=80 * 2**20)
    finally:
        del os.environ["SKYNET_TEST_RAY_API_KEY"]
    yield ray
    ray.shutdown()


# -- no Ray needed ------------------------------------------------------------------------------------


def test_a_runtime_env_carrying_a_credential_is_refused():
    for env_vars in ({"OPENAI_API_KEY": "sk-x123456789"}, {"my_token": "t0k-0123456789"}, {"DB_PASSWORD": "hunter2!x"}):
        with pytest.raises(ValueError, match="whose name says it is a credential") as raised:
            RayCluster(runtime_env={"env_vars": env_vars})
        assert not set(env_vars.values()) & set(str(raised.value).split())
    with pytest.raises(ValueError, match=r"runtime_env\['pip'\]\[0\] holds what looks like a credential") as raised:
        check_runtime_env({"pip": ["https://me:hunter2secret@pypi.example.com/simple/pkg"]})
    assert "hunter2secret" not in str(raised.value)
    with pytest.raises(ValueError, match=r"runtime_env\['env_vars'\]\['SETTINGS'\] holds what looks like a credential"):
        RayCluster(runtime_env={"env_vars": {"SETTINGS": "sk-proj-abcdefghijklmnop"}})  # a key under a plain name
    settings = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}  # settings, as for local workers
    RayCluster(runtime_env={"env_vars": settings, "pip": ["numpy"]})
    with pytest.raises(ValueError, match="workers_per_node"):
        RayCluster(workers_per_node=0)
    with pytest.raises(TypeError, match="runtime_env must be a dict"):
        RayCluster(runtime_env=["pip"])  # type: ignore[arg-type]


def test_the_package_imports_ray_only_when_isolation_ray_is_used(tmp_path):
    code = ("import sys, skynet_dspy, skynet_dspy._core.scorer\n"
            f"metric = skynet_dspy.load_metric({str(write_metric(tmp_path, ENV_METRIC))!r})\n"
            "assert metric.score({}, 1).ok and skynet_dspy.RayCluster(workers_per_node=2).workers_per_node == 2\n"
            "assert 'ray' not in sys.modules, 'ray imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_unknown_isolation_names_ray_among_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"'thread', 'ray' or a skynet_dspy.RayCluster"):
        skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC), isolation="cluster")


def test_without_ray_installed_isolation_ray_is_a_clear_error_naming_the_extra(tmp_path):
    metric = write_metric(tmp_path, ENV_METRIC)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["ray"] = None  # as if ray were not installed: `import ray` raises ImportError
        import skynet_dspy
        for isolation in ("ray", skynet_dspy.RayCluster()):
            try:
                skynet_dspy.load_metric({str(metric)!r}, isolation=isolation)
            except skynet_dspy.MissingExtra as exc:
                print(exc)
            else:
                print("loaded")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stderr
    for line in lines:
        assert "isolation='ray' needs ray" in line and "pip install 'skynet-dspy[ray]'" in line


# -- on a local Ray started by the session -------------------------------------------------------------


class Echo(dspy.Module):
    def forward(self, case: str, answer: str) -> dspy.Prediction:
        return dspy.Prediction(label=answer)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_evaluate_with_ray_gives_the_scores_of_the_default(local_ray, tmp_path):
    path = write_metric(tmp_path, """
        def score(input, output, expected=None):
            right = output == expected["label"]
            return (1.0 if right else 0.0), {"feedback": "right" if right else f"wrong: {output}"}
    """)
    devset = [dspy.Example(case=str(i), answer="a" if i % 3 else "b", label="a").with_inputs("case", "answer")
              for i in range(30)]
    scores = {}
    for isolation in ("process", "ray"):
        with skynet_dspy.load_metric(path, isolation=isolation) as metric:
            result = dspy.Evaluate(devset=devset, metric=metric, num_threads=64, display_progress=False)(Echo())
            scores[isolation] = [float(score) for _, _, score in result.results]
            assert metric.stats.get("crashed", 0) == 0
    assert scores["ray"] == scores["process"]
    assert sorted(set(scores["ray"])) == [0.0, 1.0]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_c_level_loop_is_ended_at_its_timeout_and_the_next_call_succeeds(local_ray, tmp_path):
    with skynet_dspy.load_metric(write_metric(tmp_path, HOSTILE_METRIC), isolation="ray", timeout=2) as metric:
        [host] = metric.scorer.executor.host_pids()
        started = time.monotonic()
        stuck = metric.score({"case": "c_loop"}, 1)
        took = time.monotonic() - started
        assert stuck.failure is Failure.TIMEOUT, stuck.detail
        assert took < 15, took  # ended at 2 s (generous bound: a busy 2-core machine)
        after = metric.score({"case": "fine"}, 1)
        assert after.ok and after.score == 1.0
        # the same node host: the actor lived, its worker was replaced (forked by its pool's template, or started by it)
        assert host["host"] in _lineage(after.extra["parent"])
        [host] = metric.scorer.executor.host_pids()
        assert host["host"] in _lineage(after.extra["parent"]) and host["workers"]
    for _ in range(100):  # close() stopped the node host (a Ray actor of the package's) and its workers
        if not any(_alive(pid) for pid in [host["host"], *host["workers"]]):
            break
        time.sleep(0.1)
    assert not [pid for pid in [host["host"], *host["workers"]] if _alive(pid)]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_os_exit_scores_crashed_once_and_is_never_re_run(local_ray, tmp_path):
    log = tmp_path / "calls.log"
    with skynet_dspy.load_metric(write_metric(tmp_path, HOSTILE_METRIC), isolation="ray", timeout=10) as metric:
        crashed = metric.score({"case": "os_exit", "log": str(log)}, 1)
        assert crashed.failure is Failure.CRASHED, crashed.detail
        assert "exited with code 3" in (crashed.detail or "")
        time.sleep(1.0)  # a retry, were there one, would have written again by now
        assert log.read_text().splitlines() == ["called"]
        assert metric.score({"case": "fine"}, 1).ok
        assert metric.stats["crashed"] == 1


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_llm_is_served_by_the_driver_and_no_credential_reaches_the_metric(local_ray, server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    server.responder = lambda request: "PASS: it is Paris."
    judge = {"model": "openai/judge", "api_base": server.url, "api_key": "judge-key-0123456789"}
    metrics = ROOT / "tests" / "metrics"
    with skynet_dspy.load_metric(metrics / "judge.py", isolation="ray", metric_lm=judge) as metric:
        results = []
        threads = [threading.Thread(target=lambda i=i: results.append(
            metric.score({"question": f"Capital of France? ({i})"}, "Paris"))) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [result.score for result in results] == [1.0] * 6, [result.detail for result in results]
        assert metric.judge_usage.requests == 6 == len(server.requests)
        assert all(request.headers.get("authorization") == "Bearer judge-key-0123456789"
                   for request in server.requests)
    with skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC), isolation="ray") as metric:
        seen = metric.score({}, 1)
        assert seen.ok
        assert not seen.extra["canary_seen"]
        assert not [name for name in seen.extra["env"] if name in ("OPENAI_API_KEY", "SKYNET_TEST_RAY_API_KEY")]


JUDGED_METRIC = """
from skynet import llm
def score(input, output, expected=None):
    verdict = str(llm("Answer PASS or FAIL.", input=str(output)))
    return (1.0 if verdict.startswith("PASS") else 0.0), {"feedback": verdict}
"""


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_calls_in_flight_follow_the_callers_threads_up_to_workers_per_node(local_ray, server, tmp_path):
    """dspy.Evaluate(num_threads=8) with a judge-bound metric: 8 calls in flight on a 2-CPU node by default (the
    judge sees 8 requests at once); workers_per_node=2 caps them at 2 per node."""
    lock = threading.Lock()
    at_once = {"now": 0, "most": 0}

    def responder(request):
        with lock:
            at_once["now"] += 1
            at_once["most"] = max(at_once["most"], at_once["now"])
        time.sleep(0.5)
        with lock:
            at_once["now"] -= 1
        return "PASS: fine"

    server.responder = responder
    judge = {"model": "openai/judge", "api_base": server.url, "api_key": "judge-key-0123456789"}
    path = write_metric(tmp_path, JUDGED_METRIC)
    assert local_ray.cluster_resources()["CPU"] == 2 and len(local_ray.nodes()) == 1
    most = {}
    for name, cluster in (("default", RayCluster()), ("capped", RayCluster(workers_per_node=2))):
        at_once["most"] = 0
        devset = [dspy.Example(case=str(i), answer=f"{name} {i}").with_inputs("case", "answer") for i in range(48)]
        with skynet_dspy.load_metric(path, isolation=cluster, metric_lm=judge) as metric:
            result = dspy.Evaluate(devset=devset, metric=metric, num_threads=8, display_progress=False)(Echo())
            assert [float(score) for _, _, score in result.results] == [1.0] * 48
        most[name] = at_once["most"]
    assert most == {"default": 8, "capped": 2}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_gepa_with_ray_gives_the_result_of_the_default(local_ray, server, lm):
    from unit.dspy.test_optimize import BETTER, JUDGE_INSTRUCTIONS, examples, scripted

    server.responder = scripted
    found = {}
    for isolation in ("process", "ray"):
        reflection = dspy.LM("openai/reflector", api_base=server.url, api_key="reflection-key-123", cache=False)
        optimizer = skynet_dspy.gepa(ROOT / "tests" / "metrics" / "judge.py", reflection_lm=reflection,
                                     max_metric_calls=12, num_threads=64, isolation=isolation)
        metric = optimizer.skynet_metric
        program = dspy.Predict("question -> answer")
        with metric, dspy.context(lm=lm):
            before = [metric(example, program(**example.inputs())).score for example in examples()]
            optimized = optimizer.compile(program, trainset=examples(), valset=examples())
            after = [metric(example, optimized(**example.inputs())).score for example in examples()]
            found[isolation] = (before, after, optimized.predictors()[0].signature.instructions, metric.stats)
    assert found["ray"][:3] == found["process"][:3] == ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], BETTER)
    assert found["ray"][3].get("crashed", 0) == 0
    assert any(request.system == JUDGE_INSTRUCTIONS for request in server.requests)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_score_defined_in_a_notebook_travels_by_value(local_ray):
    namespace: dict = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        BONUS = 0.25
        def score(input, output, expected=None):
            return min(1.0, output / 4 + BONUS), {"feedback": "by value"}
    """), namespace)
    with skynet_dspy.load_metric(namespace["score"], isolation=RayCluster(workers_per_node=2)) as metric:
        assert metric.score({}, 2).score == 0.75
        assert metric.isolation == "ray"


# -- in processes of their own: the package's own local Ray, two nodes, the command line --------------------


def _run(code: str, timeout: float = 240, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _lineage(pid: int) -> list[int]:
    """`pid` and its parents, up to the first process."""
    found = []
    while pid > 1:
        found.append(pid)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            break
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


FOLDER_METRIC = """
import os
def score(input, output, expected=None):
    shipped = sorted(os.path.relpath(os.path.join(folder, name), ".") for folder, _, names in os.walk(".")
                     for name in names)
    mark = "sk-" + "canary"  # not the text itself: this file travels in the package searched for it
    holds = [name for name in shipped if mark in open(name, errors="replace").read()]
    values = "\\0".join(os.environ.values())
    return 1.0, {"feedback": "ok", "env": sorted(os.environ), "canary_seen": mark in values,
                 "shipped": shipped, "holding_the_key": holds}
"""


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_local_ray_the_package_starts_is_quiet_keeps_keys_home_and_is_gone_after_close(tmp_path):
    """The user's command line and environment hold a key, and a .env beside metric.py too: it reaches neither the
    nodes nor Ray's job and actor tables nor the uploaded package; nothing is printed; nothing is left."""
    folder = tmp_path / "project"
    folder.mkdir()
    path = write_metric(folder, FOLDER_METRIC)
    (folder / ".env").write_text(f"OPENAI_API_KEY={CANARY}\n")
    (folder / "deploy.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{CANARY}\n")
    (folder / "id_ed25519").write_text(CANARY)
    (folder / "id_helpers.py").write_text("WORD = 'kept'\n")  # code named id_*.py travels
    out = tmp_path / "found.json"
    code = textwrap.dedent(f"""
        import json, os, sys, time
        import ray, skynet_dspy
        from skynet_dspy._core.isolation import ray_session, tree
        MARK = ("sk-" + "canary").encode()  # not the text itself: this command line is searched for it
        assert not ray.is_initialized()
        metric = skynet_dspy.load_metric({str(path)!r}, isolation="ray")
        result = metric.score({{}}, 1)
        [host] = metric.scorer.executor.host_pids()
        with open(f"/proc/{{host['host']}}/environ", "rb") as file:
            host_env = file.read()
        started = tree.marked(ray_session.session.mark())
        folder, helper = ray_session.session.folder, ray_session.session.helper.pid
        # Ray's own records: the job table (the command line it shows as the job's entrypoint, its config and
        # runtime_env) and the actor table (names, runtime_envs), as the GCS holds them; the package uploaded
        from ray._private import state
        from ray.core.generated import gcs_pb2
        from ray.experimental import internal_kv
        jobs = [str(gcs_pb2.JobTableData.FromString(entry)) for entry in
                state.state._connect_and_get_accessor().get_job_table(skip_submission_job_info_field=False,
                                                                      skip_is_running_tasks_field=True)]
        actors = json.dumps(state.actors(), default=str)
        package = internal_kv._internal_kv_get(metric.scorer.executor.runtime_env["working_dir"]) or b""
        metric.close()
        connected_after = ray.is_initialized()
        try:
            metric.score({{}}, 1)
            again = "scored"
        except skynet_dspy.WorkerError as exc:
            again = str(exc)
        time.sleep(2)
        with open({str(out)!r}, "w") as file:
            json.dump({{"ok": result.ok, "canary": result.extra["canary_seen"], "env": result.extra["env"],
                       "shipped": result.extra["shipped"], "holding_the_key": result.extra["holding_the_key"],
                       "host_env_has_canary": MARK in host_env, "host": host["host"],
                       "workers": host["workers"], "started": started, "connected_after": connected_after,
                       "again": again, "initialized_later": ray.is_initialized(), "folder": folder,
                       "pids": [os.getpid(), helper],
                       "jobs": jobs, "actors": actors, "package_size": len(package),
                       "package_has_key": MARK in package, "argv": sys.argv,
                       "left": [pid for pid in started + host["workers"] if os.path.exists(f"/proc/{{pid}}")]}}, file)
    """)
    command = [sys.executable, "-c", code, "--api-key", CANARY, f"--token={CANARY}", "--max-tokens", "4096"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "OPENAI_API_KEY": CANARY, "SKYNET_TEST_RAY_API_KEY": CANARY})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (done.stdout, done.stderr) == ("", "")  # nothing from Ray on the user's terminal
    found = json.loads(out.read_text())
    assert CANARY in found["argv"]  # the key was on the command line...
    assert [job for job in found["jobs"] if "--api-key *** --token=*** --max-tokens 4096" in job]  # masked, once
    assert not [job for job in found["jobs"] if "sk-canary" in job] and "sk-canary" not in found["actors"]
    assert found["ok"] and not found["canary"] and "OPENAI_API_KEY" not in found["env"]
    assert "metric.py" in found["shipped"] and "id_helpers.py" in found["shipped"]
    assert not {".env", "deploy.pem", "id_ed25519"} & set(found["shipped"]) and found["holding_the_key"] == []
    assert found["package_size"] > 0 and not found["package_has_key"]
    assert not found["host_env_has_canary"]  # the node host, a Ray worker, was started without the keys
    assert found["host"] in found["started"] and len(found["started"]) >= 4  # GCS, raylet, workers, the host...
    assert not found["connected_after"] and not found["initialized_later"]  # nothing restarted Ray
    assert "closed" in found["again"]
    assert found["left"] == []
    assert not [pid for pid in found["started"] + found["workers"] if _alive(pid)]
    assert not os.path.exists(found["folder"])  # the local Ray's folder (its session folder) is gone
    left = os.listdir("/tmp/ray") if os.path.isdir("/tmp/ray") else []  # Ray's default folder: nothing of ours
    assert not [name for name in left if name.rpartition("_")[2] in map(str, found["pids"])]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_two_nodes_share_the_calls_and_a_lost_node_scores_its_call_crashed(tmp_path):
    path = write_metric(tmp_path, HOSTILE_METRIC)
    found = _run(f"""
        import json, threading, time
        import ray, skynet_dspy
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1, "include_dashboard": False}})
        doomed = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        metric = skynet_dspy.load_metric({str(path)!r}, isolation=skynet_dspy.RayCluster(workers_per_node=1),
                                         timeout=30)
        hosts = metric.scorer.executor.host_pids()
        results = {{}}
        def call(name, seconds):
            results[name] = metric.score({{"case": "sleep", "seconds": seconds}}, 1)
        threads = [threading.Thread(target=call, args=(name, 6)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        time.sleep(3)
        cluster.remove_node(doomed)
        started = time.monotonic()
        for thread in threads:
            thread.join()
        after = [metric.score({{"case": "fine"}}, 1) for _ in range(4)]
        out = {{
            "hosts": len(hosts), "nodes": len({{host["node"] for host in hosts}}),
            "failures": sorted(str(r.failure) for r in results.values()),
            "details": [r.detail for r in results.values()],
            "parents": sorted({{r.extra.get("parent") for r in results.values() if r.ok}}),
            "after": [r.ok for r in after], "crashed": metric.stats.get("crashed", 0),
            "waited": time.monotonic() - started,
        }}
        metric.close()
        ray.shutdown()
        cluster.shutdown()
        print(json.dumps(out))
    """, timeout=300)
    assert found["hosts"] == 2 and found["nodes"] == 2  # a host on each node
    assert found["failures"] == ["None", "crashed"], found["details"]  # one call per node; the lost one crashed
    assert any("lost" in (detail or "") for detail in found["details"]), found["details"]
    assert found["after"] == [True] * 4  # the run goes on, on the node left
    assert found["crashed"] == 1


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_the_command_line_scores_on_ray(local_ray, tmp_path, capsys):
    from skynet_dspy._cli import main

    path = write_metric(tmp_path, """
        def score(input, output, expected=None):
            return (1.0 if output == expected["label"] else 0.0), {"feedback": "checked"}
    """)
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps({"input": {"q": i}, "output": "a", "expected": {"label": "a" if i % 2 else "b"}})
                            + "\n" for i in range(6)))
    out = tmp_path / "rows.jsonl"
    before = _ray_marked()
    assert main(["score", str(path), "--data", str(data), "--out", str(out), "--isolation", "ray"]) == 0
    assert "every call worked" in capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["score"] for row in rows] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert _ray_marked() - before == set()
    assert local_ray.is_initialized()  # the user's Ray was used, and is left connected


def _ray_marked() -> set[int]:
    """Processes of a local Ray the package started (they carry SKYNET_DSPY_WORKER=ray-<token>)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as file:
                    if b"SKYNET_DSPY_WORKER=ray-" in file.read():
                        found.add(int(entry))
            except OSError:
                pass
    return {pid for pid in found if _alive(pid)}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_metric_that_cannot_load_on_the_cluster_is_a_load_error_naming_why(local_ray, tmp_path):
    broken = write_metric(tmp_path, "import no_such_module_anywhere\ndef score(input, output, expected=None):\n"
                          "    return 1.0, {'feedback': 'x'}\n")
    with pytest.raises(skynet_dspy.MetricLoadError, match="on the Ray cluster: .*no_such_module_anywhere"):
        skynet_dspy.load_metric(broken, isolation="ray")
    with pytest.raises(FileNotFoundError, match="metric file not found"):
        skynet_dspy.load_metric(tmp_path / "missing.py", isolation="ray")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(ValueError, match=r"is not inside runtime_env\['working_dir'\]"):
        skynet_dspy.load_metric(write_metric(tmp_path, ENV_METRIC),
                                isolation=RayCluster(runtime_env={"working_dir": str(elsewhere)}))


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_the_metric_folder_travels_with_it_and_a_given_working_dir_is_used(local_ray, tmp_path):
    folder = tmp_path / "project"
    (folder / "metrics").mkdir(parents=True)
    (folder / "metrics" / "helper_words.py").write_text("WORD = 'shipped'\n")
    path = write_metric(folder / "metrics", """
        import os
        from helper_words import WORD
        def score(input, output, expected=None):
            return 1.0, {"feedback": WORD, "cwd": os.getcwd()}
    """)
    for cluster in (RayCluster(), RayCluster(runtime_env={"working_dir": str(folder)})):
        with skynet_dspy.load_metric(path, isolation=cluster) as metric:
            result = metric.score({}, 1)
            assert result.ok and result.feedback == "shipped", result.detail
            assert not result.extra["cwd"].startswith(str(tmp_path))  # it ran on the node's copy of the folder


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_optimize_anything_with_64_workers_scores_on_ray(local_ray, server):
    from unit.test_gepa import HINT, KEY, REFLECTION_MARK, QuietLogger

    namespace: dict = {"__name__": "__main__", "HINT": HINT}  # defined as in a notebook: sent by value
    exec(textwrap.dedent("""
        def ticket_metric(input, output, expected=None):
            right = output == expected["code"]
            return float(right), {"feedback": "Correct." if right else f"Wrong: mention the phrase '{HINT}'."}
    """), namespace)
    ticket_metric = namespace["ticket_metric"]

    tickets = [f"Ticket {word}: the order arrived damaged" for word in ("amber", "basil", "cedar", "dune")]
    codes = {ticket: f"RC-{index:04d}" for index, ticket in enumerate(tickets)}

    def responder(request):
        import re

        if REFLECTION_MARK in request.text:
            current = re.search(r"```\n(.*?)\n```", request.text, re.S).group(1)
            return f"```\n{current} Answer with the {HINT}.\n```"
        ticket = next(ticket for ticket in tickets if ticket in request.text)
        return codes[ticket] if HINT in request.text else "general"

    server.responder = responder

    def run(template, input):
        import litellm

        reply = litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key=KEY,
                                   messages=[{"role": "user", "content": template.format(**input)}])
        return reply.choices[0].message.content.strip()

    data = [skynet_dspy.split_row({"ticket": ticket, "code": codes[ticket]}, inputs=["ticket"], outputs=["code"])
            for ticket in tickets]
    with skynet_dspy.load_metric(ticket_metric, isolation="ray") as metric:
        result = skynet_dspy.optimize_anything(
            "Classify the ticket: {ticket}", run, metric, trainset=data[:2], valset=data[2:],
            reflection_lm=dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False),
            max_metric_calls=16, max_workers=64, logger=QuietLogger(),
        )
        assert result.val_aggregate_scores[0] == 0.0 and max(result.val_aggregate_scores) == 1.0
        assert metric.stats["calls"] >= 4 and metric.stats.get("crashed", 0) == metric.stats.get("exception", 0) == 0


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_package_of_the_users_travels_and_its_functions_import_on_the_nodes(local_ray, tmp_path, monkeypatch):
    package = tmp_path / "src" / "my_metrics_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "words.py").write_text("WORD = 'from my package'\n")
    (package / "scoring.py").write_text(textwrap.dedent("""
        from my_metrics_pkg.words import WORD
        def score(input, output, expected=None):
            return 1.0, {"feedback": WORD}
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    import importlib

    module = importlib.import_module("my_metrics_pkg.scoring")
    try:
        for source in (module, module.score):  # the module by name (py_modules); the function by reference
            with skynet_dspy.load_metric(source, isolation="ray") as metric:
                result = metric.score({}, 1)
                assert result.ok and result.feedback == "from my package", result.detail
    finally:
        for name in [name for name in sys.modules if name.startswith("my_metrics_pkg")]:
            del sys.modules[name]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_an_async_rubric_metric_scores_on_ray_as_its_sync_form_does_in_processes(local_ray, server):
    from unit.test_async_metrics import ANSWERS, fixed_answers, judge_of

    server.responder = fixed_answers
    metrics = ROOT / "tests" / "metrics"
    cases = [({"question": f"What is the capital of {country}?"}, answer) for country, answer in ANSWERS.items()]
    found = {}
    for form, isolation in (("rubric.py", "process"), ("rubric_async.py", "ray")):
        with skynet_dspy.load_metric(metrics / form, isolation=isolation, metric_lm=judge_of(server)) as metric:
            assert metric.info.is_async is (isolation == "ray")
            found[isolation] = [(result.score, result.feedback) for result in
                                (metric.score(question, answer) for question, answer in cases)]
    assert found["ray"] == found["process"]
    assert [score for score, _ in found["ray"]] == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)]
