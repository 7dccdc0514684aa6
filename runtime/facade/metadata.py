"""The metadata answers (seed 000's ``/metadata`` paths) and the store catalog, from the cached view."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from runtime.bus import Bus
from runtime.errors import PartitionUnavailable, RiqrError
from runtime.lag import Newest, with_lag
from runtime.ownership import ActorInfo, ClusterView, OwnershipTable, Route

__all__ = [
    "instance_json",
    "instances",
    "catalog",
    "owner_of",
    "gather_positions",
    "replicas",
    "newest_batches",
    "Positions",
    "Ingest",
    "POSITIONS_DEADLINE",
]

# actor uuid -> partition -> {"source", "batch_id", "state"[, "reason"]}
Positions = dict[str, dict[int, dict[str, Any]]]
# store -> its entry in the registry's status["ingest"] (runtime.feeds.FeedBook.status)
Ingest = dict[str, dict[str, Any]]

# Seconds a copy has to say its positions for the catalog and the metadata answers (a small call that
# takes no lock): past it the copy shows ``unavailable``. With the request's deadline (10 s), one frozen
# actor held ``GET /stores``, ``/metadata``, `riqr status` and the console for 10 s each, just when an
# operator looks (a black-box run). Longer than ``/ready``'s 1 s probe: these answers say more.
POSITIONS_DEADLINE = 2.0


def newest_batches(ingest: Ingest | None) -> dict[str, Newest | None]:
    """Each store's newest acknowledged batch (``runtime.lag``), from the registry's ingest status."""
    return {store: Newest.from_ingest(entry) for store, entry in (ingest or {}).items()}


def public_ingest(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A store's ingest record as the catalog shows it: without the acknowledgement times (``acked``),
    which only serve to compute lag."""
    if entry is None:
        return None
    return {k: v for k, v in entry.items() if k != "acked"}


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


def _position(positions: Positions, uuid: str, partition: int) -> dict[str, Any]:
    known = positions.get(uuid, {})
    return dict(known.get(partition, known.get(-1, {"state": "unknown"})))


def _positions_json(
    info: ActorInfo, positions: Positions, active: list[int], newest: Newest | None
) -> list[dict[str, Any]]:
    return [
        {"partition": p, **with_lag(_position(positions, info.uuid, p), "active" if p in active else "standby", newest)}
        for p in info.partitions
    ]


def instance_json(
    view: ClusterView, info: ActorInfo, positions: Positions | None = None, newest: Newest | None = None
) -> dict[str, Any]:
    """A seed-000 metadata instance for a query actor, plus riqr's fields: the actor, its node, its
    partitions (those it answers for, and those it holds a standby copy of) and, when known, each
    partition's position, state, role, replica state and lag behind ``newest`` (``runtime.lag``).

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
        out["positions"] = _positions_json(info, positions, active, newest)
    return out


def instances(
    view: ClusterView, positions: Positions, store: str | None = None, ingest: Ingest | None = None
) -> list[dict[str, Any]]:
    """Every query actor (of ``store``, if given) as a metadata instance, in a stable order; with the
    registry's ``ingest`` status, each partition's lag behind its store's newest acknowledged batch."""
    newest = newest_batches(ingest)
    infos = [i for i in view.actors.values() if store is None or i.store == store]
    infos.sort(key=lambda i: (i.store, i.partitions, i.uuid))
    return [instance_json(view, i, positions, newest.get(i.store)) for i in infos]


def replicas(
    view: ClusterView, table: OwnershipTable, partition: int, positions: Positions, newest: Newest | None
) -> list[dict[str, Any]]:
    """Every copy of ``partition``, the active first then each standby in the table's order: its actor,
    node, position, partition state, replica state and lag (``runtime.lag``). A copy with no owner is
    ``unavailable``."""
    owners = table.partitions[partition]
    out = []
    for role, uuid in [("active", owners.active), *(("standby", u) for u in owners.standbys)]:
        if uuid is None:
            out.append(with_lag({"actor": None, "node": None, "state": "unassigned"}, role, newest))
            continue
        info = view.actors.get(uuid)
        node = info.node_id if info is not None else None
        out.append(with_lag({"actor": uuid, "node": node, **_position(positions, uuid, partition)}, role, newest))
    return out


def catalog(view: ClusterView, positions: Positions, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The catalog entry of every store, by name, with its ingest state (as its sink last reported it)
    and, per partition, the active copy's position, state and lag (the fields of old) and ``replicas``:
    every copy's (``replicas``)."""
    ingest = status.get("ingest", {})
    newest = newest_batches(ingest)
    out = []
    for spec in view.stores():
        table = view.tables[spec.name]
        partitions = []
        for p, owners in enumerate(table.partitions):
            copies = replicas(view, table, p, positions, newest.get(spec.name))
            entry: dict[str, Any] = {"partition": p, "actor": owners.active}
            if owners.active is not None:
                entry.update(_position(positions, owners.active, p))
            else:
                entry["state"] = "unassigned"
            active = copies[0]
            entry.update(
                replica_state=active["replica_state"],
                lag_batches=active["lag_batches"],
                lag_seconds=active["lag_seconds"],
                replicas=copies,
            )
            partitions.append(entry)
        out.append({**spec.to_json(), "ingest": public_ingest(ingest.get(spec.name)), "positions": partitions})
    return out


def owner_of(
    view: ClusterView, table: OwnershipTable, route: Route, positions: Positions, ingest: Ingest | None = None
) -> dict[str, Any]:
    """The instance that owns ``route``'s partition, with the partition, its standbys and ``replicas``:
    every copy of the partition with its position, replica state and lag (``replicas``)."""
    info = view.actors.get(route.owner)
    if info is None:
        raise PartitionUnavailable(
            f"the owner of partition {route.partition} of {table.spec.name} is not registered",
            store=table.spec.name,
            partition=route.partition,
        )
    newest = newest_batches(ingest).get(table.spec.name)
    standbys = [instance_json(view, view.actors[u], positions, newest) for u in route.standbys if u in view.actors]
    return {
        **instance_json(view, info, positions, newest),
        "partition": route.partition,
        "standbys": standbys,
        "replicas": replicas(view, table, route.partition, positions, newest),
    }
