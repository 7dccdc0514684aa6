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

Offsets Kafka no longer has when a batch reads them (retention removed them while the query was down),
or a partition whose end went back below what the query has read (the topic made again), fail the
batch, as Spark's connector does; ``.option("failOnDataLoss", "false")`` skips them with a
warning instead. Offsets with no record (a transaction's markers, aborted records, compaction) are
skipped: only committed records are read (librdkafka's ``isolation.level``, ``read_committed``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

__all__ = ["KafkaDataSource", "SCHEMA", "TopicRange", "later_offsets"]

log = logging.getLogger(__name__)

# ``problem``: null for a usable record, else why it is not one (a key or value that is not UTF-8, kept in
# the record with its bad bytes as \x escapes): such records go to the dead letters, not into a store.
SCHEMA = "key string, value string, ts bigint, seq bigint, topic string, partition int, offset bigint, problem string"
_TIMEOUT = 30.0
_POLL = 0.2
_METADATA_READS, _METADATA_RETRY = 10, 1.0  # reads of a topic's metadata that says an error, seconds between
_END_READS, _END_RETRY = 3, 1.0  # reads of a partition's end below the query's position, seconds between


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
        lossy = options.get("failOnDataLoss", "true").lower()
        if lossy not in ("true", "false"):
            raise ValueError(f"failOnDataLoss must be 'true' or 'false', got {lossy!r}")
        self.fail_on_data_loss = lossy == "true"

    def consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(
            {
                **self.extra,
                "group.id": "riqr-spark-source",
                "enable.auto.commit": False,
                "log_level": 3,
                # An offset Kafka no longer has (retention, a topic made again) is an error to see, not a
                # silent jump to the end (librdkafka's default), which skipped what was still there.
                "auto.offset.reset": "error",
                # The end of a partition is said, so a range that ends after a transaction's control record
                # (never delivered) ends there rather than waiting for a message that never comes.
                "enable.partition.eof": True,
            }
        )

    def watermarks(self, *, low: bool, strict: bool = False) -> dict[str, int]:
        """``{"topic/partition": offset}`` of the start (``low``) or the end of every partition. ``strict``
        (where a query starts, and a batch read): metadata that says an error is read again, then raised
        (``_metadata``); otherwise a topic it leaves out, or a partition without a leader (an election,
        whose offsets would wait out ``_TIMEOUT``), keeps the offsets known (``later_offsets``)."""
        consumer = self.consumer()
        try:
            from confluent_kafka import TopicPartition

            out: dict[str, int] = {}
            metadata = self._metadata(consumer) if strict else consumer.list_topics(timeout=_TIMEOUT)
            for topic in self.topics:
                meta = metadata.topics.get(topic)
                if meta is None or meta.error is not None:
                    continue  # not created yet: no partitions, no offsets
                for p, part in sorted(meta.partitions.items()):
                    if getattr(part, "leader", 0) < 0:
                        continue  # no leader now (``strict`` read again until there was one)
                    lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_TIMEOUT)
                    out[f"{topic}/{p}"] = lo if low else hi
            return out
        finally:
            consumer.close()

    def _metadata(self, consumer: Any) -> Any:
        """The cluster's metadata, read again while a subscribed topic's, or one of its partitions', says an
        error other than "no such topic" (a topic being made, a leader election: ``LEADER_NOT_AVAILABLE``):
        such a topic is there, and read as absent it was missing from the query's start offsets, so it was
        read from offset 0 (the whole backlog at ``latest``, data loss at ``earliest`` once retention had
        moved on); a leaderless partition's offsets wait out ``_TIMEOUT``. A ``RuntimeError`` naming them
        after ``_METADATA_READS`` reads."""
        from confluent_kafka import KafkaError

        absent = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
        # A partition without a leader. Not any partition error: REPLICA_NOT_AVAILABLE says a follower's
        # broker is down while the leader serves, and refusing it stopped every start while one was (a
        # diff review).
        leaderless = (KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION)
        for attempt in range(_METADATA_READS):
            if attempt:
                time.sleep(_METADATA_RETRY)
            metadata = consumer.list_topics(timeout=_TIMEOUT)
            troubled: dict[str, Any] = {}
            for topic in self.topics:
                meta = metadata.topics.get(topic)
                if meta is None:
                    continue
                if meta.error is not None:
                    if meta.error.code() not in absent:
                        troubled[f"topic {topic}"] = meta.error
                    continue
                for p, part in sorted(meta.partitions.items()):
                    error = getattr(part, "error", None)
                    if getattr(part, "leader", 0) < 0 or (error is not None and error.code() in leaderless):
                        troubled[f"topic {topic} partition {p}"] = error or "no leader"
            if not troubled:
                return metadata
        raise RuntimeError(
            f"Kafka's metadata of {', '.join(f'{what} says {e}' for what, e in sorted(troubled.items()))} after "
            f"{_METADATA_READS} reads {_METADATA_RETRY:g}s apart: its partitions' offsets cannot be read now"
        )

    def data_loss(self, what: str, verdict: str, going_on: str) -> None:
        """Records of a topic are gone (``what``, ``verdict``): raise (``failOnDataLoss``, the default),
        or warn that the read goes on (``going_on``)."""
        if self.fail_on_data_loss:
            raise RuntimeError(
                f"{what}: {verdict}. Rebuild its stores from what the topic holds: delete the stores' checkpoints "
                "(<home>/checkpoints/<namespace>/<store>; keep _deadletter/ there, or every dead letter is written "
                "again) and start the topology with --take-over (take_over=True for materialize), which a store "
                "that holds the old checkpoint's batches needs; or go on past the loss (failOnDataLoss=false: a "
                "riqr topology's --skip-lost-offsets)"
            )
        log.warning("%s: %s (failOnDataLoss=false)", what, going_on)

    def _lost(self, consumer: Any, part: TopicRange, position: int) -> int:
        """Offset ``position`` of ``part`` is gone from Kafka: raise (``failOnDataLoss``, the default), or
        go on from the partition's first offset and return where the read stands."""
        from confluent_kafka import TopicPartition

        low, high = consumer.get_watermark_offsets(TopicPartition(part.topic, part.partition), timeout=_TIMEOUT)
        where = f"{part.topic}/{part.partition}"
        if position < low:
            what = f"offsets {position}-{min(low, part.end) - 1} of {where} are no longer in Kafka"
        else:
            what = f"offset {position} of {where} is past its end, {high}"
        what += f" (it keeps {low}-{high - 1}: removed by retention, or the topic was made again)"
        self.data_loss(what, "records were lost before this query read them", "skipped")
        if low >= part.end or low <= position:
            return part.end
        consumer.assign([TopicPartition(part.topic, part.partition, low)])
        return low

    def ranges(self, start: dict[str, int], end: dict[str, int]) -> list[TopicRange]:
        out = []
        for name, stop in sorted(end.items()):
            topic, _, p = name.rpartition("/")
            begin = start.get(name, 0)
            if stop > begin:
                out.append(TopicRange(topic, int(p), begin, stop))
        return out

    def read(self, part: TopicRange) -> Iterator[tuple[Any, ...]]:
        """The records of ``part``. Offsets with no record (a transaction's control records, aborted
        records, a compacted topic's removed ones) are skipped: the range ends where the consumer's
        position reaches its end. Offsets Kafka no longer has fail the read (``failOnDataLoss``, as
        Spark's connector) or are skipped from the partition's first offset with a warning."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        consumer = self.consumer()
        where = f"{part.topic}/{part.partition}"
        try:
            consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
            position = part.start
            waited_since = time.monotonic()
            while position < part.end:
                # Short waits: a call for n messages waits its whole timeout when fewer come (offsets with
                # no record make fewer), so the read ends as soon as the position shows the range done.
                messages = consumer.consume(min(1000, part.end - position), timeout=_POLL)
                if not messages:
                    at = consumer.position([TopicPartition(part.topic, part.partition)])[0].offset
                    if at >= part.end:  # past control or aborted records to the end: nothing more to read
                        break
                    if time.monotonic() - waited_since > _TIMEOUT:
                        raise TimeoutError(
                            f"no message from {where} at offset {position} (expected up to {part.end}) within "
                            f"{_TIMEOUT:g}s; an open transaction holds back what follows until it ends"
                        )
                    continue
                waited_since = time.monotonic()
                for m in messages:
                    error = m.error()
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= part.end:
                            position = part.end
                            break
                        continue  # the end for now; what is up to part.end is still coming
                    if error is not None and error.code() in (KafkaError._AUTO_OFFSET_RESET,
                                                              KafkaError.OFFSET_OUT_OF_RANGE):  # fmt: skip
                        position = self._lost(consumer, part, position)
                        break
                    if error is not None:
                        raise KafkaException(error)
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


def _warn_of_lost_history(starts: dict[str, int]) -> None:
    """A query starting from the earliest offsets (a new topology, or a rebuild from Kafka) of partitions
    whose start Kafka has moved on (retention, deleted records) builds its state from what is left: a
    count or a sum then covers only the records still there, and nothing else says so. Said once, in the
    topology's log, naming each partition and how many records it no longer has."""
    lost = {name: start for name, start in starts.items() if start > 0}
    if lost:
        log.warning(
            "reading from the earliest offsets, but Kafka no longer has the first records of %s: state built "
            "from here (a rebuild, a count, a sum) covers only the records still there",
            ", ".join(f"{name} (offsets 0-{start - 1})" for name, start in sorted(lost.items())),
        )


class KafkaStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.kafka = _Kafka(options)
        self._last: dict[str, int] = {}  # the last offsets this reader gave Spark

    def initialOffset(self) -> dict[str, int]:
        self._last = self.kafka.watermarks(low=self.kafka.starting == "earliest", strict=True)
        if self.kafka.starting == "earliest":
            _warn_of_lost_history(self._last)
        return dict(self._last)

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """The end of every partition. (Spark 4.2 passes the start and a read limit. Reading everything
        available is what the default limit asks for.)"""
        known = {**self._last, **(start or {})}
        for attempt in range(_END_READS):
            if attempt:
                time.sleep(_END_RETRY)
            fresh = self.kafka.watermarks(low=False)
            behind = {name: (known[name], end) for name, end in fresh.items() if end < known.get(name, end)}
            if not behind:
                break
            # A new leader's high watermark can lag the old one's for a moment (Spark's connector reads the
            # ends again too before it calls it data loss).
        if behind:
            what = ", ".join(
                f"{name} ends at {end}, below the {at} this query has read" for name, (at, end) in behind.items()
            )
            what += " (the topic was made again, or a partition lost records to an unclean leader election)"
            self.kafka.data_loss(what, "records may have been lost", "going on from where the topic ends now")
            known = {name: at for name, at in known.items() if name not in behind}
        self._last = later_offsets(known, fresh)
        return dict(self._last)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[TopicRange]:
        return self.kafka.ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        return self.kafka.read(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Offsets live in Spark's checkpoint; nothing to tell Kafka."""


def later_offsets(known: dict[str, int], fresh: dict[str, int]) -> dict[str, int]:
    """The end offsets of a batch that starts at ``known``, from a read of the partitions' ends ``fresh``:
    with every partition of ``known`` in it, and none below ``known`` (``latestOffset`` says when a
    partition's end went back). A topic whose metadata one read did not give (a leader election) was left
    out of the end, and the next batch began it again at 0, counting its records twice."""
    return {name: max(known.get(name, offset), fresh.get(name, offset)) for name, offset in {**fresh, **known}.items()}


class KafkaBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.kafka = _Kafka(options)

    def partitions(self) -> list[TopicRange]:
        return self.kafka.ranges(
            self.kafka.watermarks(low=True, strict=True), self.kafka.watermarks(low=False, strict=True)
        )

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
