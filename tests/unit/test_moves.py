"""Moving query actors between nodes (``runtime.moves``): the plan, the table's steps, the switch's check,
a query core's seal and explicit catch-up, and the registry driving a whole move over real query
verticles in this process (no Ray: the environment is a fake whose actors are plain objects)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from runtime.catalog import StoreSpec
from runtime.errors import Conflict, CopyMoved, InvalidParameter, NotFound, OwnerUnavailable, PartitionUnavailable
from runtime.moves import Move, behind, plan_moves
from runtime.ownership import ActorInfo, ClusterView, OwnershipTable, PartitionOwners, table_from_placement
from runtime.query import QueryCore
from runtime.scan import Scan
from tests.unit.fakes import kv_spec
from tests.unit.test_verticles import Clock, FakeEnv, uuids
from verticles.query import QueryVerticle
from verticles.registry import Registry

# -- the table's steps -------------------------------------------------------------------------------------


def _table(spec: StoreSpec, owners: Sequence[tuple[str, tuple[str, ...]]]) -> OwnershipTable:
    return OwnershipTable(spec, tuple(PartitionOwners(a, s) for a, s in owners))


def test_a_joining_actor_is_the_last_standby_of_the_partitions_it_copies_and_then_takes_the_old_ones_place() -> None:
    spec = kv_spec("s", partitions=4, actors=2, standbys=1)
    table = _table(spec, [("a", ("b",)), ("b", ("a",)), ("a", ("b",)), ("b", ("a",))])
    joined = table.with_joining("a", "c")
    assert [o.standbys for o in joined.partitions] == [("b", "c"), ("a", "c"), ("b", "c"), ("a", "c")]
    assert [o.active for o in joined.partitions] == ["a", "b", "a", "b"]  # reads still go where they went

    switched = joined.with_replaced("a", "c")
    # Where "a" answered, "c" answers; where it was a standby, "c" is, at the same rank.
    assert [(o.active, o.standbys) for o in switched.partitions] == [
        ("c", ("b",)),
        ("b", ("c",)),
        ("c", ("b",)),
        ("b", ("c",)),
    ]
    assert "a" not in switched.all_owners()
    assert switched.lineage() == {"a", "b", "c"}  # a feed that declared the store with "a" still feeds it
    # Promotions and give-backs keep the lineage.
    assert switched.promote({"c"}).moved_from == {"a"}
    assert switched.with_active(1, "c").moved_from == {"a"}

    # The new actor answering already (a promotion, a restarted registry's deal) is not listed twice.
    dealt = _table(spec, [("c", ("a",)), ("b", ("a", "c")), ("a", ("b", "c")), ("b", ("a", "c"))])
    assert [(o.active, o.standbys) for o in dealt.with_replaced("a", "c").partitions] == [
        ("c", ()),  # "c" answered already: it keeps answering
        ("b", ("c",)),
        ("c", ("b",)),
        ("b", ("c",)),
    ]
    ahead = _table(spec, [("c", ("b", "a")), ("b", ()), ("b", ()), ("b", ())])
    assert ahead.with_replaced("a", "c").partitions[0] == PartitionOwners("c", ("b",))
    assert joined.without_standby("c") == table  # a move given up leaves the table as it was
    with pytest.raises(ValueError):
        switched.without_standby("c")  # it answers for partitions now
    with pytest.raises(ValueError):
        table.with_replaced("a", "c")  # "c" holds no copy of "a"'s partitions
    with pytest.raises(ValueError):
        table.with_joining("z", "c")  # "z" holds nothing
    with pytest.raises(ValueError):
        table.with_joining("a", "b")  # "b" holds copies already


def test_a_switch_waits_until_the_new_copy_serves_every_batch_the_old_one_holds() -> None:
    def pos(state: str, batch: int, source: str = "q") -> dict[str, Any]:
        return {"state": state, "source": source, "batch_id": batch}

    old = {0: pos("serving", 7), 1: pos("serving", 7), 2: pos("incomplete", -1)}
    assert behind(old, {0: pos("serving", 7), 1: pos("serving", 8), 2: pos("serving", 7)}) == []
    assert behind(old, {0: pos("serving", 6), 1: pos("catching-up", 7), 2: pos("serving", 7)}) == [0, 1]
    assert behind(old, {0: pos("serving", 9, "other"), 1: pos("serving", 7)}) == [0, 2]  # another source; missing
    # The old copy could not serve: the new one needs only to serve (it copied from another holder).
    assert behind(old, {0: pos("serving", 7), 1: pos("serving", 7), 2: pos("incomplete", -1)}) == [2]


# -- the plan ------------------------------------------------------------------------------------------------


def _placed(spec: StoreSpec, nodes: Sequence[str], uuids_: Sequence[str]) -> ClusterView:
    from runtime.ownership import plan_placement

    plans = plan_placement(spec, nodes)
    table = table_from_placement(spec, uuids_, plans)
    holdings = table.all_owners()
    actors = {u: ActorInfo(u, spec.name, p.node_id or "", "ip", tuple(holdings[u])) for u, p in zip(uuids_, plans)}
    return ClusterView(1, {spec.name: table}, actors)


def _after(view: ClusterView, moves: Sequence[Move]) -> dict[str, str]:
    where = {u: info.node_id for u, info in view.actors.items()}
    for m in moves:
        assert where[m.uuid] == m.source
        where[m.uuid] = m.target
    return where


def _no_two_copies_on_a_node(view: ClusterView, where: dict[str, str]) -> None:
    for table in view.tables.values():
        for owners in table.partitions:
            copies = [where[u] for u in (owners.active, *owners.standbys) if u is not None]
            assert len(copies) == len(set(copies)), copies


def test_a_node_that_joined_gets_its_share_of_each_stores_actors_and_a_second_plan_moves_nothing() -> None:
    spec = kv_spec("s", partitions=8, actors=4, standbys=1)
    view = _placed(spec, ["n1", "n2"], ["u1", "u2", "u3", "u4"])
    moves = plan_moves(view, ["n1", "n2", "n3"])
    where = _after(view, moves)
    counts = sorted(list(where.values()).count(n) for n in ("n1", "n2", "n3"))
    assert counts == [1, 1, 2] and len(moves) == 1
    assert moves[0].target == "n3" and moves[0].partitions == view.actors[moves[0].uuid].partitions
    _no_two_copies_on_a_node(view, where)
    # Planned again on the result: nothing left to even out.
    moved = ClusterView(
        2,
        view.tables,
        {u: ActorInfo(u, "s", where[u], "ip", info.partitions) for u, info in view.actors.items()},
    )
    assert plan_moves(moved, ["n1", "n2", "n3"]) == []
    assert plan_moves(view, ["n1", "n2", "n3"], stores={"other"}) == []  # only the stores asked for


def test_draining_a_node_moves_each_of_its_actors_where_no_other_copy_of_its_partitions_is() -> None:
    spec = kv_spec("s", partitions=6, actors=3, standbys=1)
    view = _placed(spec, ["n1", "n2", "n3"], ["u1", "u2", "u3"])
    moves = plan_moves(view, ["n1", "n2", "n3", "n4"], drain={"n2"})
    where = _after(view, moves)
    assert "n2" not in where.values()
    assert [m.target for m in moves if m.source == "n2"] == ["n4"]  # the only node with no copy of its partitions
    _no_two_copies_on_a_node(view, where)
    # With no node free of its partitions' copies, it still goes (a node lost would do the same), to the
    # node with the fewest of the store's actors.
    small = _placed(kv_spec("t", partitions=2, actors=2, standbys=1), ["n1", "n2"], ["v1", "v2"])
    (only,) = plan_moves(small, ["n1", "n2"], drain={"n2"})
    assert (only.source, only.target, only.shared) == ("n2", "n1", True)
    assert not any(m.shared for m in moves)


def test_evening_out_never_puts_two_copies_of_a_partition_on_one_node_and_leaves_dead_nodes_alone() -> None:
    spec = kv_spec("s", partitions=4, actors=2, standbys=1)
    view = _placed(spec, ["n1", "n2"], ["u1", "u2"])
    assert plan_moves(view, ["n1", "n2", "n3"]) == []  # one actor a node already: as even as it gets
    crowded = _placed(kv_spec("t", partitions=6, actors=3, standbys=0), ["n1"], ["v1", "v2", "v3"])
    moves = plan_moves(crowded, ["n1", "n2", "n3"])
    assert sorted(_after(crowded, moves).values()) == ["n1", "n2", "n3"]
    # Actors on a node that is not alive are the node-loss check's to re-create, not moved by a plan.
    assert plan_moves(crowded, ["n2", "n3"]) == []


# -- a query core sealed, and told to copy ------------------------------------------------------------------


def _batch(keys: Sequence[str], value: str) -> pa.Table:
    return pa.table({"key": list(keys), "value": [value] * len(keys)})


def test_a_sealed_core_refuses_batches_keeps_its_positions_and_takes_them_again_once_unsealed() -> None:
    clock = Clock(100.0)
    core = QueryCore(kv_spec("s", partitions=2, actors=1), [0, 1], clock=clock)
    core.apply("q", 0, {0: _batch(["a"], "1"), 1: None})
    sealed = core.seal(30)
    assert sealed == core.positions() and core.sealed
    with pytest.raises(CopyMoved, match="moving to another actor"):
        core.apply("q", 1, {0: _batch(["a"], "2"), 1: None})
    assert core.positions() == sealed
    assert core.get_many([(0, "a")])[0] == [b"\xa11"]  # reads go on
    core.unseal()
    core.apply("q", 1, {0: _batch(["a"], "2"), 1: None})
    assert core.positions()[0]["batch_id"] == 1
    core.seal(30)
    clock.now += 31  # a seal no switch followed (its registry died) lapses
    core.apply("q", 2, {0: None, 1: None})
    core.seal(None)  # for good: a switch made
    clock.now += 10**9
    with pytest.raises(CopyMoved):
        core.apply("q", 3, {0: None, 1: None})


def test_a_copy_catches_up_on_a_gap_by_itself_only_in_a_store_with_standbys_and_always_when_told() -> None:
    started: list[Any] = []
    spec = kv_spec("s", partitions=2, actors=2, standbys=0)

    class NoPeers:
        def holders(self, partition: int) -> list[str]:
            return []

        def peer(self, uuid: str) -> Any:
            raise AssertionError("no peer")

    core = QueryCore(spec, [0, 1], peers=NoPeers(), spawn=started.append, catch_up_on_gap=False)
    core.apply("q", 3, {0: None, 1: None})  # a gap: incomplete, and no catch-up of its own
    assert {p["state"] for p in core.positions().values()} == {"incomplete"} and started == []
    assert core.rebuild_unserved() == []
    assert core.catch_up([0, 1]) == [0, 1] and len(started) == 2
    assert {p["state"] for p in core.positions().values()} == {"catching-up"}
    assert core.catch_up([0]) == []  # catching up already
    with_standbys = QueryCore(
        kv_spec("s", partitions=2, actors=2, standbys=1), [0, 1], peers=NoPeers(), spawn=started.append
    )
    with_standbys.apply("q", 3, {0: None, 1: None})
    assert {p["state"] for p in with_standbys.positions().values()} == {"catching-up"} and len(started) == 4


# -- the registry moving an actor over real query verticles -------------------------------------------------


class MoveEnv(FakeEnv):
    """``FakeEnv`` whose query actors are real ``QueryVerticle``s in this process, under ``data``."""

    def __init__(self, data: Path) -> None:
        super().__init__(nodes=("node-a", "node-b", "node-c"))
        self.data = data
        self.actors: dict[str, QueryVerticle] = {}
        self.registry: Registry | None = None
        self.unreachable: set[str] = set()  # actors whose calls fail (restarting, a probe timing out)

    def _start(self, spec: StoreSpec, uuid: str, partitions: Sequence[int], node: str, **kw: Any) -> ActorInfo:
        self.actors[uuid] = QueryVerticle(uuid, spec, list(partitions), self, **kw)
        self.actors[uuid].node_id, self.actors[uuid].node_ip = node, "10.0.0.9"  # where Ray would have put it
        return ActorInfo(uuid, spec.name, node, "10.0.0.9", tuple(partitions))

    def start_query_actors(
        self, stores: Sequence[tuple[StoreSpec, Sequence[tuple[str, Sequence[int], str | None]]]]
    ) -> list[list[ActorInfo]]:
        return [
            [self._start(spec, u, parts, node or "node-a") for u, parts, node in members] for spec, members in stores
        ]

    def start_joining_actor(self, spec: StoreSpec, uuid: str, partitions: Sequence[int], node_id: str) -> None:
        self._start(spec, uuid, partitions, node_id, joining=True)

    def query_actor_call(self, uuid: str, method: str, *args: Any) -> Any:
        actor = self.actors.get(uuid)
        if actor is None or uuid in self.unreachable:
            raise OwnerUnavailable(f"query actor {uuid} is not running", actors=[uuid])
        return getattr(actor, method)(*args)

    def query_actor_tell(self, uuid: str, method: str) -> None:
        actor = self.actors.get(uuid)
        if actor is not None and uuid not in self.unreachable:
            getattr(actor, method)()

    def holders(self, store: str, partition: int) -> list[str]:
        assert self.registry is not None
        table = self.registry.view().table(store)
        owners = table.partitions[partition] if table is not None else PartitionOwners(None)
        return [u for u in (owners.active, *owners.standbys) if u is not None]

    def snapshot_peer(self, uuid: str) -> Any:
        return self.actors[uuid]

    def reset_refused(self, store: str, source: str) -> str | None:
        return None if self.registry is None else self.registry.reset_refused(store, source)

    def serving_partitions(self, uuid: str) -> set[int]:
        actor = self.actors.get(uuid)
        if actor is None or uuid in self.unreachable:  # as RayEnv: empty when it does not answer
            return set()
        return {p for p, pos in actor.positions().items() if pos["state"] == "serving"}

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            self.actors.pop(name, None)
        super().kill(names)

    def destroy(self, uuids: Sequence[str]) -> None:
        for uuid in uuids:
            actor = self.actors.pop(uuid, None)
            if actor is not None:
                actor.destroy()
        super().destroy(uuids)

    def deliver(self, batch_id: int, rows: dict[str, str], *, to: Sequence[str] | None = None) -> None:
        """What the sink does: every copy the registry lists gets each partition's slice (``to``: only
        these actors, as a delivery with an older view would)."""
        assert self.registry is not None
        table = self.registry.view().table("s")
        assert table is not None
        for uuid, parts in table.all_owners().items():
            if to is not None and uuid not in to:
                continue
            slices = {}
            for p in parts:
                keys = [k for k in rows if table.partition_of(k) == p]
                slices[p] = pa.table({"key": keys, "value": [rows[k] for k in keys]}) if keys else None
            self.actors[uuid].apply("q", batch_id, slices)


def _join(registry: Registry, old: str, node: str) -> str:
    """A mover's first two steps (``riqr.moves``): ask for the new actor, then admit it once it started."""
    new = str(registry.join(old, node)["uuid"])
    return str(registry.admit(old, new)["uuid"])


def _serving(actor: QueryVerticle) -> bool:
    return all(pos["state"] == "serving" for pos in actor.positions().values())


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("standbys", [0, 1])
def test_the_registry_moves_an_actor_copy_catch_up_switch_drop_with_no_batch_lost(
    tmp_path: Path, standbys: int
) -> None:
    env = MoveEnv(tmp_path)
    clock = Clock()
    registry = Registry("ns", env, new_uuid=uuids(), clock=clock)
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=4, actors=2, standbys=standbys))
    old = sorted(view.actors)[0]
    latest = {f"k{i}": "0" for i in range(40)}
    env.deliver(0, latest)
    for b in (1, 2):
        latest.update({f"k{i}": str(b) for i in range(0, 40, 3)})
        env.deliver(b, latest)

    with pytest.raises(InvalidParameter, match="already runs"):
        registry.join(old, view.actors[old].node_id)
    with pytest.raises(InvalidParameter, match="not a live node"):
        registry.join(old, "node-z")
    with pytest.raises(NotFound):
        registry.join("nobody", "node-c")
    epoch = registry.epoch()
    joined = registry.join(old, "node-c")
    new = joined["uuid"]
    # Asked for and not waited for: not in the table, no new epoch, until its mover saw it start (admit).
    assert joined["node_id"] == "node-c" and registry.epoch() == epoch and new not in registry.view().actors
    with pytest.raises(NotFound):
        registry.join(new, "node-b")
    with pytest.raises(NotFound, match="no move"):
        registry.admit(sorted(view.actors)[1], new)
    assert registry.admit(old, new)["node_id"] == "node-c" and registry.epoch() > epoch
    assert new in registry.view().actors and env.actors[new].info()["joining"] is False
    again = _join(registry, old, "node-c")  # a second mover: the earlier move is given up for it
    assert new in env.destroyed and new not in registry.view().actors
    with pytest.raises(Conflict):
        registry.join(again, "node-b")  # a move's new actor is not moved before it is in place
    given_up, new = new, again
    table = registry.view().table("s")
    assert table is not None and all(new in o.standbys for o in table.partitions if old in (o.active, *o.standbys))
    _wait(lambda: _serving(env.actors[new]), "the new copy caught up from its peers")
    # Batches keep coming; a delivery made with the view from before the join reaches the old copy only.
    env.deliver(3, latest)
    env.deliver(4, latest, to=[u for u in table.all_owners() if u != new])
    out = registry.switch(old, new)
    assert out["switched"] is False and out["behind"]  # it lacks batch 4: the old copy is not sealed now
    env.deliver(5, latest)  # the next batch shows it the gap
    if not standbys:  # a store without standbys mends it when its mover says so
        _wait(lambda: env.actors[new].positions()[out["behind"][0]]["state"] != "catching-up", "the gap seen")
        env.actors[new].catch_up(out["behind"])
    _wait(lambda: _serving(env.actors[new]), "the new copy caught up again")

    assert registry.switch(old, new)["switched"] is True
    after = registry.view()
    moved = after.table("s")
    assert moved is not None and old not in moved.all_owners() and old not in after.actors
    assert after.actors[new].node_id == "node-c" and moved.lineage() >= {old, new}
    assert [o.active for o in moved.partitions] == [new if o.active == old else o.active for o in table.partitions]
    with pytest.raises(CopyMoved):  # a delivery with an older view: refused, the sink asks again
        env.actors[old].apply("q", 6, {p: None for p in env.actors[old].info()["partitions"]})
    registry.check_nodes()
    assert old not in env.destroyed  # it still answers the reads already sent to it
    clock.now += 6
    registry.check_nodes()
    assert env.destroyed[-1] == old and env.destroyed.count(old) == 1
    env.deliver(6, latest)
    for uuid, parts in moved.all_owners().items():  # every copy holds every batch: none lost
        got = dict(env.actors[uuid].scan(parts, Scan())[0])
        assert {k: v for k, v in got.items()} == {
            k: b"\xa1" + v.encode() for k, v in latest.items() if moved.partition_of(k) in parts
        }
    assert env.membership is not None
    saved = env.membership["stores"]["s"]
    # the store's earlier actors: the one moved away, and the given-up move's, admitted before (its cursors)
    assert old not in [a["uuid"] for a in saved["actors"]] and saved["moved_from"] == sorted([old, given_up])


def test_a_move_given_up_destroys_the_new_actor_and_leaves_the_old_one_taking_batches(tmp_path: Path) -> None:
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=2, standbys=0))
    before = view.table("s")
    old = sorted(view.actors)[0]
    env.deliver(0, {"a": "1", "b": "2"})
    new = _join(registry, old, "node-c")
    env.actors[old].seal(30)  # as a switch that found the copy behind would leave it, had it died there
    registry.abandon_move(old, new)
    after = registry.view().table("s")
    assert after is not None and after.partitions == before.partitions and after.moved_from == {new}
    assert new in env.destroyed and new not in env.actors
    env.deliver(1, {"a": "3"})  # the old actor takes batches again
    assert env.actors[old].positions()[0]["batch_id"] == 1
    with pytest.raises(PartitionUnavailable):
        QueryVerticle("x", kv_spec("s", partitions=2, actors=2), [0], env, joining=True).get_many([(0, "a")])


# -- the sink meeting a copy that moves ---------------------------------------------------------------------


def test_the_sink_delivers_a_batch_again_to_the_copies_the_registry_names_when_one_is_moving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime.deadline import Deadline
    from tests.unit.test_runner import FakeFeeder, one_string_store
    from topologies.delivery import BatchDelivery

    delivery = BatchDelivery(one_string_store(), "ns", "unused", query_name="riqr-ns-moving", feeder=FakeFeeder())  # type: ignore[arg-type]
    rounds: list[float] = []

    def rounds_refused_twice(*args: Any) -> list[Any]:
        deadline: Deadline = args[-1]
        rounds.append(deadline.remaining())
        if len(rounds) <= 2:
            raise CopyMoved("the copies of store s on this query actor are moving to another actor", store="s")
        return ["applied"]

    monkeypatch.setattr(delivery, "_apply_rounds", rounds_refused_twice)
    assert delivery._apply_everywhere("q", 7, {}, 0) == ["applied"]
    assert len(rounds) == 3 and rounds[0] >= rounds[-1]  # one deadline for the batch, not one per round

    def always_refused(*args: Any) -> list[Any]:
        raise CopyMoved("moving", store="s")

    monkeypatch.setattr(delivery, "_apply_rounds", always_refused)
    delivery.delivery_timeout = 0.3
    with pytest.raises(OwnerUnavailable, match="no switch-over ended within"):
        delivery._apply_everywhere("q", 8, {}, 0)


def test_a_feed_forgets_the_handles_of_actors_its_store_no_longer_names(tmp_path: Path) -> None:
    """A long-running feed kept a Ray handle for every actor it ever sent a batch to (every move's old
    actor, every dropped read replica): each batch's view now keeps only the ones it names."""
    import types

    from tests.unit.test_runner import FakeFeeder
    from topologies.delivery import BatchDelivery

    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=1, standbys=0))
    delivery = BatchDelivery(view.tables["s"].spec, "ns", "unused", query_name="riqr-ns-s", feeder=FakeFeeder())  # type: ignore[arg-type]
    (first,) = view.actors
    delivery._handles = {first: "owner", "moved-away": "old", "http-1": "reader", "http-gone": "dropped reader"}
    reader = types.SimpleNamespace(actor="http-1")
    delivery._keep_handles(view.tables["s"], [reader])  # type: ignore[list-item]
    assert delivery._handles == {first: "owner", "http-1": "reader"}


def test_a_feed_follows_its_store_through_moves_even_across_a_registry_restart(tmp_path: Path) -> None:
    from tests.unit.test_runner import FakeFeeder
    from topologies.delivery import BatchDelivery

    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=1, standbys=0))
    spec = view.tables["s"].spec
    delivery = BatchDelivery(spec, "ns", "unused", query_name="riqr-ns-s", feeder=FakeFeeder())  # type: ignore[arg-type]
    delivery.declared(view)
    (first,) = view.actors
    env.deliver(0, {"a": "1"})
    second = _join(registry, first, "node-b")
    _wait(lambda: _serving(env.actors[second]), "the copy caught up")
    assert registry.switch(first, second)["switched"]
    # The registry restarts (the saved members and the live actors rebuild it) and the one actor moves again,
    # all while the feed looked at no view: its owners then are none of the table's actors.
    restarted_env = MoveEnv(tmp_path)
    restarted_env.membership, restarted_env.actors, restarted_env._restarted = env.membership, env.actors, True
    restarted_env.infos = [a.info() for u, a in env.actors.items() if u == second]
    later = itertools.count(100)  # uuids the first registry did not hand out
    restarted = Registry(
        "ns", restarted_env, new_uuid=lambda: f"00000000-0000-4000-8000-{next(later):012d}", clock=Clock()
    )
    restarted_env.registry = restarted
    third = _join(restarted, second, "node-c")
    _wait(lambda: _serving(restarted_env.actors[third]), "the copy caught up")
    assert restarted.switch(second, third)["switched"]
    now = restarted.view()
    assert delivery.table(now) == now.tables["s"] and not delivery.replaced  # still its store
    assert delivery.owners == {third}
    # A store of that name dropped and declared again has none of them: not this feed's store.
    restarted.drop_store("s")
    again = restarted.create_store(kv_spec("s", partitions=2, actors=1, standbys=0))
    assert delivery.table(again) is None and delivery.replaced


def test_giving_a_move_up_undoes_nothing_once_switched_and_keeps_a_new_copy_that_alone_serves(tmp_path: Path) -> None:
    from runtime.membership import merge_members

    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=2, standbys=0))
    old, other = sorted(view.actors)
    env.deliver(0, {"a": "1", "b": "2"})
    new = _join(registry, old, "node-c")
    _wait(lambda: _serving(env.actors[new]), "the copy caught up")
    assert registry.switch(old, new)["switched"]
    # Its mover gave up while the switch call was under way (a timeout, Ctrl-C): the move stands.
    assert registry.abandon_move(old, new)["outcome"] == "switched"
    assert new in registry.view().actors and new not in env.destroyed
    # The old actor, sealed for good, is never taken back by a restarted registry, even unsaved.
    assert env.actors[old].info()["moved"] is True
    live = [a.info() for a in env.actors.values()]
    merged = merge_members(None, live)
    assert old in merged.dropping and old not in {a.uuid for a in merged.stores["s"][1]}

    # A move whose source stops serving meanwhile (its data lost) keeps the new copy, the only serving one.
    newer = _join(registry, other, "node-c")
    _wait(lambda: _serving(env.actors[newer]), "the copy caught up")
    for state in env.actors[other].core.partitions.values():
        state._mark_incomplete(-1, "lost, for the test")
    assert registry.abandon_move(other, newer)["outcome"] == "kept"
    assert newer in registry.view().actors and newer not in env.destroyed
    assert registry.abandon_move(other, "nobody")["outcome"] == "none"


def test_a_move_given_up_keeps_its_new_copy_when_it_cannot_tell_what_the_copy_serves(tmp_path: Path) -> None:
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=2, standbys=0))
    old = sorted(view.actors)[0]
    env.deliver(0, {"a": "1", "b": "2"})
    new = _join(registry, old, "node-c")
    _wait(lambda: _serving(env.actors[new]), "the copy caught up")
    env.unreachable = {new}  # its probe fails: it may be the only serving copy, so it is not destroyed
    out = registry.abandon_move(old, new)
    assert out["outcome"] == "kept" and "did not say" in out["why"]
    assert new in registry.view().actors and new not in env.destroyed


def test_a_new_actor_its_mover_never_admits_is_destroyed_and_never_taken_back_by_a_restarted_registry(
    tmp_path: Path,
) -> None:
    from runtime.config import MOVE_START_SECONDS
    from runtime.membership import merge_members

    env = MoveEnv(tmp_path)
    clock = Clock()
    registry = Registry("ns", env, new_uuid=uuids(), clock=clock)
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=4, actors=2, standbys=0))
    old, other = sorted(view.actors)
    before = registry.view().table("s")
    env.deliver(0, {"a": "1", "b": "2"})

    # Given up before it was admitted (Ctrl-C while it started): stopped at once (a destroy call would wait
    # behind its constructor, the registry with it; its node's sweeper reclaims what it wrote), the table
    # never changed.
    new = registry.join(old, "node-c")["uuid"]
    assert registry.abandon_move(old, new)["outcome"] == "given-up"
    assert new in env.killed and new not in env.destroyed and registry.view().table("s") == before
    with pytest.raises(NotFound, match="no move"):
        registry.admit(old, new)

    # Its mover was killed: nobody admits it, and the registry's check gives it up once MOVE_START_SECONDS pass.
    orphan = registry.join(old, "node-c")["uuid"]
    clock.now += MOVE_START_SECONDS / 2
    registry.check_nodes()
    assert orphan not in env.killed
    clock.now += MOVE_START_SECONDS
    registry.check_nodes()
    assert orphan in env.killed and registry.view().table("s") == before

    # A restarted registry finds an unadmitted new actor alive: not a copy of anything, destroyed. An admitted
    # one is a copy like any other; one Ray restarted never says joining (it may have been admitted, and be
    # the only copy of its partitions since its switch).
    unadmitted = registry.join(other, "node-c")["uuid"]
    admitted = _join(registry, old, "node-b")
    assert env.membership is not None
    live = [a.info() for a in env.actors.values()]
    assert {i["uuid"]: i["joining"] for i in live if i["uuid"] in (unadmitted, admitted)} == {
        unadmitted: True,
        admitted: False,
    }
    merged = merge_members(env.membership, live)
    kept = {a.uuid for a in merged.stores["s"][1]}
    assert unadmitted in merged.dropping and unadmitted not in kept
    assert admitted in kept and admitted not in merged.dropping
    env._restarted = True  # as Ray restarts it: with its first arguments, joining=True among them
    again = QueryVerticle("restarted-mover", kv_spec("s", partitions=4, actors=2, standbys=0), [1], env, joining=True)
    assert again.info()["joining"] is False
    env._restarted = False
    # Without a readable record, in doubt, nothing is dropped: an extra copy at worst.
    assert unadmitted in {a.uuid for a in merge_members(None, live).stores["s"][1]}
    registry.abandon_move(other, unadmitted)

    # A move whose old actor left the table while its new one started, or whose new actor would run on the
    # old one's node: given up at the admit, the new actor destroyed.
    late = registry.join(other, "node-c")["uuid"]
    env.actors[late].node_id = view.actors[other].node_id
    with pytest.raises(Conflict, match="plan again"):
        registry.admit(other, late)
    assert late in env.killed and late not in registry.view().actors
    gone = registry.join(other, "node-c")["uuid"]
    registry.drop_store("s")
    with pytest.raises(NotFound, match="left its store's table"):
        registry.admit(other, gone)
    assert gone in env.killed


# -- standby copies added to a store (riqr standbys) ---------------------------------------------------------


def _copies_after(view: ClusterView, adds: Sequence[Move]) -> dict[int, list[str]]:
    """Partition -> the nodes of its copies once ``adds`` are made."""
    table = view.tables["s"]
    out = {p: [view.actors[u].node_id for u in (o.active, *o.standbys) if u] for p, o in enumerate(table.partitions)}
    for m in adds:
        assert m.standby and set(m.partitions) <= set(table.all_owners()[m.uuid])
        for p in m.partitions:
            out[p].append(m.target)
    return out


def test_standby_copies_are_planned_one_new_actor_per_active_actor_on_nodes_without_a_copy() -> None:
    from runtime.moves import plan_standbys

    # Made on one node with none: a second node gets one copy of each actor's partitions.
    alone = _placed(kv_spec("s", partitions=4, actors=2, standbys=0), ["n1"], ["u1", "u2"])
    adds = plan_standbys(alone, ["n1", "n2"], "s", 1)
    assert [(m.uuid, m.target, m.partitions, m.shared) for m in adds] == [
        ("u1", "n2", (0, 2), False),
        ("u2", "n2", (1, 3), False),
    ]
    assert all(sorted(nodes) == ["n1", "n2"] for nodes in _copies_after(alone, adds).values())
    assert plan_standbys(alone, ["n1", "n2"], "s", 0) == []  # it has that many already
    # Two: each round goes where no copy is, the least loaded node first.
    two = plan_standbys(alone, ["n1", "n2", "n3"], "s", 2)
    assert len(two) == 4 and not any(m.shared for m in two)
    assert all(sorted(nodes) == ["n1", "n2", "n3"] for nodes in _copies_after(alone, two).values())
    # One node: the copy shares it (another process), and says so.
    (first, second) = plan_standbys(alone, ["n1"], "s", 1)
    assert first.target == second.target == "n1" and first.shared and second.shared
    # A store placed with standbys on two nodes, a third joins: one more copy of each, all on it.
    ringed = _placed(kv_spec("s", partitions=4, actors=2, standbys=1), ["n1", "n2"], ["u1", "u2"])
    more = plan_standbys(ringed, ["n1", "n2", "n3"], "s", 2)
    assert {m.target for m in more} == {"n3"} and sorted(p for m in more for p in m.partitions) == [0, 1, 2, 3]
    # A partition with no active has nothing to copy from: left out.
    table = alone.tables["s"]
    dark = replace(table, partitions=(PartitionOwners(None), *table.partitions[1:]))
    left = plan_standbys(ClusterView(2, {"s": dark}, alone.actors), ["n1", "n2"], "s", 1)
    assert sorted(p for m in left for p in m.partitions) == [1, 2, 3]


def _with_copies(view: ClusterView, copies: dict[str, tuple[str, Sequence[int]]]) -> ClusterView:
    """``view`` with the actors ``copies`` names (uuid -> node and partitions) as the last standbys of their
    partitions, as ``riqr standbys`` adds them."""
    table = view.tables["s"]
    actors = dict(view.actors)
    for uuid, (node, parts) in copies.items():
        source = table.partitions[parts[0]].active
        assert source is not None
        table = table.with_joining(source, uuid, tuple(parts))
        actors[uuid] = ActorInfo(uuid, "s", node, "ip", tuple(parts))
    return ClusterView(view.epoch, {"s": table}, actors)


def test_standby_copies_planned_for_removal_are_whole_actors_that_answer_for_nothing() -> None:
    from runtime.moves import plan_standby_removals, removable_standby

    alone = _placed(kv_spec("s", partitions=4, actors=2, standbys=0), ["n1"], ["u1", "u2"])
    two = _with_copies(alone, {"c1": ("n2", (0, 2)), "c2": ("n2", (1, 3)), "c3": ("n3", (0, 2)), "c4": ("n1", (1, 3))})
    # To one each: c4 shares n1 with u2, the original of its partitions; c1 and c3 are on nodes of their own,
    # the most loaded node's first (n2 holds c1 and c2).
    assert plan_standby_removals(two, ["n1", "n2", "n3"], "s", 1) == (["c4", "c1"], [])
    # To none: all four, the ones on a node that is not alive first.
    removed, left = plan_standby_removals(two, ["n1", "n2"], "s", 0)
    assert removed[0] == "c3" and sorted(removed) == ["c1", "c2", "c3", "c4"] and left == []
    assert plan_standby_removals(two, ["n1", "n2", "n3"], "s", 2) == ([], [])  # none has more than 2
    # A copy that answers for a partition now (a failover promoted it) stays, and so does its partition's
    # other standby; a store's own actors hold active copies: their standbys are not removed.
    promoted = two.tables["s"].with_active(0, "c1")
    view = ClusterView(2, {"s": promoted}, two.actors)
    assert "answers for partitions [0]" in (removable_standby(promoted, "c1", 0) or "")
    removed, left = plan_standby_removals(view, ["n1", "n2", "n3"], "s", 0)
    assert "c1" not in removed and sorted(removed) == ["c2", "c3", "c4"] and left == [0, 2]
    ringed = _placed(kv_spec("s", partitions=4, actors=2, standbys=1), ["n1", "n2"], ["u1", "u2"])
    assert plan_standby_removals(ringed, ["n1", "n2"], "s", 0) == ([], [0, 1, 2, 3])
    assert "answers for partitions" in (removable_standby(ringed.tables["s"], "u1", 0) or "")
    assert "would keep fewer than 2" in (removable_standby(two.tables["s"], "c1", 2) or "")


def test_a_moved_actor_is_said_to_answer_for_its_active_partitions_and_keep_copies_of_the_others() -> None:
    """What `riqr rebalance` and `riqr drain` say of a moved actor: a copy `riqr standbys` added answers for
    no partition (it used to be said to answer for all it held), a store's own actor for its actives."""
    from riqr.moves import holdings_phrase

    alone = _placed(kv_spec("s", partitions=4, actors=2, standbys=0), ["n1"], ["u1", "u2"])
    two = _with_copies(alone, {"c1": ("n2", (0, 2))}).tables["s"]
    assert holdings_phrase(two, "c1", (0, 2)) == "keeps a standby copy of partitions 0, 2"
    assert holdings_phrase(two, "u1", (0, 2)) == "answers for partitions 0, 2"
    promoted = two.with_active(0, "c1")
    said = holdings_phrase(promoted, "c1", (0, 2))
    assert said == "answers for partitions 0 and keeps a standby copy of partitions 2"


def test_the_registry_adds_a_standby_copy_that_catches_up_and_stays_with_no_batch_lost(tmp_path: Path) -> None:
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=4, actors=2, standbys=0))
    first, second = sorted(view.actors)
    latest = {f"k{i}": "0" for i in range(40)}
    env.deliver(0, latest)
    held = view.tables["s"].all_owners()

    with pytest.raises(InvalidParameter, match="not all of"):
        registry.add_standby(first, "node-b", held[second])
    added = []
    for source, node in ((first, "node-b"), (second, view.actors[second].node_id)):  # the second on its own node
        new = registry.add_standby(source, node, held[source])["uuid"]
        assert new not in registry.view().actors  # not waited for, as a move's join
        assert registry.admit(source, new)["node_id"] == node
        table = registry.view().table("s")
        assert table is not None and all(o.standbys[-1] == new for p, o in enumerate(table.partitions)
                                         if p in held[source])  # fmt: skip
        assert registry.view().actors[new].partitions == tuple(held[source])
        latest.update({f"k{i}": str(len(added) + 1) for i in range(0, 40, 3)})
        env.deliver(len(added) + 1, latest)  # batches go on meanwhile, to the new copy as well
        _wait(lambda n=new: _serving(env.actors[n]), "the new copy caught up")
        out = registry.keep(source, new)
        assert out["kept"] is True, out
        assert registry.keep(source, new)["kept"] is True  # asked again (an answer lost): the same
        added.append(new)
        # The store's standbys: the fewest any partition has, 0 until both actors' partitions have one.
        spec = registry.view().tables["s"].spec
        assert spec.standbys == len(added) // 2 == out["standbys"]
    # The original actors stay where they were, and answer for their partitions as before.
    after = registry.view()
    assert [o.active for o in after.tables["s"].partitions] == [o.active for o in view.tables["s"].partitions]
    assert after.actors[first] == view.actors[first] and after.actors[second] == view.actors[second]
    env.deliver(3, latest)
    for uuid, parts in after.tables["s"].all_owners().items():  # every copy holds every batch
        got = dict(env.actors[uuid].scan(parts, Scan())[0])
        want = {k: b"\xa1" + v.encode() for k, v in latest.items() if after.tables["s"].partition_of(k) in parts}
        assert got == want, uuid
    assert env.membership is not None and env.membership["stores"]["s"]["spec"]["standbys"] == 1
    # A copy behind is not kept: the answer says which partitions.
    late = registry.add_standby(first, "node-c", held[first])["uuid"]
    registry.admit(first, late)
    _wait(lambda: _serving(env.actors[late]), "the late copy caught up")
    others = [u for u in registry.view().tables["s"].all_owners() if u != late]
    env.deliver(4, latest, to=others)  # a delivery with the view from before its admission
    out = registry.keep(first, late)
    assert out["kept"] is False and out["behind"] == list(held[first])
    assert registry.abandon_move(first, late)["outcome"] == "given-up" and late not in registry.view().actors


def test_a_store_dropped_while_a_copy_and_a_move_of_its_actors_are_under_way_leaves_nothing_of_them(
    tmp_path: Path,
) -> None:
    """Their drivers killed after admission, the store then dropped: the registry kept each entry for its
    life (a long-lived process's slow growth)."""
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=2, standbys=0))
    first, second = sorted(view.actors)
    copy = registry.add_standby(first, "node-b", view.tables["s"].all_owners()[first])["uuid"]
    registry.admit(first, copy)
    moved = _join(registry, second, "node-c")
    assert {copy, moved} <= set(registry.view().actors)
    registry.drop_store("s")
    assert not registry._moving and not registry._copying
    with pytest.raises(NotFound):
        registry.keep(first, copy)  # its driver's next call: no such actor
    assert registry.abandon_move(second, moved)["outcome"] == "none"


def test_copies_added_to_a_store_without_standbys_make_every_copy_catch_up_from_peers_and_stay_once_kept(
    tmp_path: Path,
) -> None:
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=4, actors=2, standbys=0))
    first, second = sorted(view.actors)
    held = view.tables["s"].all_owners()
    env.deliver(0, {f"k{i}": "0" for i in range(40)})
    assert not env.actors[first].core.catch_up_on_gap  # created without standbys: no peer to copy from

    # A move of an actor under way: no standby copy of its partitions until it is made.
    moving = registry.join(first, "node-c")["uuid"]
    with pytest.raises(Conflict, match="being moved"):
        registry.add_standby(first, "node-b", held[first])
    registry.abandon_move(first, moving)

    copies = {}
    for source in (first, second):
        new = registry.add_standby(source, "node-c", held[source])["uuid"]
        registry.admit(source, new)
        assert env.actors[new].core.catch_up_on_gap  # a standby copy from its start
        _wait(lambda n=new: _serving(env.actors[n]), "the copy caught up")
        copies[source] = new
    out = registry.keep(first, copies[first])
    assert out["kept"] is True and set(out) == {"kept", "epoch", "standbys"}
    # Its driver's answer lost, then its deadline: giving it up leaves it, a standby already.
    assert registry.abandon_move(first, copies[first])["outcome"] == "kept"
    assert copies[first] in registry.view().actors and copies[first] not in env.destroyed
    # The second's driver was killed after the admit: its source is neither copied nor moved meanwhile...
    with pytest.raises(Conflict, match="being added"):
        registry.add_standby(second, "node-a", held[second])
    with pytest.raises(Conflict, match="being added"):
        registry.join(second, "node-a")
    # ... and the next `riqr standbys` settles it, caught up: kept, not destroyed.
    assert registry.settle_standbys("s") == {"standbys": 1, "pending": [], "kept": [copies[second]]}
    assert copies[second] in registry.view().actors and copies[second] not in env.destroyed
    table = registry.view().tables["s"]
    assert table.spec.standbys == table.fewest_standbys() == 1
    # Every actor of the store now rebuilds a copy it cannot serve from its peers by itself; one that
    # Ray restarts with its first arguments (a spec without standbys) is told so when it reports back.
    assert all(env.actors[u].core.catch_up_on_gap for u in table.all_owners())
    env.actors[first].core.catch_up_on_gap = False
    registry.actor_moved(first, view.actors[first].node_id, "10.0.0.9")
    assert env.actors[first].core.catch_up_on_gap


def _restart(env: MoveEnv, tmp_path: Path) -> tuple[MoveEnv, Registry]:
    """A registry restarted over ``env``'s actors and saved members (Ray restarts it; the actors live on)."""
    restarted_env = MoveEnv(tmp_path)
    restarted_env.membership, restarted_env.actors, restarted_env._restarted = env.membership, env.actors, True
    restarted_env.infos = [a.info() for a in env.actors.values()]
    later = itertools.count(100)
    restarted = Registry(
        "ns", restarted_env, new_uuid=lambda: f"00000000-0000-4000-8000-{next(later):012d}", clock=Clock()
    )
    restarted_env.registry = restarted
    return restarted_env, restarted


def _copy_admitted(tmp_path: Path) -> tuple[MoveEnv, Registry, str, str]:
    """A store of 2 partitions on one actor, no standbys, loaded; a standby copy of both partitions added
    and admitted, caught up, not kept yet: the env, the registry, the store's actor and the copy."""
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=1, standbys=0))
    (first,) = view.actors
    env.deliver(0, {f"k{i}": "0" for i in range(20)})
    copy = registry.add_standby(first, "node-b", (0, 1))["uuid"]
    registry.admit(first, copy)
    _wait(lambda: _serving(env.actors[copy]), "the copy caught up")
    return env, registry, first, copy


def test_a_copy_admitted_before_a_registry_restart_stays_when_its_driver_gives_up_and_counts_as_a_standby(
    tmp_path: Path,
) -> None:
    env, _, first, copy = _copy_admitted(tmp_path)
    # The registry restarts before its driver's keep (the saved members and the live actors rebuild it): it
    # keeps no moves, so it cannot tell this copy from one kept already.
    restarted_env, restarted = _restart(env, tmp_path)
    table = restarted.view().tables["s"]
    assert set(table.all_owners()) == {first, copy}
    # The store says the standbys its table has, and its original actor now rebuilds from its peer.
    assert table.spec.standbys == table.fewest_standbys() == 1
    assert env.actors[first].core.catch_up_on_gap
    # The driver's keep answer was lost and its deadline passed: its give-up leaves the copy, in doubt.
    out = restarted.abandon_move(first, copy)
    assert out["outcome"] == "kept" and "restarted" in out["why"]
    assert copy in restarted.view().actors and copy not in restarted_env.destroyed
    assert all(copy in (o.active, *o.standbys) for o in restarted.view().tables["s"].partitions)


def test_copies_added_before_a_registry_restart_stay_standbys_and_can_be_removed_after_it(tmp_path: Path) -> None:
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=4, actors=2, standbys=0))
    held = view.tables["s"].all_owners()
    env.deliver(0, {f"k{i}": str(i) for i in range(40)})
    copies = []
    for source in sorted(held):
        new = registry.add_standby(source, "node-b", held[source])["uuid"]
        registry.admit(source, new)
        _wait(lambda n=new: _serving(env.actors[n]), "the copy caught up")
        assert registry.keep(source, new)["kept"]
        copies.append(new)
    before = registry.view().tables["s"].partitions
    # A restarted registry learns from the actors which partitions each holds, not which copy answered: the
    # saved members say, so the store's own actors answer again and the added copies stay standbys (dealt
    # anew, some copies became actives, and ``riqr standbys s 0`` was refused for them).
    _, restarted = _restart(env, tmp_path)
    assert restarted.view().tables["s"].partitions == before
    for copy in copies:
        restarted.remove_standby(copy, 0)
    table = restarted.view().tables["s"]
    assert set(table.all_owners()) == set(held) and table.spec.standbys == 0


def test_a_partition_a_failover_moved_goes_back_to_its_first_active_across_a_registry_restart(tmp_path: Path) -> None:
    env, registry, first, copy = _copy_admitted(tmp_path)
    assert registry.keep(first, copy)["kept"]
    env.down = {first}
    registry.check_actors()  # a failover: the added copy answers for both partitions
    assert {o.active for o in registry.view().tables["s"].partitions} == {copy}
    # The registry restarts before the first active is back: the give-back it owed is saved with the members.
    restarted_env, restarted = _restart(env, tmp_path)
    assert {o.active for o in restarted.view().tables["s"].partitions} == {copy}
    restarted_env.down = set()
    restarted.check_actors()
    assert {o.active for o in restarted.view().tables["s"].partitions} == {first}
    restarted.remove_standby(copy, 0)  # the added copy is one again: it can go
    assert set(restarted.view().tables["s"].all_owners()) == {first}


def _move_admitted(tmp_path: Path) -> tuple[MoveEnv, str, str]:
    """A store of 2 partitions on one actor, no standbys, loaded; a move of that actor admitted and its new
    actor caught up, not switched: the env, the old actor and the new one."""
    env = MoveEnv(tmp_path)
    registry = Registry("ns", env, new_uuid=uuids(), clock=Clock())
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=2, actors=1, standbys=0))
    (old,) = view.actors
    env.deliver(0, {f"k{i}": "0" for i in range(20)})
    new = _join(registry, old, "node-b")
    _wait(lambda: _serving(env.actors[new]), "the new actor caught up")
    return env, old, new


def test_a_move_under_way_across_a_registry_restart_leaves_the_store_with_the_standbys_it_had(tmp_path: Path) -> None:
    env, old, new = _move_admitted(tmp_path)
    # Restarted mid-move, the registry takes the new actor for a standby copy (it keeps no moves): the
    # store says 1 standby while both copies are there.
    restarted_env, restarted = _restart(env, tmp_path)
    assert restarted.view().tables["s"].spec.standbys == 1
    # The mover's switch needs no memory of the move: once made, the store has the 0 standbys it had.
    assert restarted.switch(old, new)["switched"]
    table = restarted.view().tables["s"]
    assert set(table.all_owners()) == {new} and table.spec.standbys == table.fewest_standbys() == 0
    assert restarted_env.membership is not None
    assert restarted_env.membership["stores"]["s"]["spec"]["standbys"] == 0
    assert not env.actors[new].core.catch_up_on_gap  # told it has no peers: the rebuild path


def test_a_move_across_two_registry_restarts_still_gives_the_store_its_standbys_back_and_no_copy_goes_meanwhile(
    tmp_path: Path,
) -> None:
    env, old, new = _move_admitted(tmp_path)
    once_env, once = _restart(env, tmp_path)
    # While the move may be under way unseen, no copy is removed: the one kept could be the move's old actor.
    with pytest.raises(Conflict, match="restarted with more copies"):
        once.remove_standby(new, 0)
    twice_env, twice = _restart(once_env, tmp_path)  # the raised spec was saved: this one sees nothing raised
    assert twice.view().tables["s"].spec.standbys == 1
    assert twice.switch(old, new)["switched"]
    table = twice.view().tables["s"]
    assert set(table.all_owners()) == {new} and table.spec.standbys == table.fewest_standbys() == 0


def test_standby_copies_are_removed_whole_after_a_grace_and_the_store_says_what_it_has_left(tmp_path: Path) -> None:
    env = MoveEnv(tmp_path)
    clock = Clock()
    registry = Registry("ns", env, new_uuid=uuids(), clock=clock)
    env.registry = registry
    view = registry.create_store(kv_spec("s", partitions=4, actors=2, standbys=0))
    first, second = sorted(view.actors)
    held = view.tables["s"].all_owners()
    latest = {f"k{i}": str(i) for i in range(40)}
    env.deliver(0, latest)
    copies = {}
    for source in (first, second):
        new = registry.add_standby(source, "node-b", held[source])["uuid"]
        registry.admit(source, new)
        _wait(lambda n=new: _serving(env.actors[n]), "the copy caught up")
        assert registry.keep(source, new)["kept"]
        copies[source] = new
    assert registry.view().tables["s"].spec.standbys == 1 and env.actors[first].core.catch_up_on_gap

    # Refused, nothing changed: an actor that answers for partitions, a removal that would leave fewer than
    # wanted, a copy whose partitions' other copy does not serve now, an actor not known.
    with pytest.raises(Conflict, match="answers for partitions"):
        registry.remove_standby(first, 0)
    with pytest.raises(Conflict, match="would keep fewer than 1"):
        registry.remove_standby(copies[first], 1)
    env.unreachable = {first}
    with pytest.raises(Conflict, match="would not keep 1 copies that serve now"):
        registry.remove_standby(copies[first], 0)
    env.unreachable = set()
    # While a move of one of the store's actors is under way: its new actor counts as a standby it may
    # never be.
    moving = registry.join(second, "node-c")["uuid"]
    registry.admit(second, moving)
    with pytest.raises(Conflict, match="under way"):
        registry.remove_standby(copies[first], 0)
    registry.abandon_move(second, moving)
    # An actor a failover took partitions from, which gets them back once it serves: one of the store's own.
    registry._first_active[("s", held[first][0])] = copies[first]  # as a promotion leaves it
    with pytest.raises(Conflict, match="gets them back"):
        registry.remove_standby(copies[first], 0)
    registry._first_active.clear()
    with pytest.raises(NotFound):
        registry.remove_standby("nobody", 0)
    assert registry.view().tables["s"].spec.standbys == 1

    # Removed: out of the table at once (the sink stops delivering to it), destroyed after the grace for
    # reads already sent to it; the store says the fewest standbys any partition has left.
    out = registry.remove_standby(copies[first], 0)
    assert out["standbys"] == 0 and out["partitions"] == list(held[first])
    assert copies[first] not in registry.view().tables["s"].all_owners() and copies[first] not in env.destroyed
    assert not env.actors[first].core.catch_up_on_gap  # its copies have no peer left: the rebuild path
    assert env.actors[second].core.catch_up_on_gap  # its partitions still have one
    clock.now += 6
    registry.check_nodes()
    assert copies[first] in env.destroyed
    registry.remove_standby(copies[second], 0)
    table = registry.view().tables["s"]
    assert set(table.all_owners()) == {first, second} and table.spec.standbys == 0
    assert not env.actors[second].core.catch_up_on_gap
    assert env.membership is not None and env.membership["stores"]["s"]["spec"]["standbys"] == 0
    # Batches go on to the copies left, and every one of them holds every batch.
    env.deliver(1, {k: v + "!" for k, v in latest.items()})
    for uuid, parts in table.all_owners().items():
        got = dict(env.actors[uuid].scan(parts, Scan())[0])
        assert got == {k: msgpack.packb(v + "!") for k, v in latest.items() if table.partition_of(k) in parts}
    # A restarted original is told it has no peers (Ray restarts it with its first arguments).
    env.actors[first].core.catch_up_on_gap = True
    registry.actor_moved(first, view.actors[first].node_id, "10.0.0.9")
    assert not env.actors[first].core.catch_up_on_gap


def test_a_mover_asks_the_new_copy_to_copy_from_the_one_it_replaces_and_an_older_actor_without() -> None:
    from riqr.moves import _catch_up
    from runtime.errors import InternalError

    asked: list[tuple[Any, ...]] = []

    def ask(uuid: str, method: str, *args: Any) -> Any:
        asked.append((uuid, method, *args))
        return [0]

    _catch_up(ask, "new", [0, 2], "old")
    assert asked == [("new", "catch_up", [0, 2], "old")]

    def older(uuid: str, method: str, *args: Any) -> Any:
        asked.append((uuid, method, *args))
        if len(args) == 2:
            raise InternalError("catch_up on query actor new failed inside the actor: TypeError: takes 2 arguments")
        return [0]

    asked.clear()
    _catch_up(older, "new", [1], "old")
    assert asked == [("new", "catch_up", [1], "old"), ("new", "catch_up", [1])]

    def broken(uuid: str, method: str, *args: Any) -> Any:
        raise InternalError("catch_up on query actor new failed inside the actor: OSError: disk full")

    with pytest.raises(InternalError, match="disk full"):
        _catch_up(broken, "new", [1], "old")
