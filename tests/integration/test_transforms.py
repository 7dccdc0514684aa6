"""The food-orders transforms on small static frames (the same functions the streaming job runs)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from topologies.food_orders import latest_by_key, order_counts

pytestmark = pytest.mark.integration

SCHEMA = "key string, value string, ts bigint, seq bigint"


def test_latest_by_key_orders_by_ts_then_seq_and_keeps_deletes(spark: Any) -> None:
    records = spark.createDataFrame(
        [
            ("1", "john", 1, 0),
            ("1", "johnny", 1, 1),
            ("2", "adam", 5, 0),
            ("2", "old", 4, 9),
            ("3", "x", 1, 0),
            ("3", None, 2, 0),
            (None, "lost", 9, 0),
        ],
        SCHEMA,
    )
    assert {r.key: r.value for r in latest_by_key(records).collect()} == {"1": "johnny", "2": "adam", "3": None}


def test_order_counts_keep_every_order_including_unknown_customers_and_the_empty_key(spark: Any) -> None:
    orders = spark.createDataFrame(
        [("1", "spagety", 1, 0), ("2", "pizza", 1, 1), ("", "pasta", 1, 2), ("1", "soup", 2, 0), (None, "x", 3, 0),
         ("2", None, 4, 0)],  # a tombstone is no order: Kafka Streams' join and count skip it
        SCHEMA,
    )  # fmt: skip
    customers = spark.createDataFrame([("1", "john"), ("2", "adam"), ("3", "daniel")], "key string, value string")
    counts = {r.key: r["count"] for r in order_counts(orders, customers).collect()}
    assert counts == {"1": 2, "2": 1, "": 1}


def test_spark_kafka_connector_columns_map_to_riqr_records(spark: Any) -> None:
    # Spark's Kafka connector cannot be fetched here (no Maven); its output schema is documented, so the
    # mapping that makes it interchangeable with the other sources is checked on a frame of that shape.
    import datetime as dt

    from topologies.sources import _kafka_columns

    when = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    df = spark.createDataFrame(
        [
            (b"1", b"pizza", "order", 0, 7, when, 0),
            (None, b"x", "order", 1, 3, when, 0),
            (b"\xff\xfe", b"tea", "order", 2, 9, when, 0),  # not UTF-8: a cast to string kept the bytes,
            (b"2", b"caf\xe9", "order", 3, 4, when, 0),  # which failed the batch where Arrow met them
        ],
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, timestampType int",
    )
    good, bad = _kafka_columns(df)
    rows = [r.asDict() for r in good.collect()]
    millis = int(when.timestamp() * 1000)
    assert rows == [
        {"key": "1", "value": "pizza", "ts": millis, "seq": 7},
        {"key": None, "value": "x", "ts": millis, "seq": 3},
    ]
    letters = [(r.reason, json.loads(r.record)) for r in bad.collect()]
    assert [reason for reason, _ in letters] == ["the record's key or value is not UTF-8"] * 2
    assert sorted(record["seq"] for _, record in letters) == [4, 9]
    assert all("\ufffd" in record["key"] + record["value"] for _, record in letters)  # replaced, readable


def test_a_kafka_record_whose_time_spark_cannot_hold_is_a_dead_letter(spark: Any) -> None:
    """A producer sets a Kafka record's time: Long.MAX_VALUE made the windowed query's timestamp_millis
    throw, failing it at every replay."""
    from pyspark.sql import functions as F

    from topologies.sources import _split_undecodable

    rows = spark.createDataFrame(
        [("1", "pizza", 1_767_268_800_000, 0, None), ("2", "tea", 9_223_372_036_854_775_807, 1, None),
         ("3", "soup", -9_000_000_000_000_000, 2, None)],
        "key string, value string, ts bigint, seq bigint, problem string",
    )  # fmt: skip
    good, bad = _split_undecodable(rows, F.col("problem"))
    assert [r.key for r in good.collect()] == ["1"]
    assert sorted((json.loads(r.record)["key"], r.reason) for r in bad.collect()) == [
        ("2", "ts out of range"),
        ("3", "ts out of range"),
    ]


def test_hopping_windows_count_each_order_in_every_window_that_covers_it(spark: Any) -> None:
    from topologies.food_orders_windowed import orders_per_window

    base = 1_767_268_800_000  # 2026-01-01T12:00:00Z in epoch millis
    orders = spark.createDataFrame(
        [("alice", "a", base + 10_000, 0), ("alice", "b", base + 40_000, 1), ("bob", "c", base + 70_000, 2),
         ("bob", None, base + 75_000, 3)],  # no order (a tombstone)
        SCHEMA,
    )  # fmt: skip
    rows = orders_per_window(orders, duration="1 minute", slide="30 seconds", watermark="5 seconds").collect()
    got = sorted((r.key, r.window.start.strftime("%H:%M:%S"), r.orders) for r in rows)
    assert got == [
        ("alice", "11:59:30", 1),
        ("alice", "12:00:00", 2),
        ("alice", "12:00:30", 1),
        ("bob", "12:00:30", 1),
        ("bob", "12:01:00", 1),
    ]
