"""The one place riqr's actors are created: names, namespace, lifetime and restart options; and
``RayEnv``, the one implementation of what verticles need from Ray (``verticles.env``).

Nothing in ``runtime`` or in the other verticle modules imports this module: the registry gets a
``RayEnv`` to create query actors with, so this module sits at the top of the import graph.

Every verticle is a detached named actor in the riqr namespace, so it outlives the driver that made it
(``riqr up`` returns; the topology job comes and goes). Verticles ask for no CPU: they are I/O bound and
must never wait for Spark's tasks to free a slot. Every verticle restarts forever (``max_restarts=-1``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import ray._private.state as ray_state  # the GCS actor table: ray.util.state needs the dashboard
from ray.experimental import internal_kv  # the GCS key-value store (the stores' members)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime import logs, raycalls
from runtime.catalog import StoreSpec
from runtime.config import (
    PROBE_GROUP,
    RECLAIM_ENV,
    REGISTRY_NAME,
    ROCKSDB_CACHE_ENV,
    RuntimeConfig,
    facade_name,
    http_name,
    http_url,
    riqr_data,
)
from runtime.deadline import Deadline
from runtime.engines import Position
from runtime.errors import (
    CannotListen,
    DeadlineExceeded,
    DeploymentConflict,
    InternalError,
    NotConnected,
    OwnerUnavailable,
    RiqrError,
)
from runtime.membership import UndecodableRecord
from runtime.metrics import Metrics
from runtime.orphans import ACTOR_NAME
from runtime.ownership import ActorInfo, Endpoint, ReaderCopy
from runtime.partition import SERVING
from runtime.snapshots import SnapshotOffer
from verticles.metrics import RayMetricsExporter
from verticles.query import QueryVerticle

# The registry, facade and HTTP verticles (aiohttp, the REST layer, JWT) are imported where they are
# deployed, not here: every query actor's process imports this module to unpickle its ``RayEnv``, and
# they cost it 0.4-0.5 s of CPU at start (docs/benchmarks.md, "Demo start-up").
if TYPE_CHECKING:
    from runtime.auth import DeploymentSecrets

__all__ = [
    "RayEnv",
    "RaySnapshotPeer",
    "Deployment",
    "NodeEndpoint",
    "ensure_registry",
    "deployment_secrets",
    "existing_secrets",
    "up",
    "down",
    "alive_nodes",
]

log = logging.getLogger(__name__)

_CALL_TIMEOUT = 30.0
# Exporting a snapshot checksums every file of the partition on the peer: allow for a large one.
_EXPORT_TIMEOUT = 300.0
# The registry looks for dead nodes this often; a check that re-creates actors may take a while.
_NODE_CHECK_EVERY = 1.0
_CHECK_TIMEOUT = 300.0
# Re-creating query actors together: the deadline grows by this much per actor (each a process to start).
_START_SECONDS_EACH = 2.0
# How long the registry waits for a query actor that is back to say what it serves (it blocks the
# registry meanwhile, so short; a copy that does not answer in time is asked again at the next check).
_PROBE_TIMEOUT = 0.5
# How long the registry keeps a query actor's handle for its pings before it looks it up again.
_PING_HANDLE_SECONDS = 60.0
# Threads of the registry's "watch" group: facades waiting for the next epoch (``Registry.wait_epoch``).
_EPOCH_WATCHERS = 64
# Threads of a query actor: reads go on while one thread applies a batch (docs/benchmarks.md).
_QUERY_THREADS = 4
# The GCS key-value namespace of what riqr keeps there (the stores' members, keyed by riqr namespace).
_KV_NAMESPACE = "riqr"


def _options(name: str, namespace: str, node_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """Options of a detached verticle, pinned to ``node_id`` when one is given.

    Pinned (hard affinity): with a soft preference Ray put both actors of a store, or a node's HTTP
    verticle, on one node while the other node was busy starting workers. A query actor of a node that
    died is re-created by the registry on a live node (``RayEnv.replace_query_actors``, docs/design.md
    "Node loss"), which chooses that node by the replicas' placement rule rather than leaving it to Ray.
    """
    strategy = {} if node_id is None else {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
    # The log, engine and reclaim settings of whoever deploys (`RIQR_LOG_FORMAT=json riqr up`) reach every
    # verticle, and through the registry's environment the query actors it creates.
    forwarded = (logs.LEVEL_ENV, logs.FORMAT_ENV, ROCKSDB_CACHE_ENV, RECLAIM_ENV)
    env = {k: os.environ[k] for k in forwarded if os.environ.get(k)}
    runtime_env = {"runtime_env": {"env_vars": env}} if env else {}
    return {"name": name, "namespace": namespace, "lifetime": "detached", "num_cpus": 0, "max_restarts": -1,
            **strategy, **runtime_env, **extra}  # fmt: skip


def _remote(cls: type, **options: Any) -> Any:
    """``ray.remote`` applied to a verticle class (typed loosely: Ray's actor classes defeat mypy)."""
    return ray.remote(**options)(cls) if options else ray.remote(cls)


def _query_actor(uuid: str, namespace: str, node_id: str | None) -> Any:
    """The query actor ``uuid``'s class for Ray, with its options: ``_QUERY_THREADS`` threads for its calls,
    and one more of its own for ``ping`` (``PROBE_GROUP``), which long calls on the others do not hold up."""
    actor = _remote(QueryVerticle, concurrency_groups={PROBE_GROUP: 1})
    return actor.options(**_options(uuid, namespace, node_id, max_concurrency=_QUERY_THREADS))


def alive_nodes() -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))


def _named_in(namespace: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]


class RayEnv:
    """What a verticle of ``namespace`` needs from Ray. Picklable: it travels to the actors it serves,
    which call it inside their own process."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        # The registry's pings' handles: uuid -> (handle, when looked up) (``send_ping``).
        self._ping_handles: dict[str, tuple[Any, float]] = {}
        self._pings_swept = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        return {"namespace": self.namespace}  # handles stay in the process that looked them up

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["namespace"])  # type: ignore[misc]

    # -- NodeFacts --------------------------------------------------------------------------------------

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def node_ip(self) -> str:
        return str(ray.util.get_node_ip_address())

    def restarted(self) -> bool:
        # Ray's property reads its own deprecated ``actor_id``: every query actor's log had the warning.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)

    def data_dir(self) -> Path | None:
        return riqr_data(self.namespace)

    def export_metrics(self, metrics: Metrics) -> None:
        RayMetricsExporter(metrics).start()

    def known_actors(self) -> set[str]:
        names = set(_named_in(self.namespace))
        view = raycalls.get(self._registry().view.remote(), "registry view", timeout=_CALL_TIMEOUT)
        names.update(view.actors)
        for table in view.tables.values():
            names.update(table.all_owners())
        return names

    # -- RegistryLink -----------------------------------------------------------------------------------

    def _registry(self) -> Any:
        return ray.get_actor(REGISTRY_NAME, namespace=self.namespace)

    async def _ask_registry(self, method: str, *args: Any) -> Any:
        """The registry's answer to ``method``, asked again while it restarts and waited for no longer than
        ``_CALL_TIMEOUT`` in all (``DeadlineExceeded``): a registry busy with one long call must not hold a
        verticle's start or stop for as long as that call takes."""
        remote = getattr(self._registry(), method).remote
        deadline = Deadline.after(_CALL_TIMEOUT)
        return await raycalls.call_within(lambda: remote(*args), f"registry {method}", deadline=deadline)

    async def _tell_registry(self, method: str, *args: Any) -> None:
        """``_ask_registry`` for a verticle that is stopping: a registry gone (``riqr down``), dying during the
        call or not answering in time is logged, and the stop goes on. What it was told catches up by
        itself: the sink drops a read replica it cannot deliver to, and a node's next HTTP verticle
        registers its endpoint again."""
        try:
            await self._ask_registry(method, *args)
        except ValueError:  # the registry is gone already (riqr down)
            pass
        except RiqrError as err:  # not in time, or it died during the call
            log.warning("the registry did not answer %s (%s); stopping without it", method, err.message)

    def report_moved(self, uuid: str, node_id: str, node_ip: str) -> None:
        try:
            self._registry().actor_moved.remote(uuid, node_id, node_ip)
        except ValueError:
            log.warning("registry not found while reporting the restart of %s", uuid)

    def report_restart(self, uuid: str, node_id: str, node_ip: str) -> None:
        try:
            registry = self._registry()
        except ValueError:
            raise NotConnected(f"no registry in namespace {self.namespace!r} to tell of the restart") from None
        raycalls.get(registry.actor_moved.remote(uuid, node_id, node_ip), "telling the registry of the restart",
                     timeout=_CALL_TIMEOUT)  # fmt: skip

    async def endpoint_of(self, node_id: str) -> Endpoint | None:
        view = await self._ask_registry("view")
        endpoint: Endpoint | None = view.endpoints.get(node_id)
        return endpoint

    async def register_endpoint(self, endpoint: Endpoint) -> None:
        await self._ask_registry("register_endpoint", endpoint.node_id, endpoint.host, endpoint.port)

    async def unregister_endpoint(self, node_id: str) -> None:
        await self._tell_registry("unregister_endpoint", node_id)

    async def add_reader(self, reader: ReaderCopy) -> int:
        return int(await self._ask_registry("add_reader", reader))

    async def drop_reader(self, uuid: str, reason: str) -> None:
        await self._tell_registry("drop_reader", uuid, reason)

    # -- PeerLink ---------------------------------------------------------------------------------------

    def holders(self, store: str, partition: int) -> list[str]:
        view = raycalls.get(self._registry().view.remote(), "registry view", timeout=_CALL_TIMEOUT)
        table = view.table(store)
        if table is None or partition >= len(table.partitions):
            return []
        owners = table.partitions[partition]
        return [u for u in (owners.active, *owners.standbys) if u is not None]

    def snapshot_peer(self, uuid: str) -> RaySnapshotPeer:
        return RaySnapshotPeer(self.namespace, uuid)

    def reset_refused(self, store: str, source: str) -> str | None:
        reg = self._registry()
        if not hasattr(reg, "reset_refused"):  # a registry of an earlier riqr: it cannot say
            return None
        why: str | None = raycalls.get(reg.reset_refused.remote(store, source), "the registry's word on a reset",
                                       timeout=_CALL_TIMEOUT)  # fmt: skip
        return why

    # -- ClusterOps -------------------------------------------------------------------------------------

    def alive_nodes(self) -> list[str]:
        return alive_nodes()

    def start_query_actors(
        self, stores: Sequence[tuple[StoreSpec, Sequence[tuple[str, Sequence[int], str | None]]]]
    ) -> list[list[ActorInfo]]:
        # Every actor is asked for before waiting on any: Ray starts their worker processes side by side
        # rather than a store's pair after the other's (docs/benchmarks.md, "Demo start-up").
        handles = [
            [
                _query_actor(uuid, self.namespace, node_id).remote(uuid, spec, list(partitions), self)
                for uuid, partitions, node_id in members
            ]
            for spec, members in stores
        ]
        names = ", ".join(spec.name for spec, _ in stores)
        where = iter(raycalls.get([h.ready.remote() for hs in handles for h in hs], f"starting the actors of {names}"))
        return [
            [ActorInfo(uuid, spec.name, w["node_id"], w["node_ip"], tuple(partitions)) for (uuid, partitions, _), w in
             zip(members, where)]
            for spec, members in stores
        ]  # fmt: skip

    def replace_query_actors(
        self, asks: Sequence[tuple[StoreSpec, str, Sequence[int], str]]
    ) -> list[ActorInfo | Exception]:
        for _, uuid, _, _ in asks:
            self._ping_handles.pop(uuid, None)  # the new actor under this name is another: its pings too
            with contextlib.suppress(ValueError):  # its node is gone: stop Ray from waiting for it forever
                ray.kill(ray.get_actor(uuid, namespace=self.namespace), no_restart=True)
        # One deadline for all, with room for their processes starting side by side on a few cores.
        deadline = Deadline.after(_CALL_TIMEOUT + _START_SECONDS_EACH * len(asks))
        starting: list[Any] = []
        for spec, uuid, partitions, node_id in asks:
            try:
                starting.append(self._create_replacement(spec, uuid, partitions, node_id, deadline).ready.remote())
            except Exception as err:  # noqa: BLE001 - said for this one; the others go on
                starting.append(err)
        out: list[ActorInfo | Exception] = []
        for (spec, uuid, partitions, _), ready in zip(asks, starting, strict=True):
            if isinstance(ready, Exception):
                out.append(ready)
                continue
            try:
                where = raycalls.get(ready, f"re-creating query actor {uuid}", timeout=max(0.0, deadline.remaining()))
            except Exception as err:  # noqa: BLE001 - its constructor failed, or it did not start in time
                out.append(err)
                continue
            out.append(ActorInfo(uuid, spec.name, where["node_id"], where["node_ip"], tuple(partitions)))
        return out

    def _create_replacement(
        self, spec: StoreSpec, uuid: str, partitions: Sequence[int], node_id: str, deadline: Deadline
    ) -> Any:
        while True:
            try:
                return _query_actor(uuid, self.namespace, node_id).remote(
                    uuid, spec, list(partitions), self, replacement=True
                )
            except ValueError:  # the killed actor's name is not released yet
                if deadline.remaining() <= 0:
                    raise
                time.sleep(0.1)

    def start_joining_actor(self, spec: StoreSpec, uuid: str, partitions: Sequence[int], node_id: str) -> None:
        # Not waited for: the mover looks it up by name (again until it is listed) and waits for ``ready``.
        # One that never starts is destroyed by its move's give-up or the registry's check
        # (``MOVE_START_SECONDS``), and one found by a restarted registry is dropped (``joining``).
        _query_actor(uuid, self.namespace, node_id).remote(uuid, spec, list(partitions), self, joining=True)

    def query_actor_tell(self, uuid: str, method: str) -> None:
        _submit_unless_gone(self.namespace, uuid, method, f"{method} on query actor {uuid}")

    def query_actor_call(self, uuid: str, method: str, *args: Any) -> Any:
        try:
            handle = ray.get_actor(uuid, namespace=self.namespace)
        except ValueError as err:
            raise OwnerUnavailable(f"query actor {uuid} is not running", actors=[uuid]) from err
        return raycalls.get(getattr(handle, method).remote(*args), f"{method} on query actor {uuid}",
                            timeout=_CALL_TIMEOUT, actor=uuid)  # fmt: skip

    def unavailable_actors(self, uuids: Sequence[str]) -> set[str]:
        # Ray's actor table, filtered to live actors by the GCS; names are uuids, unique across namespaces.
        alive = {a["Name"] for a in ray_state.actors(actor_state_name="ALIVE").values()}
        return {u for u in uuids if u not in alive}

    def vanished_actors(self, uuids: Sequence[str]) -> set[str] | None:
        # Names are released when an actor is dead for good and kept while it restarts (measured: a
        # restarting actor stays listed), so a missing name is an actor Ray will not bring back.
        names = set(_named_in(self.namespace))
        if REGISTRY_NAME not in names:  # the registry asking is alive and named: this listing is not whole
            return None
        return {u for u in uuids if u not in names}

    def serving_partitions(self, uuid: str) -> set[int]:
        try:
            handle = ray.get_actor(uuid, namespace=self.namespace)
            positions = raycalls.get(handle.positions.remote(), "positions", timeout=_PROBE_TIMEOUT)
        except Exception:
            return set()
        return {p for p, pos in positions.items() if pos.get("state") == SERVING}

    def send_ping(self, uuid: str) -> Any:
        # A GCS lookup per ping was one a second per five actors on the registry's one thread: handles are
        # kept for a minute, and dropped when the registry kills or re-creates the actor (a new actor under
        # the name has a new handle; the old one's pings fail at once, which counts as answered).
        now = time.monotonic()
        if now - self._pings_swept > _PING_HANDLE_SECONDS:  # actors no longer pinged (dropped, moved away)
            self._pings_swept = now
            kept = {u: c for u, c in self._ping_handles.items() if now - c[1] <= _PING_HANDLE_SECONDS}
            self._ping_handles = kept
        cached = self._ping_handles.get(uuid)
        if cached is None or now - cached[1] > _PING_HANDLE_SECONDS:
            cached = self._ping_handles[uuid] = (ray.get_actor(uuid, namespace=self.namespace), now)
        return cached[0].ping.options(concurrency_group=PROBE_GROUP).remote()

    def pings_answered(self, pings: Sequence[Any]) -> list[bool]:
        done, _ = ray.wait(list(pings), num_returns=len(pings), timeout=0, fetch_local=False)
        finished = set(done)
        return [ping in finished for ping in pings]

    def restart_actor(self, uuid: str) -> None:
        self._ping_handles.pop(uuid, None)
        # Ray asks the worker to exit and, when it does not within its kill_worker_timeout_milliseconds (5 s
        # by default; a stopped process cannot), its raylet SIGKILLs it; either way Ray restarts the actor.
        ray.kill(ray.get_actor(uuid, namespace=self.namespace), no_restart=False)

    def watch_nodes(self) -> None:
        def watch() -> None:
            while True:
                time.sleep(_NODE_CHECK_EVERY)
                try:  # through the actor's own queue, so the check never runs beside another call
                    raycalls.get(self._registry().check_nodes.remote(), "checking nodes", timeout=_CHECK_TIMEOUT)
                except Exception:
                    log.warning("checking for dead nodes failed", exc_info=True)

        threading.Thread(target=watch, name="riqr-node-watch", daemon=True).start()

    # The stores' members (``runtime.membership``) live in Ray's GCS key-value store: the registry is not
    # pinned to a node, so a file on the node it ran on may not be where it restarts, while the GCS outlives
    # every actor (Ray Serve's controller keeps its own checkpoint there the same way). The API is Ray's
    # internal one (``ray.experimental.internal_kv``), stable across Ray 2.x.
    def _membership_key(self) -> bytes:
        return f"riqr/{self.namespace}/members".encode()

    def load_membership(self) -> dict[str, Any] | None:
        raw = internal_kv._internal_kv_get(self._membership_key(), namespace=_KV_NAMESPACE)
        if raw is None:
            return None
        try:
            record: dict[str, Any] = json.loads(raw)
        except ValueError as err:
            raise UndecodableRecord(str(err)) from err
        return record

    def save_membership(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, sort_keys=True).encode()
        internal_kv._internal_kv_put(self._membership_key(), data, overwrite=True, namespace=_KV_NAMESPACE)

    def forget_membership(self) -> None:
        internal_kv._internal_kv_del(self._membership_key(), namespace=_KV_NAMESPACE)

    def query_actor_infos(self) -> list[dict[str, Any]]:
        """Every query actor's ``info()``; one that cannot answer (hung, or pinned to a node that is gone)
        is left out (the saved members remember it)."""
        names = [n for n in _named_in(self.namespace) if ACTOR_NAME.match(n)]
        return self._ask_each(names, "info", "query actor")

    def http_endpoints(self) -> list[Endpoint]:
        """Where each HTTP verticle listens (one that cannot answer is left out)."""
        names = [n for n in _named_in(self.namespace) if n.startswith("riqr-http-")]
        return [
            Endpoint(str(where["node_id"]), str(where["host"]), int(where["port"]))
            for where in self._ask_each(names, "where", "HTTP verticle")
            if where is not None
        ]

    def nodes_with_verticles(self) -> set[str] | None:
        prefix = http_name("")
        try:
            names = _named_in(self.namespace)
        except Exception:  # noqa: BLE001 - the GCS not answering now: the caller tries again later
            log.warning("could not list the HTTP verticles", exc_info=True)
            return None
        return {n[len(prefix) :] for n in names if n.startswith(prefix)}

    def start_verticles(self, node_id: str, cursor_key: bytes, among: Collection[str]) -> _Joining | None:
        """Ask the HTTP verticles of the nodes ``among`` for their settings (``HttpVerticle.deployment``),
        not waiting: the first answer is the new node's settings (``verticles_started`` starts the verticles
        with it)."""
        asked: list[Any] = []
        for name in sorted(http_name(n) for n in among if n != node_id):
            with contextlib.suppress(ValueError, AttributeError):  # gone meanwhile, or of an earlier riqr
                asked.append(ray.get_actor(name, namespace=self.namespace).deployment.remote())
        return _Joining(node_id, cursor_key, asked) if asked else None

    def verticles_started(self, starting: _Joining, *, give_up: bool = False) -> tuple[bool, str] | None:
        if starting.started is None:
            settings = _first_answer(starting.asked)
            if settings is None:
                return (False, "no running REST API said its settings in time") if give_up else None
            if isinstance(settings, BaseException):
                return False, f"no running REST API said its settings ({settings})"
            starting.started = _start_node_verticles(self.namespace, starting.node_id, starting.cursor_key, **settings)
        http, serving, ready = starting.started
        done, _ = ray.wait([serving, ready], num_returns=2, timeout=0)
        if len(done) < 2 and not give_up:
            return None
        try:
            if len(done) < 2:
                raise DeadlineExceeded("it did not start serving in time")
            where = raycalls.get(serving, f"starting the REST API on node {starting.node_id}", timeout=_CALL_TIMEOUT)
            raycalls.get(ready, f"starting the facade on node {starting.node_id}", timeout=_CALL_TIMEOUT)
        except Exception as err:  # noqa: BLE001 - its port taken, its start timed out, its node gone meanwhile
            # An HTTP verticle that is not serving is stopped (as `up` stops one that cannot listen): left,
            # its name would make the node look served, and the next attempt would find it as it is.
            with contextlib.suppress(Exception):
                ray.kill(http, no_restart=True)
            return False, err.message if isinstance(err, CannotListen) else str(err)
        return True, http_url(str(where["host"]), int(where["port"]))

    def _ask_each(self, names: Sequence[str], method: str, kind: str) -> list[Any]:
        """The answers of the actors ``names`` to ``method``, asked of all at once and waited for within one
        ``_CALL_TIMEOUT``, for a rebuilding registry: actors that do not answer cost that once, not each.
        Those that cannot be asked or do not answer are logged and left out."""
        calls: list[tuple[str, Any]] = []
        for name in names:
            try:
                calls.append((name, getattr(ray.get_actor(name, namespace=self.namespace), method).remote()))
            except Exception:
                log.warning("%s %s could not be asked while the registry rebuilt", kind, name, exc_info=True)
        out: list[Any] = []
        deadline = Deadline.after(_CALL_TIMEOUT)
        for name, ref in calls:
            try:
                out.append(raycalls.get(ref, method, timeout=max(0.0, deadline.remaining())))
            except Exception:
                log.warning("%s %s did not answer while the registry rebuilt", kind, name, exc_info=True)
        return out

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)

    def destroy(self, uuids: Sequence[str]) -> None:
        """Each actor deletes its data, then is killed. The calls go out together and are waited for within
        one ``_CALL_TIMEOUT``, so actors that do not answer hold the caller (the registry, whose calls run
        one at a time) that long once, not each in turn."""
        calls = [(uuid, _submit_unless_gone(self.namespace, uuid, "destroy", _deleting(uuid))) for uuid in uuids]
        deadline = Deadline.after(_CALL_TIMEOUT)
        for uuid, ref in calls:
            if ref is not None:
                _await_unless_dead(ref, uuid, _deleting(uuid), max(0.0, deadline.remaining()))
        self.kill(uuids)


@dataclass
class _Joining:
    """A node's verticles being started by the registry (``RayEnv.start_verticles``): the running HTTP
    verticles asked for their settings, then the new verticles and their start calls."""

    node_id: str
    cursor_key: bytes
    asked: list[Any]
    started: tuple[Any, Any, Any] | None = None  # the HTTP verticle, its ``start``, the facade's ``ready``


def _first_answer(refs: list[Any]) -> Any:
    """The first of ``refs`` that answered, without waiting; None while none has and some still may; the
    last error once every one failed."""
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    error: BaseException | None = None
    for ref in done:
        try:
            return raycalls.get(ref, "asking a REST API its settings", timeout=_CALL_TIMEOUT)
        except Exception as err:  # noqa: BLE001 - gone, or of an earlier riqr: another may answer
            error = err
    return error if len(done) == len(refs) else None


def _start_node_verticles(
    namespace: str,
    node_id: str,
    cursor_key: bytes,
    *,
    host: str,
    port: int,
    advertise_host: str | None,
    timeout: float,
    auth: Any,
) -> tuple[Any, Any, Any]:
    """Create ``node_id``'s facade and HTTP verticle (or find them: ``get_if_exists``) and call their start,
    not waiting; returns the HTTP verticle, its ``start`` and the facade's ``ready``."""
    from verticles.bus import RayBus
    from verticles.facade import FacadeVerticle
    from verticles.http import HttpVerticle

    bus = RayBus(namespace, timeout)
    facade = (
        _remote(FacadeVerticle)
        .options(**_options(facade_name(node_id), namespace, node_id, get_if_exists=True))
        .remote(bus, timeout, cursor_key=cursor_key)
    )
    http = (
        _remote(HttpVerticle)
        .options(**_options(http_name(node_id), namespace, node_id, get_if_exists=True))
        .remote(bus, RayEnv(namespace), host, port, advertise_host, timeout, auth=auth, cursor_key=cursor_key)
    )
    return http, http.start.remote(), facade.ready.remote()


def _deleting(uuid: str) -> str:
    return f"deleting the data of query actor {uuid}"


class RaySnapshotPeer:
    """A query actor as a source of partition snapshots (``runtime.snapshots.SnapshotPeer``), over Ray."""

    def __init__(self, namespace: str, uuid: str) -> None:
        self.uuid = uuid
        try:
            self._handle = ray.get_actor(uuid, namespace=namespace)
        except ValueError:
            raise OwnerUnavailable(f"query actor {uuid} is not running", actor=uuid) from None

    def open_snapshot(self, partition: int, at_least: Position | None = None) -> SnapshotOffer:
        """``at_least`` only when given, and asked again without it of a peer whose riqr predates it (a
        restarted actor runs newer code than its peers during an upgrade): that peer exports whatever it
        holds, and the receiver compares positions itself (``Rebuilder._open``)."""
        args: tuple[Any, ...] = (partition,) if at_least is None else (partition, at_least)
        try:
            return self._export(args)
        except (InternalError, TypeError) as err:
            if at_least is None or not raycalls.refused_arguments(err):
                raise
            return self._export((partition,))

    def _export(self, args: tuple[Any, ...]) -> SnapshotOffer:
        ref: Any = self._handle.open_snapshot.remote(*args)
        offer: SnapshotOffer = raycalls.get(ref, "exporting a snapshot", timeout=_EXPORT_TIMEOUT, actor=self.uuid)
        return offer

    def read_snapshot(self, token: str, path: str, offset: int, length: int) -> bytes:
        data: bytes = raycalls.get(self._handle.read_snapshot.remote(token, path, offset, length),
                                   "copying a snapshot", timeout=_CALL_TIMEOUT, actor=self.uuid)  # fmt: skip
        return data

    def close_snapshot(self, token: str) -> None:
        raycalls.get(self._handle.close_snapshot.remote(token), "closing a snapshot export", timeout=_CALL_TIMEOUT,
                     actor=self.uuid)  # fmt: skip


def _call_unless_dead(namespace: str, name: str, method: str, what: str, timeout: float = _CALL_TIMEOUT) -> None:
    """Call ``method`` of the actor ``name`` and wait, for teardown (``riqr down``, dropping a store).

    An actor that is gone or dead already (killed, its node lost) is the expected case there: one line at
    info, since a dead actor's data goes with it or stays on its node's disk. Anything else is a real
    failure: a warning, with the traceback when the error is not one riqr knows.
    """
    ref = _submit_unless_gone(namespace, name, method, what)
    if ref is not None:
        _await_unless_dead(ref, name, what, timeout)


def _submit_unless_gone(namespace: str, name: str, method: str, what: str) -> Any | None:
    """``method`` of the actor ``name`` called, or None (logged at info) if Ray has no actor of that name."""
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        log.info("%s: the actor is gone already", what, extra={"actor": name})
        return None
    try:
        return getattr(handle, method).remote()
    except Exception:  # as a failed wait would be: logged, and the caller goes on with the others
        log.warning("%s failed: the call could not be sent", what, exc_info=True, extra={"actor": name})
        return None


def _await_unless_dead(ref: Any, name: str, what: str, timeout: float) -> None:
    """Wait for a call ``_submit_unless_gone`` made: see ``_call_unless_dead``."""
    try:
        ray.get(ref, timeout=timeout)
    except Exception as exc:
        if raycalls.is_dead(exc):
            log.info("%s: the actor is dead already", what, extra={"actor": name})
            return
        try:
            err = raycalls.translate(exc, what, actor=name)
        except Exception:
            log.warning("%s failed", what, exc_info=True, extra={"actor": name})
            return
        if err.code == "internal":
            log.warning("%s failed: %s", what, err.message, exc_info=exc, extra={"actor": name})
        else:
            log.warning("%s failed: %s", what, err.message, extra={"actor": name})


@dataclass(frozen=True)
class NodeEndpoint:
    node_id: str
    host: str
    port: int
    auth: str = "off"  # the running verticle's AuthConfig.fingerprint(), or "unknown"
    kept: tuple[str, ...] = ()  # settings this node's running verticle keeps against what `up` asked

    @property
    def auth_enabled(self) -> bool:
        return self.auth != "off"  # "unknown" counts as on: every riqr verticle checks tokens unless told not to

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)


@dataclass(frozen=True)
class Deployment:
    namespace: str
    endpoints: tuple[NodeEndpoint, ...]


def ensure_registry(namespace: str, placement: Mapping[str, Any] | None = None) -> Any:
    """The registry of ``namespace``, created if missing (with fresh deployment secrets; an existing
    registry keeps its own), and started. A new one goes where Ray places it; ``placement`` adds Ray actor
    options for that, other than its name and namespace (``resources``: the tests use a custom resource to
    put it on a node they remove, and on the node it restarts on)."""
    handle, _ = _registry(namespace, placement)
    raycalls.get(handle.epoch.remote(), "starting the registry")
    return handle


# The secrets of the registries this process created, by namespace, with the registry's actor id: they
# are known without waiting for the registry's process to start, which a deployment then does beside the
# verticles' (docs/benchmarks.md, "Deploying"). The id tells a later registry (after `riqr down`) apart.
_CREATED: dict[str, tuple[str, DeploymentSecrets]] = {}
_CREATED_LOCK = threading.Lock()


def _registry(namespace: str, placement: Mapping[str, Any] | None = None) -> tuple[Any, DeploymentSecrets | None]:
    """The registry's handle, not waited for, and its secrets when this process created it."""
    from runtime.auth import DeploymentSecrets
    from verticles.registry import Registry, recreate_after, restart_silent_after

    try:
        handle = ray.get_actor(REGISTRY_NAME, namespace=namespace)
    except ValueError:
        secrets = DeploymentSecrets.generate()
        # Epoch watchers in a group of their own; other calls one at a time.
        registry = _remote(Registry, concurrency_groups={"watch": _EPOCH_WATCHERS})
        registry = registry.options(**_options(REGISTRY_NAME, namespace, **dict(placement or {})))
        args = (namespace, RayEnv(namespace))
        try:
            # Ray takes the name at once or refuses it (ActorAlreadyExistsError, a ValueError): of two
            # deployments racing, one creates the registry and the other finds it.
            handle = registry.remote(
                *args, secrets=secrets, recreate_after=recreate_after(), restart_silent_after=restart_silent_after()
            )
        except ValueError as taken:
            try:
                handle = ray.get_actor(REGISTRY_NAME, namespace=namespace)
            except ValueError:
                raise taken from None  # not a name taken: the creation's own error
        else:
            with _CREATED_LOCK:
                _CREATED[namespace] = (handle._actor_id.hex(), secrets)
    with _CREATED_LOCK:
        created = _CREATED.get(namespace)
    return handle, created[1] if created is not None and created[0] == handle._actor_id.hex() else None


def deployment_secrets(namespace: str) -> DeploymentSecrets:
    """The cursor key and token secret of ``namespace``'s deployment (creating its registry if needed;
    a registry this process created is not waited for)."""
    return _registry_and_secrets(namespace)[1]


def _registry_and_secrets(namespace: str) -> tuple[Any, DeploymentSecrets]:
    """``_registry``, and its secrets asked of it when this process did not create it."""
    handle, secrets = _registry(namespace)
    if secrets is None:
        secrets = raycalls.get(handle.secrets.remote(), "the deployment's keys")
    return handle, secrets


def existing_secrets(namespace: str) -> DeploymentSecrets | None:
    """The secrets of a deployment that is up, or None (``riqr token`` must not create a registry)."""
    try:
        handle = ray.get_actor(REGISTRY_NAME, namespace=namespace)
    except ValueError:
        return None
    secrets: DeploymentSecrets = raycalls.get(handle.secrets.remote(), "the deployment's keys", timeout=_CALL_TIMEOUT)
    return secrets


def token_refusal(namespace: str, token: str) -> str | None:
    """Why the REST API of ``namespace`` would refuse ``token`` (asked of one node's HTTP verticle; they
    all run with the same settings), or None when it takes it or no HTTP verticle answers."""
    prefix = http_name("")
    for name in sorted(n for n in _named_in(namespace) if n.startswith(prefix)):
        try:
            refusal: str | None = raycalls.get(
                ray.get_actor(name, namespace=namespace).token_refusal.remote(token), "checking the token",
                timeout=_CALL_TIMEOUT,
            )  # fmt: skip
        except (ValueError, OwnerUnavailable, DeadlineExceeded, AttributeError):
            # gone meanwhile, its node gone or slow, or a verticle of an earlier riqr: ask another
            continue
        return refusal
    return None


def up(config: RuntimeConfig, nodes: Sequence[str] | None = None, *, follow: bool | None = None) -> Deployment:
    """Deploy (or re-start) the registry, and a facade and an HTTP verticle on each node (``nodes``: those
    only). Idempotent: a verticle that is running already keeps its settings (``riqr down`` first to change
    auth or binding); each endpoint says whether its REST API checks tokens and which settings it kept
    against ``config``. A new registry starts beside the verticles: one that fails to start fails ``up``
    once they have started, and ``riqr down`` removes them.

    ``follow`` (by default when ``nodes`` is None: every node): once every verticle serves, the registry
    gives each node that joins later a facade and an HTTP verticle too, with the settings the running ones
    serve with (``Registry.follow_nodes``), until ``riqr down``."""
    from verticles.http import http_settings

    ns = config.namespace
    registry, secrets = _registry_and_secrets(ns)
    cursor_key = secrets.cursor_key
    # A `riqr down` that stopped after retiring the registry (interrupted) left it running but retired:
    # this deployment wants it re-creating actors and promoting standbys again. Waited for with the
    # verticles: a registry just created starts beside them.
    resumed = registry.resume.remote()
    asked = http_settings(config.http_host, config.http_port, config.advertise_host, config.auth)
    targets = list(nodes if nodes is not None else alive_nodes())
    _refuse_other_settings_for_new_nodes(ns, targets, asked)
    # Every node's verticles are created first and waited for together: each is a new worker process
    # (seconds to start and import), so the nodes start side by side rather than one after the other.
    starting = []
    for node_id in targets:
        http, serving, ready = _start_node_verticles(
            ns, node_id, cursor_key, host=config.http_host, port=config.http_port,
            advertise_host=config.advertise_host, timeout=config.request_timeout, auth=config.auth,
        )  # fmt: skip
        starting.append((node_id, http, serving, ready))
    raycalls.get(resumed, "starting the registry")
    endpoints = []
    unbound: dict[str, list[str]] = {}  # why, and the nodes it is why for
    for node_id, http, serving, ready in starting:
        try:
            where = raycalls.get(serving, f"starting the REST API on node {node_id}")
        except CannotListen as err:
            # It serves nothing, and kept as it is it would try the same address at the next ``up``
            # (``get_if_exists`` finds it with its first settings): gone, so a retry with another port works.
            ray.kill(http, no_restart=True)
            unbound.setdefault(err.message, []).append(node_id[:12])
            continue
        raycalls.get(ready, f"starting the facade on node {node_id}")
        # A verticle of an earlier riqr does not say what it was started with: its auth is "unknown".
        running = where.get("settings", {})
        endpoints.append(
            NodeEndpoint(
                str(where["node_id"]),
                str(where["host"]),
                int(where["port"]),
                auth=str(running.get("auth", "unknown")),
                kept=kept_settings(running, asked),
            )
        )
    if unbound:
        said = "; ".join(f"{why} (node {', '.join(nodes)})" for why, nodes in unbound.items())
        raise CannotListen(f"{said}: free it, or choose another --host or --port")
    if nodes is None if follow is None else follow:
        try:
            following = registry.follow_nodes.remote()
        except AttributeError:  # a registry of an earlier riqr, still running: it cannot
            log.warning("the running registry is of an earlier riqr: nodes that join get no REST API by "
                        "themselves until riqr down and riqr up")  # fmt: skip
        else:
            raycalls.get(following, "telling the registry to serve nodes that join")
    return Deployment(ns, tuple(endpoints))


def _refuse_other_settings_for_new_nodes(namespace: str, targets: Sequence[str], asked: Mapping[str, Any]) -> None:
    """``DeploymentConflict``, before anything is created, when ``up`` would start HTTP verticles on nodes
    that have none (nodes that joined since the first ``up``, or came back with a new id) with other auth
    than the running verticles keep: without it, a second ``up`` from a shell without the first one's
    ``RIQR_JWT_SECRET_FILE``, or with ``--no-auth``, left new nodes on another key or without auth beside
    nodes that check tokens."""
    prefix = http_name("")
    named = set(_named_in(namespace))
    new = [n for n in targets if http_name(n) not in named]
    if not new:
        return
    for name in sorted(n for n in named if n.startswith(prefix)):
        try:
            verticle = ray.get_actor(name, namespace=namespace)
            where = raycalls.get(verticle.start.remote(), "asking a REST API its settings", timeout=_CALL_TIMEOUT)
        except (ValueError, OwnerUnavailable, DeadlineExceeded, CannotListen):
            continue  # gone meanwhile, its node gone or slow, or it cannot bind: ask another
        running = where.get("settings") or {}
        # Auth only: a port or host that differs is what the bind error advises ("choose another --port")
        # for a node whose address was taken, and is said as kept settings afterwards.
        differs = _auth_kept(running, asked) if running else None
        if differs is not None:
            raise DeploymentConflict(
                f"the running REST API keeps its auth ({differs}), and {len(new)} node(s) without one "
                "would get this instead: run riqr up with the auth settings it first ran with (RIQR_JWT_*, "
                "RIQR_AUTH, --no-auth), or riqr down first, which deletes the stores' data"
            )
        return


def kept_settings(running: Mapping[str, Any], asked: Mapping[str, Any]) -> tuple[str, ...]:
    """What a running HTTP verticle serves that differs from what ``up`` asked for, one phrase each
    (``riqr up`` is idempotent: a verticle that runs already keeps its settings until ``riqr down``)."""
    if not running:
        return ("settings it cannot report (a verticle of an earlier riqr)",)
    auth = _auth_kept(running, asked)
    kept = [] if auth is None else [auth]
    for key, label in (("host", "listening on"), ("port", "port"), ("advertise_host", "advertising")):
        if key in running and running[key] != asked[key]:
            what, wanted = (_setting(key, running[key]), _setting(key, asked[key]))
            kept.append(f"{label} {what} (asked: {wanted})")
    return tuple(kept)


def _auth_kept(running: Mapping[str, Any], asked: Mapping[str, Any]) -> str | None:
    """The phrase for a running HTTP verticle's auth when it differs from what ``up`` asked, else None."""
    have, want = running.get("auth", "off"), asked["auth"]
    if have == want:
        return None
    if "off" in (have, want):
        return f"REST auth {'off' if have == 'off' else 'on'} (asked: {'off' if want == 'off' else 'on'})"
    return "REST auth with other keys or token settings than asked"


def _setting(key: str, value: Any) -> str:
    if key == "port":
        return str(value) if value else "any free one"
    return str(value) if value else "its bound address"


def is_up(namespace: str) -> bool:
    """Whether any riqr actor runs in ``namespace`` (its registry, a verticle or a query actor)."""
    return any(n.startswith("riqr-") or ACTOR_NAME.match(n) for n in _named_in(namespace))  # the registry's too


def down(namespace: str) -> list[str]:
    """Stop every riqr actor of ``namespace``: HTTP servers first, then facades, query actors, registry.

    The registry is told first to stop re-creating query actors and promoting standbys (``retire``, which
    waits for a re-creation under way), and only then are the names listed: it would otherwise create
    again the query actors killed here. A query actor that appears anyway (``retire`` timed out behind
    long re-creations) is found by a last listing, once the registry is gone, and stopped too."""
    _call_unless_dead(namespace, REGISTRY_NAME, "retire", "telling the registry that the runtime goes down",
                      timeout=_CHECK_TIMEOUT)  # fmt: skip
    names = _named_in(namespace)
    for name in [n for n in names if n.startswith("riqr-http-")]:
        _call_unless_dead(namespace, name, "stop", f"stopping HTTP verticle {name}", timeout=10)
    order = sorted(names, key=lambda n: (n == REGISTRY_NAME, not n.startswith("riqr-"), n))
    env = RayEnv(namespace)
    # riqr down removes the stores' state too: new actors of a later riqr up start empty and are rebuilt
    # by the topology (docs/design.md, "Durability").
    env.destroy([n for n in order if ACTOR_NAME.match(n)])
    if REGISTRY_NAME in names:
        _call_unless_dead(namespace, REGISTRY_NAME, "forget_records", "deleting the registry's records")
    env.kill(order)
    now = _named_in(namespace)
    late = [n for n in now if ACTOR_NAME.match(n) and n not in names]
    if late:
        log.warning("query actors %s were created while riqr down ran; stopping them too", late)
        env.destroy(late)
    verticles = [n for n in now if n.startswith(("riqr-http-", "riqr-facade-")) and n not in names]
    if verticles:  # started for a node that joined, by a registry whose retire timed out
        log.warning("verticles %s were created while riqr down ran; stopping them too", verticles)
        env.kill(verticles)
    return order + late + verticles
