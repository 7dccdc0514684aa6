"""The metadata answers (seed 000's ``/metadata`` paths) and the store catalog, from the cached view."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from runtime.bus import Bus
from runtime.errors import PartitionUnavailable, RiqrError
from runtime.ownership import ActorInfo, ClusterView, OwnershipTable, Route

__all__ = ["instance_json", "instances", "catalog", "owner_of", "gather_positions", "Positions"]

# actor uuid -> partition -> {"source", "batch_id", "state"[, "reason"]}
Positions = dict[str, dict[int, dict[str, Any]]]


async def gather_positions(bus: Bus, uuids: Iterable[str], timeout: float) -> Positions:
    """Every listed actor's partition positions, asked in parallel; an actor that does not answer in time
    has its partitions reported ``unavailable`` with the reason, rather than failing the whole answer."""
    order = sorted(set(uuids))

    async def one(uuid: str) -> dict[int, dict[str, Any]]:
        async with asyncio.timeout(timeout):
            return await bus.owner(uuid).positions()

    answers = await asyncio.gather(*(one(u) for u in order), return_exceptions=True)
    out: Positions = {}
    for uuid, answer in zip(order, answers):
        if isinstance(answer, BaseException):
            reason = answer.message if isinstance(answer, RiqrError) else "the actor did not answer in time"
            out[uuid] = {-1: {"state": "unavailable", "reason": reason}}
        else:
            out[uuid] = answer
    return out


def _positions_json(info: ActorInfo, positions: Positions) -> list[dict[str, Any]]:
    known = positions.get(info.uuid, {})
    fallback = known.get(-1, {"state": "unknown"})
    return [{"partition": p, **known.get(p, fallback)} for p in info.partitions]


def instance_json(view: ClusterView, info: ActorInfo, positions: Positions | None = None) -> dict[str, Any]:
    """A seed-000 metadata instance for a query actor, plus riqr's fields: the actor, its node, its
    partitions (those it answers for, and those it holds a standby copy of) and, when known, each
    partition's position and state.

    ``host``/``port`` are the HTTP verticle on the actor's node, so a client that follows the metadata
    lands on the node holding the data.
    """
    endpoint = view.endpoints.get(info.node_id)
    table = view.tables.get(info.store)
    active = table.by_owner().get(info.uuid, []) if table is not None else list(info.partitions)
    out: dict[str, Any] = {
        "host": endpoint.host if endpoint else info.node_ip,
        "port": endpoint.port if endpoint else None,
        "state-store-names": [info.store],
        "actor": info.uuid,
        "node": info.node_id,
        "partitions": active,
        "standby-partitions": [p for p in info.partitions if p not in active],
    }
    if positions is not None:
        out["positions"] = _positions_json(info, positions)
    return out


def instances(view: ClusterView, positions: Positions, store: str | None = None) -> list[dict[str, Any]]:
    """Every query actor (of ``store``, if given) as a metadata instance, in a stable order."""
    infos = [i for i in view.actors.values() if store is None or i.store == store]
    infos.sort(key=lambda i: (i.store, i.partitions, i.uuid))
    return [instance_json(view, i, positions) for i in infos]


def catalog(view: ClusterView, positions: Positions, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The catalog entry of every store, by name, with its ingest state (as its sink last reported it)
    and each partition's position and state on the actor answering for it."""
    ingest = status.get("ingest", {})
    out = []
    for spec in view.stores():
        table = view.tables[spec.name]
        partitions = []
        for p, owners in enumerate(table.partitions):
            entry: dict[str, Any] = {"partition": p, "actor": owners.active}
            if owners.active is not None:
                known = positions.get(owners.active, {})
                entry.update(known.get(p, known.get(-1, {"state": "unknown"})))
            else:
                entry["state"] = "unassigned"
            partitions.append(entry)
        out.append({**spec.to_json(), "ingest": ingest.get(spec.name), "positions": partitions})
    return out


def owner_of(view: ClusterView, table: OwnershipTable, route: Route, positions: Positions) -> dict[str, Any]:
    """The instance that owns ``route``'s partition, with the partition and its standbys."""
    info = view.actors.get(route.owner)
    if info is None:
        raise PartitionUnavailable(
            f"the owner of partition {route.partition} of {table.spec.name} is not registered",
            store=table.spec.name,
            partition=route.partition,
        )
    standbys = [instance_json(view, view.actors[u], positions) for u in route.standbys if u in view.actors]
    return {**instance_json(view, info, positions), "partition": route.partition, "standbys": standbys}
