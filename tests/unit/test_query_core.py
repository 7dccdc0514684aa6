import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from runtime.catalog import StoreSpec, ValueField
from runtime.codec import decode_value
from runtime.engines import Position
from runtime.errors import PartitionIncomplete, PartitionUnavailable
from runtime.keys import KeySchema
from runtime.query import QueryCore, rows_from_arrow
from runtime.scan import Scan
from tests.unit.fakes import kv_spec


def test_rows_from_arrow_scalar_values_nulls_delete_null_keys_drop() -> None:
    spec = kv_spec()
    rows = rows_from_arrow(spec, pa.table({"key": ["a", None, "b"], "value": ["x", "y", None]}))
    assert [(k, None if v is None else decode_value(v)) for k, v in rows] == [("a", "x"), ("b", None)]


def test_rows_from_arrow_multi_column_values_are_maps() -> None:
    spec = StoreSpec("s", KeySchema("id", "long"), (ValueField("name", "string"), ValueField("n", "bigint")))
    rows = rows_from_arrow(spec, pa.table({"id": [1, 2], "name": ["a", None], "n": [3, None]}))
    assert rows[0][0] == 1 and decode_value(rows[0][1]) == {"name": "a", "n": 3}
    assert rows[1] == (2, None)  # every value column null: a delete


def test_rows_from_arrow_without_nulls_takes_the_short_path_to_the_same_rows() -> None:
    spec = kv_spec()
    rows = rows_from_arrow(spec, pa.table({"key": ["b", "a", "b"], "value": ["x", "y", "z"]}))
    assert [(k, decode_value(v)) for k, v in rows] == [("b", "x"), ("a", "y"), ("b", "z")]


def test_apply_get_scan_count() -> None:
    core = QueryCore(kv_spec(), [0, 2])
    core.apply(
        "q",
        0,
        {0: pa.table({"key": ["b", "d"], "value": ["B", "D"]}), 2: pa.table({"key": ["a", "c"], "value": ["A", "C"]})},
    )
    values, spans = core.get_many([(0, "b"), (2, "a"), (2, "zz")])
    assert [decode_value(v) if v else v for v in values] == ["B", "A", None]
    assert spans == {0: ("q", 0, 0), 2: ("q", 0, 0)}  # one span per partition, not per key
    for partition, key in [(0, "b"), (2, "a"), (2, "zz")]:  # one key (a read replica's lookup): the same
        value, span = core.get_one(partition, key)
        assert (value, span) == (core.get_many([(partition, key)])[0][0], spans[partition])

    def keys(scan: Scan, limit: int | None = None) -> list[str]:
        entries, spans = core.scan([0, 2], scan, limit)
        assert spans == {0: ("q", 0, 0), 2: ("q", 0, 0)}
        return [k for k, _ in entries]

    assert keys(Scan()) == ["a", "b", "c", "d"]
    assert keys(Scan.closed("b", "c")) == ["b", "c"]
    assert keys(Scan(reverse=True), limit=3) == ["d", "c", "b"]
    assert keys(Scan().after("b"), limit=1) == ["c"]
    assert keys(Scan.closed("c", "b")) == []
    assert core.count([0, 2]) == (4, {0: ("q", 0, 0), 2: ("q", 0, 0)}) and core.count([0])[0] == 2


def test_a_read_overlapping_an_apply_spans_both_batches_and_one_overlapping_a_reset_fails() -> None:
    core = QueryCore(kv_spec(), [0])
    core.apply("q", 0, {0: pa.table({"key": ["a"], "value": ["A"]})})
    state = core.partitions[0]
    read = core._start_read((0,))
    before = read.positions[0]
    state.moving_to = Position("q", 1)  # batch 1 is being applied: its rows may already show
    assert state.span(before) == ("q", 0, 1)
    state.moving_to = Position("r", 0)  # a new source's batch 0 is resetting the partition
    assert state.span(before) is None
    with pytest.raises(PartitionUnavailable, match="changed source"):
        core._spans(read)
    with pytest.raises(PartitionUnavailable, match="changed source"):
        core.get_one(0, "a")
    state.moving_to = None
    assert core.get_many([(0, "a")])[1] == {0: ("q", 0, 0)}
    assert state.moving_to is None


def test_empty_slices_still_advance_the_position() -> None:
    core = QueryCore(kv_spec(), [0, 2])
    core.apply("q", 0, {0: None, 2: None})
    core.apply("q", 1, {0: None, 2: pa.table({"key": ["a"], "value": ["A"]})})
    assert core.positions() == {
        0: {"source": "q", "batch_id": 1, "state": "serving"},
        2: {"source": "q", "batch_id": 1, "state": "serving"},
    }


def test_a_lookup_touching_a_partition_not_held_here_names_it() -> None:
    core = QueryCore(kv_spec(), [0])
    assert core.begin("q") == [0]
    assert core.get_many([(0, "x")]) == ([None], {0: ("q", -1, -1)})
    with pytest.raises(PartitionUnavailable) as info:
        core.get_many([(0, "x"), (1, "y"), (3, "z")])
    assert info.value.details["partitions"] == [1, 3]
    with pytest.raises(PartitionUnavailable):
        core.apply("q", 0, {1: None})


def test_a_new_partition_answers_503_until_its_first_batch() -> None:
    core = QueryCore(kv_spec(), [0])
    with pytest.raises(PartitionIncomplete, match="first batch"):
        core.get_many([(0, "k")])
    with pytest.raises(PartitionIncomplete, match="first batch"):
        core.get_one(0, "k")
    with pytest.raises(PartitionUnavailable, match="not held here"):
        core.get_one(1, "k")
    core.apply("q", 0, {0: pa.table({"key": ["k"], "value": ["v"]})})
    assert core.get_many([(0, "k")])[0] != [None]


def test_a_restarted_actor_answers_503_not_an_empty_store() -> None:
    core = QueryCore(kv_spec(), [0, 2], recovered=True)
    with pytest.raises(PartitionUnavailable, match="restarted"):
        core.scan([0, 2], Scan())
    with pytest.raises(PartitionUnavailable):
        core.count([0])
    with pytest.raises(PartitionUnavailable, match="restarted") as info:
        core.get_many([(0, "k")])
    assert info.value.details["partitions"] == [0] and info.value.details["retry_after"] == 5


def test_a_restarted_copy_with_nothing_on_disk_never_serves_empty_at_a_new_sources_start(tmp_path: Path) -> None:
    """A replacement on another node, or a copy whose data was wiped, reopens at no position. It may
    have held rows: a topology started on a fresh checkpoint must not make it answer 404s (and scans
    without its keys) until the source's batch 0 brings them back, as a never-fed copy rightly does."""
    import shutil

    where = tmp_path / "s" / "u1"
    core = QueryCore(kv_spec(), [0, 2], directory=where)
    core.apply("q", 0, {0: pa.table({"key": ["a"], "value": ["A"]}), 2: None})
    core.close()
    shutil.rmtree(where)
    again = QueryCore(kv_spec(), [0, 2], directory=where, recovered=True)
    assert again.begin("fresh") == []
    with pytest.raises(PartitionIncomplete, match="nothing on disk"):
        again.get_many([(0, "a")])
    with pytest.raises(PartitionIncomplete):
        again.scan([0, 2], Scan())
    again.apply("fresh", 0, {0: pa.table({"key": ["a"], "value": ["A2"]}), 2: None})  # batch 0 brings them back
    assert decode_value(again.get_many([(0, "a")])[0][0]) == "A2"
    again.close()
    never_fed = QueryCore(kv_spec(), [0], directory=tmp_path / "s" / "u2")
    never_fed.close()
    restarted = QueryCore(kv_spec(), [0], directory=tmp_path / "s" / "u2", recovered=True)  # its files are there
    assert restarted.begin("fresh") == [0]  # never fed: complete when empty, restarted or not
    restarted.close()


@pytest.mark.parametrize("read", ["get_many", "get_one", "scan", "count"])
def test_a_reset_between_the_serving_check_and_the_position_is_never_answered(
    read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new source's batch 0 that lands (held: ``rebuilding``, at batch 0 of the new source) just after
    a read found the partition serving: the read must fail, not answer the partial state with a span
    that looks whole (``(Y, 0, 0)``)."""
    from runtime.partition import Hold, PartitionState

    core = QueryCore(kv_spec(), [0])
    core.apply("X", 0, {0: pa.table({"key": ["a"], "value": ["A"]})})
    real = PartitionState.serving
    landed: list[bool] = []

    def serving_then_reset(state: PartitionState) -> bool:
        answer = bool(real.fget(state))  # type: ignore[attr-defined]
        if not landed:
            landed.append(True)
            core.apply("Y", 0, {0: None}, Hold(0))  # on the apply thread, right after the check
        return answer

    monkeypatch.setattr(PartitionState, "serving", property(serving_then_reset))
    calls = {
        "get_many": lambda: core.get_many([(0, "a")]),
        "get_one": lambda: core.get_one(0, "a"),
        "scan": lambda: core.scan([0], Scan()),
        "count": lambda: core.count([0]),
    }
    with pytest.raises(PartitionUnavailable):
        calls[read]()
    assert landed and core.positions()[0]["state"] == "rebuilding"


def test_windowed_rows_keep_the_end_and_the_time_filter_runs_on_the_owner() -> None:
    import datetime as dt

    from runtime.codec import decode_value as unpack
    from runtime.ingest import WINDOW_END_COLUMN
    from runtime.scan import TimeFilter
    from tests.unit.fakes import windowed_spec

    spec = windowed_spec("w", kind="session")
    t = [dt.datetime(2026, 1, 1, 12, m, tzinfo=dt.UTC) for m in range(6)]
    table = pa.table(
        {
            "user": ["a", "a", "b"],
            "window_start": pa.array([t[0], t[3], t[1]], pa.timestamp("us", tz="UTC")),
            "count": [1, 2, None],  # a null value deletes that window
            WINDOW_END_COLUMN: pa.array([t[1], t[5], t[2]], pa.timestamp("us", tz="UTC")),
        }
    )
    core = QueryCore(spec, [0, 1, 2, 3])
    core.apply("q", 0, {p: table for p in [0]} | {p: None for p in [1, 2, 3]})
    everything, _ = core.scan([0, 1, 2, 3], Scan())
    assert [(k[0], unpack(v)[1]) for k, v in everything] == [("a", 1), ("a", 2)]
    micros = [spec.key.columns[1][1].coerce(x) for x in t]
    ended_late, _ = core.scan([0], Scan(times=TimeFilter(end_from=micros[4])))
    assert [unpack(v) for _, v in ended_late] == [[micros[5], 2]]
    started_early, _ = core.scan([0], Scan(times=TimeFilter(start_to=micros[2])))
    assert [k[1] for k, _ in started_early] == [micros[0]]


def test_a_destroyed_core_answers_unavailable_until_it_is_killed(tmp_path: Path) -> None:
    """``destroy`` deletes the data before the registry kills the actor; a read meanwhile (a facade that
    has not learnt of the drop yet) is a 503, never an error from a deleted engine."""
    core = QueryCore(kv_spec(), [0, 2], directory=tmp_path / "s" / "u1")
    core.apply("q", 0, {0: pa.table({"key": ["a"], "value": ["A"]}), 2: None})
    assert core.get_many([(0, "a")])[0] != [None]
    core.destroy()
    for read in (
        lambda: core.get_many([(0, "a")]),
        lambda: core.scan([0, 2], Scan()),
        lambda: core.count([2]),
        lambda: core.apply("q", 1, {0: None}),
    ):
        with pytest.raises(PartitionUnavailable, match="being dropped"):
            read()
    with pytest.raises(PartitionUnavailable, match="being dropped"):
        core.open_snapshot(0)  # for a peer catching up: nothing is exported, nothing made where the data was
    assert core.positions() == {} and not (tmp_path / "s" / "u1").exists()


@pytest.mark.parametrize(
    ("engine", "read"),
    [("rocksdb", "get_many"), ("rocksdb", "get_one"), ("rocksdb", "scan"), ("rocksdb", "count"),
     ("memory", "get_many"), ("memory", "get_one"), ("memory", "count")],
)  # fmt: skip
def test_a_read_that_a_destroy_overtakes_is_a_503(tmp_path: Path, engine: str, read: str) -> None:
    """A read that looked its partitions up before ``destroy`` and reads their engines after: RocksDB's
    raises on a deleted database, the memory engine's answers nothing. Either way the answer is a 503,
    never an error nor an empty answer. (A memory engine's scan holds the write lock, which ``destroy``
    takes too, so a destroy cannot overtake it.)"""
    spec = dataclasses.replace(kv_spec(), engine=engine)
    core = QueryCore(spec, [0, 2], directory=tmp_path / "s" / "u1")
    core.apply("q", 0, {0: pa.table({"key": ["a"], "value": ["A"]}), 2: None})
    engine_of = core.partitions[0].engine
    reads = {
        "get_many": lambda: core.get_many([(0, "a")]),
        "get_one": lambda: core.get_one(0, "a"),
        "scan": lambda: core.scan([0], Scan()),
        "count": lambda: core.count([0]),
    }
    method = {"get_many": "get", "get_one": "get", "scan": "scan", "count": "count"}[read]
    original = getattr(engine_of, method)

    def overtaken(*args: Any, **kwargs: Any) -> Any:
        core.destroy()
        return original(*args, **kwargs)

    setattr(engine_of, method, overtaken)
    with pytest.raises(PartitionUnavailable, match="being dropped"):
        reads[read]()


def test_a_partition_whose_data_cannot_be_deleted_does_not_stop_the_others(tmp_path: Path) -> None:
    """A RocksDB scan under way in another thread can make closing its partition raise: the other
    partitions are deleted all the same, and the core is destroyed (its reads are 503s)."""
    core = QueryCore(kv_spec(), [0, 2], directory=tmp_path / "s" / "u1")
    core.apply("q", 0, {0: pa.table({"key": ["a"], "value": ["A"]}), 2: pa.table({"key": ["b"], "value": ["B"]})})
    stuck, other = core.partitions[0].engine, core.partitions[2].engine

    def busy() -> None:
        raise ValueError("generator already executing")

    stuck.destroy = busy  # type: ignore[method-assign]
    destroyed_other = []
    original = other.destroy

    def tracked() -> None:
        original()
        destroyed_other.append(True)

    other.destroy = tracked  # type: ignore[method-assign]
    core.destroy()
    assert destroyed_other == [True] and core.destroyed
    with pytest.raises(PartitionUnavailable, match="being dropped"):
        core.get_many([(2, "b")])
