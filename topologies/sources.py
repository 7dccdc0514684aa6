"""Sources for topologies: the landing directories written by ``riqr produce`` (see runtime.landing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.landing import topic_dir

__all__ = ["RECORD_SCHEMA_DDL", "read_topic", "read_topic_batch"]

RECORD_SCHEMA_DDL = "key STRING, value STRING, ts BIGINT, seq BIGINT"


def read_topic(spark: Any, home: Path, topic: str, *, max_files_per_trigger: int = 1000) -> Any:
    """A streaming DataFrame of the records of ``topic`` (columns key, value, ts, seq)."""
    directory = topic_dir(home, topic)
    directory.mkdir(parents=True, exist_ok=True)
    return (
        spark.readStream.schema(RECORD_SCHEMA_DDL)
        .option("maxFilesPerTrigger", max_files_per_trigger)
        .json(str(directory))
    )


def read_topic_batch(spark: Any, home: Path, topic: str) -> Any:
    """The records of ``topic`` present now, as a static DataFrame."""
    directory = topic_dir(home, topic)
    directory.mkdir(parents=True, exist_ok=True)
    return spark.read.schema(RECORD_SCHEMA_DDL).json(str(directory))
