"""isolation="ray": metric calls on a Ray cluster, each node running the package's own worker pool.

One Ray actor per node (`_NodeHost`) hosts a ProcessExecutor, so the timeout, the process-tree kill and the
contract checks stay on the node, exactly as on one machine. The user's process (the driver) sends each call
to the least busy node and keeps its own deadline (2 x timeout + a margin): a node lost mid-call scores the
call `crashed`. Ray's retries are off (max_restarts=0, max_task_retries=0): a call is never silently re-run.

llm() is served by the driver (its judge, cache, spend caps and rate limits; no key on the node) through a
step protocol: `start(call)` and `next_event(call)` return the call's next event, an llm() request or its
outcome; the driver answers requests with `llm_reply`. Events are plain values pickled on the node and read
on the driver by wire.py's class-refusing unpickler; the outcome is checked against the contract again here.

Ray is imported lazily, only in this module (`pip install "skynet-dspy[ray]"`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..call import CallRequest
from ..context import CallScope, LLMHandler, llm_pool
from ..errors import (
    NO_JUDGE_MODEL,
    LLMCallError,
    MetricLoadError,
    MissingExtra,
    ModelNotConfigured,
    WorkerError,
    judge_error,
    judge_failure,
)
from ..secrets import credential_free_environment, env_credential, looks_like_credential
from ..types import Failure, Item, MetricInfo, Outcome
from ..values import check_llm_arguments, exception_text, whole_number
from . import tree, wire
from .process import checked_again

logger = logging.getLogger("skynet_dspy")

DEADLINE_MARGIN = 60.0  # seconds past 2 x timeout the driver waits for a node before it scores the call crashed
MAX_LLM_AT_ONCE = 16  # llm() requests one call may have in flight; more are refused at once (as in process.py)
REFRESH_EVERY = 30.0  # seconds between looks for nodes without a host (a new node, a lost host replaced)
START_TIMEOUT = 180.0  # seconds a local Ray started by the package may take to come up
_POLL = 5.0  # seconds a node holds a next_event request before answering "pending"
_STOP_WAIT = 10.0  # seconds close() gives the node hosts to stop their workers before killing them
_ADDRESS_LINE = "SKYNET_DSPY_RAY_ADDRESS="
# The helper that starts a local Ray in a process of its own: its environment (credential-free) is what every
# Ray process it starts inherits. It stops Ray when its stdin closes: close(), or the user's process exiting.
_HELPER = (
    "import sys, ray\n"
    "context = ray.init(include_dashboard=False, configure_logging=False)\n"
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


@dataclass(frozen=True)
class RayCluster:
    """Where isolation="ray" runs the metric: `load_metric(..., isolation=skynet_dspy.RayCluster(...))`.

    Args:
        address: The cluster (as `ray.init(address=...)` takes it); None uses the Ray this process is already
            connected to, else RAY_ADDRESS, else a local Ray started by the package (and stopped at close()).
        workers_per_node: Metric worker processes on each node (calls in flight there); None: the node's CPUs.
        runtime_env: Ray's runtime_env for the node hosts (pip, env_vars, ...); the metric's folder is added as
            its working_dir when it has none. A credential in it is refused: keys stay on the driver.
    """

    address: str | None = None
    workers_per_node: int | None = None
    runtime_env: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.address is not None and (not isinstance(self.address, str) or not self.address.strip()):
            raise TypeError(f"RayCluster address must be a Ray address such as 'head:6379', got {self.address!r}")
        if self.workers_per_node is not None:
            whole_number("workers_per_node", self.workers_per_node, minimum=1, unit="worker processes")
        if self.runtime_env is not None:
            if not isinstance(self.runtime_env, Mapping):
                raise TypeError(
                    f"RayCluster runtime_env must be a dict (Ray's runtime_env), got {type(self.runtime_env).__name__}"
                )
            check_runtime_env(self.runtime_env)


def check_runtime_env(runtime_env: Mapping[str, Any]) -> None:
    """ValueError for a runtime_env that would carry a credential to the cluster (the value is never shown)."""
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, Mapping):
        raise TypeError("runtime_env['env_vars'] must be a dict of environment variables")
    for name, value in env_vars.items():
        # the rule of the workers' environment (secrets.credential_free_environment): TOKENIZERS_PARALLELISM=false
        # is a setting, not a key
        if env_credential(str(name), str(value)):
            raise ValueError(
                f"runtime_env['env_vars'] holds {name}, whose name says it is a credential: keys stay on this "
                "machine (llm() from the cluster is served here, with this process's keys). Remove it; a metric "
                "that needs another service's key should not run on a shared cluster"
            )
    for where, value in _strings(runtime_env, "runtime_env"):
        if looks_like_credential(value):
            raise ValueError(
                f"{where} holds what looks like a credential (a key, a token, a password in a URL): keys stay on "
                "this machine. Remove it from the runtime_env"
            )


def _strings(value: Any, where: str) -> list[tuple[str, str]]:
    """Every text in a runtime_env, with where it is (for the error naming it)."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in _strings(item, f"{where}[{key!r}]")]
    if isinstance(value, (list, tuple)):
        return [found for index, item in enumerate(value) for found in _strings(item, f"{where}[{index}]")]
    return []


# -- the package's connection to Ray, shared by every metric of this process -----------------------


class _Session:
    """Connects to Ray for the first metric, and disconnects (stopping a local Ray it started) after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.connected_here = False  # ray.init() was called by the package (so ray.shutdown() is ours to call)
        self.helper: subprocess.Popen[str] | None = None  # the process owning a local Ray the package started
        self.token = ""

    def acquire(self, ray: ModuleType, address: str | None) -> None:
        with self.lock:
            if self.users == 0 and not ray.is_initialized():
                address = address or os.environ.get("RAY_ADDRESS") or None
                if address is None:
                    address = self._start_local()
                    _use_local_token()
                try:
                    ray.init(address=address, logging_level=logging.WARNING)
                except BaseException:
                    self._stop_local()
                    raise
                self.connected_here = True
            elif address is not None and self.users == 0:
                logger.warning("skynet-dspy: Ray is already connected in this process; RayCluster(address=%r) is "
                               "not used (call ray.shutdown() first to reach another cluster)", address)
            self.users += 1

    def release(self, ray: ModuleType) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0 or not self.connected_here:
                return
            self.connected_here = False
            ray.shutdown()
            self._stop_local()

    def _start_local(self) -> str:
        """Start a local Ray in a helper process with a credential-free environment; its GCS address."""
        self.token = uuid.uuid4().hex
        env = {**credential_free_environment(), tree.MARK: f"ray-{self.token}", "RAY_USAGE_STATS_ENABLED": "0",
               # a setting, not a key (though its name says AUTH): the driver must connect in the same mode
               "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
        self.helper = subprocess.Popen(
            [sys.executable, "-c", _HELPER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, start_new_session=True,
        )
        found: list[str] = []
        reader = threading.Thread(target=_read_address, args=(self.helper, found), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        if not found:
            code = self.helper.poll()
            self._stop_local()
            raise WorkerError(
                "a local Ray could not be started for isolation='ray' ("
                + (f"it exited with code {code}; its error output is above" if code is not None
                   else f"not ready within {START_TIMEOUT:g} s")
                + "); start one yourself with ray.init(), or give RayCluster(address=...)"
            )
        return found[0]

    def _stop_local(self) -> None:
        helper, self.helper = self.helper, None
        if helper is None:
            return
        try:
            if helper.stdin is not None:
                helper.stdin.close()  # the helper calls ray.shutdown(), which stops what it started
            helper.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        tree.kill_descendants(helper.pid, f"ray-{self.token}")  # whatever outlived ray.shutdown(), wherever it moved
        if helper.poll() is None:
            helper.kill()
            helper.wait()
        if helper.stdout is not None:
            helper.stdout.close()

    @property
    def local_token(self) -> str | None:
        """The environment mark of every process of a local Ray the package started (None when it started none)."""
        return f"ray-{self.token}" if self.helper is not None else None


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


def _read_address(helper: subprocess.Popen[str], found: list[str]) -> None:
    assert helper.stdout is not None
    for line in helper.stdout:
        if line.startswith(_ADDRESS_LINE):
            found.append(line[len(_ADDRESS_LINE):].strip())
            return


_session = _Session()


def local_ray_mark() -> str | None:
    """`SKYNET_DSPY_WORKER`'s value on every process of the local Ray the package started, if it started one."""
    return _session.local_token


# -- on a node ----------------------------------------------------------------------------------


class _Box:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: dict[str, Any] | None = None


class _NodeCall:
    """One call in progress on a node: its events for the driver, and its llm() requests awaiting an answer."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.waiting: dict[int, _Box] = {}
        self.lock = threading.Lock()
        self.ended = False
        self.ids = itertools.count(1)


class _NodeHost:
    """The Ray actor on one node: the metric in the package's own worker pool, its llm() relayed to the driver."""

    def __init__(self, source: bytes, timeout: float, feedback_limit: int, workers: int,
                 recycle: dict[str, int | None] | None = None):
        self._source = source
        self._recycle = recycle or {}  # the node pool's max_calls / max_memory (worker_max_calls / _memory)
        self._timeout = timeout
        self._feedback_limit = feedback_limit
        self._workers = workers
        self._executor: Any = None
        self._calls: dict[int, _NodeCall] = {}
        self._lock = threading.Lock()

    def load(self) -> bytes:
        """Load the metric in the node's first worker process: what it found, or why it failed (plain values)."""
        from .process import ProcessExecutor

        try:
            source = pickle.loads(self._source)
            if isinstance(source, dict) and "module" in source:
                import importlib

                source = importlib.import_module(source["module"])
            self._executor = ProcessExecutor(
                source, self._timeout, self._feedback_limit, max_workers=self._workers,
                max_calls=self._recycle.get("max_calls"), max_memory=self._recycle.get("max_memory"),
            )
        except FileNotFoundError as exc:
            return wire.to_parent({"kind": "load_failed", "message": str(exc), "item": "not_found"})
        except MetricLoadError as exc:
            return wire.to_parent({"kind": "load_failed", "message": str(exc), "item": str(exc.item)})
        except Exception as exc:  # noqa: BLE001 - the driver gets the reason in words, whatever it was
            return wire.to_parent({"kind": "load_failed", "message": exception_text(exc), "item": None})
        return wire.to_parent({"kind": "loaded", "info": wire.info_to_plain(self._executor.info),
                               "node": _node_name(), "pid": os.getpid()})

    def start(self, call_id: int, payload: bytes) -> bytes:
        """Start one call (`payload`: the pickled CallRequest) and return its first event."""
        request = pickle.loads(payload)
        call = _NodeCall()
        with self._lock:
            self._calls[call_id] = call
        threading.Thread(target=self._run, args=(call, request), name="skynet-ray-call", daemon=True).start()
        return self.next_event(call_id)

    def _run(self, call: _NodeCall, request: CallRequest) -> None:
        def relay(instructions: str, input: str | None, settings: dict[str, Any]) -> str:
            box = _Box()
            with call.lock:
                if call.ended:
                    raise LLMCallError("llm() was called after its metric call had ended")
                request_id = next(call.ids)
                call.waiting[request_id] = box
            call.events.put({"kind": "llm", "request": request_id, "instructions": instructions, "input": input,
                             "settings": wire.to_plain(settings)})
            if not box.event.wait(self._timeout + DEADLINE_MARGIN) or box.value is None:
                raise LLMCallError("llm() got no answer from the user's process before its metric call ended")
            if "text" in box.value:
                return str(box.value["text"])
            error = box.value.get("error") or {}
            kind = error.get("failure")
            failure = Failure(kind) if kind in set(Failure) else Failure.JUDGE_ERROR
            raise judge_error(failure, str(error.get("message")), error.get("status"), bool(error.get("refused")))

        try:
            outcome = self._executor.run(request, relay)
        except Exception as exc:  # noqa: BLE001 - the driver gets an outcome whatever happened here
            outcome = Outcome(failure=Failure.CRASHED, detail=f"the node's worker pool failed: {exception_text(exc)}")
        with call.lock:
            call.ended = True
            waiting, call.waiting = call.waiting, {}
        for box in waiting.values():
            box.event.set()  # its value stays None: "no answer before the call ended"
        call.events.put({"kind": "outcome", "outcome": wire.outcome_to_plain(outcome)})

    def next_event(self, call_id: int) -> bytes:
        """The call's next event: an llm() request, its outcome, or "pending" after a few seconds of neither."""
        with self._lock:
            call = self._calls.get(call_id)
        if call is None:
            return wire.to_parent({"kind": "unknown"})
        try:
            event = call.events.get(timeout=_POLL)
        except queue.Empty:
            return wire.to_parent({"kind": "pending"})
        if event["kind"] == "outcome":
            with self._lock:
                self._calls.pop(call_id, None)
        return wire.to_parent(event)

    def llm_reply(self, call_id: int, request_id: int, reply: dict[str, Any]) -> None:
        """The driver's answer to one llm() request of a call (dropped when the call has ended)."""
        with self._lock:
            call = self._calls.get(call_id)
        if call is None:
            return
        with call.lock:
            box = call.waiting.pop(request_id, None)
        if box is not None:
            box.value = reply
            box.event.set()

    def pids(self) -> dict[str, Any]:
        """This host's process id and its metric workers' (for tests and for the curious)."""
        workers = getattr(self._executor, "worker_pids", []) if self._executor is not None else []
        return {"host": os.getpid(), "workers": list(workers), "node": _node_name()}

    def stop(self) -> None:
        """Stop the node's metric workers (calls in progress there end as failures)."""
        if self._executor is not None:
            self._executor.close()


def _node_name() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - a name for messages only
        return os.uname().nodename


# -- on the driver ----------------------------------------------------------------------------------


class _Closed(Exception):
    """The executor was closed: no Ray call is made any more (one would start a new local Ray)."""


@dataclass(eq=False)
class _Host:
    """One node's host actor, as the driver sees it."""

    actor: Any
    node_id: str
    capacity: int
    in_flight: int = 0
    lost: bool = False


class RayExecutor:
    """The metric on a Ray cluster: a host actor per node, calls spread over them, llm() served here."""

    def __init__(self, source: Any, timeout: float, feedback_limit: int, cluster: RayCluster,
                 workers: int | None = None, *, max_calls: int | None = None, max_memory: int | None = None):
        self._ray = require_ray()
        self._recycle = {"max_calls": max_calls, "max_memory": max_memory}  # for each node's pool
        self.timeout = timeout
        self.feedback_limit = feedback_limit
        self.cluster = cluster
        self._per_node = cluster.workers_per_node or workers
        self._source, runtime_env = ship(source, cluster.runtime_env)
        self._deadline = 2 * timeout + DEADLINE_MARGIN
        self._cond = threading.Condition()
        self._hosts: list[_Host] = []
        self._busy = 0  # Ray calls in progress on the driver's threads
        self._closed = False
        self._ids = itertools.count(1)
        self._placing = threading.Lock()
        self._refreshed = 0.0
        _session.acquire(self._ray, cluster.address)
        try:
            self._runtime_env = _uploaded(runtime_env)
            first = self._place(initial=True)
        except BaseException:
            self.close()
            raise
        self.info: MetricInfo = first

    # -- the hosts ---------------------------------------------------------------------------

    def _alive_nodes(self) -> list[tuple[str, int]]:
        nodes = self._call(self._ray.nodes)
        found = []
        for node in nodes:
            if not node.get("Alive"):
                continue
            cpus = (node.get("Resources") or {}).get("CPU") or 1
            found.append((str(node["NodeID"]), int(self._per_node or max(1, math.floor(cpus)))))
        return found

    def _place(self, initial: bool = False) -> MetricInfo:
        """A host on every alive node without a live one; the metric's info (MetricLoadError when none loads)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._placing:
            self._refreshed = time.monotonic()
            with self._cond:
                hosted = {host.node_id for host in self._hosts}
            remote = self._ray.remote(_NodeHost)
            started = []
            for node_id, capacity in self._alive_nodes():
                if node_id in hosted:
                    continue
                options: dict[str, Any] = {
                    "num_cpus": 0, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 2 * capacity + 4,
                    "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
                }
                if self._runtime_env:
                    options["runtime_env"] = self._runtime_env
                actor = self._call(remote.options(**options).remote, self._source, self.timeout, self.feedback_limit,
                                   capacity, self._recycle)
                host = _Host(actor, node_id, capacity, lost=True)  # lost (takes no call) until it has loaded
                with self._cond:
                    self._hosts.append(host)  # so close() stops it even while it loads
                started.append((host, self._call(actor.load.remote)))
            info, problem = None, None
            for host, ref in started:
                try:
                    reply = _event(self._call(self._ray.get, ref, timeout=self.timeout + START_TIMEOUT))
                except Exception as exc:  # noqa: BLE001 - a node that cannot host the metric is left out
                    reply = {"kind": "load_failed", "item": None, "message": _ray_failure(exc)}
                if reply.get("kind") == "loaded" and isinstance(reply.get("info"), dict):
                    info = info or wire.info_from_plain(reply["info"])
                    with self._cond:
                        host.lost = False
                        self._cond.notify_all()
                    continue
                problem = problem or reply
                self._kill(host)
                with self._cond:
                    self._hosts.remove(host)
            if info is not None or not initial:
                if problem is not None:
                    logger.warning("skynet-dspy: a Ray node could not load the metric and takes no calls: %s",
                                   problem.get("message"))
                return info  # type: ignore[return-value]
            if problem is None:
                raise WorkerError("the Ray cluster has no alive node to run the metric on")
            message, item = str(problem.get("message")), problem.get("item")
            if item == "not_found":
                raise FileNotFoundError(message)
            raise MetricLoadError(f"on the Ray cluster: {message}", Item(item) if item in set(Item) else Item.LOADS)

    def _refresh_later(self) -> None:
        """Look for nodes without a host (new ones, lost hosts to replace) in the background, now and then."""
        if time.monotonic() - self._refreshed < REFRESH_EVERY or self._placing.locked():
            return
        self._refreshed = time.monotonic()

        def refresh() -> None:
            try:
                self._place()
            except Exception as exc:  # noqa: BLE001 - the run goes on with the hosts it has
                if not isinstance(exc, _Closed):
                    logger.warning("skynet-dspy: looking for new Ray nodes failed: %s", exception_text(exc))

        threading.Thread(target=refresh, name="skynet-ray-refresh", daemon=True).start()

    def _take(self) -> _Host | None:
        """The least busy host with room for one more call (waiting for room); None when closed or none is left."""
        self._refresh_later()
        for attempt in range(2):
            with self._cond:
                while not self._closed:
                    live = [host for host in self._hosts if not host.lost]
                    if not live:
                        break
                    free = [host for host in live if host.in_flight < host.capacity]
                    if free:
                        host = min(free, key=lambda host: host.in_flight / host.capacity)
                        host.in_flight += 1
                        return host
                    self._cond.wait()
                if self._closed:
                    return None
            if attempt == 0:
                try:
                    self._place()  # every host was lost: place new ones on the nodes still alive
                except Exception:  # noqa: BLE001 - answered below: the call is scored crashed
                    return None
        return None

    def _give_back(self, host: _Host) -> None:
        with self._cond:
            host.in_flight -= 1
            self._cond.notify()

    def _lose(self, host: _Host) -> None:
        """A host that died, or did not answer in time: no more calls go there (its calls in flight fail)."""
        with self._cond:
            host.lost = True
            if host in self._hosts:
                self._hosts.remove(host)
            self._cond.notify_all()
        self._refreshed = 0.0  # look for a replacement at the next call
        self._kill(host)

    def _kill(self, host: _Host) -> None:
        try:
            self._call(self._ray.kill, host.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or closed
            pass

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A Ray API call, unless closed: after ray.shutdown(), most Ray calls would start a new local Ray."""
        with self._cond:
            if self._closed:
                raise _Closed
            self._busy += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    # -- a call ------------------------------------------------------------------------------

    def run(self, request: CallRequest, llm: LLMHandler | None) -> Outcome:
        """One call of score on a node; an Outcome whatever the metric or the cluster does."""
        try:
            payload = wire.to_worker(request)
        except Exception as exc:
            return Outcome(
                failure=Failure.EXCEPTION, error_type=type(exc).__name__,
                detail=f"the values to score cannot be sent to the Ray cluster ({exception_text(exc)}); give plain "
                "values (to_output=...), or use isolation='thread'",
            )
        host = self._take()
        if host is None:
            with self._cond:
                closed = self._closed
            return Outcome(failure=Failure.CRASHED, detail="this metric was closed; load it again to score more"
                           if closed else "no node of the Ray cluster can run the metric (every host was lost)")
        scope = CallScope()  # ended with the call: its llm() requests still waiting or retrying stop (context.py)
        try:
            return self._exchange(host, payload, scope.bind(llm))
        finally:
            scope.end()
            self._give_back(host)

    def _exchange(self, host: _Host, payload: bytes, llm: LLMHandler | None) -> Outcome:
        call_id = next(self._ids)
        deadline = time.monotonic() + self._deadline
        slots = threading.BoundedSemaphore(MAX_LLM_AT_ONCE)
        ray = self._ray
        try:
            ref = self._call(host.actor.start.remote, call_id, payload)
            while True:
                try:
                    event = _event(self._call(ray.get, ref, timeout=max(0.0, deadline - time.monotonic())))
                except ray.exceptions.GetTimeoutError:
                    self._lose(host)
                    return Outcome(failure=Failure.CRASHED, detail=f"the Ray node {host.node_id[:12]} did not answer "
                                   f"within {self._deadline:g} s (2 x timeout + {DEADLINE_MARGIN:g} s); it takes no "
                                   "more calls")
                kind = event.get("kind")
                if kind == "outcome":
                    return checked_again(wire.outcome_from_plain(event.get("outcome")), self.feedback_limit)
                if kind == "llm":
                    self._serve(host, call_id, event, llm, slots)
                elif kind != "pending":
                    return Outcome(failure=Failure.CRASHED, detail="the Ray node sent an unexpected reply")
                ref = self._call(host.actor.next_event.remote, call_id)
        except _Closed:
            return Outcome(failure=Failure.CRASHED, detail="this metric was closed during the call")
        except ray.exceptions.RayActorError as exc:
            self._lose(host)
            return Outcome(failure=Failure.CRASHED, detail=f"the Ray node running the call was lost "
                           f"({_ray_failure(exc)}); the run goes on without it")
        except Exception as exc:  # noqa: BLE001 - whatever went wrong with the cluster, the run goes on
            return Outcome(failure=Failure.CRASHED, detail=f"the call on the Ray cluster failed: {_ray_failure(exc)}")

    def _serve(self, host: _Host, call_id: int, event: dict[str, Any], llm: LLMHandler | None,
               slots: threading.BoundedSemaphore) -> None:
        """Answer a node's llm() request on the process's bounded llm() pool, with this process's judge; the call's
        clock runs on."""
        request_id = event.get("request")
        if not slots.acquire(blocking=False):
            self._reply(host, call_id, request_id, _llm_error(
                LLMCallError(f"more than {MAX_LLM_AT_ONCE} llm() calls at once from one metric call")))
            return

        def answer() -> None:
            instructions, input_text, settings = event.get("instructions"), event.get("input"), event.get("settings")
            try:
                settings = settings if isinstance(settings, dict) else {}
                if llm is None:
                    raise ModelNotConfigured(NO_JUDGE_MODEL)
                check_llm_arguments(instructions, input_text, settings)  # again here: a node is not trusted
                reply: dict[str, Any] = {"text": str(llm(instructions, input_text, settings))}  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - every failure is answered, or the call would wait
                reply = _llm_error(exc)
            finally:
                slots.release()
            self._reply(host, call_id, request_id, reply)

        llm_pool.submit(answer)

    def _reply(self, host: _Host, call_id: int, request_id: Any, reply: dict[str, Any]) -> None:
        try:
            self._call(host.actor.llm_reply.remote, call_id, request_id, reply)
        except Exception:  # noqa: BLE001 - the node is gone or the metric closed: nobody is waiting
            pass

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the node hosts and their workers; disconnect, and stop a local Ray the package started."""
        with self._cond:
            if self._closed:
                return
            hosts = list(self._hosts)
        stops = []
        for host in (host for host in hosts if not host.lost):
            try:
                stops.append(self._call(host.actor.stop.remote))
            except Exception:  # noqa: BLE001 - a lost host has nothing to stop
                pass
        if stops:
            try:
                self._call(self._ray.wait, stops, num_returns=len(stops), timeout=_STOP_WAIT)
            except Exception:  # noqa: BLE001
                pass
        for host in hosts:
            self._kill(host)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            end = time.monotonic() + _STOP_WAIT
            while self._busy and time.monotonic() < end:  # calls in flight see their host die, and stop calling Ray
                self._cond.wait(0.1)
        _session.release(self._ray)

    def host_pids(self) -> list[dict[str, Any]]:
        """Each live host's process id, node and metric workers' process ids (for tests and for the curious)."""
        with self._cond:
            hosts = [host for host in self._hosts if not host.lost]
        return [_event_plain(self._call(self._ray.get, host.actor.pids.remote(), timeout=30)) for host in hosts]


def _event_plain(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _event(data: Any) -> dict[str, Any]:
    """A node's event: bytes read with the class-refusing unpickler, bounded like a worker's messages."""
    if not isinstance(data, bytes) or len(data) > wire.MAX_MESSAGE:
        return {"kind": "malformed"}
    try:
        event = wire.from_worker(data)
    except Exception:  # noqa: BLE001 - a class or a broken pickle: the node is not trusted
        return {"kind": "malformed"}
    return event if isinstance(event, dict) else {"kind": "malformed"}


def _llm_error(exc: BaseException) -> dict[str, Any]:
    kind = judge_failure(exc)
    called = exc if isinstance(exc, LLMCallError) else None  # a failed call says its HTTP status
    return {"error": {
        "failure": str(kind or Failure.JUDGE_ERROR), "message": exception_text(exc) if kind is None else str(exc),
        "status": called.status if called else None, "refused": called.refused if called else False,
    }}


def _ray_failure(exc: BaseException) -> str:
    """A Ray error in one line (its full text holds a remote traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


# -- what travels to the nodes --------------------------------------------------------------------


def ship(source: Any, runtime_env: Mapping[str, Any] | None) -> tuple[bytes, dict[str, Any]]:
    """How a node finds the metric (pickled for its host) and the runtime_env that carries its code there.

    A metric file: its folder becomes the working_dir (unless one is given, which must then hold the file),
    and the node loads it by its path there. A module: by name, its top package shipped with py_modules when
    it is the user's own code. A `score` function: by value (cloudpickle), as to a local worker process; its
    module's folder is the working_dir when the function is pickled by reference from a file of the user's.
    """
    import cloudpickle

    env = dict(runtime_env or {})
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"metric file not found: {source}")
        return pickle.dumps(_relative_to_working_dir(path, env)), env
    if isinstance(source, ModuleType):
        file = getattr(source, "__file__", None)
        top = sys.modules.get(source.__name__.partition(".")[0])
        if source.__name__ == "__main__" or file is None:
            source = getattr(source, "score", source)  # sent by value below
        elif top is not None and getattr(top, "__path__", None) and _users_own(file):
            env["py_modules"] = [*env.get("py_modules", ()), top]  # a package of the user's: shipped, imported by name
            return pickle.dumps({"module": source.__name__}), env
        elif _users_own(file):
            return pickle.dumps(_relative_to_working_dir(Path(file).resolve(), env)), env
        else:
            return pickle.dumps({"module": source.__name__}), env  # installed on the nodes as on this machine
    module = sys.modules.get(getattr(source, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if module is not None and module.__name__ != "__main__" and file and _users_own(file) and "working_dir" not in env:
        env["working_dir"] = str(_import_root(module.__name__, Path(file).resolve()))
    try:
        return cloudpickle.dumps(source, protocol=wire.PROTOCOL), env
    except Exception as exc:
        raise MetricLoadError(
            f"{getattr(source, '__qualname__', type(source).__name__)} cannot be sent to the Ray cluster "
            f"({exception_text(exc)}); define score in a metric.py and load that file"
        ) from None


def _uploaded(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """The runtime_env with its local working_dir and py_modules uploaded to the cluster (gcs:// URIs).

    Ray uploads local folders only for a runtime_env given to ray.init(), and the package may be joining a Ray
    the user already started: so it uploads them itself with the functions ray.init() uses (private API of ray,
    checked against 2.60), respecting .gitignore/.rayignore and `excludes` as ray.init() does.
    """
    if not runtime_env.get("working_dir") and not runtime_env.get("py_modules"):
        return runtime_env
    import tempfile

    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
        from ray._private.runtime_env.working_dir import upload_working_dir_if_needed
    except ImportError as exc:
        raise WorkerError(
            f"this version of Ray lacks what skynet-dspy uses to ship the metric's code ({exc}; checked against ray "
            "2.60): pip install 'skynet-dspy[ray]' to get a Ray it knows"
        ) from None

    include_gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    with tempfile.TemporaryDirectory(prefix="skynet-dspy-ray-") as scratch:
        env = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=include_gitignore, scratch_dir=scratch,
                                          logger=logger)
        env = upload_working_dir_if_needed(env, include_gitignore=include_gitignore, scratch_dir=scratch,
                                           logger=logger)
    env.pop("excludes", None)
    return env


def _relative_to_working_dir(path: Path, env: dict[str, Any]) -> str:
    """The metric file's path on a node: relative to the working_dir it travels in."""
    given = env.get("working_dir")
    if given is None:
        env["working_dir"] = str(path.parent)
        return path.name
    if not isinstance(given, (str, Path)) or "://" in str(given):
        raise ValueError(
            "runtime_env['working_dir'] is a remote package, so the metric file cannot be found in it; give a local "
            "folder holding the metric file, or leave working_dir out (the metric's folder is shipped)"
        )
    folder = Path(given).expanduser().resolve()
    try:
        return str(path.relative_to(folder))
    except ValueError:
        raise ValueError(
            f"the metric file {path} is not inside runtime_env['working_dir'] ({folder}), so it would not reach the "
            "nodes; move it there, or leave working_dir out (the metric's folder is shipped)"
        ) from None


def _import_root(name: str, file: Path) -> Path:
    """The folder from which `import name` finds `file` (for a.b in /x/a/b.py: /x)."""
    depth = name.count(".") + 1 + (file.name == "__init__.py")
    return file.parents[depth - 1] if depth <= len(file.parents) else file.parent


def _users_own(file: str) -> bool:
    """Whether a module file is the user's code (not the standard library or an installed package)."""
    import sysconfig

    resolved = str(Path(file).resolve())
    installed = {sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return not any(resolved.startswith(str(Path(folder).resolve()) + os.sep) for folder in installed)
