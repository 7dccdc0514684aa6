import pytest

from runtime.ownership import (
    ClusterView,
    OwnershipTable,
    PartitionOwners,
    Route,
    Unassigned,
    plan_placement,
    table_from_holdings,
    table_from_placement,
)
from runtime.partitioner import partition_of
from tests.unit.fakes import kv_spec


def test_placement_spreads_actors_over_nodes_and_partitions_over_actors() -> None:
    plans = plan_placement(kv_spec(partitions=4, actors=2), ["n2", "n1"])
    assert [(p.index, p.node_id, p.partitions) for p in plans] == [(0, "n1", (0, 2)), (1, "n2", (1, 3))]


def test_placement_without_known_nodes_leaves_it_to_ray() -> None:
    assert [p.node_id for p in plan_placement(kv_spec(), [])] == [None, None]


def test_resolve_routes_to_the_owner_of_the_key_partition() -> None:
    spec = kv_spec(partitions=4, actors=2)
    table = table_from_placement(spec, ["a", "b"], plan_placement(spec, ["n"]))
    for key in ["1", "2", "", "ü"]:
        p = partition_of(spec.key.type, key, 4)
        assert table.resolve(key) == Route(p, "a" if p % 2 == 0 else "b")


def test_resolve_returns_a_verdict_for_an_unowned_partition() -> None:
    spec = kv_spec(partitions=2, actors=1)
    table = OwnershipTable(spec, (PartitionOwners(None), PartitionOwners("a")))
    verdicts = {table.route(0), table.route(1)}
    assert verdicts == {Unassigned(0), Route(1, "a")}
    assert table.unassigned() == [0]
    assert table.by_owner() == {"a": [1]}


def test_standbys_are_other_actors_and_hold_copies() -> None:
    spec = kv_spec(partitions=4, actors=2)
    spec = type(spec)(**{**spec.__dict__, "standbys": 1})
    table = table_from_placement(spec, ["a", "b"], plan_placement(spec, ["n"]))
    assert table.partitions[0] == PartitionOwners("a", ("b",))
    assert table.partitions[1] == PartitionOwners("b", ("a",))
    assert table.all_owners() == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    assert table.by_owner() == {"a": [0, 2], "b": [1, 3]}


def test_view_lists_stores_sorted() -> None:
    a, b = kv_spec("b-store"), kv_spec("a-store")
    view = ClusterView(
        1,
        {s.name: table_from_placement(s, ["x", "y"], plan_placement(s, [])) for s in (a, b)},
    )
    assert [s.name for s in view.stores()] == ["a-store", "b-store"]
    assert view.table("missing") is None


def test_a_standby_goes_to_another_node_whenever_there_is_one() -> None:
    spec = kv_spec(partitions=6, actors=3, standbys=1)
    plans = plan_placement(spec, ["n1", "n2"])  # actors 0 and 2 on n1, actor 1 on n2
    table = table_from_placement(spec, ["a", "b", "c"], plans)
    node = {"a": "n1", "b": "n2", "c": "n1"}
    for owners in table.partitions:
        assert owners.active is not None and len(owners.standbys) == 1
        assert node[owners.standbys[0]] != node[owners.active]
    assert table.partitions[2] == PartitionOwners("c", ("b",))  # "a" is next round the ring, but on n1


def test_more_copies_than_nodes_share_nodes_but_never_actors() -> None:
    spec = kv_spec(partitions=3, actors=3, standbys=2)
    table = table_from_placement(spec, ["a", "b", "c"], plan_placement(spec, ["n1", "n2"]))
    for owners in table.partitions:
        copies = (owners.active, *owners.standbys)
        assert len(set(copies)) == 3


def test_promotion_moves_each_partition_of_a_down_active_to_its_first_live_standby() -> None:
    spec = kv_spec(partitions=3, actors=3, standbys=2)
    table = OwnershipTable(
        spec,
        (PartitionOwners("a", ("b", "c")), PartitionOwners("b", ("c", "a")), PartitionOwners("c", ("a", "b"))),
    )
    promoted = table.promote({"a", "b"})
    # a's partition goes to c (b is down too); b's to c; the old active stays a holder, last in line.
    assert promoted.partitions == (
        PartitionOwners("c", ("b", "a")),
        PartitionOwners("c", ("a", "b")),
        PartitionOwners("c", ("a", "b")),
    )
    assert table.promote(set()) is table and table.promote({"x"}) is table
    alone = OwnershipTable(kv_spec(partitions=1, actors=1), (PartitionOwners("a"),))
    assert alone.promote({"a"}) is alone  # no standby: the active stays, and reads get 503s
    assert sorted(promoted.all_owners()) == ["a", "b", "c"]  # nobody stops holding a copy


def test_giving_a_partition_back_to_a_holder_keeps_every_copy() -> None:
    spec = kv_spec(partitions=2, actors=2, standbys=1)
    table = OwnershipTable(spec, (PartitionOwners("b", ("a",)), PartitionOwners("b", ("a",))))
    assert table.with_active(0, "a").partitions == (PartitionOwners("a", ("b",)), PartitionOwners("b", ("a",)))
    assert table.with_active(0, "b") is table
    with pytest.raises(ValueError, match="holds no copy"):
        table.with_active(0, "z")


def test_a_table_rebuilt_from_holdings_spreads_the_actives_over_the_holders() -> None:
    spec = kv_spec(partitions=4, actors=2, standbys=1)
    table = table_from_holdings(spec, {"u2": [0, 1, 2, 3], "u1": [0, 1, 2, 3]})
    assert [(o.active, o.standbys) for o in table.partitions] == [
        ("u1", ("u2",)),
        ("u2", ("u1",)),
        ("u1", ("u2",)),
        ("u2", ("u1",)),
    ]
    with pytest.raises(KeyError):
        table_from_holdings(spec, {"u1": [0, 1]})


def test_a_rebuilt_table_gives_each_partition_back_to_its_saved_active_while_it_holds_it() -> None:
    spec = kv_spec(partitions=4, actors=2, standbys=1)
    holdings = {"u1": [0, 1, 2, 3], "u2": [0, 1, 2, 3], "u3": [0, 1, 2, 3]}
    table = table_from_holdings(spec, holdings, ["u3", "u3", None, "gone"])
    assert [(o.active, o.standbys) for o in table.partitions] == [
        ("u3", ("u1", "u2")),
        ("u3", ("u2", "u1")),
        ("u3", ("u1", "u2")),  # no saved active, and one that holds no copy: dealt as before
        ("u1", ("u2", "u3")),
    ]
