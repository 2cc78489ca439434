"""isolation="ray": metric calls on a Ray cluster, each node running the package's own worker pool (ray_node.py).

The driver (the user's process) keeps a host actor per node, sends each call to the least busy one and keeps its
own deadline (2 x timeout + a margin): a call on a lost node scores `crashed`, never re-run. llm() is served
here, with this process's judge and keys; a node's replies are read by wire.py's class-refusing unpickler and
checked again. Ray is imported lazily (`pip install "skynet-dspy[ray]"`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..call import CallRequest
from ..context import CallScope, LLMHandler, answer_llm, llm_pool
from ..errors import MetricLoadError, WorkerError
from ..logs import logger
from ..secrets import env_credential, looks_like_credential
from ..types import Failure, Item, MetricInfo, Outcome
from ..values import exception_text, whole_number
from . import wire
from .process import DEFAULT_MAX_WORKERS
from .ray_node import DEADLINE_MARGIN, NodeHost
from .ray_session import START_TIMEOUT, session
from .ray_ship import ship, uploaded

REFRESH_EVERY = 10.0  # seconds between looks for nodes without a host (a new node, a lost host replaced)
_STOP_WAIT = 10.0  # seconds close() gives the node hosts to stop their workers before killing them
_NOT_LOADED = "skynet-dspy: a Ray node could not load the metric and takes no calls: %s"


@dataclass(frozen=True)
class RayCluster:
    """Where isolation="ray" runs the metric: `load_metric(..., isolation=skynet_dspy.RayCluster(...))`.

    Args:
        address: The cluster (as `ray.init(address=...)` takes it); None uses the Ray this process is already
            connected to, else RAY_ADDRESS, else a local Ray running on this machine (`ray start --head`), else a
            local Ray started by the package (and stopped at close()).
        workers_per_node: Metric worker processes on each node at most (calls in flight there); None: as many as
            the caller's threads need, up to the local pool's ceiling (32), as with isolation="process". Set it to
            the nodes' CPUs for a CPU-bound metric.
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
        if self.runtime_env is not None and not isinstance(self.runtime_env, Mapping):
            raise TypeError(
                f"RayCluster runtime_env must be a dict (Ray's runtime_env), got {type(self.runtime_env).__name__}"
            )
        check_runtime_env(self.runtime_env or {})


def check_runtime_env(runtime_env: Mapping[str, Any]) -> None:
    """ValueError for a runtime_env that would carry a credential to the cluster (the value is never shown)."""
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, Mapping):
        raise TypeError("runtime_env['env_vars'] must be a dict of environment variables")
    # the rule of the workers' environment: TOKENIZERS_PARALLELISM=false is a setting, not a key
    for name, value in env_vars.items():
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


# -- on the driver ----------------------------------------------------------------------------------


class _Closed(Exception):
    """The executor was closed: no Ray call is made any more (one would start a new local Ray)."""


@dataclass(eq=False)
class _Host:
    """One node's host actor, as the driver sees it."""

    actor: Any
    node_id: str
    in_flight: int = 0
    ready: bool = False  # loaded and not lost: it takes calls


class RayExecutor:
    """The metric on a Ray cluster: a host actor per node, calls spread over them, llm() served here."""

    def __init__(self, source: Any, timeout: float, feedback_limit: int, cluster: RayCluster,
                 workers: int | None = None, *, max_calls: int | None = None, max_memory: int | None = None):
        self.timeout = timeout
        self.feedback_limit = feedback_limit
        # calls in flight on a node at most: its pool grows to the calls it is sent, as a local one does
        self._per_node = cluster.workers_per_node or workers or DEFAULT_MAX_WORKERS
        self._pool = {"feedback_limit": feedback_limit, "max_workers": self._per_node, "max_calls": max_calls,
                      "max_memory": max_memory}  # each node's ProcessExecutor
        self._source, runtime_env = ship(source, cluster.runtime_env)
        self._deadline = 2 * timeout + DEADLINE_MARGIN
        self._cond = threading.Condition()
        self._hosts: list[_Host] = []
        self._busy = 0  # Ray calls in progress on the driver's threads
        self._closed = False
        self._ids = itertools.count(1)
        self._placing = threading.Lock()
        self._refreshed = 0.0
        self._ray = session.acquire(cluster.address)
        try:
            self.runtime_env = uploaded(runtime_env)  # what the node hosts get (code uploaded: gcs:// URIs)
            info = self._place()
            if info is None:
                raise WorkerError("the Ray cluster has no alive node to run the metric on")
            if isinstance(info, dict):  # no node loaded it: the first one's reason
                item = Item(info["item"]) if info.get("item") in set(Item) else Item.LOADS
                raise MetricLoadError(f"on the Ray cluster: {info.get('message')}", item)
        except BaseException:
            self.close()
            raise
        self.info: MetricInfo = info

    # -- the hosts ---------------------------------------------------------------------------

    def _place(self) -> MetricInfo | dict[str, Any] | None:
        """A host on every alive node without one: the metric's info, else why no host loaded (None: no node)."""
        with self._placing:
            self._refreshed = time.monotonic()
            with self._cond:
                hosted = {host.node_id for host in self._hosts}
            alive = [str(node["NodeID"]) for node in self._call(self._ray.nodes) if node.get("Alive")]
            loads = [self._start_host(node_id) for node_id in alive if node_id not in hosted]
            found = [self._loaded(host, ref) for host, ref in loads]
        problems = [reply for reply in found if isinstance(reply, dict)]
        info = next((reply for reply in found if isinstance(reply, MetricInfo)), None)
        if problems and info is not None:
            logger.warning(_NOT_LOADED, problems[0].get("message"))
        return info if info is not None else (problems[0] if problems else None)

    def _start_host(self, node_id: str) -> tuple[_Host, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {
            "num_cpus": 0, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 2 * self._per_node + 4,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        }
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        remote = self._ray.remote(NodeHost).options(**options).remote
        host = _Host(self._call(remote, self._source, self.timeout, self._pool), node_id)
        with self._cond:
            self._hosts.append(host)  # so close() stops it even while it loads
        return host, self._call(host.actor.load.remote)

    def _loaded(self, host: _Host, ref: Any) -> MetricInfo | dict[str, Any]:
        """The metric's info once the host has loaded it (it takes calls), else why not (the host is dropped)."""
        try:
            reply = self._get(ref, self.timeout + START_TIMEOUT)
        except _Closed:
            raise
        except Exception as exc:  # noqa: BLE001 - a node that cannot host the metric is left out
            reply = {"kind": "load_failed", "item": None, "message": _ray_failure(exc)}
        if reply.get("kind") == "loaded" and isinstance(reply.get("info"), dict):
            with self._cond:
                host.ready = True
                self._cond.notify_all()
            return wire.info_from_plain(reply["info"])
        self._drop(host)
        return reply

    def _refresh_later(self) -> None:
        """Look for nodes without a host (new ones, lost hosts to replace) in the background, now and then."""
        if time.monotonic() - self._refreshed < REFRESH_EVERY or self._placing.locked():
            return
        self._refreshed = time.monotonic()
        threading.Thread(target=self._refresh, name="skynet-ray-refresh", daemon=True).start()

    def _refresh(self) -> None:
        try:
            found = self._place()
        except _Closed:
            return
        except Exception as exc:  # noqa: BLE001 - the run goes on with the hosts it has
            logger.warning("skynet-dspy: looking for new Ray nodes failed: %s", exception_text(exc))
            return
        if isinstance(found, dict):
            logger.warning(_NOT_LOADED, found.get("message"))

    def _take(self) -> _Host | None:
        """The least busy host with room for one more call; None when closed or no node can host the metric."""
        self._refresh_later()
        host = self._free_host()
        if host is None and not self._closed:
            self._refresh()  # every host was lost: place new ones on the nodes still alive
            host = self._free_host()
        return host

    def _free_host(self) -> _Host | None:
        with self._cond:
            while not self._closed and any(host.ready for host in self._hosts):
                free = [host for host in self._hosts if host.ready and host.in_flight < self._per_node]
                if free:
                    host = min(free, key=lambda host: host.in_flight)
                    host.in_flight += 1
                    return host
                self._cond.wait()
        return None

    def _drop(self, host: _Host, lost: bool = False) -> None:
        """No more calls go to this host (its calls in flight fail); a lost one is replaced at the next call."""
        with self._cond:
            if host in self._hosts:
                self._hosts.remove(host)
            self._cond.notify_all()
        if lost:
            self._refreshed = 0.0
        with contextlib.suppress(Exception):  # already gone, or closed
            self._call(self._ray.kill, host.actor, no_restart=True)

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

    def _get(self, ref: Any, timeout: float) -> dict[str, Any]:
        """A node's reply, read with the class-refusing unpickler."""
        reply: dict[str, Any] = wire.from_worker(self._call(self._ray.get, ref, timeout=timeout))
        return reply

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
            return Outcome(failure=Failure.CRASHED, detail="this metric was closed; load it again to score more"
                           if self._closed else "no node of the Ray cluster can run the metric (every host was lost)")
        scope = CallScope()  # ended with the call: its llm() requests still waiting or retrying stop (context.py)
        try:
            return self._exchange(host, payload, scope.bind(llm))
        finally:
            scope.end()
            with self._cond:
                host.in_flight -= 1
                self._cond.notify()

    def _exchange(self, host: _Host, payload: bytes, llm: LLMHandler | None) -> Outcome:
        call_id = next(self._ids)
        deadline = time.monotonic() + self._deadline
        ray = self._ray
        try:
            ref = self._call(host.actor.start.remote, call_id, payload)
            while True:
                try:
                    event = self._get(ref, max(0.0, deadline - time.monotonic()))
                except ray.exceptions.GetTimeoutError:
                    self._drop(host, lost=True)
                    return Outcome(failure=Failure.CRASHED, detail=f"the Ray node {host.node_id[:12]} did not answer "
                                   f"within {self._deadline:g} s (2 x timeout + {DEADLINE_MARGIN:g} s); it takes no "
                                   "more calls")
                if event["kind"] == "outcome":
                    return wire.outcome_from_plain(event["outcome"], self.feedback_limit)
                self._serve(host, call_id, event, llm)  # an llm() request
                ref = self._call(host.actor.next_event.remote, call_id)
        except _Closed:
            return Outcome(failure=Failure.CRASHED, detail="this metric was closed during the call")
        except ray.exceptions.RayActorError as exc:
            self._drop(host, lost=True)
            return Outcome(failure=Failure.CRASHED, detail=f"the Ray node running the call was lost "
                           f"({_ray_failure(exc)}); the run goes on without it")
        except Exception as exc:  # noqa: BLE001 - whatever went wrong with the cluster, the run goes on
            return Outcome(failure=Failure.CRASHED, detail=f"the call on the Ray cluster failed: {_ray_failure(exc)}")

    def _serve(self, host: _Host, call_id: int, event: dict[str, Any], llm: LLMHandler | None) -> None:
        """Answer a node's llm() request on the process's llm() pool, with this process's judge (the call's clock
        runs on). The node's pool bounds the requests of one call, as locally."""

        def answer() -> None:
            reply = answer_llm(llm, event.get("instructions"), event.get("input"), event.get("settings"))
            with contextlib.suppress(Exception):  # the node is gone or the metric closed: nobody is waiting
                self._call(host.actor.llm_reply.remote, call_id, event.get("request"), reply)

        llm_pool.submit(answer)

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the node hosts and their workers; disconnect, and stop a local Ray the package started."""
        with self._cond:
            if self._closed:
                return
            hosts = list(self._hosts)
        with contextlib.suppress(Exception):  # hosts that do not stop in time are killed below
            stops = [self._call(host.actor.stop.remote) for host in hosts if host.ready]
            self._call(self._ray.wait, stops, num_returns=len(stops), timeout=_STOP_WAIT)
        for host in hosts:
            self._drop(host)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._busy, _STOP_WAIT)  # calls in flight see their host die, and end
        session.release(self._ray)

    def host_pids(self) -> list[dict[str, Any]]:
        """Each live host's process id, node and metric workers' process ids (for tests and for the curious)."""
        with self._cond:
            hosts = [host for host in self._hosts if host.ready]
        return [self._call(self._ray.get, host.actor.pids.remote(), timeout=30) for host in hosts]


def _ray_failure(exc: BaseException) -> str:
    """A Ray error in one line (its full text holds a remote traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]
