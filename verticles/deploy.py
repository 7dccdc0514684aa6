"""The one place riqr's actors are created: names, namespace, lifetime and restart options.

Every verticle is a detached named actor in the riqr namespace, so it outlives the driver that made it
(``riqr up`` returns; the topology job comes and goes). Verticles ask for no CPU: they are I/O bound and
must never wait for Spark's tasks to free a slot. Query actors and the registry restart forever
(``max_restarts=-1``).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.catalog import StoreSpec
from runtime.config import REGISTRY_NAME, RuntimeConfig, facade_name, http_name
from verticles.facade import FacadeVerticle
from verticles.http import HttpVerticle
from verticles.query import QueryVerticle
from verticles.registry import Registry

__all__ = [
    "Deployment",
    "ensure_registry",
    "create_query_verticle",
    "up",
    "down",
    "alive_nodes",
    "kill_actors",
    "query_actor_infos",
    "http_endpoints",
]

log = logging.getLogger(__name__)

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _on_node(node_id: str | None, pinned: bool) -> dict[str, Any]:
    if node_id is None:
        return {}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=not pinned)}


def _verticle_options(
    name: str, namespace: str, node_id: str | None = None, *, pinned: bool = False, **extra: Any
) -> dict[str, Any]:
    """Options of a detached verticle. ``pinned``: it must run on ``node_id``; otherwise the node is only
    a preference that Ray may override."""
    return {
        "name": name,
        "namespace": namespace,
        "lifetime": "detached",
        "num_cpus": 0,
        **_on_node(node_id, pinned),
        **extra,
    }


def _actor_class(cls: type) -> Any:
    """``ray.remote`` applied to a verticle class (typed loosely: Ray's actor classes defeat mypy)."""
    return ray.remote(cls)


def _get(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get`` of one object ref, typed as what the verticle returns (Any to mypy)."""
    return ray.get(ref, timeout=timeout)


def alive_nodes() -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))


def ensure_registry(namespace: str) -> Any:
    """The registry of ``namespace``, created if missing."""
    options = _verticle_options(REGISTRY_NAME, namespace, get_if_exists=True, max_restarts=-1)
    handle = _actor_class(Registry).options(**options).remote(namespace)
    ray.get(handle.epoch.remote())
    return handle


def create_query_verticle(
    namespace: str, uuid: str, spec: StoreSpec, partitions: Sequence[int], node_id: str | None
) -> Any:
    """A query actor named ``uuid`` holding ``partitions`` of ``spec``, placed on ``node_id`` if alive."""
    # Pinned: a soft preference let Ray put both actors of a store on one node while the other node was
    # busy starting workers. A restarted actor answers 503 until rebuilt wherever it runs, so pinning
    # costs nothing today; moving partitions off a dead node is the registry's job (a later issue).
    options = _verticle_options(uuid, namespace, node_id, pinned=True, max_restarts=-1)
    return _actor_class(QueryVerticle).options(**options).remote(uuid, spec, list(partitions), namespace)


@dataclass(frozen=True)
class NodeEndpoint:
    node_id: str
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Deployment:
    namespace: str
    endpoints: tuple[NodeEndpoint, ...]


def up(config: RuntimeConfig, nodes: Sequence[str] | None = None) -> Deployment:
    """Deploy (or re-start) the registry, and a facade and an HTTP verticle on each node. Idempotent."""
    ns = config.namespace
    ensure_registry(ns)
    endpoints = []
    for node_id in nodes if nodes is not None else alive_nodes():
        facade = (
            _actor_class(FacadeVerticle)
            .options(
                **_verticle_options(facade_name(node_id), ns, node_id, pinned=True, get_if_exists=True, max_restarts=-1)
            )
            .remote(ns, config.request_timeout)
        )
        http = (
            _actor_class(HttpVerticle)
            .options(
                **_verticle_options(http_name(node_id), ns, node_id, pinned=True, get_if_exists=True, max_restarts=-1)
            )
            .remote(ns, config.http_host, config.http_port, config.advertise_host, config.request_timeout)
        )
        where = _get(http.start.remote())
        ray.get(facade.ready.remote())
        endpoints.append(NodeEndpoint(str(where["node_id"]), str(where["host"]), int(where["port"])))
    return Deployment(ns, tuple(endpoints))


def _named_in(namespace: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]


def kill_actors(namespace: str, names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


def query_actor_infos(namespace: str) -> list[dict[str, Any]]:
    """``info()`` of every live query actor in ``namespace`` (used by a restarted registry)."""
    handles = [ray.get_actor(n, namespace=namespace) for n in _named_in(namespace) if _UUID.match(n)]
    out: list[dict[str, Any]] = []
    for handle in handles:
        try:
            out.append(_get(handle.info.remote(), timeout=30))
        except Exception:  # an actor that cannot answer is left out; its partitions stay unassigned
            log.warning("a query actor did not answer while the registry rebuilt", exc_info=True)
    return out


def http_endpoints(namespace: str) -> list[dict[str, Any]]:
    """Where each serving HTTP verticle of ``namespace`` listens (used by a restarted registry)."""
    out: list[dict[str, Any]] = []
    for name in _named_in(namespace):
        if name.startswith("riqr-http-"):
            try:
                where: dict[str, Any] | None = _get(ray.get_actor(name, namespace=namespace).where.remote(), 30)
            except Exception:
                log.warning("HTTP verticle %s did not answer while the registry rebuilt", name, exc_info=True)
                continue
            if where is not None:
                out.append(where)
    return out


def down(namespace: str) -> list[str]:
    """Stop every riqr actor of ``namespace``: HTTP servers first, then facades, query actors, registry."""
    names = _named_in(namespace)
    for name in [n for n in names if n.startswith("riqr-http-")]:
        try:
            ray.get(ray.get_actor(name, namespace=namespace).stop.remote(), timeout=10)
        except Exception:
            log.warning("HTTP verticle %s did not stop cleanly", name, exc_info=True)
    order = sorted(names, key=lambda n: (n == REGISTRY_NAME, not n.startswith("riqr-"), n))
    kill_actors(namespace, order)
    return order
