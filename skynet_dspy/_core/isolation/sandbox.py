"""sandbox=True: the metric's template and workers run inside bubblewrap (`bwrap`), in Linux namespaces of their own:
its own PID namespace, no network unless asked, a read-only view of what Python needs (never a home folder), a
private /tmp, a read-only /proc/sys, no capabilities (even as root), seccomp.py's calls refused. No bwrap or no
namespaces is a clear error when the first worker starts (`Sandbox.start_error`), never an unsandboxed run.
"""

from __future__ import annotations

import os
import platform
import pwd
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import WorkerError
from . import handle, seccomp

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; Arch: "
    "pacman -S bubblewrap) so that `bwrap` is on PATH, or load the metric without sandbox=True"
)
USERNS_HINT = (
    "bubblewrap needs user namespaces: enable them (sysctl user.max_user_namespaces=15000; on Debian before 11 "
    "kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ kernel.apparmor_restrict_unprivileged_userns=0 or an "
    "AppArmor profile allowing bwrap 'userns'); in a Docker container, run it with --security-opt "
    "seccomp=unconfined --security-opt apparmor=unconfined (or --privileged)"
)
# The parts of /etc a Python program needs (libraries, time zone, names of users, certificates): not all of
# /etc, which holds secrets a root user could read (/etc/shadow, ssh host keys).
_ETC = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "zoneinfo", "passwd", "group",
    "nsswitch.conf", "host.conf", "hosts", "gai.conf", "services", "protocols", "mime.types", "ssl",
    "ca-certificates", "pki", "alternatives", "os-release", "fonts", "matplotlibrc",
)
_SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt")


@dataclass(frozen=True)
class Sandbox:
    """How to start a template inside bubblewrap (template.py calls `start`).

    network: keep the host's network (False: a network namespace with only its own loopback).
    read_only: further folders or files the worker may read (the metric's folder; what sys.path names is
        always readable). max_memory: bytes of address space each worker process may map (RLIMIT_AS, set by
        the template before the import: worker.prepare).
    """

    network: bool = False
    read_only: tuple[str, ...] = ()
    max_memory: int | None = None
    bwrap: str = field(default="", compare=False)

    def start(self, argv: list[str], *, env: dict[str, str], cwd: str, **popen: Any) -> subprocess.Popen[bytes]:
        """subprocess.Popen(argv, env=env, cwd=cwd, **popen), inside the sandbox."""
        with seccomp.program() as rules:  # read by bwrap as it starts
            wrapped, inside_env, inside_cwd = self.wrap(argv, env, cwd, rules)
            pass_fds = (*popen.pop("pass_fds", ()), rules)
            return subprocess.Popen(wrapped, env=inside_env, cwd=inside_cwd, pass_fds=pass_fds, **popen)

    def wrap(self, argv: Sequence[str], env: dict[str, str], cwd: str,
             rules: int | None = None) -> tuple[list[str], dict[str, str], str]:
        """(argv, env, cwd) that start `argv` inside the sandbox; the descriptors given to Popen pass through.
        `rules`: a descriptor to read the seccomp program from (seccomp.program()), passed to Popen too."""
        bwrap = self.bwrap or find_bwrap()
        env = {**env, "HOME": "/tmp", "TMPDIR": "/tmp", "TMP": "/tmp", "TEMP": "/tmp"}
        readable = _readable(self.read_only)
        inside_cwd = cwd if any(_under(cwd, path) for path in readable) else "/tmp"
        if self.max_memory is not None:  # set by the template (worker.prepare): bwrap has no option for it
            env[handle.MEMORY_VARIABLE] = str(int(self.max_memory))
        args = [
            # --disable-userns: no user namespace inside, whose root would own (root's) files mapped in it
            "--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        ]
        if not self.network:
            args.append("--unshare-net")
        # bwrap leaves /proc/sys writable (it skips what access() calls read-only, and the folder is): kernel.*
        # sysctls check the global uid, so a root user's sandbox could set kernel.core_pattern without it
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger",
                 "/proc/sysrq-trigger", "--dev", "/dev", "--tmpfs", "/tmp"]
        for path in _SYSTEM:
            if os.path.islink(path):  # /lib -> usr/lib on a merged-/usr system: the same link inside
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for name in _ETC:
            path = f"/etc/{name}"
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        if self.network and os.path.exists("/etc/resolv.conf"):
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        for path in readable:
            args += ["--ro-bind", path, path]
        filters = ["--seccomp", str(rules)] if rules is not None else []
        return [bwrap, *args, *filters, "--chdir", inside_cwd, "--", *argv], env, "/"

    def start_error(self, printed: str | None) -> WorkerError:
        """The error for a template that did not start in the sandbox: bwrap's own message, and what to enable."""
        said = (printed or "").strip()[-600:] or "no message"
        namespaces = any(word in said.lower() for word in ("namespace", "uid map", "permission", "userns"))
        hint = USERNS_HINT if namespaces else "see bwrap's message above"
        return WorkerError(f"sandbox=True: bubblewrap could not start a sandbox here ({said}); {hint}")


def sandbox_for(source: Any, sandbox: bool, network: bool, isolation: str = "process",
                max_memory: int | None = None) -> Sandbox | None:
    """The Sandbox for load_metric's options, or None for sandbox=False."""
    if sandbox not in (True, False) or network not in (True, False):
        raise TypeError(f"sandbox= and sandbox_network= are True or False, got {sandbox!r} and {network!r}")
    if not sandbox:
        if network:
            raise ValueError("sandbox_network=True lets a sandboxed worker use the network; it needs sandbox=True")
        return None
    if isolation != "process":  # score would run in this process, or on a Ray cluster's own nodes
        raise ValueError(
            "sandbox=True runs the metric in sandboxed worker processes on this machine; it cannot be combined "
            f"with isolation={isolation!r}. Drop isolation= or sandbox= (a Ray cluster's nodes are yours to isolate)"
        )
    if not sys.platform.startswith("linux"):
        raise WorkerError(f"sandbox=True needs Linux (bubblewrap and its namespaces); this is {sys.platform}")
    if not seccomp.supported():
        raise WorkerError(f"sandbox=True runs on x86-64 and arm64 (seccomp.py); this is {platform.machine()}")
    return Sandbox(network=network, read_only=folders_of(source), max_memory=max_memory, bwrap=find_bwrap())


def find_bwrap() -> str:
    """The path of `bwrap` on PATH, or a WorkerError saying how to install it."""
    found = shutil.which("bwrap")
    if found is None:
        raise WorkerError(f"sandbox=True runs the metric's workers under bubblewrap, but `bwrap` is not on PATH; "
                          f"{INSTALL_HINT}")
    return found


def folders_of(source: Any) -> tuple[str, ...]:
    """The folder a metric (or run.py) comes from, for a read-only view inside the sandbox."""
    file: Any = None
    if isinstance(source, (str, Path)):
        file = source
    elif isinstance(source, ModuleType):
        file = getattr(source, "__file__", None)
    elif callable(source):
        file = getattr(getattr(source, "__code__", None), "co_filename", None)
    if not file:
        return ()
    folder = os.path.dirname(os.path.realpath(os.fspath(file)))  # through links: the folder the worker reads
    return (folder,) if os.path.isdir(folder) else ()


def _readable(extra: Iterable[str]) -> list[str]:
    """What a worker may read besides the system: the interpreter's folders, the import path's, this package's and
    `extra`, only what exists, each once (not under another)."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable)]
    candidates += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    candidates += [entry or os.getcwd() for entry in sys.path]
    candidates += list(extra)
    candidates.append(str(Path(__file__).resolve().parents[2]))  # this package, wherever it is (an editable install)
    homes = _homes()
    found: list[str] = []
    for path in sorted({os.path.abspath(path) for path in candidates if path}, key=len):
        if os.path.exists(path) and not any(_under(path, kept) for kept in found) and _mountable(path, homes):
            found.append(path)
    return found


def _mountable(path: str, homes: set[str]) -> bool:
    """Whether `path` may be mounted: never "/" nor a whole home, however reached (a notebook started in ~ has it
    on its path), nor what the system folders already give."""
    if any(_under(home, seen) for home in homes for seen in (path, os.path.realpath(path))):
        return False
    return not any(_under(path, system) for system in _SYSTEM if os.path.isdir(system) and not os.path.islink(system))


def _homes() -> set[str]:
    """The user's home folders as named ($HOME, the password database's) and as resolved (through links)."""
    named = {os.path.expanduser("~"), os.environ.get("HOME", "")}
    with suppress(KeyError):
        named.add(pwd.getpwuid(os.geteuid()).pw_dir)
    return {path for home in named if home for path in (os.path.abspath(home), os.path.realpath(home))}


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")

