"""Partition storage engines behind one contract: ``memory`` (a sorted map with a changelog and snapshots)
and ``rocksdb`` (one RocksDB database per partition). See ``runtime.engines.base`` for the contract;
``open_engine`` is the one way to open either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.engines.base import (
    ENGINES,
    NONE,
    EngineCorrupt,
    EngineMismatch,
    PartitionEngine,
    PendingCheckpoint,
    Position,
)
from runtime.engines.keycodec import KeyCodec
from runtime.engines.memory import MemoryEngine
from runtime.engines.rocks import RocksEngine
from runtime.keys import KeySchema

__all__ = [
    "ENGINES",
    "NONE",
    "EngineCorrupt",
    "EngineMismatch",
    "KeyCodec",
    "PartitionEngine",
    "PendingCheckpoint",
    "Position",
    "open_engine",
]


def open_engine(kind: str, schema: KeySchema, path: Path | None, **options: Any) -> PartitionEngine:
    """Open (or create) a partition engine. ``kind`` is one of ``ENGINES``; ``path`` None is only for the
    memory engine and means not durable (tests, benchmarks). ``options`` go to the engine's constructor."""
    if kind == "memory":
        return MemoryEngine(schema, path, **options)
    if kind == "rocksdb":
        if path is None:
            raise ValueError("the rocksdb engine needs a directory")
        return RocksEngine(schema, path, **options)
    raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINES)}")
