"""A Kafka source for PySpark, on the Python Data Source API, reading through ``confluent-kafka``.

Spark's own Kafka connector is a JVM jar fetched from Maven; where that is not possible this source
reads Kafka from Python. It registers as format ``riqr-kafka``:

    spark.dataSource.register(KafkaDataSource)
    spark.readStream.format("riqr-kafka")
        .option("kafka.bootstrap.servers", "broker:9092")
        .option("subscribe", "order")              # several topics: "order,customer"
        .option("startingOffsets", "earliest")      # or "latest"
        .load()

Rows have the columns of riqr's landing directories, so topologies work unchanged: ``key``, ``value``
(UTF-8 strings; null stays null), ``ts`` (the message timestamp, epoch millis) and ``seq`` (the offset),
plus ``topic``, ``partition`` and ``offset``. Offsets live in the Spark checkpoint as
``{"topic/partition": next offset}``: a restarted query resumes where it left off and a replayed batch
reads the same messages again, which riqr's idempotent sink turns into a no-op. Consumer group offsets
are not used. A batch read (``spark.read``) returns every message up to the current end of each partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

__all__ = ["KafkaDataSource", "SCHEMA", "TopicRange"]

# ``problem``: null for a usable record, else why it is not one (a key or value that is not UTF-8, kept in
# the record with its bad bytes as \x escapes): such records go to the dead letters, not into a store.
SCHEMA = "key string, value string, ts bigint, seq bigint, topic string, partition int, offset bigint, problem string"
_TIMEOUT = 30.0


@dataclass(frozen=True)
class TopicRange(InputPartition):  # type: ignore[misc]
    """One Spark partition: messages ``[start, end)`` of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int


def _decode(data: bytes | None) -> tuple[str | None, bool]:
    """The text of a key or value, and whether it was UTF-8. It was decoded with U+FFFD for bad bytes,
    which made two binary keys one and changed values without a trace."""
    if data is None:
        return None, True
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="backslashreplace"), False


def _problem(key_ok: bool, value_ok: bool) -> str | None:
    if key_ok and value_ok:
        return None
    what = "key and value are" if not (key_ok or value_ok) else "key is" if not key_ok else "value is"
    return f"the record's {what} not UTF-8 (bad bytes shown as \\x escapes)"


class _Kafka:
    """What the readers share: options, topic listing and reading one range."""

    def __init__(self, options: dict[str, str]) -> None:
        try:
            self.bootstrap = options["kafka.bootstrap.servers"]
            self.topics = [t.strip() for t in options["subscribe"].split(",") if t.strip()]
        except KeyError as missing:
            raise ValueError(f"the riqr-kafka source needs the option {missing.args[0]!r}") from None
        self.starting = options.get("startingOffsets", "earliest")
        if self.starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be 'earliest' or 'latest', got {self.starting!r}")
        self.extra = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}

    def consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer({**self.extra, "group.id": "riqr-spark-source", "enable.auto.commit": False, "log_level": 3})

    def watermarks(self, *, low: bool) -> dict[str, int]:
        """``{"topic/partition": offset}`` of the start (``low``) or the end of every partition."""
        consumer = self.consumer()
        try:
            from confluent_kafka import TopicPartition

            out: dict[str, int] = {}
            metadata = consumer.list_topics(timeout=_TIMEOUT)
            for topic in self.topics:
                meta = metadata.topics.get(topic)
                if meta is None or meta.error is not None:
                    continue  # not created yet: no partitions, no offsets
                for p in sorted(meta.partitions):
                    lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_TIMEOUT)
                    out[f"{topic}/{p}"] = lo if low else hi
            return out
        finally:
            consumer.close()

    def ranges(self, start: dict[str, int], end: dict[str, int]) -> list[TopicRange]:
        out = []
        for name, stop in sorted(end.items()):
            topic, _, p = name.rpartition("/")
            begin = start.get(name, 0)
            if stop > begin:
                out.append(TopicRange(topic, int(p), begin, stop))
        return out

    def read(self, part: TopicRange) -> Iterator[tuple[Any, ...]]:
        from confluent_kafka import KafkaException, TopicPartition

        consumer = self.consumer()
        try:
            consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
            position = part.start
            while position < part.end:
                messages = consumer.consume(min(1000, part.end - position), timeout=_TIMEOUT)
                if not messages:
                    raise TimeoutError(
                        f"no message from {part.topic}/{part.partition} at offset {position} "
                        f"(expected up to {part.end}) within {_TIMEOUT:g}s"
                    )
                for m in messages:
                    if m.error() is not None:
                        raise KafkaException(m.error())
                    if m.offset() >= part.end:
                        position = part.end
                        break
                    _, timestamp = m.timestamp()
                    (key, key_ok), (value, value_ok) = _decode(m.key()), _decode(m.value())
                    yield (
                        key,
                        value,
                        timestamp,
                        m.offset(),
                        part.topic,
                        part.partition,
                        m.offset(),
                        _problem(key_ok, value_ok),
                    )
                    position = m.offset() + 1
        finally:
            consumer.close()


class KafkaStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.kafka = _Kafka(options)

    def initialOffset(self) -> dict[str, int]:
        return self.kafka.watermarks(low=self.kafka.starting == "earliest")

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """The end of every partition. (Spark 4.2 passes the start and a read limit; before, nothing.
        Reading everything available is what the default limit asks for.)"""
        return self.kafka.watermarks(low=False)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[TopicRange]:
        return self.kafka.ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        return self.kafka.read(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Offsets live in Spark's checkpoint; nothing to tell Kafka."""


class KafkaBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.kafka = _Kafka(options)

    def partitions(self) -> list[TopicRange]:
        return self.kafka.ranges(self.kafka.watermarks(low=True), self.kafka.watermarks(low=False))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        return self.kafka.read(partition)


class KafkaDataSource(DataSource):  # type: ignore[misc]
    """Format ``riqr-kafka``: Kafka topics as a Spark source (stream and batch)."""

    @classmethod
    def name(cls) -> str:
        return "riqr-kafka"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(dict(self.options))

    def reader(self, schema: Any) -> KafkaBatchReader:
        return KafkaBatchReader(dict(self.options))
