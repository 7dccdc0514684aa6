"""Which query actors each store has: what a restarted registry cannot learn from the actors that answer.

A registry that restarts rebuilds its tables from the query actors of its namespace (each knows its store,
spec and partitions). An actor that cannot answer at that moment (killed for good, its constructor
failing, its node just lost) used to be forgotten: it was never created again, and a store without
standbys that had it was left out of the tables altogether, its keys answering 404 as if it had never
existed, while the sweeper would in time delete the forgotten actor's data as orphaned. So the registry
also saves each store's members (its spec, and every actor's uuid, node and partitions) whenever they
change, and a restarted one adds to what the live actors say the members that did not answer. From
there they are any dead actor: re-created on their node once gone for good, or elsewhere if the node is
gone (docs/design.md, "A restarted registry").

This module is the record and the merge (pure, tested without Ray); where the record is kept is the
registry environment's business (``verticles.deploy.RayEnv``: Ray's GCS key-value store).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.catalog import StoreSpec, ValueField
from runtime.errors import SchemaError
from runtime.keys import KeySchema
from runtime.ownership import ActorInfo, ClusterView

__all__ = [
    "MEMBERSHIP_VERSION",
    "Merged",
    "UndecodableRecord",
    "membership_record",
    "merge_members",
    "spec_record",
    "spec_from_record",
]

log = logging.getLogger(__name__)

MEMBERSHIP_VERSION = 1


class UndecodableRecord(Exception):
    """The saved members are there but are not a record (not JSON): a restarted registry replaces them."""


def spec_record(spec: StoreSpec) -> dict[str, Any]:
    """Every field of ``spec`` as JSON-able values (``spec_from_record`` reads it back)."""
    return {
        "name": spec.name,
        "kind": spec.kind,
        "key": {"column": spec.key.column, "type": spec.key.type_name, "rest": [list(c) for c in spec.key.rest]},
        "value": [[f.name, f.type_name] for f in spec.value_fields],
        "partitions": spec.partitions,
        "actors": spec.actors,
        "standbys": spec.standbys,
        "engine": spec.engine,
        "extra": [[k, v] for k, v in spec.extra],
        "read_replicas": spec.read_replicas,
    }


def spec_from_record(record: Mapping[str, Any]) -> StoreSpec:
    """The spec ``spec_record`` wrote (``KeyError``, ``TypeError``, ``ValueError`` or ``SchemaError`` for
    a record that is not one)."""
    key = record["key"]
    return StoreSpec(
        name=record["name"],
        key=KeySchema(key["column"], key["type"], tuple((str(c), str(t)) for c, t in key["rest"])),
        value_fields=tuple(ValueField(str(n), str(t)) for n, t in record["value"]),
        kind=record["kind"],
        partitions=int(record["partitions"]),
        actors=int(record["actors"]),
        standbys=None if record["standbys"] is None else int(record["standbys"]),
        engine=record["engine"],
        extra=tuple((str(k), v) for k, v in record["extra"]),
        read_replicas=bool(record["read_replicas"]),
    )


def membership_record(
    view: ClusterView,
    *,
    retired: bool = False,
    carried: Mapping[str, Any] | None = None,
    without: str | None = None,
    dropping: Iterable[str] = (),
    follow: bool = False,
    first_actives: Mapping[tuple[str, int], str] | None = None,
    epochs_below: int | None = None,
) -> dict[str, Any]:
    """Each store of ``view`` (but ``without``) with its spec and its actors (uuid, node, partitions), and
    whether the registry is retired (``riqr down`` under way: a registry restarted meanwhile stays so).
    ``carried``: entries of an earlier record this registry could not read, kept as they were for the
    stores it does not hold (dropping them would forget those stores' actors for good). ``dropping``: the
    uuids of query actors of dropped stores not yet destroyed (a registry restarted meanwhile destroys
    them rather than take them back). ``follow``: nodes that join get a facade and a REST API (``riqr up``
    for every node asked for it), which a restarted registry goes on doing. ``first_actives``: (store,
    partition) -> the active a promotion replaced, to be given the partition back once it serves (a
    registry restarted meanwhile still gives it back). ``epochs_below``: a bound on every epoch the registry
    has handed out, which a restarted registry starts at or past whatever its node's clock says."""
    stores: dict[str, Any] = {name: entry for name, entry in (carried or {}).items() if name not in view.tables}
    for name, table in sorted(view.tables.items()):
        members = sorted((a for a in view.actors.values() if a.store == name), key=lambda a: a.uuid)
        stores[name] = {
            "spec": spec_record(table.spec),
            "actors": [
                {"uuid": a.uuid, "node_id": a.node_id, "node_ip": a.node_ip, "partitions": list(a.partitions)}
                for a in members
            ],
        }
        # Which copy answers for each partition: the actors cannot say (a copy does not know it is active), and
        # a restart that dealt actives anew would make copies ``riqr standbys`` added answer for partitions.
        stores[name]["actives"] = [o.active for o in table.partitions]
        owed = {str(p): u for (store, p), u in sorted((first_actives or {}).items()) if store == name}
        if owed:
            stores[name]["first_actives"] = owed
        if table.moved_from:  # the actors moves replaced (``OwnershipTable.lineage``)
            stores[name]["moved_from"] = sorted(table.moved_from)
    if without is not None:
        stores.pop(without, None)
    record: dict[str, Any] = {"version": MEMBERSHIP_VERSION, "retired": retired, "stores": stores}
    pending = sorted(dropping)
    if pending:
        record["dropping"] = pending
    if follow:
        record["follow"] = True
    if epochs_below is not None:
        record["epochs_below"] = epochs_below
    return record


def epochs_below(saved: Mapping[str, Any] | None) -> int:
    """The bound a saved record puts on the epochs handed out before it (0 when it has none: a record of
    an earlier riqr)."""
    bound = (saved or {}).get("epochs_below")
    return bound if isinstance(bound, int) and not isinstance(bound, bool) else 0


@dataclass(frozen=True)
class Merged:
    """What a registry takes from the live query actors and its saved record (``merge_members``)."""

    stores: dict[str, tuple[StoreSpec, list[ActorInfo]]]  # store -> its spec and every member
    remembered: list[str]  # uuids only the record knew of (they did not answer)
    carried: dict[str, Any]  # entries of the record that could not be read, to keep as they are
    retired: bool  # the record says ``riqr down`` was under way
    dropping: list[str]  # uuids of dropped stores' actors the record says are still to be destroyed
    moved_from: dict[str, frozenset[str]]  # store -> the actors moves replaced (``OwnershipTable.moved_from``)
    follow: bool = False  # the record says nodes that join get a facade and a REST API
    actives: dict[str, tuple[str | None, ...]] = field(default_factory=dict)  # store -> each partition's saved active
    # (store, partition) -> the active a promotion replaced, owed the partition back once it serves.
    first_actives: dict[tuple[str, int], str] = field(default_factory=dict)


def merge_members(saved: Mapping[str, Any] | None, live: Sequence[Mapping[str, Any]]) -> Merged:
    """The stores a restarted registry installs, each with its spec and actors; the uuids of the actors
    only ``saved`` knows of; the saved entries it could not read; whether ``saved`` says retired; the
    actors ``saved`` says are being dropped.

    ``live`` is the ``info()`` of every query actor that answered: their uuids, partitions and nodes are
    facts, except for the actors being dropped (their store's drop was saved, and the registry stopped
    before destroying them) and every actor of a store one of whose actors says it was destroyed (its data
    deleted, not yet killed: only a drop or a `down` does that): those are left out, to be destroyed.
    ``saved`` (a ``membership_record``, or None) adds the actors that did not answer, and the stores none of
    whose actors did; its spec wins over the live actors' when the layout is the same (fields that change in
    place, such as ``read_replicas``, are saved when they change; an actor keeps the spec it was created
    with). A saved store whose layout differs from what its live actors say is left out and logged (the live
    actors are the facts); a saved entry that cannot be read is logged and carried."""
    stores: dict[str, tuple[StoreSpec, dict[str, ActorInfo]]] = {}
    answered: set[str] = set()
    dropping = _saved_dropping(saved)
    entries = _saved_stores(saved)
    # Only a drop or a `down` destroys an actor: a store the record still lists with an actor that says it
    # deleted its data is being dropped (a restart in the middle of `down`, a record without marks), and
    # all of its actors go, not only those destroyed so far. A destroyed actor the record does not list
    # under its store (marked, or of an earlier store of that name) goes alone: the store of that name
    # now may be a new one.
    # With no readable record at all (deleted by `down` before the registry restarted, or unreadable), a
    # destroyed actor dooms its store by name: leaving its siblings would serve a dropped store again.
    doomed = {
        info["spec"].name
        for info in live
        if info.get("destroyed")
        and str(info["uuid"]) not in dropping
        and (not entries or str(info["uuid"]) in _listed(entries.get(info["spec"].name)))
    }
    for info in live:
        # A move's old actor, sealed for good: another one took its place (its members save may have failed).
        if info.get("destroyed") or info.get("moved") or info["spec"].name in doomed:
            dropping.add(str(info["uuid"]))
        # A move's new actor started and never admitted to a table (its mover stopped, or the registry did
        # before admitting it): no copy of anything yet. Only when a readable record lists its store's other
        # actors and not it: without one, in doubt, it stays (an extra copy at worst, never data lost).
        listed = _listed(entries.get(info["spec"].name))
        if info.get("joining") and listed and str(info["uuid"]) not in listed:
            dropping.add(str(info["uuid"]))
        if str(info["uuid"]) in dropping:
            continue
        spec: StoreSpec = info["spec"]
        members = stores.setdefault(spec.name, (spec, {}))[1]
        uuid = str(info["uuid"])
        members[uuid] = ActorInfo(uuid, spec.name, info["node_id"], info["node_ip"], tuple(info["partitions"]))
        answered.add(uuid)
    remembered: list[str] = []
    carried: dict[str, Any] = {}
    moved_from: dict[str, frozenset[str]] = {}
    actives: dict[str, tuple[str | None, ...]] = {}
    first_actives: dict[tuple[str, int], str] = {}
    for name, entry in sorted(entries.items()):
        if name in doomed:
            dropping.update(_listed(entry))
            continue
        try:
            spec = spec_from_record(entry["spec"])
            actors = [
                ActorInfo(
                    str(a["uuid"]),
                    spec.name,
                    str(a["node_id"]),
                    str(a["node_ip"]),
                    tuple(int(p) for p in a["partitions"]),
                )
                for a in entry["actors"]
            ]
        except (KeyError, TypeError, ValueError, SchemaError) as err:
            log.warning("the saved members of store %s are unreadable (%r); kept as they are, the store is left to "
                        "its live actors", name, err, extra={"store": name})  # fmt: skip
            carried[str(name)] = entry
            continue
        if name in stores:
            if not stores[name][0].same_layout(spec):
                log.warning("store %s: its live query actors have another definition than the saved one; the "
                            "saved members are ignored", name, extra={"store": name})  # fmt: skip
                continue
            stores[name] = (spec, stores[name][1])
        members = stores.setdefault(name, (spec, {}))[1]
        replaced = entry.get("moved_from", [])
        if isinstance(replaced, list) and replaced:
            moved_from[name] = frozenset(str(u) for u in replaced)
        saved_actives = entry.get("actives")  # absent in a record of an older riqr: actives are dealt
        if isinstance(saved_actives, list) and all(u is None or isinstance(u, str) for u in saved_actives):
            actives[name] = tuple(saved_actives)
        owed = entry.get("first_actives")
        if isinstance(owed, Mapping):
            first_actives.update(
                {(name, int(p)): u for p, u in owed.items() if isinstance(u, str) and str(p).isdigit()}
            )
        for actor in actors:
            if actor.uuid not in answered and actor.uuid not in members and actor.uuid not in dropping:
                members[actor.uuid] = actor
                remembered.append(actor.uuid)
    ours: Mapping[str, Any] = saved if isinstance(saved, Mapping) and saved.get("version") == MEMBERSHIP_VERSION else {}
    retired, follow = bool(ours.get("retired")), ours.get("follow") is True
    return Merged(
        {name: (spec, list(members.values())) for name, (spec, members) in stores.items()},
        remembered,
        carried,
        retired,
        sorted(dropping),
        moved_from,
        follow,
        actives,
        first_actives,
    )


def _listed(entry: Any) -> set[str]:
    """The uuids a saved store entry lists (those that can be read)."""
    actors = entry.get("actors") if isinstance(entry, Mapping) else None
    if not isinstance(actors, list):
        return set()
    return {str(a["uuid"]) for a in actors if isinstance(a, Mapping) and "uuid" in a}


def _saved_dropping(saved: Mapping[str, Any] | None) -> set[str]:
    if not isinstance(saved, Mapping):
        return set()
    if saved.get("version") != MEMBERSHIP_VERSION:
        if saved.get("dropping"):
            log.error("a record of an unknown version says query actors were being dropped (%r); they are taken "
                      "back if they answer: drop their store again", saved["dropping"])  # fmt: skip
        return set()
    dropping = saved.get("dropping", [])
    if not isinstance(dropping, list) or not all(isinstance(u, str) for u in dropping):
        log.warning("the saved list of query actors being dropped is unreadable (%r); ignored", dropping)
        return set()
    return set(dropping)


def _saved_stores(saved: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if saved is None:
        return {}
    if not isinstance(saved, Mapping) or saved.get("version") != MEMBERSHIP_VERSION:
        version = saved.get("version") if isinstance(saved, Mapping) else None
        log.warning("the saved members are of an unknown version (%r); rebuilding from the live actors alone", version)
        return {}
    stores = saved.get("stores")
    if not isinstance(stores, Mapping):
        log.warning("the saved members are unreadable; rebuilding from the live actors alone")
        return {}
    return stores
