import zlib
from collections import Counter

import pytest

from runtime.keys import LONG, STRING
from runtime.partitioner import partition_of, partition_of_bytes, spark_partition_sql


def test_uses_ieee_crc32() -> None:
    # The standard CRC-32 check value: any correct implementation in any language gives it.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert partition_of_bytes(b"123456789", 2**32) == 0xCBF43926


def test_partition_is_crc_mod_p() -> None:
    for key in ["", "1", "ünï", "order-42"]:
        assert partition_of(STRING, key, 7) == zlib.crc32(key.encode()) % 7
    assert partition_of(LONG, -5, 4) == zlib.crc32(b"-5") % 4


def test_partitions_are_in_range_and_spread() -> None:
    counts = Counter(partition_of(STRING, str(i), 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 800  # roughly uniform: 1000 expected per partition


def test_rejects_nonpositive_partition_counts() -> None:
    with pytest.raises(ValueError):
        partition_of_bytes(b"x", 0)
    with pytest.raises(ValueError):
        spark_partition_sql(STRING, "key", 0)


def test_spark_expression() -> None:
    assert spark_partition_sql(STRING, "key", 4) == "pmod(crc32(CAST(`key` AS BINARY)), 4)"
