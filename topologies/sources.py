"""Where topologies read topics from: landing directories (the default), or Kafka.

* ``files``: the landing directories written by ``riqr produce`` (see ``runtime.landing``);
* ``kafka``: Kafka through riqr's Python source (``topologies.kafka_source``, needs ``confluent-kafka``);
* ``spark-kafka``: Kafka through Spark's own connector, where its jar is on the classpath (for example
  ``--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``).

Every choice gives the same columns: ``key``, ``value`` (strings), ``ts`` (event time, epoch millis) and
``seq`` (order within the source), so a topology's transforms do not change with the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.landing import topic_dir

__all__ = ["RECORD_SCHEMA_DDL", "SourceConfig", "FILES", "read_topic", "read_topic_batch"]

RECORD_SCHEMA_DDL = "key STRING, value STRING, ts BIGINT, seq BIGINT"
SOURCE_KINDS = ("files", "kafka", "spark-kafka")


@dataclass(frozen=True)
class SourceConfig:
    """Which source topics come from; ``bootstrap`` is the Kafka bootstrap servers for the Kafka kinds."""

    kind: str = "files"
    bootstrap: str | None = None
    starting_offsets: str = "earliest"

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"source must be one of {', '.join(SOURCE_KINDS)}, got {self.kind!r}")
        if self.kind != "files" and not self.bootstrap:
            raise ValueError(f"the {self.kind} source needs the Kafka bootstrap servers")


FILES = SourceConfig()


def _kafka_columns(df: Any) -> Any:
    """Spark's Kafka connector's columns as riqr's record columns."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        F.unix_millis("timestamp").alias("ts"),
        F.col("offset").alias("seq"),
    )


def _reader(spark: Any, streaming: bool) -> Any:
    return spark.readStream if streaming else spark.read


def _read(spark: Any, home: Path, topic: str, source: SourceConfig, *, streaming: bool) -> Any:
    reader = _reader(spark, streaming)
    if source.kind == "files":
        directory = topic_dir(home, topic)
        directory.mkdir(parents=True, exist_ok=True)
        if streaming:
            reader = reader.option("maxFilesPerTrigger", 1000)
        return reader.schema(RECORD_SCHEMA_DDL).json(str(directory))
    if source.kind == "kafka":
        from topologies.kafka_source import KafkaDataSource

        spark.dataSource.register(KafkaDataSource)
        df = (
            reader.format("riqr-kafka")
            .option("kafka.bootstrap.servers", source.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", source.starting_offsets)
            .load()
        )
        return df.select("key", "value", "ts", "seq")
    df = reader.format("kafka").option("kafka.bootstrap.servers", source.bootstrap).option("subscribe", topic)
    if streaming:
        df = df.option("startingOffsets", source.starting_offsets)
    return _kafka_columns(df.load())


def read_topic(spark: Any, home: Path, topic: str, source: SourceConfig = FILES) -> Any:
    """A streaming DataFrame of the records of ``topic`` (columns key, value, ts, seq)."""
    return _read(spark, home, topic, source, streaming=True)


def read_topic_batch(spark: Any, home: Path, topic: str, source: SourceConfig = FILES) -> Any:
    """The records of ``topic`` present now, as a static DataFrame."""
    return _read(spark, home, topic, source, streaming=False)
