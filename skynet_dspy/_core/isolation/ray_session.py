"""The package's connection to Ray for isolation="ray", shared by every metric of the process: found, or started.

The Ray used is the one this process is connected to, else `RayCluster(address=...)`, else RAY_ADDRESS, else a
local Ray already running (`ray start --head`), else a local Ray the package starts: in a helper process with a
credential-free environment (every Ray process inherits it), in a temporary folder deleted at the end, without
the dashboard or worker prestarts; it stops when the helper's stdin closes (the last close(), or the user's
process exiting). While connected, Ray's log records go to the "skynet_dspy" logger at debug and the nodes'
output is not streamed here; the command line Ray records for the job has every credential-like value masked.
"""

from __future__ import annotations

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
import time
from types import ModuleType

from ..errors import WorkerError, require_extra
from ..logs import logger
from ..secrets import MASK, credential_free_environment, env_credential, redact
from . import tree

START_TIMEOUT = 180.0  # seconds a local Ray started by the package may take to come up
_ADDRESS_LINE = "SKYNET_DSPY_RAY_ADDRESS="
_OUTPUT = "helper.log"  # what the helper prints, in its folder: logged at debug, shown when Ray does not start
# The helper that starts a local Ray (no worker prestarted: the node hosts get workers with the metric's
# runtime_env): it prints the GCS address, then waits for its stdin to close.
_HELPER = (
    "import sys, ray\n"
    "context = ray.init(include_dashboard=False, configure_logging=False, log_to_driver=False,\n"
    "                   _temp_dir=sys.argv[1], _system_config={'enable_worker_prestart': False})\n"
    f"print({_ADDRESS_LINE!r} + context.address_info['gcs_address'], flush=True)\n"
    "sys.stdin.read()\n"
    "ray.shutdown()\n"
)


class _Session:
    """Connects to Ray for the first metric, and disconnects (stopping a local Ray it started) after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.connected_here = False  # ray.init() was called by the package (so ray.shutdown() is ours to call)
        self.helper: subprocess.Popen[bytes] | None = None  # the process owning a local Ray the package started
        self.folder: str | None = None  # the local Ray's temporary folder (its session folders), deleted at the end
        self.quieted: list[logging.Handler] = []  # Ray's own stderr handlers, set aside while connected

    def acquire(self, address: str | None) -> ModuleType:
        """The ray module, connected: to the Ray found, or to a local Ray started now."""
        with self.lock:
            loaded = sys.modules.get("ray")
            if self.users == 0 and not (loaded is not None and loaded.is_initialized()):
                self._connect(address or os.environ.get("RAY_ADDRESS") or None)
            elif address is not None and self.users == 0:
                logger.warning("skynet-dspy: Ray is already connected in this process; RayCluster(address=%r) "
                               "is not used (call ray.shutdown() first to reach another cluster)", address)
            self.users += 1
            return require_extra("ray", "ray", "isolation='ray'")

    def _connect(self, address: str | None) -> None:
        from unittest import mock  # here: not on the import path of the package

        if address is None and importlib.util.find_spec("ray") is not None:
            address = _running_local_ray()
            if address is None:
                self._start_local()  # before `import ray` here: the two overlap
        ray = require_extra("ray", "ray", "isolation='ray'")
        try:
            self._quiet()
            if address is None:
                address = self._local_address()
                _use_local_token()
            # the job's entrypoint masked; create=True: nothing changes on a Ray without that function
            with mock.patch.object(ray._private.utils, "get_entrypoint_name", _masked_entrypoint, create=True):
                ray.init(address=address, configure_logging=False, log_to_driver=False)
        except BaseException:
            self._loud()
            self._stop_local()
            raise
        self.connected_here = True

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
        self.folder = tempfile.mkdtemp(prefix="skynet-ray-")  # short: Ray's socket paths live under it
        env = {**credential_free_environment(), tree.MARK: self.mark(), "RAY_USAGE_STATS_ENABLED": "0",
               # a setting, not a key (though its name says AUTH): the driver must connect in the same mode
               "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
        with open(os.path.join(self.folder, _OUTPUT), "wb") as output:
            self.helper = subprocess.Popen([sys.executable, "-c", _HELPER, self.folder], env=env,
                                           stdin=subprocess.PIPE, stdout=output, stderr=output, start_new_session=True)

    def _output(self) -> str:
        assert self.folder is not None
        with open(os.path.join(self.folder, _OUTPUT), errors="replace") as output:
            return output.read()

    def _local_address(self) -> str:
        """The GCS address of the local Ray being started (WorkerError, with its output, if it does not start)."""
        assert self.helper is not None
        end = time.monotonic() + START_TIMEOUT
        while (code := self.helper.poll()) is None and time.monotonic() < end:
            found = [line for line in self._output().splitlines() if line.startswith(_ADDRESS_LINE)]
            if found:
                return found[0][len(_ADDRESS_LINE):].strip()
            time.sleep(0.05)
        output = self._output().strip()
        raise WorkerError(
            "a local Ray could not be started for isolation='ray' ("
            + (f"it exited with code {code}" if code is not None else f"not ready within {START_TIMEOUT:g} s")
            + "); start one yourself with `ray start --head`, or give RayCluster(address=...)"
            + (f". Its output:\n{redact(output[-4000:])}" if output else "")
        )

    def _stop_local(self) -> None:
        helper, self.helper = self.helper, None
        if helper is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                helper.communicate(timeout=60)  # its stdin closed, the helper calls ray.shutdown()
            tree.kill_descendants(helper.pid, self.mark())  # whatever outlived ray.shutdown()
            helper.kill()  # nothing when it has exited
            helper.wait()
            logger.debug("local Ray's output: %s", self._output())
        folder, self.folder = self.folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def mark(self) -> str:
        """`SKYNET_DSPY_WORKER`'s value on every process of the local Ray the package started."""
        return f"ray-{os.path.basename(str(self.folder))}"

    # -- quiet -----------------------------------------------------------------------------------

    def _quiet(self) -> None:
        """Ray's records to the package's logger, not Ray's default stderr handler (until _loud())."""
        ray_handlers = logging.getLogger("ray").handlers
        self.quieted = [handler for handler in ray_handlers if type(handler).__name__ == "PlainRayHandler"]
        for handler in self.quieted:
            handler.addFilter(_to_package)

    def _loud(self) -> None:
        for handler in self.quieted:
            handler.removeFilter(_to_package)
        self.quieted = []


def _to_package(record: logging.LogRecord) -> bool:
    """A Ray log record, re-logged on the "skynet_dspy" logger (at debug, or at warning for an error), not shown."""
    level = logging.WARNING if record.levelno >= logging.ERROR else logging.DEBUG
    with contextlib.suppress(Exception):  # a log record never breaks a call
        if logger.isEnabledFor(level):
            logger.log(level, "ray (%s): %s", record.name, record.getMessage())
    return False


def _running_local_ray() -> str | None:
    """The address of a Ray started on this machine by `ray start`, if it answers: found as ray.init() finds it
    (private API of ray, checked against 2.60)."""
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
    """Connect with the token of the local Ray just started, as ray.init() does for a local Ray it finds: Ray 2.60
    turns token authentication on for an address only when RAY_AUTH_MODE says so (private API, checked)."""
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


def _masked_entrypoint() -> str:
    """The command line ray.init() records as the job's entrypoint, as ray._private.utils.get_entrypoint_name gives
    it (private API of ray, checked against 2.60), with masked_command_line's masks."""
    shell = "(interactive_shell) " if hasattr(sys, "ps1") else ""  # as Ray says it
    return shell + subprocess.list2cmdline(masked_command_line(sys.orig_argv))


session = _Session()
