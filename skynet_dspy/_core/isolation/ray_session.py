"""The package's connection to Ray for isolation="ray", shared by every metric of the process: found, or started.

The Ray to use is the one this process is connected to, else `RayCluster(address=...)`, else RAY_ADDRESS, else a
local Ray already running (`ray start --head` on this machine), else a local Ray the package starts and stops.

A local Ray the package starts runs in a helper process of its own, with a credential-free environment (every
Ray process inherits it), in a temporary folder of its own (deleted at the end, so no session folder is left),
without the dashboard or worker prestarts (a quick start). It is started before the user's process imports
Ray, so the two overlap. The helper stops Ray when its stdin closes: at the last close(), or when the user's
process exits.

Quiet: while the package holds a connection, Ray's log records go to the "skynet_dspy" logger at debug
(errors at warning) instead of Ray's own stderr handler; what the helper prints is logged at debug and shown
only in the error when Ray does not start; workers' output is not streamed to the user's terminal
(`log_to_driver=False`) when the package connects. Keys: the command line Ray records for the job (its
"entrypoint", shown by the dashboard) has every credential-like value masked.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..errors import MissingExtra, WorkerError
from ..logs import logger
from ..secrets import MASK, credential_free_environment, env_credential, redact
from . import tree

START_TIMEOUT = 180.0  # seconds a local Ray started by the package may take to come up
_ADDRESS_LINE = "SKYNET_DSPY_RAY_ADDRESS="
# The helper that starts a local Ray: no dashboard, no worker prestarted (the node hosts get workers of their own,
# with the metric's runtime_env), no usage report. It prints the GCS address, then waits for its stdin to close.
_HELPER = (
    "import sys, ray\n"
    "context = ray.init(include_dashboard=False, configure_logging=False, log_to_driver=False,\n"
    "                   _temp_dir=sys.argv[1], _system_config={'enable_worker_prestart': False})\n"
    f"print({_ADDRESS_LINE!r} + context.address_info['gcs_address'], flush=True)\n"
    "sys.stdin.read()\n"
    "ray.shutdown()\n"
)


def require_ray() -> ModuleType:
    """The ray module, or MissingExtra naming the extra that brings it."""
    try:
        import ray
    except ImportError as exc:
        raise MissingExtra(
            f"isolation='ray' needs Ray, which is not installed ({exc}); it comes with skynet-dspy's [ray] extra: "
            "pip install 'skynet-dspy[ray]'"
        ) from None
    return ray


class _Session:
    """Connects to Ray for the first metric, and disconnects (stopping a local Ray it started) after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.connected_here = False  # ray.init() was called by the package (so ray.shutdown() is ours to call)
        self.helper: subprocess.Popen[str] | None = None  # the process owning a local Ray the package started
        self.token = ""
        self.folder: str | None = None  # the local Ray's temporary folder (its session folders), deleted at the end
        self.output: collections.deque[str] = collections.deque(maxlen=40)  # the helper's last lines, for errors
        self.quieted: list[logging.Handler] = []  # Ray's own stderr handlers, set aside while connected

    def acquire(self, address: str | None) -> ModuleType:
        """The ray module, connected: to the Ray found, or to a local Ray started now."""
        with self.lock:
            loaded = sys.modules.get("ray")
            if self.users == 0 and not (loaded is not None and loaded.is_initialized()):
                address = address or os.environ.get("RAY_ADDRESS") or None
                if address is None and importlib.util.find_spec("ray") is not None:
                    address = _running_local_ray()
                    if address is None:
                        self._start_local()  # before `import ray` here: the two overlap
                ray = require_ray()
                try:
                    self._quiet(ray)
                    if address is None:
                        address = self._local_address()
                        _use_local_token()
                    with _masked_entrypoint(ray):
                        ray.init(address=address, configure_logging=False, log_to_driver=False)
                except BaseException:
                    self._loud()
                    self._stop_local()
                    raise
                self.connected_here = True
            else:
                ray = require_ray()
                if address is not None and self.users == 0:
                    logger.warning("skynet-dspy: Ray is already connected in this process; RayCluster(address=%r) "
                                   "is not used (call ray.shutdown() first to reach another cluster)", address)
            self.users += 1
            return ray

    def release(self, ray: ModuleType) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0 or not self.connected_here:
                return
            self.connected_here = False
            try:
                ray.shutdown()
            finally:
                self._loud()
                self._stop_local()

    # -- a local Ray of the package's own -----------------------------------------------------------

    def _start_local(self) -> None:
        """Start a local Ray in a helper process with a credential-free environment, in a folder of its own."""
        self.token = uuid.uuid4().hex
        self.folder = tempfile.mkdtemp(prefix="skynet-ray-")  # short: Ray's socket paths live under it
        self.output.clear()
        env = {**credential_free_environment(), tree.MARK: f"ray-{self.token}", "RAY_USAGE_STATS_ENABLED": "0",
               # a setting, not a key (though its name says AUTH): the driver must connect in the same mode
               "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
        self.helper = subprocess.Popen(
            [sys.executable, "-c", _HELPER, self.folder], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )

    def _local_address(self) -> str:
        """The GCS address of the local Ray being started (WorkerError, with its output, if it does not start)."""
        assert self.helper is not None
        found: list[str] = []
        ready = threading.Event()
        threading.Thread(target=_read_output, args=(self.helper, found, ready, self.output), daemon=True).start()
        ready.wait(START_TIMEOUT)
        if found:
            return found[0]
        code = self.helper.poll()
        output = "\n".join(self.output)
        raise WorkerError(
            "a local Ray could not be started for isolation='ray' ("
            + (f"it exited with code {code}" if code is not None else f"not ready within {START_TIMEOUT:g} s")
            + "); start one yourself with `ray start --head`, or give RayCluster(address=...)"
            + (f". Its output:\n{redact(output)}" if output else "")
        )

    def _stop_local(self) -> None:
        helper, self.helper = self.helper, None
        if helper is not None:
            try:
                if helper.stdin is not None:
                    helper.stdin.close()  # the helper calls ray.shutdown(), which stops what it started
                helper.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                pass
            tree.kill_descendants(helper.pid, f"ray-{self.token}")  # whatever outlived ray.shutdown()
            if helper.poll() is None:
                helper.kill()
                helper.wait()
        folder, self.folder = self.folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    @property
    def local_token(self) -> str | None:
        """The environment mark of every process of a local Ray the package started (None when it started none)."""
        return f"ray-{self.token}" if self.helper is not None else None

    # -- quiet -----------------------------------------------------------------------------------

    def _quiet(self, ray: ModuleType) -> None:
        """Ray's records to the package's logger, in place of Ray's default stderr handler (put back at the end)."""
        ray_logger = logging.getLogger("ray")
        ray_logger.addHandler(_to_package)
        self.quieted = [handler for handler in ray_logger.handlers if type(handler).__name__ == "PlainRayHandler"]
        for handler in self.quieted:
            ray_logger.removeHandler(handler)

    def _loud(self) -> None:
        ray_logger = logging.getLogger("ray")
        ray_logger.removeHandler(_to_package)
        for handler in self.quieted:
            ray_logger.addHandler(handler)
        self.quieted = []


class _ToPackage(logging.Handler):
    """A Ray log record, re-logged on the "skynet_dspy" logger: at debug, or at warning for an error."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = logging.WARNING if record.levelno >= logging.ERROR else logging.DEBUG
            if logger.isEnabledFor(level):
                logger.log(level, "ray (%s): %s", record.name, record.getMessage())
        except Exception:  # noqa: BLE001 - a log record never breaks a call
            self.handleError(record)


_to_package = _ToPackage()


def _read_output(helper: subprocess.Popen[str], found: list[str], ready: threading.Event,
                 kept: collections.deque[str]) -> None:
    """The helper's output to its end: its address line, every other line logged at debug (and kept for an error)."""
    assert helper.stdout is not None
    for line in helper.stdout:
        if line.startswith(_ADDRESS_LINE) and not found:
            found.append(line[len(_ADDRESS_LINE):].strip())
            ready.set()
            continue
        kept.append(line.rstrip("\n"))
        logger.debug("local Ray: %s", line.rstrip("\n"))
    ready.set()


def _running_local_ray() -> str | None:
    """The address of a Ray started on this machine by `ray start` (as ray.init() finds it), if it answers.

    Ray's own lookup (private API of ray, checked against 2.60): the address `ray start` wrote in its folder.
    """
    try:
        from ray._private.services import find_bootstrap_address

        address = find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - another Ray version, or no folder: none found
        return None
    if not isinstance(address, str) or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return address
    except (OSError, ValueError):
        return None  # a stale address: that Ray has stopped


def _use_local_token() -> None:
    """Connect to the local Ray just started with its token, as ray.init() does for a local Ray it finds.

    Ray 2.60 starts a local cluster with token authentication (the token in ~/.ray/auth_token); connecting by
    address turns it on only when RAY_AUTH_MODE says so, a setting Ray reads once per process. Ray's own function
    for the local case (private API, checked against ray 2.60) sets both; without it, RAY_AUTH_MODE is set.
    """
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def masked_command_line(arguments: list[str]) -> list[str]:
    """The command line with every credential-like value masked: `--api-key VALUE`, `--token=VALUE`, `sk-...`."""
    masked: list[str] = []
    flag = ""  # the option before this argument, when it takes a value
    for argument in arguments:
        name, equals, value = argument.partition("=")
        if argument.startswith("-") and equals and env_credential(name.lstrip("-").replace("-", "_"), value):
            masked.append(f"{name}={MASK}")
        elif flag and not argument.startswith("-") and env_credential(flag, argument):
            masked.append(MASK)
        else:
            masked.append(redact(argument))
        flag = argument.lstrip("-").replace("-", "_") if argument.startswith("-") and not equals else ""
    return masked


@contextlib.contextmanager
def _masked_entrypoint(ray: ModuleType) -> Iterator[None]:
    """While ray.init() runs: the command line it records as the job's entrypoint is masked (masked_command_line).

    Ray records the process's command line from ray._private.utils.get_entrypoint_name (private API, checked
    against ray 2.60): the same, masked, is given instead; when that function is not there, nothing is changed.
    """
    utils: Any = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "get_entrypoint_name", None)
    if original is None:
        yield
        return

    def masked() -> str:
        found = str(original())
        prefix = "(interactive_shell) " if found.startswith("(interactive_shell) ") else ""
        return prefix + subprocess.list2cmdline(masked_command_line(list(sys.orig_argv)))

    utils.get_entrypoint_name = masked
    try:
        yield
    finally:
        utils.get_entrypoint_name = original


session = _Session()


def local_ray_mark() -> str | None:
    """`SKYNET_DSPY_WORKER`'s value on every process of the local Ray the package started, if it started one."""
    return session.local_token
