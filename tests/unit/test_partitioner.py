import zlib
from collections import Counter

import pytest

from runtime.keys import LONG, STRING, TIMESTAMP
from runtime.partitioner import partition_of, partition_of_bytes, spark_partition_sql


def test_uses_ieee_crc32() -> None:
    # The standard CRC-32 check value: any correct implementation in any language gives it.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert partition_of_bytes(b"123456789", 2**32) == 0xCBF43926


# Published CRC-32 (IEEE 802.3) values, independent of any implementation here.
KNOWN_CRC32 = {"": 0x00000000, "a": 0xE8B7BE43, "abc": 0x352441C2, "1": 0x83DCEFB7, "123456789": 0xCBF43926}


@pytest.mark.parametrize(("key", "crc"), sorted(KNOWN_CRC32.items()))
def test_partition_is_the_published_crc_mod_p(key: str, crc: int) -> None:
    for partitions in (1, 3, 4, 7, 9):
        assert partition_of(STRING, key, partitions) == crc % partitions


def test_known_partitions_of_the_seed_keys() -> None:
    # Written out by hand from the CRC values above: what a client in another language must compute.
    assert [partition_of(STRING, k, 4) for k in ["", "a", "abc", "1", "123456789"]] == [0, 3, 2, 3, 2]


def test_integer_and_timestamp_keys_hash_their_decimal_text() -> None:
    assert LONG.canonical_bytes(-5) == b"-5"
    assert LONG.canonical_bytes(123456789) == b"123456789"
    assert partition_of(LONG, 123456789, 4) == 0xCBF43926 % 4
    assert TIMESTAMP.canonical_bytes(1_700_000_000_000_000) == b"1700000000000000"


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
