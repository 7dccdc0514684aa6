"""The food-orders transforms on small static frames (the same functions the streaming job runs)."""

from __future__ import annotations

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
        [("1", "spagety", 1, 0), ("2", "pizza", 1, 1), ("", "pasta", 1, 2), ("1", "soup", 2, 0), (None, "x", 3, 0)],
        SCHEMA,
    )
    customers = spark.createDataFrame([("1", "john"), ("2", "adam"), ("3", "daniel")], "key string, value string")
    counts = {r.key: r["count"] for r in order_counts(orders, customers).collect()}
    assert counts == {"1": 2, "2": 1, "": 1}
