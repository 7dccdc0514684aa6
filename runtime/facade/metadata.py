"""The metadata answers (seed 000's ``/metadata`` paths) and the store catalog, from the cached view."""

from __future__ import annotations

from typing import Any

from runtime.errors import PartitionUnavailable
from runtime.ownership import ActorInfo, ClusterView, OwnershipTable, Route

__all__ = ["instance_json", "instances", "catalog", "owner_of"]


def instance_json(view: ClusterView, info: ActorInfo) -> dict[str, Any]:
    """A seed-000 metadata instance for a query actor, plus riqr's fields.

    ``host``/``port`` are the HTTP verticle on the actor's node, so a client that follows the metadata
    lands on the node holding the data.
    """
    endpoint = view.endpoints.get(info.node_id)
    return {
        "host": endpoint.host if endpoint else info.node_ip,
        "port": endpoint.port if endpoint else None,
        "state-store-names": [info.store],
        "actor": info.uuid,
        "node": info.node_id,
        "partitions": list(info.partitions),
    }


def instances(view: ClusterView, store: str | None = None) -> list[dict[str, Any]]:
    """Every query actor (of ``store``, if given) as a metadata instance, in a stable order."""
    infos = [i for i in view.actors.values() if store is None or i.store == store]
    infos.sort(key=lambda i: (i.store, i.partitions, i.uuid))
    return [instance_json(view, i) for i in infos]


def catalog(view: ClusterView) -> list[dict[str, Any]]:
    """The catalog entry of every store, by name."""
    return [spec.to_json() for spec in view.stores()]


def owner_of(view: ClusterView, table: OwnershipTable, route: Route) -> dict[str, Any]:
    """The instance that owns ``route``'s partition, with the partition and its standbys."""
    info = view.actors.get(route.owner)
    if info is None:
        raise PartitionUnavailable(
            f"the owner of partition {route.partition} of {table.spec.name} is not registered",
            store=table.spec.name,
            partition=route.partition,
        )
    standbys = [instance_json(view, view.actors[u]) for u in route.standbys if u in view.actors]
    return {**instance_json(view, info), "partition": route.partition, "standbys": standbys}
