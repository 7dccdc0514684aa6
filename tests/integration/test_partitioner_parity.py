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
