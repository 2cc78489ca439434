"""isolation="ray" across hosts: a Ray cluster whose nodes each have a network namespace (and address) of their own.

The test makes the hosts (tests/netns_support.py: `ip netns`, veth pairs on a bridge, addresses 10.250.0.N, only
those): the Ray head on host 1, nodes on hosts 2 and 3, the driver on host 4 (with the loopback judge on its own
127.0.0.1), and a node that joins mid-run on host 5. One `dspy.Evaluate` run over them sees a node killed
mid-run, a node cut off from the network mid-run and a node joining; a second driver reaches the cluster through
a Ray Client address (ray://) and sees a node killed mid-run. Every call that was in flight on a lost node is
scored `crashed` once (never re-run), within the documented deadline (2 x timeout + 60 s); every other call
scores. It skips, saying why, only where namespaces cannot be made (not root, no iproute2).

The hosts share one file system: each node has a Ray folder of its own, and the driver, which runs no raylet of
its own, uses the head's through it (as a driver on a machine of the cluster uses its own); every other exchange
is over the network. The Ray Client driver needs nothing but the network.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from netns_support import Hosts, unavailable

from skynet_dspy._core.secrets import credential_free_environment

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
HEAD, NODE_A, NODE_B, DRIVER, NODE_C = 1, 2, 3, 4, 5
TIMEOUT = 30.0  # the metric's timeout (generous: a loaded machine); the deadline for a silent node is 2 x 30 + 60 s
DEADLINE = 2 * TIMEOUT + 60

METRIC = """
import os, socket, time
from skynet import llm

LOG, STOP = {log!r}, {stop!r}


def _address():
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.250.0.1", 9))  # no packet is sent: this finds the host's own address
        return probe.getsockname()[0]
    finally:
        probe.close()


def _log(line):
    with open(LOG, "a") as file:
        file.write(line + "\\n")


def score(input, output, expected=None):
    host = _address()
    _log(f"start {{input['case']}} {{host}}")
    verdict = str(llm("Answer PASS or FAIL.", input=f"case {{input['case']}}"))  # served by the driver
    if not os.path.exists(STOP):
        time.sleep(1.0)
    _log(f"end {{input['case']}} {{host}}")
    return (1.0 if verdict.startswith("PASS") else 0.0), {{"feedback": verdict, "host": host}}
"""

DRIVER_CODE = """
import json, sys, threading, time
import dspy, ray, skynet_dspy
from skynet_dspy.devserver import DevServer

config = json.loads(sys.argv[1])
with DevServer(model_name="judge") as server:
    server.responder = lambda request: "PASS: fine"
    judge = {"model": "openai/judge", "api_base": server.url, "api_key": "judge-key-0123456789"}
    address = config["address"]
    if not address.startswith("ray://"):  # the user connects, then waits for the nodes to be up
        ray.init(address=address)
        for _ in range(600):
            if sum(node["Alive"] for node in ray.nodes()) >= config["nodes"]:
                break
            time.sleep(0.5)
        else:
            sys.exit("the nodes did not come up (their logs are below)")
    cluster = skynet_dspy.RayCluster(address=address, workers_per_node=2)
    for attempt in range(3):
        try:
            metric = skynet_dspy.load_metric(config["metric"], isolation=cluster, timeout=config["timeout"],
                                             metric_lm=judge)
            break
        except ConnectionError as exc:  # Ray Client's server for this driver failed to start (a loaded machine)
            print("connecting again:", exc, flush=True)
            time.sleep(5)
    client = ray.util.client.ray.is_connected()
    arrived = {}

    def timed(example, prediction, trace=None):
        score = metric(example, prediction, trace)
        result = score.result
        arrived[example.case] = {"at": time.time(), "failure": str(result.failure), "detail": result.detail,
                                 "score": float(score), "host": result.extra.get("host")}
        return score

    class Echo(dspy.Module):
        def forward(self, case):
            return dspy.Prediction(answer=case)

    devset = [dspy.Example(case=str(i)).with_inputs("case") for i in range(config["examples"])]
    print("evaluating", flush=True)
    dspy.Evaluate(devset=devset, metric=timed, num_threads=config["threads"], display_progress=False)(Echo())
    out = {"arrived": arrived, "stats": dict(metric.stats), "client": client, "judge_calls": len(server.requests)}
    metric.close()
with open(config["out"], "w") as file:
    json.dump(out, file)
"""


@pytest.fixture
def hosts(tmp_path):
    why = unavailable()
    if why is not None:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    logs = tmp_path / "logs"
    logs.mkdir()
    made = Hosts(logs)
    made.folder = tempfile.mkdtemp(prefix="skyray-")  # Ray's sockets live under it: a short path
    try:
        for number in (HEAD, NODE_A, NODE_B, DRIVER, NODE_C):
            made.make(number)
        yield made
    finally:
        made.close()
        shutil.rmtree(made.folder, ignore_errors=True)
        for log in sorted(logs.iterdir()):  # shown when the test fails
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")


def _wait(condition, what: str, driver, seconds: float = 600):
    """Wait for `condition()` while the driver runs (a hang bound, not a speed)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        found = condition()
        if found:
            return found
        assert driver.poll() is None, f"the driver ended (code {driver.returncode}) before {what}"
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


def _calls(log: Path) -> list[tuple[str, str, str]]:
    """(start|end, case, host address) per line of the metric's log."""
    if not log.exists():
        return []
    return [tuple(line.split()) for line in log.read_text().splitlines() if len(line.split()) == 3]  # type: ignore


def _in_flight(log: Path, address: str) -> set[str]:
    calls = _calls(log)
    ended = {case for kind, case, _ in calls if kind == "end"}
    return {case for kind, case, host in calls if kind == "start" and host == address and case not in ended}


def _never_started(arrived: dict[str, dict], calls: list[tuple[str, str, str]]) -> set[str]:
    """The cases whose metric never began: sent to a node that was lost before the call reached `score` (Ray
    cannot tell whether such a call ran, so it scores `crashed` and is not re-run elsewhere)."""
    never = set(arrived) - {case for kind, case, _ in calls if kind == "start"}
    assert all(arrived[case]["failure"] == "crashed" for case in never), never  # no score without a call
    return never


def test_evaluate_across_hosts_survives_a_killed_node_a_partition_and_a_node_joining(hosts, tmp_path):
    token = tmp_path / "ray-token"
    token.write_text(uuid.uuid4().hex)
    env = {**credential_free_environment(), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": str(token),
           # the head declares a node dead after 5 missed health checks of 1 s (the operator's choice; Ray's default
           # is slower): the driver's own deadline (2 x timeout + 60 s) bounds the wait in any case
           "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
           "RAY_health_check_failure_threshold": "5",
           "RAY_agent_register_timeout_ms": "600000"}  # a loaded machine: a node's agents may take minutes to start
    head = hosts.address(HEAD)
    def common(number: int) -> list[str]:
        # the hosts share one file system: each node's folder (its Unix sockets, its logs) is its own
        return ["--block", "--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats",
                f"--node-ip-address={hosts.address(number)}", f"--temp-dir={hosts.folder}/{number}"]

    hosts.start(HEAD, [RAY, "start", "--head", "--port=6379", "--ray-client-server-port=10001",
                       "--include-dashboard=false", *common(HEAD)], "head", env)

    def node(number: int) -> None:
        hosts.start(number, [RAY, "start", f"--address={head}:6379", *common(number)], f"node-{number}", env)

    node(NODE_A)
    node(NODE_B)
    folder = tmp_path / "metric"
    folder.mkdir()
    log, stop = tmp_path / "calls.log", tmp_path / "stop"
    (folder / "metric.py").write_text(textwrap.dedent(METRIC.format(log=str(log), stop=str(stop))))

    def driver(name: str, address: str, nodes: int, examples: int, threads: int):
        config = {"address": address, "nodes": nodes, "metric": str(folder / "metric.py"), "timeout": TIMEOUT,
                  "examples": examples, "threads": threads, "out": str(tmp_path / f"{name}.json")}
        return hosts.start(DRIVER, [sys.executable, "-c", DRIVER_CODE, json.dumps(config)], name, env, cwd=ROOT)

    # -- run 1: the driver connects by address; a node dies, a node is cut off, a node joins ------------------
    run = driver("driver", f"{head}:6379", nodes=3, examples=400, threads=6)
    a, b, c = hosts.address(NODE_A), hosts.address(NODE_B), hosts.address(NODE_C)
    killed = _wait(lambda: _in_flight(log, a), "calls on node A", run)
    hosts.kill(NODE_A)
    cut_off = _wait(lambda: _in_flight(log, b), "calls on node B", run)
    hosts.cut(NODE_B)
    cut_at = time.time()
    node(NODE_C)
    _wait(lambda: sum(1 for kind, _, host in _calls(log) if kind == "end" and host == c) >= 2, "calls on node C", run)
    stop.touch()  # the remaining calls are quick
    assert run.wait(600) == 0, "the driver failed (its log is below)"
    found = json.loads((tmp_path / "driver.json").read_text())
    arrived = found["arrived"]
    calls = _calls(log)

    assert len(arrived) == 400  # every example has a score
    starts = Counter(case for kind, case, _ in calls if kind == "start")
    assert max(starts.values()) == 1  # no call ran twice: a lost node's calls are never re-run
    crashed = {case for case, result in arrived.items() if result["failure"] == "crashed"}
    others = {result["failure"] for case, result in arrived.items() if case not in crashed}
    assert others == {"None"}, [result for result in arrived.values() if result["failure"] not in ("None", "crashed")]
    lost_a = {case for kind, case, host in calls if kind == "start" and host == a} - {
        case for kind, case, host in calls if kind == "end" and host == a}
    on_b = {case for kind, case, host in calls if kind == "start" and host == b}
    assert killed <= lost_a and lost_a <= crashed  # what ran on the killed node scored crashed, once
    assert cut_off <= crashed and crashed <= lost_a | on_b | _never_started(arrived, calls)  # nothing else
    assert found["stats"].get("crashed") == len(crashed)
    for case in crashed & on_b:  # within the documented deadline (plus a generous margin for a loaded machine)
        assert arrived[case]["at"] - cut_at < DEADLINE + 60, arrived[case]
    assert any(result["host"] == c for result in arrived.values())  # the node that joined took calls
    assert any(result["at"] > cut_at and result["host"] == head for result in arrived.values())  # the run went on

    # -- run 2: through a Ray Client address (ray://); a node dies mid-run -------------------------------------
    log.unlink()
    stop.unlink()
    run = driver("client", f"ray://{head}:10001", nodes=2, examples=60, threads=4)
    killed = _wait(lambda: _in_flight(log, c), "calls on node C through ray://", run)
    hosts.kill(NODE_C)
    stop.touch()
    assert run.wait(600) == 0, "the Ray Client driver failed (its log is below)"
    found = json.loads((tmp_path / "client.json").read_text())
    arrived, calls = found["arrived"], _calls(log)
    assert found["client"]  # it went through Ray Client
    assert len(arrived) == 60
    assert max(Counter(case for kind, case, _ in calls if kind == "start").values()) == 1
    crashed = {case for case, result in arrived.items() if result["failure"] == "crashed"}
    on_c = {case for kind, case, host in calls if kind == "start" and host == c}
    assert killed <= crashed and crashed <= on_c | _never_started(arrived, calls)
    assert {result["failure"] for case, result in arrived.items() if case not in crashed} == {"None"}
    assert found["judge_calls"] >= 60 - len(crashed)  # llm() served by the driver's judge, from the nodes
