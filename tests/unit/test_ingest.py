import pyarrow as pa
import pytest

from runtime.ingest import PARTITION_COLUMN, slices_for_owners, split_by_partition
from runtime.ownership import OwnershipTable, PartitionOwners
from tests.unit.fakes import kv_spec


def batch(keys: list[str], parts: list[int]) -> pa.Table:
    return pa.table({"key": keys, "value": [k.upper() for k in keys], PARTITION_COLUMN: pa.array(parts, pa.int32())})


def test_split_groups_rows_by_partition_keeping_their_order_and_dropping_the_column() -> None:
    out = split_by_partition(batch(["a", "b", "c", "d"], [1, 3, 1, 3]), 4)
    assert sorted(out) == [1, 3]
    assert out[1].column_names == ["key", "value"]
    assert out[1].column("key").to_pylist() == ["a", "c"]
    assert out[3].column("key").to_pylist() == ["b", "d"]


def test_split_of_a_batch_in_many_arrow_batches_gives_slices_of_one_chunk() -> None:
    """As Spark hands a batch over: an Arrow batch per 10,000 rows. A slice of one chunk is a few buffers
    for Ray to serialize, not a few per Arrow batch."""
    keys = [f"k{i}" for i in range(100)]
    whole = batch(keys, [i % 3 for i in range(100)])
    chunked = pa.Table.from_batches(whole.to_batches(max_chunksize=7))
    assert chunked.column("key").num_chunks == 15
    out = split_by_partition(chunked, 3)
    for p in range(3):
        assert all(out[p].column(name).num_chunks == 1 for name in out[p].column_names)
        assert out[p].column("key").to_pylist() == keys[p::3]


def test_split_of_an_empty_batch_is_empty() -> None:
    assert split_by_partition(batch([], []), 4) == {}


def test_rows_with_a_null_key_are_dropped_with_a_warning_even_when_they_are_the_whole_batch(caplog) -> None:  # type: ignore[no-untyped-def]
    """A null key has a null partition. A batch of such rows only (a groupBy's null group, alone in its
    batch) was a ValueError blaming the partition count, which failed the query at every replay."""
    only_nulls = pa.table(
        {"key": [None, None], "value": ["x", "y"], PARTITION_COLUMN: pa.array([None, None], pa.int32())}
    )
    with caplog.at_level("WARNING", logger="runtime.ingest"):
        assert split_by_partition(only_nulls, 4, "s") == {}
    assert "store s: dropped 2 rows with a null key" in caplog.text
    caplog.clear()
    mixed = pa.table(
        {"key": ["a", None, "b"], "value": ["A", "N", "B"], PARTITION_COLUMN: pa.array([1, None, 2], pa.int32())}
    )
    with caplog.at_level("WARNING", logger="runtime.ingest"):
        out = split_by_partition(mixed, 4, "s")
    assert {p: t.column("key").to_pylist() for p, t in out.items()} == {1: ["a"], 2: ["b"]}
    assert "dropped 1 rows with a null key" in caplog.text  # once silent


def test_split_refuses_partitions_the_store_does_not_have() -> None:
    with pytest.raises(ValueError, match="4 partitions"):
        split_by_partition(batch(["a"], [4]), 4)


def test_every_holder_gets_every_partition_it_holds_even_empty_ones() -> None:
    spec = kv_spec(partitions=4, actors=2)
    table = OwnershipTable(
        spec, (PartitionOwners("a", ("b",)), PartitionOwners("b"), PartitionOwners("a"), PartitionOwners("b"))
    )
    split = split_by_partition(batch(["x"], [0]), 4)
    out = slices_for_owners(table, split)
    assert set(out) == {"a", "b"}
    assert set(out["a"]) == {0, 2} and set(out["b"]) == {0, 1, 3}
    assert out["a"][0] is split[0] and out["b"][0] is split[0]
    assert out["a"][2] is None


def test_timestamp_keys_and_windows_outside_years_1_to_9999_are_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A seven-day window of an event on 9999-12-30 ends in year 10000; a sliding window of an event in
    year 1 starts in year 0. Stored, no answer could hold them (every scan reaching them failed)."""
    import logging

    from runtime.ingest import MAX_MICROS, MIN_MICROS, WINDOW_END_COLUMN, drop_unrepresentable_times, time_columns
    from tests.unit.fakes import windowed_spec

    day = 86_400_000_000
    starts = [0, MAX_MICROS - 2 * day, MIN_MICROS - day, MIN_MICROS, None]
    ends = [day, MAX_MICROS + 5 * day, MIN_MICROS, MIN_MICROS + day, None]
    table = pa.table({
        "user": ["ok", "year-10000-end", "year-0-start", "first-day", "null-window"],
        "window_start": pa.array(starts, pa.timestamp("us", tz="UTC")),
        WINDOW_END_COLUMN: pa.array(ends, pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    columns = time_columns(windowed_spec("clicks"))
    assert columns == ["window_start", WINDOW_END_COLUMN]
    with caplog.at_level(logging.WARNING):
        kept = drop_unrepresentable_times(table, columns, "clicks")
    assert kept.column("user").to_pylist() == ["ok", "first-day", "null-window"]
    assert "store clicks: dropped 2 rows whose timestamp key or window lies outside years 1 to 9999" in caplog.text
    usual = table.slice(0, 1)
    assert drop_unrepresentable_times(usual, columns) is usual  # the usual batch: untouched
    # A key-value store keyed by (customer, ts): milliseconds read as seconds land in year 55000.
    bookings = kv_spec("bookings", rest=(("ts", "timestamp"),))
    assert time_columns(bookings) == ["ts"] and time_columns(kv_spec("s")) == []
    rows = pa.table({"key": ["a", "b"], "ts": pa.array([0, 1_700_000_000_000 * 1_000_000], pa.int64())})
    assert drop_unrepresentable_times(rows, time_columns(bookings)).column("key").to_pylist() == ["a"]


def test_the_sink_checks_the_timestamp_columns_of_every_batch_it_delivers() -> None:
    from topologies.delivery import BatchDelivery

    delivery = BatchDelivery(kv_spec("bookings", rest=(("ts", "timestamp"),)), "ns", "unused", feeder=object())  # type: ignore[arg-type]
    assert delivery._times == ["ts"]


def test_rows_whose_key_is_not_whole_are_dropped_and_counted() -> None:
    from runtime.ingest import drop_null_keys

    usual = pa.table({"site": ["a", "b"], "sensor": [1, 2], "v": [None, 3], PARTITION_COLUMN: [0, 1]})
    kept, dropped = drop_null_keys(usual, ["site", "sensor"], "s")
    assert kept is usual and dropped == 0  # the usual batch: untouched (a null value is a delete, not a drop)
    table = pa.table(
        {
            "site": ["a", None, "c", "d"],
            "sensor": [1, 2, None, 4],
            "v": [1, 2, 3, 4],
            PARTITION_COLUMN: pa.array([0, None, 1, None], pa.int32()),
        }
    )
    kept, dropped = drop_null_keys(table, ["site", "sensor"], "s")
    assert dropped == 3 and kept.column("site").to_pylist() == ["a"]  # a null in any key column, or its partition


BIG = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z in microseconds: Spark holds it, Python cannot
TS = pa.timestamp("us", tz="UTC")


def test_rows_whose_value_holds_a_time_outside_years_1_to_9999_are_dropped_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A value's timestamp or date out of range, at any depth, failed the query actor's apply (an
    ``OverflowError`` turning it into Python), and the same batch at every replay (an ingest review): such
    rows are dropped and counted as a key out of range is; the rest convert."""
    import logging

    from runtime.ingest import drop_unrepresentable_value_times

    table = pa.table({
        "key": ["ok", "when", "day", "struct", "list", "map", "nested", "nulls"],
        "when": pa.array([0, BIG, 0, 0, 0, 0, 0, None], TS),
        "day": pa.array([0, 0, 2_932_897, 0, 0, 0, 0, None], pa.date32()),
        "s": pa.array([{"t": 0}, {"t": 0}, {"t": 0}, {"t": BIG}, None, {"t": 0}, {"t": 0}, {"t": None}],
                      pa.struct([("t", TS)])),
        "l": pa.array([[0], [], [0], [0], [0, BIG], [], [], None], pa.list_(TS)),
        "m": pa.array([[("k", 0)], [], [], [], [], [("k", BIG)], [], None], pa.map_(pa.string(), TS)),
        "n": pa.array([[], [], [], [], [], [], [{"t": [0, BIG]}], None], pa.list_(pa.struct([("t", pa.list_(TS))]))),
        "count": [1, 2, 3, 4, 5, 6, 7, 8],
    })  # fmt: skip
    with caplog.at_level(logging.WARNING):
        kept, dropped = drop_unrepresentable_value_times(table, ["when", "day", "s", "l", "m", "n", "count"], "st")
    assert kept.column("key").to_pylist() == ["ok", "nulls"] and dropped == 6
    assert "store st: dropped 6 rows whose value holds a time outside years 1 to 9999 (in when, day, s, l, m, n)" in (
        caplog.text
    )
    kept.to_pylist()  # what the actor's apply does with them: no OverflowError
    usual = table.slice(0, 1)
    assert drop_unrepresentable_value_times(usual, ["when", "day", "s", "l", "m", "n"]) == (usual, 0)
    plain = pa.table({"key": ["a"], "count": [1]})
    assert drop_unrepresentable_value_times(plain, ["count"]) == (plain, 0)  # no time in its type: no look


def test_value_times_are_checked_across_chunks_slices_and_every_unit() -> None:
    from runtime.ingest import MIN_MICROS, drop_unrepresentable_value_times

    chunked = pa.Table.from_batches([
        pa.record_batch({"key": ["a", "b"], "when": pa.array([0, BIG], TS)}),
        pa.record_batch({"key": ["c", "d"], "when": pa.array([BIG, 0], TS)}),
    ])  # fmt: skip
    assert drop_unrepresentable_value_times(chunked, ["when"])[0].column("key").to_pylist() == ["a", "d"]
    sliced = pa.array([[BIG], [0], [0, BIG], [0]], pa.list_(TS)).slice(1)
    table = pa.table({"key": ["x", "y", "z"], "l": sliced})
    assert drop_unrepresentable_value_times(table, ["l"])[0].column("key").to_pylist() == ["x", "z"]
    seconds = MIN_MICROS // 1_000_000
    units = pa.table({
        "key": ["first", "before", "last", "after-ms", "date64"],
        "s": pa.array([seconds, seconds - 1, BIG // 1_000_000 - 1, 0, 0], pa.timestamp("s")),
        "ms": pa.array([0, 0, 0, BIG // 1_000, 0], pa.timestamp("ms")),
        "ns": pa.array([0, 0, 0, 0, 2**62], pa.timestamp("ns")),  # nanoseconds cannot leave the range
        "d64": pa.array([0, 0, 0, 0, 2_932_897 * 86_400_000], pa.date64()),
    })  # fmt: skip
    kept, dropped = drop_unrepresentable_value_times(units, ["s", "ms", "ns", "d64"])
    assert kept.column("key").to_pylist() == ["first", "last"] and dropped == 3


def test_the_sink_checks_the_value_columns_of_every_batch_it_delivers() -> None:
    from runtime.catalog import StoreSpec, ValueField
    from runtime.keys import KeySchema
    from topologies.delivery import BatchDelivery

    spec = StoreSpec("s", KeySchema("key", "string"), (ValueField("seen", "timestamp"), ValueField("n", "long")))
    delivery = BatchDelivery(spec, "ns", "unused", feeder=object())  # type: ignore[arg-type]
    assert delivery._values == ["seen", "n"]


def test_value_times_near_the_bounds_in_another_zone_and_null_lists_over_values_are_handled() -> None:
    """Two cases a diff review found: a timestamp in a zone other than UTC within a day of year 10000 passed
    the check and overflowed where Python turned it into its zone; a null list entry whose offsets span
    values misaligned the flattened entries with their rows (an IndexError, the batch failed)."""
    from runtime.ingest import MAX_MICROS, drop_unrepresentable_value_times

    hour = 3_600_000_000
    tokyo = pa.table({
        "key": ["near", "far"],
        "t": pa.array([MAX_MICROS - hour, 0], pa.timestamp("us", tz="Asia/Tokyo")),
    })  # fmt: skip
    kept, dropped = drop_unrepresentable_value_times(tokyo, ["t"])
    assert kept.column("key").to_pylist() == ["far"] and dropped == 1
    kept.to_pylist()
    utc = pa.table({"key": ["near"], "t": pa.array([MAX_MICROS - hour], TS)})
    assert drop_unrepresentable_value_times(utc, ["t"])[1] == 0  # in UTC it is a valid instant: kept
    values = pa.array([0, 0, BIG, BIG, 0, 0], TS)
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 4, 6], pa.int32()), values, mask=pa.array([False, True, False]))
    table = pa.table({"key": ["a", "null-over-values", "c"], "l": lists})
    kept, dropped = drop_unrepresentable_value_times(table, ["l"])
    assert kept.column("key").to_pylist() == ["a", "null-over-values", "c"] and dropped == 0
    fixed = pa.FixedSizeListArray.from_arrays(values, 2, mask=pa.array([False, True, False]))
    assert drop_unrepresentable_value_times(pa.table({"key": ["a", "b", "c"], "l": fixed}), ["l"])[1] == 0
