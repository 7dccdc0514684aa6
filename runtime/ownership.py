"""Ownership as a value: who holds which partition, the cluster view, and placement planning.

``OwnershipTable.resolve`` returns a verdict, never raises: a ``Route`` to the active owner, or an
``Unassigned`` saying the partition has no owner, which the facade turns into a 503. ``ClusterView`` is
the whole immutable picture a facade caches (catalog, tables, actors, HTTP endpoints) with the epoch that
grows on every change; a facade refreshes when it sees a newer epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.catalog import StoreSpec
from runtime.partitioner import partition_of_bytes

__all__ = [
    "PartitionOwners",
    "OwnershipTable",
    "Route",
    "Unassigned",
    "ActorInfo",
    "Endpoint",
    "ReaderCopy",
    "ClusterView",
    "plan_placement",
    "Placement",
    "replacement_node",
    "table_from_holdings",
]


@dataclass(frozen=True)
class PartitionOwners:
    """The active owner of a partition and its standbys, by actor uuid."""

    active: str | None
    standbys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Route:
    """Verdict: ask ``owner`` about ``partition``."""

    partition: int
    owner: str
    standbys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unassigned:
    """Verdict: ``partition`` has no active owner right now."""

    partition: int


@dataclass(frozen=True)
class OwnershipTable:
    """Partition -> owners for one store."""

    spec: StoreSpec
    partitions: tuple[PartitionOwners, ...]
    # Query actors this store had before a move replaced them (``runtime.moves``) or the registry removed
    # them (``RegistryState.remove_actor``: ``riqr standbys``, a move given up): a topology that declared the
    # store with those still feeds the same store, not one dropped and declared again, and a cursor one of
    # them issued is the store's still (``runtime.cursor``).
    moved_from: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if len(self.partitions) != self.spec.partitions:
            raise ValueError(
                f"table for {self.spec.name} has {len(self.partitions)} entries, spec says {self.spec.partitions}"
            )

    def partition_of(self, key: Any) -> int:
        """The partition of an internal key (only its partition column counts)."""
        return partition_of_bytes(self.spec.key.canonical_bytes(key), self.spec.partitions)

    def route(self, partition: int) -> Route | Unassigned:
        owners = self.partitions[partition]
        if owners.active is None:
            return Unassigned(partition)
        return Route(partition, owners.active, owners.standbys)

    def resolve(self, key: Any) -> Route | Unassigned:
        """The verdict for a typed key."""
        return self.route(self.partition_of(key))

    def by_owner(self) -> dict[str, list[int]]:
        """Active owner uuid -> the partitions it answers for, in partition order."""
        out: dict[str, list[int]] = {}
        for p, owners in enumerate(self.partitions):
            if owners.active is not None:
                out.setdefault(owners.active, []).append(p)
        return out

    def promote(self, down: Set[str]) -> OwnershipTable:
        """This table with every partition whose active is in ``down`` answered for by its first standby
        that is not; the old active becomes the last standby (it still holds a copy and gets every batch).
        Partitions with no such standby keep their active. The same table if nothing changed."""
        owners = list(self.partitions)
        for p, current in enumerate(owners):
            if current.active is None or current.active not in down:
                continue
            up = [u for u in current.standbys if u not in down]
            if up:
                owners[p] = _with_active(current, up[0])
        return self if owners == list(self.partitions) else replace(self, partitions=tuple(owners))

    def with_active(self, partition: int, uuid: str) -> OwnershipTable:
        """This table with ``uuid``, which must hold a copy of ``partition``, as its active."""
        current = self.partitions[partition]
        if current.active == uuid:
            return self
        if uuid not in current.standbys:
            raise ValueError(f"{uuid} holds no copy of partition {partition} of {self.spec.name}")
        owners = list(self.partitions)
        owners[partition] = _with_active(current, uuid)
        return replace(self, partitions=tuple(owners))

    def with_joining(self, old: str, new: str, partitions: Sequence[int] | None = None) -> OwnershipTable:
        """This table with ``new`` as the last standby of every partition ``old`` holds a copy of (or of
        ``partitions``, which ``old`` must hold): a move's first step, or a standby added (``runtime.moves``).
        The sink delivers every batch to it from then on, and it is the last copy a read fails over to
        while it catches up."""
        held = set(self.all_owners().get(old, ()))
        if not held:
            raise ValueError(f"{old} holds no copy of store {self.spec.name}")
        if partitions is not None:
            if not partitions or not set(partitions) <= held:
                raise ValueError(f"{old} does not hold partitions {sorted(partitions)} of store {self.spec.name}")
            held = set(partitions)
        if new in self.all_owners():
            raise ValueError(f"{new} already holds copies of store {self.spec.name}")
        owners = tuple(
            replace(o, standbys=(*o.standbys, new)) if p in held else o for p, o in enumerate(self.partitions)
        )
        return replace(self, partitions=owners)

    def with_replaced(self, old: str, new: str) -> OwnershipTable:
        """This table with ``new`` in ``old``'s place in every partition (active where ``old`` was active,
        the same standby rank where it was a standby) and ``old`` gone: a move's switch. ``new`` must hold
        a copy of exactly the partitions ``old`` holds (``with_joining``)."""
        holdings = self.all_owners()
        if sorted(holdings.get(old, ())) != sorted(holdings.get(new, ())) or old == new or old not in holdings:
            raise ValueError(f"{new} does not hold the copies {old} holds in store {self.spec.name}")
        owners = []
        for o in self.partitions:
            holders = [u for u in (o.active, *o.standbys) if u is not None]
            if old not in holders:
                owners.append(o)
                continue
            # ``new`` where ``old`` was, and nowhere else (a promotion, or a restarted registry, may have
            # made it the active already).
            if o.active == new:  # it answers already: it keeps answering, ``old`` just goes
                owners.append(PartitionOwners(new, tuple(u for u in o.standbys if u != old)))
                continue
            ranked = [new if u == old else u for u in holders if u != new]
            owners.append(PartitionOwners(ranked[0], tuple(ranked[1:])))
        return replace(self, partitions=tuple(owners), moved_from=self.moved_from | {old})

    def without_standby(self, uuid: str) -> OwnershipTable:
        """This table with ``uuid`` no longer a standby anywhere (a move given up: ``with_joining`` undone).
        ``ValueError`` if it answers for a partition."""
        if any(o.active == uuid for o in self.partitions):
            raise ValueError(f"{uuid} answers for a partition of store {self.spec.name}")
        owners = tuple(replace(o, standbys=tuple(u for u in o.standbys if u != uuid)) for o in self.partitions)
        return replace(self, partitions=owners)

    def fewest_standbys(self) -> int:
        """The fewest standby copies any partition has (a store's ``standbys`` as its table stands)."""
        return min(len(o.standbys) for o in self.partitions)

    def lineage(self) -> frozenset[str]:
        """Every query actor that holds or held copies of this store (moves give new actors): a feed that
        declared the store with any of them feeds this store."""
        return frozenset(self.all_owners()) | self.moved_from

    def unassigned(self) -> list[int]:
        return [p for p, owners in enumerate(self.partitions) if owners.active is None]

    def all_owners(self) -> dict[str, list[int]]:
        """Every actor (active or standby) -> the partitions it holds a copy of."""
        out: dict[str, list[int]] = {}
        for p, owners in enumerate(self.partitions):
            for uuid in ((owners.active,) if owners.active else ()) + owners.standbys:
                out.setdefault(uuid, []).append(p)
        return out


def _with_active(owners: PartitionOwners, uuid: str) -> PartitionOwners:
    rest = tuple(u for u in owners.standbys if u != uuid)
    return PartitionOwners(uuid, rest + ((owners.active,) if owners.active else ()))


@dataclass(frozen=True)
class ActorInfo:
    """A query actor: its uuid (its name on the bus), its store, where it runs, what it holds, and its
    ``incarnation``: the registry's epoch when it listed the actor or last heard it restarted
    (``RegistryState.install``, ``actor_moved``), so it only grows, across a registry restart too (a
    restarted registry's epochs start past every earlier one). A batch's delivery that sees it change goes
    to that copy again: a restarted copy may have lost what it acknowledged
    (``BatchDelivery._to_copies_changed_meanwhile``)."""

    uuid: str
    store: str
    node_id: str
    node_ip: str
    partitions: tuple[int, ...]
    incarnation: int = 0


@dataclass(frozen=True)
class Endpoint:
    """The HTTP verticle of a node."""

    node_id: str
    host: str
    port: int


@dataclass(frozen=True)
class ReaderCopy:
    """A read replica: a copy of every partition of ``store`` kept inside the HTTP verticle ``actor`` on
    ``node_id``, which answers that verticle's key lookups without a Ray hop (``runtime.readreplica``).
    The sink feeds it with the standbys; it is never promoted and no other facade reads it."""

    uuid: str
    store: str
    node_id: str
    actor: str


@dataclass(frozen=True)
class ClusterView:
    """Everything a facade needs to route, as one immutable value stamped with an epoch."""

    epoch: int = 0
    tables: Mapping[str, OwnershipTable] = field(default_factory=dict)
    actors: Mapping[str, ActorInfo] = field(default_factory=dict)
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict)
    readers: Mapping[str, ReaderCopy] = field(default_factory=dict)

    def table(self, store: str) -> OwnershipTable | None:
        return self.tables.get(store)

    def readers_of(self, store: str) -> list[ReaderCopy]:
        """The read replicas of ``store``, by uuid."""
        return sorted((r for r in self.readers.values() if r.store == store), key=lambda r: r.uuid)

    def stores(self) -> list[StoreSpec]:
        return [self.tables[name].spec for name in sorted(self.tables)]


@dataclass(frozen=True)
class Placement:
    """One planned query actor: its index within the store, the node to place it on, its partitions."""

    index: int
    node_id: str | None
    partitions: tuple[int, ...]


def plan_placement(spec: StoreSpec, nodes: Sequence[str]) -> list[Placement]:
    """Spread a store's actors over nodes round-robin, and its partitions over actors round-robin.

    Partition ``p`` goes to actor ``p % actors``; actor ``i`` to node ``nodes[i % len(nodes)]`` (sorted,
    so the plan is deterministic). With no known node the placement is left to Ray.
    """
    ordered = sorted(nodes)
    plans = []
    for i in range(spec.actors):
        parts = tuple(p for p in range(spec.partitions) if p % spec.actors == i)
        node = ordered[i % len(ordered)] if ordered else None
        plans.append(Placement(i, node, parts))
    return plans


def table_from_placement(spec: StoreSpec, uuids: Sequence[str], plans: Sequence[Placement]) -> OwnershipTable:
    """The ownership table for actors created from ``plans`` (``uuids[i]`` runs ``plans[i]``).

    Standbys, when asked for, are actors further round the ring, never the active itself, and never on a
    node that already holds a copy of the partition while an actor on another node is left: so a node's
    loss takes at most one copy of any partition when there are enough nodes.
    """
    if spec.standbys is None:
        raise ValueError(f"store {spec.name}: decide its standbys (StoreSpec.with_standbys_for) before placing it")
    owners: list[PartitionOwners] = []
    holder = {p: i for i, plan in enumerate(plans) for p in plan.partitions}
    n = len(plans)
    wanted = min(spec.standbys, n - 1)
    for p in range(spec.partitions):
        i = holder[p]
        ring = [(i + k) % n for k in range(1, n)]
        chosen: list[int] = []
        nodes = {plans[i].node_id}
        for j in ring:  # first, actors on nodes without a copy yet
            if len(chosen) < wanted and plans[j].node_id not in nodes:
                chosen.append(j)
                nodes.add(plans[j].node_id)
        for j in ring:  # then any other actor, when there are fewer nodes than copies
            if len(chosen) < wanted and j not in chosen:
                chosen.append(j)
        owners.append(PartitionOwners(uuids[i], tuple(uuids[j] for j in chosen)))
    return OwnershipTable(spec, tuple(owners))


def replacement_node(
    table: OwnershipTable, actors: Mapping[str, ActorInfo], uuid: str, alive: Sequence[str]
) -> str | None:
    """The live node to re-create actor ``uuid`` of ``table``'s store on when its node is gone.

    The placement rule of ``table_from_placement``, for one actor: a node holding no other copy of any
    partition ``uuid`` holds, while there is one; among those (or among all live nodes when every one
    holds such a copy) the node with the fewest of the store's actors, then the smallest id, so the choice
    is deterministic. Copies on dead nodes do not count: they are being moved too. None: no live node.
    """
    live = set(alive)
    if not live:
        return None
    mine = set(table.all_owners().get(uuid, ()))
    peers = {u for u, parts in table.all_owners().items() if u != uuid and mine & set(parts)}
    taken = {actors[u].node_id for u in peers if u in actors and actors[u].node_id in live}
    load = {n: 0 for n in live}
    for u, info in actors.items():
        if info.store == table.spec.name and u != uuid and info.node_id in load:
            load[info.node_id] += 1
    free = sorted(live - taken) or sorted(live)
    return min(free, key=lambda n: (load[n], n))


def table_from_holdings(
    spec: StoreSpec, holdings: Mapping[str, Sequence[int]], actives: Sequence[str | None] = ()
) -> OwnershipTable:
    """An ownership table rebuilt from what each actor holds (a restarted registry asks the actors).

    The actors know which partitions they hold a copy of, not which copy was active: ``actives`` (the
    saved members' record of them, partition by partition) says. A partition whose saved active still
    holds it gets it back; the others' actives are dealt out evenly: partition ``p``'s is the ``p``-th of
    its holders (sorted by uuid) round the ring. The other holders are standbys in ring order. Every copy
    serves reads alike (the in-sync rule is the copy's own, and facades refuse older copies), so dealing
    only balances the load, but keeping the saved actives keeps a store's own actors answering for their
    partitions, and so the copies ``riqr standbys`` added removable.
    ``KeyError`` when a partition has no holder.
    """
    owners = []
    for p in range(spec.partitions):
        holders = sorted(u for u, parts in holdings.items() if p in parts)
        if not holders:
            raise KeyError(p)
        first = p % len(holders)
        ring = holders[first:] + holders[:first]
        saved = actives[p] if p < len(actives) else None
        if saved is not None and saved in ring:
            ring.remove(saved)
            ring.insert(0, saved)
        owners.append(PartitionOwners(ring[0], tuple(ring[1:])))
    return OwnershipTable(spec, tuple(owners))
