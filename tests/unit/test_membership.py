"""The stores' members a registry saves, and how a restarted one merges them with the live query actors."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from runtime.catalog import StoreSpec, ValueField
from runtime.keys import KeySchema
from runtime.membership import membership_record, merge_members, spec_from_record, spec_record
from runtime.ownership import ActorInfo, ClusterView, table_from_holdings
from tests.unit.fakes import kv_spec, windowed_spec

SPECS = [
    kv_spec("plain"),
    kv_spec("auto", standbys=None),
    kv_spec("composite", key_type="long", rest=(("n", "int"), ("at", "timestamp")), standbys=1),
    windowed_spec("w"),
    windowed_spec("sessions", kind="session"),
    StoreSpec(
        "maps",
        KeySchema("id", "string"),
        (ValueField("a", "bigint"), ValueField("b", "string")),
        partitions=8,
        actors=3,
        standbys=2,
        engine="memory",
        read_replicas=True,
    ),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_field_of_a_spec_comes_back_from_its_json_record(spec: StoreSpec) -> None:
    record = json.loads(json.dumps(spec_record(spec)))
    assert spec_from_record(record) == spec


def _view(*stores: tuple[StoreSpec, dict[str, tuple[str, tuple[int, ...]]]]) -> ClusterView:
    tables, actors = {}, {}
    for spec, members in stores:
        tables[spec.name] = table_from_holdings(spec, {u: parts for u, (_, parts) in members.items()})
        for uuid, (node, parts) in members.items():
            actors[uuid] = ActorInfo(uuid, spec.name, node, f"ip-{node}", parts)
    return ClusterView(epoch=3, tables=tables, actors=actors)


def _info(spec: StoreSpec, uuid: str, node: str, parts: list[int]) -> dict[str, Any]:
    return {"uuid": uuid, "spec": spec, "partitions": parts, "node_id": node, "node_ip": f"ip-{node}"}


def test_a_record_lists_each_store_with_its_spec_and_every_actor() -> None:
    spec = kv_spec("s", partitions=4, actors=2)
    record = json.loads(json.dumps(membership_record(_view((spec, {"u2": ("b", (1, 3)), "u1": ("a", (0, 2))})))))
    assert record["version"] == 1
    assert spec_from_record(record["stores"]["s"]["spec"]) == spec
    assert record["stores"]["s"]["actors"] == [
        {"uuid": "u1", "node_id": "a", "node_ip": "ip-a", "partitions": [0, 2]},
        {"uuid": "u2", "node_id": "b", "node_ip": "ip-b", "partitions": [1, 3]},
    ]
    assert record["stores"]["s"]["actives"] == ["u1", "u2", "u1", "u2"]


def test_each_partitions_saved_active_comes_back_and_a_record_of_an_older_riqr_has_none() -> None:
    spec = kv_spec("s", partitions=2, actors=2, standbys=1)
    view = _view((spec, {"u1": ("a", (0, 1)), "u2": ("b", (0, 1))}))
    swapped = dataclasses.replace(view.tables["s"], partitions=tuple(
        dataclasses.replace(o, active=o.standbys[0], standbys=(o.active,)) for o in view.tables["s"].partitions
    ))  # fmt: skip
    saved = json.loads(json.dumps(membership_record(dataclasses.replace(view, tables={"s": swapped}))))
    live = [_info(spec, "u1", "a", [0, 1]), _info(spec, "u2", "b", [0, 1])]
    assert merge_members(saved, live).actives == {"s": ("u2", "u1")}
    del saved["stores"]["s"]["actives"]
    assert merge_members(saved, live).actives == {}
    saved["stores"]["s"]["actives"] = "u1"  # not a list: ignored, the actives are dealt
    assert merge_members(saved, live).actives == {}


def test_the_actors_that_do_not_answer_come_from_the_record_and_the_live_ones_win() -> None:
    s, t, gone = kv_spec("s", partitions=4, actors=2), kv_spec("t", partitions=2, actors=1), kv_spec("gone")
    saved = membership_record(
        _view(
            (s, {"u1": ("a", (0, 2)), "u2": ("b", (1, 3))}),
            (t, {"u3": ("a", (0, 1))}),
            (gone, {"u4": ("b", (0, 1, 2, 3))}),
        )
    )
    # u1 answers from another node (it was re-created there); u2 does not answer; t's only actor answers;
    # none of "gone"'s does.
    live = [_info(s, "u1", "c", [0, 2]), _info(t, "u3", "a", [0, 1])]
    merged = merge_members(saved, live)
    stores, remembered = merged.stores, merged.remembered
    assert sorted(remembered) == ["u2", "u4"] and merged.carried == {} and not merged.retired
    assert sorted(stores) == ["gone", "s", "t"]
    spec, actors = stores["s"]
    assert spec == s
    assert {a.uuid: (a.node_id, a.partitions) for a in actors} == {"u1": ("c", (0, 2)), "u2": ("b", (1, 3))}
    assert [a.uuid for a in stores["gone"][1]] == ["u4"] and stores["gone"][0] == gone
    assert [a.uuid for a in stores["t"][1]] == ["u3"]


def test_without_a_record_only_the_live_actors_count() -> None:
    s = kv_spec("s", partitions=4, actors=2)
    merged = merge_members(None, [_info(s, "u1", "a", [0, 2])])
    assert merged.remembered == [] and [a.uuid for a in merged.stores["s"][1]] == ["u1"]


def test_a_record_that_disagrees_with_the_live_actors_is_left_out_and_one_that_cannot_be_read_is_carried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = kv_spec("s", partitions=4, actors=2)
    other = dataclasses.replace(s, partitions=8)
    saved = membership_record(_view((other, {"u1": ("a", (0, 2, 4, 6)), "u9": ("b", (1, 3, 5, 7))})))
    merged = merge_members(saved, [_info(s, "u1", "a", [0, 2])])
    assert merged.remembered == [] and merged.stores["s"][0] == s and [a.uuid for a in merged.stores["s"][1]] == ["u1"]
    assert "another definition" in caplog.text

    unreadable = {"spec": {"name": "x"}, "actors": []}
    broken = {"version": 1, "stores": {"x": unreadable, "s": saved["stores"]["s"]}}
    merged = merge_members(broken, [])
    assert "x" not in merged.stores and "unreadable" in caplog.text
    assert merged.carried == {"x": unreadable}  # kept as it was, for the next saves
    assert sorted(merged.remembered) == ["u1", "u9"]  # the readable entry still counts
    # A record written with what could not be read carries it, and drops it once the store is held again.
    assert membership_record(ClusterView(), carried=merged.carried)["stores"] == {"x": unreadable}
    held = _view((kv_spec("x"), {"u5": ("a", (0, 1, 2, 3))}))
    assert membership_record(held, carried=merged.carried)["stores"]["x"]["actors"][0]["uuid"] == "u5"
    for unknown in ({"version": 99, "stores": saved["stores"]}, {"version": 1, "stores": []}, ["not", "a", "map"]):
        assert merge_members(unknown, []).stores == {}  # type: ignore[arg-type]


def test_the_saved_spec_wins_where_the_layout_is_the_same_and_retired_comes_back() -> None:
    """``read_replicas`` changes in place and is saved; an actor keeps the spec it was created with."""
    s = kv_spec("s", partitions=4, actors=2)
    turned_on = dataclasses.replace(s, read_replicas=True)
    saved = membership_record(_view((turned_on, {"u1": ("a", (0, 2)), "u2": ("b", (1, 3))})), retired=True)
    merged = merge_members(saved, [_info(s, "u1", "a", [0, 2]), _info(s, "u2", "b", [1, 3])])
    assert merged.stores["s"][0] == turned_on and merged.retired
    assert not merge_members(membership_record(ClusterView()), []).retired


def test_a_record_without_a_store_leaves_it_out() -> None:
    s, t = kv_spec("s"), kv_spec("t")
    view = _view((s, {"u1": ("a", (0, 1, 2, 3))}), (t, {"u2": ("b", (0, 1, 2, 3))}))
    assert sorted(membership_record(view, without="t")["stores"]) == ["s"]


def test_the_actors_of_a_drop_saved_but_not_finished_are_not_taken_back() -> None:
    """A registry saved a drop (the store gone, its actors marked) and stopped before destroying them:
    they still answer a restarted one, which must destroy them rather than serve the store again."""
    dropped, kept = kv_spec("d", partitions=2, actors=2), kv_spec("k", partitions=2, actors=1)
    view = _view((dropped, {"d1": ("a", (0,)), "d2": ("b", (1,))}), (kept, {"k1": ("a", (0, 1))}))
    record = json.loads(json.dumps(membership_record(view, without="d", dropping=["d2", "d1"])))
    assert sorted(record["stores"]) == ["k"] and record["dropping"] == ["d1", "d2"]
    live = [_info(dropped, "d1", "a", [0]), _info(dropped, "d2", "b", [1]), _info(kept, "k1", "a", [0, 1])]
    merged = merge_members(record, live)
    assert sorted(merged.stores) == ["k"] and merged.dropping == ["d1", "d2"] and merged.remembered == []
    # Nothing pending: the key is left out, and a record without it (or an unreadable one) drops nothing.
    assert "dropping" not in membership_record(view, dropping=iter(()))
    assert merge_members(membership_record(view), live).dropping == []
    assert sorted(merge_members({**record, "dropping": "d1"}, live).stores) == ["d", "k"]


def test_an_actor_that_says_it_was_destroyed_is_never_taken_back() -> None:
    """It deleted its data for a drop or a `down` and was not killed yet; the record may not say so (no
    marks: a registry restarted in the middle of `riqr down`, or a record of another version)."""
    spec = kv_spec("d", partitions=2, actors=2)
    view = _view((spec, {"d1": ("a", (0,)), "d2": ("b", (1,))}))
    live = [{**_info(spec, "d1", "a", [0]), "destroyed": True}, _info(spec, "d2", "b", [1])]
    # The whole store goes: the actors not destroyed yet too, and the saved ones that did not answer.
    other = kv_spec("k", partitions=2, actors=1)
    view = _view((spec, {"d1": ("a", (0,)), "d2": ("b", (1,)), "d3": ("a", (1,))}), (other, {"k1": ("a", (0, 1))}))
    merged = merge_members(membership_record(view), [*live, _info(other, "k1", "a", [0, 1])])
    assert merged.dropping == ["d1", "d2", "d3"] and sorted(merged.stores) == ["k"] and merged.remembered == []
    # No readable record at all (deleted by a `down`, or unreadable): the store goes whole, by its name.
    assert merge_members(None, live).dropping == ["d1", "d2"] and merge_members(None, live).stores == {}


def test_a_destroyed_actor_of_an_earlier_store_of_that_name_leaves_the_new_store_alone() -> None:
    """`riqr drop x`: old1 deleted its data but was not killed yet (marked); the topology started again
    made a new x (new1). A restart must destroy old1 only, never new1."""
    spec = kv_spec("x", partitions=2, actors=1)
    record = membership_record(_view((spec, {"new1": ("a", (0, 1))})), dropping=["old1"])
    live = [{**_info(spec, "old1", "b", [0, 1]), "destroyed": True}, _info(spec, "new1", "a", [0, 1])]
    merged = merge_members(record, live)
    assert merged.dropping == ["old1"] and [a.uuid for a in merged.stores["x"][1]] == ["new1"]
    # Not marked either (the record already replaced by the new store's): still only itself.
    merged = merge_members(membership_record(_view((spec, {"new1": ("a", (0, 1))}))), live)
    assert merged.dropping == ["old1"] and [a.uuid for a in merged.stores["x"][1]] == ["new1"]


def test_following_nodes_that_join_is_saved_and_comes_back_only_from_a_record_of_this_version() -> None:
    saved = membership_record(ClusterView(), follow=True)
    assert json.loads(json.dumps(saved))["follow"] is True and merge_members(saved, []).follow
    assert "follow" not in membership_record(ClusterView())  # off: not written, as before
    assert not merge_members(membership_record(ClusterView()), []).follow
    assert not merge_members({**saved, "version": -1}, []).follow
    assert not merge_members({**saved, "follow": "yes"}, []).follow  # only a true boolean turns it on
    assert not merge_members(None, []).follow
