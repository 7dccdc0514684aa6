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
    stores, remembered = merge_members(saved, live)
    assert sorted(remembered) == ["u2", "u4"]
    assert sorted(stores) == ["gone", "s", "t"]
    spec, actors = stores["s"]
    assert spec == s
    assert {a.uuid: (a.node_id, a.partitions) for a in actors} == {"u1": ("c", (0, 2)), "u2": ("b", (1, 3))}
    assert [a.uuid for a in stores["gone"][1]] == ["u4"] and stores["gone"][0] == gone
    assert [a.uuid for a in stores["t"][1]] == ["u3"]


def test_without_a_record_only_the_live_actors_count() -> None:
    s = kv_spec("s", partitions=4, actors=2)
    stores, remembered = merge_members(None, [_info(s, "u1", "a", [0, 2])])
    assert remembered == [] and [a.uuid for a in stores["s"][1]] == ["u1"]


def test_a_record_that_disagrees_with_the_live_actors_or_cannot_be_read_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = kv_spec("s", partitions=4, actors=2)
    other = dataclasses.replace(s, partitions=8)
    saved = membership_record(_view((other, {"u1": ("a", (0, 2, 4, 6)), "u9": ("b", (1, 3, 5, 7))})))
    stores, remembered = merge_members(saved, [_info(s, "u1", "a", [0, 2])])
    assert remembered == [] and stores["s"][0] == s and [a.uuid for a in stores["s"][1]] == ["u1"]
    assert "another definition" in caplog.text

    broken = {"version": 1, "stores": {"x": {"spec": {"name": "x"}, "actors": []}, "s": saved["stores"]["s"]}}
    stores, remembered = merge_members(broken, [])
    assert "x" not in stores and "unreadable" in caplog.text
    assert sorted(remembered) == ["u1", "u9"]  # the readable entry still counts
    for unknown in ({"version": 99, "stores": saved["stores"]}, {"version": 1, "stores": []}, ["not", "a", "map"]):
        assert merge_members(unknown, []) == ({}, [])  # type: ignore[arg-type]
