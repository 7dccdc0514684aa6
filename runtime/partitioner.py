"""The one partitioner: ``partition = crc32(canonical key bytes) mod P``.

The write path computes it in Spark SQL (``pmod(crc32(<canonical bytes>), P)``, no Python UDF) and the
read path computes it here with ``zlib.crc32``. ``tests/integration/test_partitioner_parity.py`` proves
both put the same keys in the same partitions. CRC-32 here is the IEEE 802.3 polynomial that Spark's
``crc32``, ``zlib``, Java's ``java.util.zip.CRC32`` and Go's ``hash/crc32.ChecksumIEEE`` all compute, so
any proxy or client can route a key to its owner without asking riqr (see docs/partitioning.md).
"""

from __future__ import annotations

import zlib

from runtime.keys import KeyType

__all__ = ["partition_of_bytes", "partition_of", "spark_partition_sql"]


def partition_of_bytes(canonical: bytes, partitions: int) -> int:
    """The partition of a key given its canonical bytes."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    return zlib.crc32(canonical) % partitions


def partition_of(key_type: KeyType, key: object, partitions: int) -> int:
    """The partition of a typed key."""
    return partition_of_bytes(key_type.canonical_bytes(key), partitions)


def spark_partition_sql(key_type: KeyType, column: str, partitions: int) -> str:
    """The Spark SQL expression computing ``partition_of`` for ``column``."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    return f"pmod(crc32({key_type.spark_canonical_sql(column)}), {int(partitions)})"
