"""Dead letters: records a topology cannot use, kept with the reason instead of failing or vanishing.

Spark 4 runs SQL in ANSI mode, where a bad cast or an out-of-range index fails the whole query; one
malformed record would stop a store from being fed. Topologies therefore parse with null-safe functions
(``try_element_at``, ``try_to_timestamp``, ...), state what a usable record is, and split their input:

    good, bad = split_valid(df, valid=F.col("booked_at").isNotNull(), reason=F.lit("unparsable time"))

``good`` keeps the input's columns; ``bad`` has two columns, ``reason`` and ``record`` (the original
record as JSON text, or the raw line for a line that was not JSON), so rejects from several places union.
``write_dead_letters`` starts a small streaming query of its own (own checkpoint, relaxed trigger) that
appends them as JSON lines to ``<home>/deadletter/<topic>/``:

    {"topic": "booking", "consumer": "bookings", "reason": "...", "record": "...", "dead_at": "..."}

One file per micro-batch, named by the writing query and the batch id and renamed into place, so a
replayed batch rewrites its own file instead of adding duplicates. ``consumer`` names the query (the
store) that rejected the record: two stores reading one topic each reject a bad record, so it appears
once per consumer, and ``dead_letter_count`` counts rejections.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.durable import fsync_directory, make_directories
from topologies.checkpoint import query_id
from topologies.inflight import IN_FLIGHT

log = logging.getLogger(__name__)

__all__ = [
    "DEAD_LETTER_TRIGGER",
    "split_valid",
    "dead_letter_dir",
    "record_json",
    "write_dead_letters",
    "read_dead_letters",
    "dead_letter_count",
]

# Dead letters are for people to look at later: no need to poll as often as a store is fed.
DEAD_LETTER_TRIGGER: dict[str, Any] = {"processingTime": "2 seconds"}
_SUFFIX = ".jsonl"


def record_json(*columns: Any) -> Any:
    """A record's ``columns`` as a JSON object, its null fields kept (``"key": null``): Spark's ``to_json``
    leaves them out by default, and a dead letter for a null key then had no key at all."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*columns), {"ignoreNullFields": "false"})


def split_valid(df: Any, valid: Any, reason: Any, *, record: Any = None) -> tuple[Any, Any]:
    """``(good, bad)``: the rows where ``valid`` is true, and the others as ``reason``, ``record`` columns.

    A ``valid`` that evaluates to null counts as false, so a condition over a null field rejects the row
    rather than letting it through. ``record`` is the text kept for a bad row; by default the row's
    columns as a JSON object.
    """
    from pyspark.sql import functions as F

    usable = F.coalesce(valid, F.lit(False))
    text = record if record is not None else record_json(*df.columns)
    bad = df.where(~usable).select(reason.cast("string").alias("reason"), text.alias("record"))
    return df.where(usable), bad


def dead_letter_dir(home: Path, topic: str) -> Path:
    """Where the dead letters of ``topic`` go: ``<home>/deadletter/<topic>/``."""
    from runtime.landing import topic_dir

    topic_dir(home, topic)  # the same rules for topic names, so the path cannot escape ``home``
    return home / "deadletter" / topic


def _writer_id(checkpoint: Path) -> str:
    """A stable name for the query writing from ``checkpoint``: restarts and replays reuse it."""
    return hashlib.sha256(str(checkpoint.resolve()).encode("utf-8")).hexdigest()[:12]


def _write_batch(directory: Path, name: str, lines: Iterator[str]) -> int:
    """Write ``lines`` as the file ``name`` (none if there are no lines); returns how many were written."""
    tmp = directory / f".{name}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            written = 0
            for line in lines:
                out.write(line + "\n")
                written += 1
            out.flush()
            os.fsync(out.fileno())
        if written:
            os.replace(tmp, directory / name)
            fsync_directory(directory)  # the letters are on disk before the batch is done
        return written
    finally:
        tmp.unlink(missing_ok=True)


def write_dead_letters(
    bad: Any,
    home: Path,
    topic: str,
    checkpoint: Path,
    *,
    consumer: str,
    trigger: dict[str, Any] | None = None,
    namespace: str | None = None,
) -> Any:
    """Start (or find running) the streaming query appending ``bad`` to ``topic``'s dead letters.

    ``bad`` has the columns ``split_valid`` gives. The query keeps its progress in ``checkpoint``; it is
    named after it, so asking again while it runs returns the running query instead of a second writer.
    ``trigger`` is passed to ``DataStreamWriter.trigger`` (default every 2 seconds;
    ``{"availableNow": True}`` processes what is there and stops). With a ``namespace``, every batch
    also tells that riqr runtime's registry how many records the consumer (a store) has dead-lettered
    from ``topic`` so far, which ``GET /stores`` shows in the store's ingest state. Returns the
    ``StreamingQuery``.
    """
    from pyspark.sql import functions as F

    writer = _writer_id(checkpoint)
    name = f"riqr-deadletter-{topic}-{consumer}-{writer}"
    for query in bad.sparkSession.streams.active:
        if query.name == name:
            return query
    directory = dead_letter_dir(home, topic)
    make_directories(directory)
    letters = bad.select(
        F.to_json(
            F.struct(
                F.lit(topic).alias("topic"),
                F.lit(consumer).alias("consumer"),
                F.col("reason"),
                F.col("record"),
                F.current_timestamp().alias("dead_at"),
            )
        ).alias("letter")
    )

    run: list[str] = []  # the checkpoint's query id, read at the first batch (Spark writes it as it starts)
    # The total so far, from earlier runs too (a restarted topology reports it before its first bad
    # record): the files are read once here, not at every batch, whose cost grew with every file written.
    tally = _Tally(directory, writer) if namespace is not None else None

    def deliver(batch: Any, batch_id: int) -> None:
        # Dead letters are few; the driver writes them, one file per batch, so a replay overwrites. The
        # file names the checkpoint's query too: a new checkpoint (batch ids from 0 again) overwrote an
        # earlier one's letters. Counted while it runs: a stop lets the batch end rather than cancel it
        # (``topologies.inflight``).
        with IN_FLIGHT.batch(name, jvm=lambda: batch.sparkSession._jvm):  # a job a stop cancels: quietly
            if not run:
                run.append((query_id(str(checkpoint)) or "none")[:8])
            # toArrow, not toLocalIterator: each toLocalIterator left its jobs in Spark's DAGScheduler
            # (activeQueryToJobs, emptied only when the SQL execution ends, which a foreachBatch's
            # iterator never does), about 270 KB of driver heap a batch with their lineage and broadcast
            # configuration: a soak run's 1 GB heap was full within the hour. Letters are few, and a
            # batch's come to the driver in one Arrow table, as the store's own batch does.
            rows = _letters(batch.toArrow())
            file = f"{writer}-{run[0]}-{batch_id:012d}{_SUFFIX}"
            written = _write_batch(directory, file, rows)
            if namespace is not None and tally is not None:
                _report(namespace, consumer, topic, tally.wrote(file, written))

    query = (
        letters.writeStream.queryName(name)
        .foreachBatch(deliver)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or DEAD_LETTER_TRIGGER))
        .start()
    )
    if namespace is not None and tally is not None:
        _report(namespace, consumer, topic, tally.total)
    return query


def _letters(table: Any) -> Iterator[str]:
    """The ``letter`` column of a batch collected as an Arrow table, one string at a time."""
    for chunk in table.column("letter").chunks:
        yield from (letter for letter in chunk.to_pylist() if letter is not None)


def _lines_in(path: Path) -> int:
    with open(path, "rb") as lines:
        return sum(1 for line in lines if line.strip())


class _Tally:
    """The dead letters one writer (one consumer of one topic) has written so far: its files counted
    once, then each batch's file as it is written. A replay's file replaces the one of the same name, so
    it replaces that file's count too; a batch with no letters writes no file and changes nothing."""

    def __init__(self, directory: Path, writer: str) -> None:
        self._files = {path.name: _lines_in(path) for path in directory.glob(f"{writer}-*{_SUFFIX}")}
        self.total = sum(self._files.values())

    def wrote(self, name: str, lines: int) -> int:
        """The batch's file ``name`` was written with ``lines`` letters (0: not written); the new total."""
        if lines:
            self.total += lines - self._files.get(name, 0)
            self._files[name] = lines
        return self.total


def _report(namespace: str, consumer: str, topic: str, count: int) -> None:
    """Through this process's feeder, which sends the total with the store's feed now and with every
    heartbeat (best effort: a registry that cannot be told now hears it with the next one)."""
    from topologies.feeder import feeder_for

    feeder_for(namespace).dead_letters(consumer, topic, count)


def _files(home: Path, topic: str) -> list[Path]:
    directory = dead_letter_dir(home, topic)
    if not directory.is_dir():
        return []
    files = [p for p in directory.iterdir() if p.name.endswith(_SUFFIX) and not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))  # oldest first: names lead with a query id


def read_dead_letters(home: Path, topic: str) -> list[dict[str, Any]]:
    """Every dead letter of ``topic``, oldest file first (for people and tests; not for large volumes)."""
    letters: list[dict[str, Any]] = []
    for path in _files(home, topic):
        letters.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
    return letters


def dead_letter_count(home: Path, topic: str) -> int:
    """How many records of ``topic`` were rejected (one per rejecting consumer); 0 if none ever were."""
    count = 0
    for path in _files(home, topic):
        with open(path, "rb") as lines:
            count += sum(1 for line in lines if line.strip())
    return count
