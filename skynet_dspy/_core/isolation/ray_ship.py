"""What travels to the nodes of isolation="ray": how a node finds the metric, and the code shipped with it.

A metric file travels with its folder (runtime_env `working_dir`), a package of the user's as `py_modules`, a
`score` defined in a notebook by value (cloudpickle); files that hold keys are left out (SECRET_FILES).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import MetricLoadError, WorkerError
from ..logs import logger
from ..values import exception_text
from . import wire

# Left out of what is uploaded (gitignore patterns, as Ray's `excludes`); the user's `excludes` come after them
SECRET_FILES = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "id_*", "!id_*.py", "credentials", "credentials.*",
    "*credentials*.json", "client_secret*.json", "*service-account*.json", "secrets.toml", "secrets.yaml",
    "secrets.yml", "secrets.json", "*.tfvars", ".aws/", ".ssh/", ".gnupg/", ".docker/", ".kube/",
)

def ship(source: Any, runtime_env: Mapping[str, Any] | None) -> tuple[bytes, dict[str, Any]]:
    """How a node finds the metric (pickled for its host) and the runtime_env that carries its code there: a file
    by its path in the working_dir, a module or function of the user's by name (with its package, or its folder),
    any other function by value (cloudpickle, as to a local worker)."""
    import cloudpickle

    env = dict(runtime_env or {})
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"metric file not found: {source}")
        return pickle.dumps(_relative_to_working_dir(path, env)), env
    if isinstance(source, ModuleType) and (source.__name__ == "__main__" or not getattr(source, "__file__", None)):
        source = getattr(source, "score", source)  # sent by value below
    _carry_module(source, env)
    try:
        return cloudpickle.dumps(source, protocol=wire.PROTOCOL), env  # a module, or an importable function: by name
    except Exception as exc:
        raise MetricLoadError(
            f"{getattr(source, '__qualname__', type(source).__name__)} cannot be sent to the Ray cluster "
            f"({exception_text(exc)}); define score in a metric.py and load that file"
        ) from None


def _carry_module(source: Any, env: dict[str, Any]) -> None:
    """The user's module (the source, or a function's) travels: its package as py_modules, else its folder."""
    module = source if isinstance(source, ModuleType) else sys.modules.get(getattr(source, "__module__", "") or "")
    file = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or not file or not _users_own(file):
        return
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    if getattr(top, "__path__", None):
        env["py_modules"] = [*env.get("py_modules", ()), top]  # imported by name there
    elif "working_dir" not in env:
        env["working_dir"] = str(Path(file).resolve().parent)


def uploaded(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """The runtime_env with its local working_dir and py_modules uploaded (gcs:// URIs), SECRET_FILES left out.

    Ray uploads local folders only for a runtime_env given to ray.init(), and the Ray may be the user's: so with
    the functions ray.init() uses (private API of ray, checked against 2.60), honouring .gitignore as it does.
    """
    if not runtime_env.get("working_dir") and not runtime_env.get("py_modules"):
        return runtime_env
    runtime_env = {**runtime_env, "excludes": [*SECRET_FILES, *(runtime_env.get("excludes") or ())]}
    import tempfile

    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
        from ray._private.runtime_env.working_dir import upload_working_dir_if_needed
    except ImportError as exc:
        raise WorkerError(
            f"this version of Ray lacks what skynet-dspy uses to ship the metric's code ({exc}; checked against ray "
            "2.60): pip install 'skynet-dspy[ray]' to get a Ray it knows"
        ) from None

    from ray.util.client import ray as client

    include_gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    with _pin_lock, tempfile.TemporaryDirectory(prefix="skynet-dspy-ray-") as scratch:
        pin = os.environ.get(_PIN_VARIABLE)
        if client.is_connected():  # type: ignore[no-untyped-call]
            # Ray Client 2.60 proxies the upload's "pin this package" call to a server that lacks it (the call
            # never returns): the package is not pinned; the node hosts created next hold it instead
            os.environ[_PIN_VARIABLE] = "0"
        try:
            env = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=include_gitignore,
                                              scratch_dir=scratch, logger=logger)
            env = upload_working_dir_if_needed(env, include_gitignore=include_gitignore, scratch_dir=scratch,
                                               logger=logger)
        finally:
            os.environ.pop(_PIN_VARIABLE, None)
            if pin is not None:
                os.environ[_PIN_VARIABLE] = pin
    env.pop("excludes", None)
    return env


_PIN_VARIABLE = "RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S"  # Ray's setting: how long an upload is pinned
_pin_lock = threading.Lock()


def _relative_to_working_dir(path: Path, env: dict[str, Any]) -> str:
    """The metric file's path on a node: relative to the working_dir it travels in."""
    given = env.get("working_dir")
    if given is None:
        env["working_dir"] = str(path.parent)
        return path.name
    folder = Path(str(given)).expanduser().resolve()
    if not path.is_relative_to(folder):
        raise ValueError(
            f"the metric file {path} is not inside runtime_env['working_dir'] ({given}), so it would not reach the "
            "nodes; give a local folder holding it, or leave working_dir out (the metric's folder is shipped)"
        )
    return str(path.relative_to(folder))


def _users_own(file: str) -> bool:
    """Whether a module file is the user's code (not the standard library or an installed package)."""
    import sysconfig

    resolved = str(Path(file).resolve())
    installed = {sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return not any(resolved.startswith(str(Path(folder).resolve()) + os.sep) for folder in installed)
