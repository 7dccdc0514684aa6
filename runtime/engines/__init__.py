"""Partition storage engines behind one contract: ``memory`` (a sorted map with a changelog and snapshots)
and ``rocksdb`` (one RocksDB database per partition). See ``runtime.engines.base`` for the contract."""

from runtime.engines.base import (
    ENGINES,
    NONE,
    EngineCorrupt,
    EngineMismatch,
    PartitionEngine,
    Position,
    open_engine,
)
from runtime.engines.keycodec import KeyCodec

__all__ = [
    "ENGINES",
    "NONE",
    "EngineCorrupt",
    "EngineMismatch",
    "KeyCodec",
    "PartitionEngine",
    "Position",
    "open_engine",
]
