"""Read replicas in an HTTP verticle (``runtime.readreplica``), without Ray: published before they copy
their partitions from peers, answering only once fed by the sink and while listed in the view, replaced
when dropped, and admitted by the facade's marks like a standby (``runtime.facade.routing``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from runtime.errors import KeyNotFound, OwnerUnavailable, StoreNotFound
from runtime.facade import Facade
from runtime.monotonic import Span
from runtime.ownership import ClusterView, ReaderCopy
from runtime.queries import KeyQuery
from runtime.readreplica import ReadReplica, ReadReplicas
from tests.unit.fakes import FakeBus, Peer, eventually, kv_spec

CUSTOMERS = {"1": "john", "2": "adam", "3": "daniel", "4": "james"}


class BusPeers:
    """The copies of a store's partitions in a ``FakeBus``, as a rebuilding replica sees them."""

    def __init__(self, bus: FakeBus, store: str) -> None:
        self.bus, self.store = bus, store

    def holders(self, partition: int) -> list[str]:
        owners = self.bus.state.view().tables[self.store].partitions[partition]
        return [u for u in (owners.active, *owners.standbys) if u is not None]

    def peer(self, uuid: str) -> Peer:
        return Peer(self.bus.owners[uuid].core)


class Verticle:
    """What the HTTP verticle does with its replicas, synchronously: follow each view, publish new ones."""

    def __init__(self, bus: FakeBus, actor: str = "riqr-http-a") -> None:
        self.bus = bus
        self.jobs: list[Callable[[], object]] = []
        self.replicas = ReadReplicas(actor, "node-a", lambda store: BusPeers(bus, store), spawn=self.jobs.append)
        bus.reader_hosts[actor] = self.replicas

    def follow(self, view: ClusterView) -> None:
        for replica in self.replicas.follow(view):
            self.replicas.published(replica, self.bus.state.add_reader(replica.reader))

    def copy(self) -> None:
        """Run the catch-ups the replicas started (each copies one partition from a peer)."""
        while self.jobs:
            self.jobs.pop(0)()

    def only(self) -> ReadReplica:
        (replica,) = self.replicas.replicas()
        return replica


@pytest.fixture
def bus() -> FakeBus:
    b = FakeBus()
    b.create_store(dataclasses.replace(kv_spec("customers"), read_replicas=True))
    b.create_store(kv_spec("orders"))  # no read replicas
    b.load("customers", CUSTOMERS)
    return b


@pytest.fixture
async def setup(bus: FakeBus) -> Any:
    verticle = Verticle(bus)
    facade = Facade(bus, timeout=1.0, refresh_interval=0.01, local=verticle.replicas)
    facade.views.listeners.append(verticle.follow)
    await facade.start()
    yield facade, verticle
    await facade.stop()


async def answering(verticle: Verticle, bus: FakeBus) -> ReadReplica:
    """The verticle's replica copied, listed and fed batch 1 (key "1" is "one"): it answers lookups."""
    verticle.copy()
    replica = verticle.only()
    await eventually(lambda: replica.listed, what="listed")
    bus.load("customers", {"1": "one"}, batch_id=1)
    return replica


def owner_gets(bus: FakeBus) -> int:
    return sum(o.calls.count("get_many") for o in bus.owners.values())


async def test_a_replica_answers_only_once_copied_listed_and_fed_then_without_the_owners(
    setup: Any, bus: FakeBus
) -> None:
    facade, verticle = setup
    replica = verticle.only()  # only the store that asked for one
    assert replica.reader.store == "customers" and bus.state.view().readers == {replica.uuid: replica.reader}
    assert verticle.jobs, "the copy from peers starts once the registry lists the replica"

    assert await facade.get(KeyQuery("customers", "2")) == "adam"  # nothing copied yet: the owners answer
    verticle.copy()
    await eventually(lambda: replica.listed, what="the replica listed in the facade's view")
    assert all(p["state"] == "serving" for p in replica.core.positions().values())
    assert await facade.get(KeyQuery("customers", "2")) == "adam"  # copied, but not fed by the sink yet
    asked = owner_gets(bus)
    assert asked == 2

    bus.load("customers", {"2": "adam2", "9": "nine"}, batch_id=1)
    assert replica.fed
    assert await facade.get(KeyQuery("customers", "2")) == "adam2"
    assert await facade.get(KeyQuery("customers", "9")) == "nine"
    with pytest.raises(KeyNotFound):
        await facade.get(KeyQuery("customers", "404"))
    assert owner_gets(bus) == asked, "answered in process, no call to a query actor"
    assert facade.metrics.value("riqr_local_reads_total", store="customers") == 3


async def test_a_replica_that_missed_a_batch_stops_answering_and_copies_again(setup: Any, bus: FakeBus) -> None:
    facade, verticle = setup
    replica = await answering(verticle, bus)
    assert await facade.get(KeyQuery("customers", "1")) == "one"
    asked = owner_gets(bus)

    # Batch 2 never reaches the replica (the sink would have dropped it); batch 3 shows the gap.
    host = bus.reader_hosts.pop("riqr-http-a")
    bus.load("customers", {"1": "two"}, batch_id=2)
    bus.reader_hosts["riqr-http-a"] = host
    bus.load("customers", {"1": "three"}, batch_id=3)
    assert {p["state"] for p in replica.core.positions().values()} == {"catching-up"}
    assert await facade.get(KeyQuery("customers", "1")) == "three"
    assert owner_gets(bus) == asked + 1, "a replica catching up is not read"
    verticle.copy()
    assert await facade.get(KeyQuery("customers", "1")) == "three"
    assert owner_gets(bus) == asked + 1, "caught up again: read in process"


async def test_a_dropped_replica_is_not_read_and_a_new_one_replaces_it(setup: Any, bus: FakeBus) -> None:
    facade, verticle = setup
    first = await answering(verticle, bus)
    assert bus.state.drop_reader(first.uuid)  # what the sink does when it does not acknowledge a batch
    await eventually(lambda: verticle.only() is not first, what="a new replica")
    second = verticle.only()
    assert set(bus.state.view().readers) == {second.uuid}
    asked = owner_gets(bus)
    assert await facade.get(KeyQuery("customers", "1")) == "one"
    assert owner_gets(bus) == asked + 1, "the new replica is neither copied nor fed yet"
    with pytest.raises(OwnerUnavailable):  # a batch for the old one: the sink drops it (already gone)
        verticle.replicas.apply(first.uuid, "q", 2, {})


async def test_turning_read_replicas_off_or_dropping_the_store_discards_the_replica(setup: Any, bus: FakeBus) -> None:
    facade, verticle = setup
    table = bus.state.view().tables["customers"]
    bus.state.replace_table(dataclasses.replace(table, spec=dataclasses.replace(table.spec, read_replicas=False)))
    await eventually(lambda: len(verticle.replicas) == 0, what="the replica discarded")
    bus.state.replace_table(table)
    await eventually(lambda: len(verticle.replicas) == 1, what="a replica again")
    bus.state.drop("customers")
    await eventually(lambda: len(verticle.replicas) == 0, what="discarded with its store")
    assert bus.state.view().readers == {}


def test_a_view_older_than_the_publication_does_not_discard_the_replica() -> None:
    bus = FakeBus()
    bus.create_store(dataclasses.replace(kv_spec("customers"), read_replicas=True))
    verticle = Verticle(bus)
    before = bus.state.view()
    (replica,) = verticle.replicas.follow(before)
    verticle.replicas.published(replica, bus.state.add_reader(replica.reader))
    assert verticle.replicas.follow(before) == [] and verticle.only() is replica  # fetched before, seen after
    assert not replica.listed
    assert verticle.replicas.follow(bus.state.view()) == [] and replica.listed


# -- the router's rule for a local copy, with a scripted one -------------------------------------------


class Scripted:
    """A ``LocalCopies`` answering what the test says."""

    def __init__(self) -> None:
        self.answer: tuple[bytes | None, Span] | None = None

    def get(self, store: str, partition: int, key: Any) -> tuple[bytes | None, Span] | None:
        return self.answer


async def test_a_local_copy_older_than_what_the_facade_served_is_not_read(bus: FakeBus) -> None:
    local = Scripted()
    facade = Facade(bus, timeout=1.0, refresh_interval=0.01, local=local)
    await facade.start()
    try:
        bus.load("customers", {"2": "adam-1"}, batch_id=1)
        assert await facade.get(KeyQuery("customers", "2")) == "adam-1"  # no local answer: the owner, batch 1
        local.answer = (b"\xa4old!", ("q", 0, 0))
        assert await facade.get(KeyQuery("customers", "2")) == "adam-1", "the local copy is behind the mark"
        local.answer = (b"\xa3new", ("q", 1, 1))
        assert await facade.get(KeyQuery("customers", "2")) == "new"
        local.answer = (None, ("q", 2, 2))
        with pytest.raises(KeyNotFound):
            await facade.get(KeyQuery("customers", "2"))
    finally:
        await facade.stop()


def test_the_registry_lists_and_unlists_read_replicas() -> None:
    bus = FakeBus()
    bus.create_store(kv_spec("customers"))
    state = bus.state
    a = ReaderCopy("r1", "customers", "node-a", "riqr-http-a")
    epoch = state.add_reader(a)
    assert state.view().readers_of("customers") == [a] and state.epoch == epoch
    again = ReaderCopy("r2", "customers", "node-a", "riqr-http-a")
    state.add_reader(again)  # the same verticle's new replica replaces its old one
    assert state.view().readers_of("customers") == [again]
    with pytest.raises(StoreNotFound):
        state.add_reader(ReaderCopy("r3", "nope", "node-a", "riqr-http-a"))
    b = ReaderCopy("r4", "customers", "node-b", "riqr-http-b")
    state.add_reader(b)
    assert not state.drop_reader("r-unknown")
    state.unregister_endpoint("node-b")  # its HTTP verticle stopped or its node died
    assert state.view().readers_of("customers") == [again]
    state.drop("customers")
    assert state.view().readers == {}


def test_apply_in_the_sink_shape(bus: FakeBus) -> None:
    verticle = Verticle(bus)
    verticle.follow(bus.state.view())
    verticle.copy()
    replica = verticle.only()
    results = verticle.replicas.apply(replica.uuid, "q", 1, {0: pa.table({"key": ["x"], "value": ["y"]}), 1: None})
    assert {r.partition for r in results} == {0, 1}


def test_a_replica_stays_across_a_move_of_its_stores_actors_and_goes_when_the_store_is_another() -> None:
    bus = FakeBus()
    bus.create_store(dataclasses.replace(kv_spec("customers"), read_replicas=True))
    verticle = Verticle(bus)
    (replica,) = verticle.replicas.follow(bus.state.view())
    verticle.replicas.published(replica, bus.state.add_reader(replica.reader))
    table = bus.state.view().table("customers")
    assert table is not None
    old = sorted(table.all_owners())[0]
    moved = table.with_joining(old, "new-actor").with_replaced(old, "new-actor")
    bus.state.replace_table(moved)  # a move put "new-actor" in old's place (runtime.moves)
    assert verticle.replicas.follow(bus.state.view()) == [] and verticle.only() is replica
    assert replica.holders == frozenset(moved.all_owners())
    other = dataclasses.replace(
        moved, partitions=tuple(type(o)("x", ()) for o in moved.partitions), moved_from=frozenset()
    )
    bus.state.replace_table(other)  # dropped and declared again: none of its actors are this store's
    (fresh,) = verticle.replicas.follow(bus.state.view())
    assert fresh is not replica
