"""Moving a store's copies between nodes while queries go on (``riqr rebalance``, ``riqr drain``).

A move replaces one query actor by a new one on another node, in four steps (docs/design.md, "Moving
copies"):

1. **copy**: the new actor starts with its partitions incomplete and joins the table as the last standby
   of each (``OwnershipTable.with_joining``); from the next batch on the sink delivers to it, and it
   rebuilds each partition from a live peer (``runtime.rebuild``), buffering the batches meanwhile;
2. **catch up**: until it serves every partition at the old actor's position;
3. **switch**: the registry seals the old actor (it refuses batches, ``CopyMoved``, so its position stops
   moving), checks that the new copy holds every batch the old one holds (``behind``), and puts the new
   actor in the old one's place (``OwnershipTable.with_replaced``) in one epoch; if the new copy is
   behind after all, the seal is lifted and the move waits;
4. **drop**: facades and the sink learn the new table within milliseconds (their long poll); the old
   actor keeps answering the reads already sent to it for a grace period, then is destroyed with its data.

Reads never lack a copy: before the switch the old actor answers and the new one is a standby; after it,
a facade with the old table that finds the old actor gone fails over to the new one, which that table
already lists. No batch is lost: one the old actor took before its seal is in the positions the switch
checks; one it refused is delivered again by the sink, which asks the registry which copies to use.

This module is the plan (which actor goes where) and the check, as pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Any

from runtime.ownership import ActorInfo, ClusterView, OwnershipTable, replacement_node

__all__ = ["Move", "plan_moves", "plan_standbys", "plan_standby_removals", "removable_standby", "behind"]

SERVING = "serving"


@dataclass(frozen=True)
class Move:
    """Query actor ``uuid`` of ``store`` goes from node ``source`` to node ``target``."""

    store: str
    uuid: str
    source: str
    target: str
    partitions: tuple[int, ...]
    # No live node without another copy of its partitions was left (a drain with fewer nodes than copies):
    # two copies of some of them share ``target``, as a node loss would leave them.
    shared: bool = False
    # Not a move: a new standby copy of ``partitions`` on ``target``, and ``uuid`` (their active when
    # planned, the copy the new one is compared with) stays where it is (``plan_standbys``).
    standby: bool = False


def plan_moves(
    view: ClusterView, alive: Sequence[str], *, drain: Set[str] = frozenset(), stores: Set[str] | None = None
) -> list[Move]:
    """The moves that take every query actor off the ``drain`` nodes and then spread each store's actors
    evenly over the other live nodes, one actor at a time (each planned move counts in the next).

    An actor off a drained node goes where ``replacement_node`` would re-create it (no node holding
    another copy of its partitions while one is left, then the fewest of the store's actors). Evening out
    moves an actor from the node with the most of the store's actors to one with at least two fewer,
    never onto a node that holds another copy of one of its partitions; it stops when no such move is
    left. Actors on nodes that are not alive are the node-loss check's business, not moved here.
    ``stores``: only these (None: every store)."""
    targets = sorted(set(alive) - set(drain))
    live = set(alive)
    actors: dict[str, ActorInfo] = dict(view.actors)
    moves: list[Move] = []
    for name in sorted(view.tables):
        if stores is not None and name not in stores:
            continue
        table = view.tables[name]
        mine = sorted(u for u, info in actors.items() if info.store == name and u in table.all_owners())

        def go(uuid: str, node: str, table: OwnershipTable = table) -> None:
            info = actors[uuid]
            peers = {u for u, held in table.all_owners().items() if u != uuid and set(held) & set(info.partitions)}
            shared = any(actors[u].node_id == node for u in peers if u in actors)
            moves.append(Move(info.store, uuid, info.node_id, node, info.partitions, shared))
            actors[uuid] = replace(info, node_id=node)

        for uuid in mine:
            if actors[uuid].node_id in drain:
                node = replacement_node(table, actors, uuid, targets)
                if node is not None:
                    go(uuid, node)
        while targets:
            load = {n: 0 for n in targets}
            for uuid in mine:
                if actors[uuid].node_id in load:
                    load[actors[uuid].node_id] += 1
            step = _evening_step(table, actors, mine, load, live)
            if step is None:
                break
            go(*step)
    return moves


def _evening_step(
    table: OwnershipTable, actors: Mapping[str, ActorInfo], mine: Sequence[str], load: Mapping[str, int], live: Set[str]
) -> tuple[str, str] | None:
    """One move from the most loaded node to a node at least two actors lighter that holds no other copy
    of the moved actor's partitions; None when there is none."""
    holdings = table.all_owners()
    for high in sorted(load, key=lambda n: (-load[n], n)):
        for low in sorted(load, key=lambda n: (load[n], n)):
            if load[high] - load[low] < 2:
                break
            for uuid in mine:
                if actors[uuid].node_id != high:
                    continue
                parts = set(holdings.get(uuid, ()))
                peers = {u for u, held in holdings.items() if u != uuid and parts & set(held)}
                if all(actors[u].node_id != low for u in peers if u in actors and actors[u].node_id in live):
                    return uuid, low
    return None


def plan_standbys(view: ClusterView, alive: Sequence[str], store: str, wanted: int) -> list[Move]:
    """The standby copies to add so that every partition of ``store`` has ``wanted`` of them
    (``riqr standbys``): for each round of copies, one new actor per active actor, holding a copy of those of
    its partitions that have fewer. Each goes to a live node holding no copy of any of them while there is
    one (then ``shared``), the one with the fewest of the store's actors, then the smallest id; each
    planned copy counts in the next. Copies on nodes that are not alive count (the node-loss check
    re-creates them). A partition with no active is left out: there is nothing to copy it from."""
    table = view.tables[store]
    live = sorted(set(alive))
    if not live:
        return []
    where = {u: info.node_id for u, info in view.actors.items()}
    nodes = {
        p: [where.get(u) for u in (o.active, *o.standbys) if u is not None] for p, o in enumerate(table.partitions)
    }
    load = {n: 0 for n in live}
    for uuid in table.all_owners():
        if where.get(uuid) in load:
            load[where[uuid]] += 1
    planned: list[Move] = []
    while True:
        lacking: dict[str, list[int]] = {}
        for p, o in enumerate(table.partitions):
            if o.active is not None and len(nodes[p]) - 1 < wanted:
                lacking.setdefault(o.active, []).append(p)
        if not lacking:
            return planned
        for source, parts in sorted(lacking.items()):
            taken = {n for p in parts for n in nodes[p]}
            free = [n for n in live if n not in taken]
            target = min(free or live, key=lambda n: (load[n], n))
            planned.append(Move(store, source, where.get(source) or "", target, tuple(parts), not free, True))
            load[target] += 1
            for p in parts:
                nodes[p].append(target)


def removable_standby(table: OwnershipTable, uuid: str, wanted: int) -> str | None:
    """Why query actor ``uuid`` cannot leave ``table`` so that its partitions keep ``wanted`` standby copies
    (None: it can). It must answer for no partition (an actor's partitions are fixed when it starts, so a
    store's own actors, which hold active copies beside their standbys, stay), and each of its partitions
    must have an active and keep ``wanted`` standbys without it."""
    held = table.all_owners().get(uuid)
    if held is None:
        return f"query actor {uuid} holds no copy of store {table.spec.name}"
    answers = [p for p in held if table.partitions[p].active == uuid]
    if answers:
        return f"query actor {uuid} answers for partitions {answers}"
    short = [p for p in held if table.partitions[p].active is None or len(table.partitions[p].standbys) - 1 < wanted]
    if short:
        return f"partitions {short} would keep fewer than {wanted} standby copies without query actor {uuid}"
    return None


def plan_standby_removals(
    view: ClusterView, alive: Sequence[str], store: str, wanted: int
) -> tuple[list[str], list[int]]:
    """The query actors to remove so that no partition of ``store`` has more than ``wanted`` standby
    copies (``riqr standbys`` with fewer than a partition has), and the partitions that would have more
    all the same (their other copies are on actors that cannot go: ``removable_standby``). The copies
    ``riqr standbys`` added are removable actors; a store's own are not. Preferred, one after another: an
    actor on a node that is not alive, then one sharing its node with another copy of one of its
    partitions, then one on the node with the most of the store's actors, then the smallest uuid."""
    table = view.tables[store]
    live = set(alive)
    where = {u: info.node_id for u, info in view.actors.items()}
    removed: list[str] = []
    while True:
        over = sorted(p for p, o in enumerate(table.partitions) if len(o.standbys) > wanted)
        if not over:
            return removed, []
        held = table.all_owners()
        candidates = [u for u in held if removable_standby(table, u, wanted) is None]
        if not candidates:
            return removed, over
        load: dict[str | None, int] = {}
        for u in held:
            load[where.get(u)] = load.get(where.get(u), 0) + 1
        preference = {u: _removal_preference(table, where, live, load, u, held[u]) for u in candidates}
        pick = min(candidates, key=preference.__getitem__)
        removed.append(pick)
        table = table.without_standby(pick)


def _removal_preference(
    table: OwnershipTable,
    where: Mapping[str, str],
    live: Set[str],
    load: Mapping[str | None, int],
    uuid: str,
    partitions: Sequence[int],
) -> tuple[bool, bool, int, str]:
    """``plan_standby_removals``' order for ``uuid``, which holds ``partitions`` (smallest first): on a node
    that is not alive, sharing its node with another copy of one of them, on the node with the most of the
    store's actors, by uuid."""
    node = where.get(uuid)
    shared = any(
        where.get(other) == node
        for p in partitions
        for other in (table.partitions[p].active, *table.partitions[p].standbys)
        if other not in (None, uuid)
    )
    return node in live, not shared, -load[node], uuid


def behind(sealed: Mapping[int, Mapping[str, Any]], joined: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """The partitions where the new copy (``joined``: its actor's ``positions()``) does not yet hold every
    batch the sealed old copy holds (``sealed``: the old actor's positions at its seal). A partition the
    old copy served needs the new one serving at the same source and at least its batch; one the old copy
    could not serve needs the new one serving (it got its state from another copy)."""
    out = []
    for p, old in sorted(sealed.items()):
        new = joined.get(p)
        serving = new is not None and new.get("state") == SERVING
        older = (
            new is not None
            and old.get("state") == SERVING
            and (new.get("source") != old.get("source") or int(new.get("batch_id", -1)) < int(old.get("batch_id", -1)))
        )
        if not serving or older:
            out.append(p)
    return out
