"""Spark's SQL crc32 (the write path) and zlib (the read path) put every key in the same partition."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.keys import INT, LONG, STRING
from runtime.partitioner import partition_of, spark_partition_sql

pytestmark = pytest.mark.integration

STRING_KEYS = ["", "1", "2", "10", "john", "ünïcødé", "日本語", "emoji 🚀", "a/b", " ", "x" * 300] + [
    f"user-{i}" for i in range(200)
]
LONG_KEYS = [0, 1, -1, 7, 2**31, -(2**31), 2**63 - 1, -(2**63)] + list(range(-100, 100, 7))


@pytest.mark.parametrize("partitions", [1, 3, 4, 16])
def test_string_keys(spark: Any, partitions: int) -> None:
    df = spark.createDataFrame([(k,) for k in STRING_KEYS], "k string")
    rows = df.selectExpr("k", f"{spark_partition_sql(STRING, 'k', partitions)} AS p").collect()
    assert {r.k: r.p for r in rows} == {k: partition_of(STRING, k, partitions) for k in STRING_KEYS}


@pytest.mark.parametrize(("key_type", "ddl"), [(LONG, "k bigint"), (INT, "k int")])
def test_integer_keys(spark: Any, key_type: Any, ddl: str) -> None:
    keys = [k for k in LONG_KEYS if key_type.lo <= k <= key_type.hi]
    df = spark.createDataFrame([(k,) for k in keys], ddl)
    rows = df.selectExpr("k", f"{spark_partition_sql(key_type, 'k', 4)} AS p").collect()
    assert {r.k: r.p for r in rows} == {k: partition_of(key_type, k, 4) for k in keys}


def test_timestamp_keys(spark: Any) -> None:
    import datetime as dt

    from runtime.keys import TIMESTAMP

    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    stamps = [dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)]
    stamps += [base + dt.timedelta(seconds=s, microseconds=s * 7) for s in range(0, 10_000, 97)]
    df = spark.createDataFrame([(t,) for t in stamps], "k timestamp")
    rows = df.selectExpr("unix_micros(k) AS micros", f"{spark_partition_sql(TIMESTAMP, 'k', 4)} AS p").collect()
    expected = {TIMESTAMP.coerce(t): partition_of(TIMESTAMP, TIMESTAMP.coerce(t), 4) for t in stamps}
    assert {r.micros: r.p for r in rows} == expected
