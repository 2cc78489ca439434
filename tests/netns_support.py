"""Simulated hosts for tests: network namespaces of their own on one bridge, each with its address (10.250.0.N).

`Hosts` makes them (`ip netns`, a veth pair per host, a bridge joining the host ends; root only), runs commands
inside them, cuts a host off the network, kills what runs in one, and removes everything at the end: every
process in its namespaces (killed), the namespaces, the bridge. Only the addresses it gives are used.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

SUBNET = "10.250.0"


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"skyprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Hosts:
    """Hosts numbered 1..254, each a network namespace with the address 10.250.0.<number>."""

    def __init__(self, logs: Path) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.bridge = f"skb{self.tag}"
        self.logs = logs
        self.made: list[int] = []
        self.started: list[subprocess.Popen[bytes]] = []
        self.files: list[IO[bytes]] = []
        self.folder = ""  # a folder of the caller's (Ray's temp dir), removed by it
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")

    def namespace(self, number: int) -> str:
        return f"sky{self.tag}h{number}"

    def veth(self, number: int) -> str:
        return f"skv{self.tag}{number}"  # the host end, on the bridge: at most 15 characters

    @staticmethod
    def address(number: int) -> str:
        return f"{SUBNET}.{number}"

    def make(self, number: int) -> None:
        namespace = self.namespace(number)
        _ip("netns", "add", namespace)
        self.made.append(number)
        _ip("link", "add", self.veth(number), "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", self.veth(number), "master", self.bridge)
        _ip("link", "set", self.veth(number), "up")
        _ip("-n", namespace, "addr", "add", f"{self.address(number)}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")

    def start(self, number: int, command: Sequence[str], name: str, env: dict[str, str],
              **options: Any) -> subprocess.Popen[bytes]:
        """`command` inside host `number`, its output in logs/<name>.log."""
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed at the end
        self.files.append(log)
        process = subprocess.Popen(["ip", "netns", "exec", self.namespace(number), *command], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **options)
        self.started.append(process)
        return process

    def pids(self, number: int) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.namespace(number)], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def kill(self, number: int) -> None:
        """SIGKILL every process of host `number` (a machine that dies), until none is left."""
        for _ in range(50):
            pids = self.pids(number)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def cut(self, number: int) -> None:
        """Host `number` off the network: its cable pulled (its processes run on, unreachable)."""
        _ip("link", "set", self.veth(number), "down")

    def close(self) -> None:
        for number in self.made:
            self.kill(number)
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()
        for number in self.made:
            subprocess.run(["ip", "netns", "del", self.namespace(number)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for file in self.files:
            file.close()
