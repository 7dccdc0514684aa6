"""Where topologies read topics from: landing directories (the default), or Kafka.

* ``files``: the landing directories written by ``riqr produce`` (see ``runtime.landing``);
* ``kafka``: Kafka through riqr's Python source (``topologies.kafka_source``, needs ``confluent-kafka``);
* ``spark-kafka``: Kafka through Spark's own connector, where its jar is on the classpath (for example
  ``--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``).

Every choice gives the same columns: ``key``, ``value`` (strings), ``ts`` (event time, epoch millis) and
``seq`` (order within the source), so a topology's transforms do not change with the source.

Landing files are written by ``riqr produce`` but are plain files anyone can put lines in. They are read
in Spark's PERMISSIVE mode with a ``_corrupt_record`` column (the file source needs it in the schema to
fill it), so a line that is not JSON, or has a field of the wrong type, does not fail the query:
``read_topic_checked`` returns such lines apart, with a reason, for ``topologies.deadletter``. So do
records without ``ts`` or ``seq`` and times outside years 1-9999, which Spark's ANSI mode would turn
into a failed query as soon as a topology makes a timestamp of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.landing import topic_dir

__all__ = [
    "RECORD_SCHEMA_DDL",
    "LANDING_SCHEMA_DDL",
    "CORRUPT_COLUMN",
    "LINE_COLUMN",
    "landing_lines",
    "SourceConfig",
    "FILES",
    "check_landing_records",
    "read_topic",
    "read_topic_checked",
    "read_topic_batch",
]

RECORD_SCHEMA_DDL = "key STRING, value STRING, ts BIGINT, seq BIGINT"
SOURCE_KINDS = ("files", "kafka", "spark-kafka")
CORRUPT_COLUMN = "_corrupt_record"
LANDING_SCHEMA_DDL = f"{RECORD_SCHEMA_DDL}, {CORRUPT_COLUMN} STRING"
LINE_COLUMN = "_line"  # a landing line as written, before it is parsed
# Epoch millis of 0001-01-01 and 9999-12-30T23:59:59.999: the range a Spark timestamp (and Python, which
# reads the stores) can hold, less a day at the top: a window or session of an event in the last day
# could end past year 9999, and every read of its key failed.
MIN_TS, MAX_TS = -62_135_596_800_000, 253_402_214_399_999


@dataclass(frozen=True)
class SourceConfig:
    """Which source topics come from; ``bootstrap`` is the Kafka bootstrap servers for the Kafka kinds."""

    kind: str = "files"
    bootstrap: str | None = None
    starting_offsets: str = "earliest"
    # Offsets gone from Kafka (retention, a topic made again) fail the batch; False skips them with a warning.
    fail_on_data_loss: bool = True

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"source must be one of {', '.join(SOURCE_KINDS)}, got {self.kind!r}")
        if self.kind != "files" and not self.bootstrap:
            raise ValueError(f"the {self.kind} source needs the Kafka bootstrap servers")


FILES = SourceConfig()


def _kafka_columns(df: Any) -> tuple[Any, Any]:
    """Spark's Kafka connector's columns as riqr's record columns, ``(good, bad)``: a key or value that is not
    UTF-8 (a cast to string keeps its bytes, which fail the batch where Arrow hands them to Python) is a
    dead letter, its bad bytes replaced in the record kept."""
    from pyspark.sql import functions as F

    key, value = F.col("key").cast("string"), F.col("value").cast("string")
    rows = df.select(
        key.alias("key"), value.alias("value"), F.unix_millis("timestamp").alias("ts"), F.col("offset").alias("seq")
    )
    return _split_undecodable(rows)


def _split_undecodable(rows: Any, problem: Any = None) -> tuple[Any, Any]:
    """``(good, bad)`` of Kafka records (key, value, ts, seq): bad where ``problem`` (riqr-kafka's column)
    is set, or, without it, where Spark sees a key or value that is not UTF-8."""
    from pyspark.sql import functions as F

    from topologies.deadletter import record_json, split_valid

    key, value = F.col("key"), F.col("value")
    if problem is None:
        utf8 = F.coalesce(F.is_valid_utf8(key), F.lit(True)) & F.coalesce(F.is_valid_utf8(value), F.lit(True))
        problem = F.when(~utf8, F.lit("the record's key or value is not UTF-8"))
    # A producer's clock sets a record's time: one far off (Long.MAX_VALUE) made timestamp_millis throw,
    # failing the query at every replay, as the landing lines' check prevents for files.
    problem = F.coalesce(problem, F.when(~F.col("ts").between(MIN_TS, MAX_TS), F.lit("ts out of range")))
    record = record_json(F.make_valid_utf8(key).alias("key"), F.make_valid_utf8(value).alias("value"), "ts", "seq")
    good, bad = split_valid(rows, problem.isNull(), problem, record=record)
    return good.select("key", "value", "ts", "seq"), bad


def check_landing_records(lines: Any) -> tuple[Any, Any]:
    """Landing-file lines (a ``LINE_COLUMN`` of text, as Spark's text source reads them) as ``(good, bad)``:
    good has key, value, ts, seq only; bad the dead-letter columns, each with its line as written.

    Lines are parsed here rather than by Spark's JSON source, which reads a missing field as null: a record
    without ``value`` (a misspelled field, a writer's bug) then deleted its key, and one without ``key`` was
    dropped without a trace. Both fields must be present (null is a value: a null value deletes the key, a
    null key is dropped, as in Kafka Streams); a line that is no JSON object of the record's types, or
    lacks ``ts`` or ``seq``, or whose ``ts`` no timestamp can hold, is a dead letter too, and so is a line
    that is not UTF-8 (Spark's text source keeps its bytes, and its JSON parser read each bad byte as
    U+FFFD, so two keys that differ in one became one key without a trace; its letter's record is the line
    with each bad byte so replaced). Blank lines are nothing, as for Spark's JSON source."""
    from pyspark.sql import functions as F

    from topologies.deadletter import split_valid

    line = F.col(LINE_COLUMN)
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    lines = lines.where(F.trim(line) != "")
    parsed = lines.select(
        line, F.from_json(line, LANDING_SCHEMA_DDL, options).alias("r"), F.json_object_keys(line).alias("fields")
    )
    rows = parsed.select(LINE_COLUMN, "r.*", "fields")
    corrupt, ts, seq, fields = F.col(CORRUPT_COLUMN), F.col("ts"), F.col("seq"), F.col("fields")
    # json_object_keys is null for what is no JSON object ("42", a cut line): malformed as well. Both it and
    # from_json stop after the first object, so '{...}{...}' (a writer that left out a newline) kept the
    # first record and lost the second, and '{...} garbage' passed: a line that may hold more than one
    # value (not ending in '}', or '}' then '{') is parsed once more, as the items of an array.
    suspect = ~F.rtrim(line).endswith("}") | line.rlike(r"\}\s*\{")
    one = F.when(suspect, F.coalesce(F.json_array_length(F.concat(F.lit("["), line, F.lit("]"))) == 1, F.lit(False)))
    malformed = corrupt.isNotNull() | fields.isNull() | ~F.coalesce(one, F.lit(True))
    both = F.array_contains(fields, "key") & F.array_contains(fields, "value")
    utf8 = F.is_valid_utf8(line)
    valid = utf8 & ~malformed & both & ts.isNotNull() & seq.isNotNull() & ts.between(MIN_TS, MAX_TS)
    reason = (
        F.when(~utf8, F.lit("line is not UTF-8"))
        .when(malformed, F.lit("malformed line: not a JSON record of key, value, ts, seq"))
        .when(~both, F.lit("missing key or value (write null to delete a key; a null key is dropped)"))
        .when(ts.isNull() | seq.isNull(), F.lit("missing ts or seq"))
        .otherwise(F.lit("ts out of range"))
    )
    good, bad = split_valid(rows, valid, reason, record=F.make_valid_utf8(line))
    return good.select("key", "value", "ts", "seq"), bad


def landing_lines(reader: Any, directory: Path) -> Any:
    """The lines of a landing directory's files, one row each (``LINE_COLUMN``), for ``check_landing_records``."""
    return reader.text(str(directory)).withColumnRenamed("value", LINE_COLUMN)


# Spark's maxFileAge for the landing directories: ten years (see ``_read``).
LANDING_MAX_FILE_AGE = "3650d"


def _reader(spark: Any, streaming: bool) -> Any:
    return spark.readStream if streaming else spark.read


def _read(spark: Any, home: Path, topic: str, source: SourceConfig, *, streaming: bool) -> tuple[Any, Any | None]:
    from pyspark.sql import functions as F

    reader = _reader(spark, streaming)
    if source.kind == "files":
        directory = topic_dir(home, topic)
        directory.mkdir(parents=True, exist_ok=True)
        # No maxFilesPerTrigger: every file present goes into the next micro-batch. The rebuild path needs
        # it (docs/design.md, "The rebuild path"): batch 0 of a fresh checkpoint resets every partition and
        # must carry the whole state, which a cap (this was 1000 files) cut short on a topic of more files,
        # leaving counts lower and keys missing until the next batches came.
        if streaming:
            # Spark's file source skips, after its first batch, a file whose time is more than maxFileAge (7
            # days by default) before the newest file's: a landing file copied with its time kept (cp -p,
            # rsync -a, tar) was never read, with no dead letter and no count. The price of a long age: the
            # source remembers every file it read that long (about a hundred bytes each, in the driver).
            reader = reader.option("maxFileAge", LANDING_MAX_FILE_AGE)
        return check_landing_records(landing_lines(reader, directory))
    if source.kind == "kafka":
        from topologies.kafka_source import KafkaDataSource

        spark.dataSource.register(KafkaDataSource)
        df = (
            reader.format("riqr-kafka")
            .option("kafka.bootstrap.servers", source.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", source.starting_offsets)
            .option("failOnDataLoss", str(source.fail_on_data_loss).lower())
            .load()
        )
        return _split_undecodable(df.select("key", "value", "ts", "seq", "problem"), F.col("problem"))
    df = reader.format("kafka").option("kafka.bootstrap.servers", source.bootstrap).option("subscribe", topic)
    df = df.option("failOnDataLoss", str(source.fail_on_data_loss).lower())  # Spark's connector: the same option
    if streaming:
        df = df.option("startingOffsets", source.starting_offsets)
    return _kafka_columns(df.load())


def read_topic_checked(spark: Any, home: Path, topic: str, source: SourceConfig = FILES) -> tuple[Any, Any | None]:
    """``(records, rejects)`` of ``topic`` as streaming DataFrames (Kafka's rejects: keys or values that are
    not UTF-8).

    ``records`` has the columns key, value, ts, seq; ``rejects`` the dead-letter columns reason, record.
    """
    return _read(spark, home, topic, source, streaming=True)


def read_topic(spark: Any, home: Path, topic: str, source: SourceConfig = FILES) -> Any:
    """A streaming DataFrame of the usable records of ``topic`` (columns key, value, ts, seq).

    Malformed landing lines are left out; use ``read_topic_checked`` to keep them as dead letters.
    """
    return _read(spark, home, topic, source, streaming=True)[0]


def read_topic_batch(spark: Any, home: Path, topic: str, source: SourceConfig = FILES) -> Any:
    """The usable records of ``topic`` present now, as a static DataFrame (malformed lines left out)."""
    return _read(spark, home, topic, source, streaming=False)[0]
