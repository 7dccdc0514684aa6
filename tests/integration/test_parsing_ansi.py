"""Hostile records through every topology's parsing, under Spark's ANSI mode: nothing raises, good records
come out right, bad ones come out as dead letters with a reason."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.landing import Record, topic_dir, write_records
from tests.integration.helpers import wait_for
from topologies.deadletter import dead_letter_count, read_dead_letters, split_valid, write_dead_letters
from topologies.sources import read_topic_batch, read_topic_checked

pytestmark = pytest.mark.integration

SCHEMA = "key string, value string, ts bigint, seq bigint"
GOOD_LINE = {"key": "1", "value": "pizza", "ts": 1_767_268_800_000, "seq": 0}


@pytest.fixture(autouse=True)
def _ansi(spark: Any) -> None:
    # The point of these tests: Spark 4's default, where a bad cast or index fails a query.
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"


def _landing_lines(home: Path, topic: str, lines: list[str]) -> None:
    directory = topic_dir(home, topic)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hand-written.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


HOSTILE_LINES = [
    json.dumps(GOOD_LINE),
    "this is not json",
    json.dumps({**GOOD_LINE, "key": "2", "ts": "yesterday"}),  # wrong type
    json.dumps({"key": "3", "value": "x"}),  # no ts, no seq
    json.dumps({**GOOD_LINE, "key": "4", "ts": 99_999_999_999_999_999}),  # overflows a timestamp
    "42",
    '{"key": "5", "value": ',  # cut short
    json.dumps({"key": "6", "vaule": "x", "ts": 1, "seq": 1}),  # misspelled: no value (it deleted key 6)
    json.dumps({"value": "x", "ts": 1, "seq": 2}),  # no key at all (dropped without a trace)
    "   ",  # blank: nothing
    json.dumps({**GOOD_LINE, "key": "8"}) + json.dumps({**GOOD_LINE, "key": "9"}),  # a newline left out: 9 lost
    json.dumps({**GOOD_LINE, "key": "10"}) + " garbage",  # passed as key 10
]
BRACES = {**GOOD_LINE, "key": "11", "value": "a}{b"}  # braces in a value (the line looks like two): usable
DELETE = {"key": "7", "value": None, "ts": 1, "seq": 3}  # a delete as written: a usable record


def test_malformed_landing_lines_are_split_off_with_a_reason(spark: Any, tmp_path: Path) -> None:
    _landing_lines(tmp_path, "order", [*HOSTILE_LINES, json.dumps(DELETE), json.dumps(BRACES) + "  "])
    # Latin-1 bytes, not UTF-8: Spark's JSON parser read each as U+FFFD, so "café" and "cafè" became one
    # key, silently (an ingest review). Dead letters, with the line as it reads with the bytes replaced.
    latin1 = [
        b'{"key": "caf\xe9", "value": "x", "ts": 1, "seq": 5}',
        b'{"key": "caf\xe8", "value": "y", "ts": 1, "seq": 6}',
    ]
    (topic_dir(tmp_path, "order") / "latin1.json").write_bytes(b"\n".join(latin1) + b"\n")
    good = read_topic_batch(spark, tmp_path, "order")
    assert good.columns == ["key", "value", "ts", "seq"]
    usable = [GOOD_LINE, BRACES, DELETE]
    assert sorted((r.asDict() for r in good.collect()), key=lambda r: r["key"]) == usable
    reasons = _rejects_of_batch(spark, tmp_path, "order")
    missing = "missing key or value (write null to delete a key; a null key is dropped)"
    assert reasons == {
        "this is not json": "malformed line: not a JSON record of key, value, ts, seq",
        HOSTILE_LINES[2]: "malformed line: not a JSON record of key, value, ts, seq",
        HOSTILE_LINES[3]: "missing ts or seq",
        HOSTILE_LINES[4]: "ts out of range",
        "42": "malformed line: not a JSON record of key, value, ts, seq",
        '{"key": "5", "value": ': "malformed line: not a JSON record of key, value, ts, seq",
        HOSTILE_LINES[7]: missing,
        HOSTILE_LINES[8]: missing,
        HOSTILE_LINES[10]: "malformed line: not a JSON record of key, value, ts, seq",
        HOSTILE_LINES[11]: "malformed line: not a JSON record of key, value, ts, seq",
        **{line.decode("utf-8", errors="replace"): "line is not UTF-8" for line in latin1},
    }


def _rejects_of_batch(spark: Any, home: Path, topic: str) -> dict[str, str]:
    from topologies.sources import check_landing_records, landing_lines

    _, bad = check_landing_records(landing_lines(spark.read, topic_dir(home, topic)))
    return {r.record: r.reason for r in bad.collect()}


def test_windowed_orders_survive_landing_lines_that_would_overflow_a_timestamp(spark: Any, tmp_path: Path) -> None:
    from topologies.food_orders_windowed import orders_per_window

    _landing_lines(tmp_path, "order", HOSTILE_LINES)
    rows = orders_per_window(read_topic_batch(spark, tmp_path, "order"), watermark="5 seconds").collect()
    assert [(r.key, r.orders) for r in rows] == [("1", 1)]


def test_food_orders_and_events_see_only_usable_records(spark: Any, tmp_path: Path) -> None:
    from topologies.events import aggregate_events
    from topologies.food_orders import latest_by_key

    _landing_lines(tmp_path, "event", HOSTILE_LINES)
    events = read_topic_batch(spark, tmp_path, "event")
    assert [(r.key, r.events, r.latest) for r in aggregate_events(events).collect()] == [("1", 1, "pizza")]
    assert [(r.key, r.value) for r in latest_by_key(events).collect()] == [("1", "pizza")]


BOOKINGS = [
    ("42", "2026-03-01T09:30:00Z Berlin-Hamburg"),
    ("42", "2026-03-01T10:00:00Z"),  # no trip
    ("42", "2026-03-01T11:00:00Z "),  # an empty trip
    ("7", "not-a-time Nowhere"),
    ("8", "2026-13-45T99:00:00Z Atlantis"),  # looks like a time, is not one
    ("9", None),
    (None, "2026-03-01T09:30:00Z Bonn-Cologne"),
    ("10", "garbage"),
    ("11", "2026-03-01 09:30 Hamburg-Berlin"),  # a space for the T: midnight, "09:30 ..." the trip
    ("12", "12000-03-01T09:30:00Z Far-Future"),  # Spark parses it; Python cannot hold it
    ("13", "T09:30 Berlin-Hamburg"),  # a time alone: Spark's cast takes it as today
]


def test_railway_bookings_split_into_bookings_and_dead_letters(spark: Any) -> None:
    from topologies.railway import latest_booking, split_bookings

    records = spark.createDataFrame([(k, v, 1, i) for i, (k, v) in enumerate(BOOKINGS)], SCHEMA)
    good, bad = split_bookings(records)
    assert [tuple(r) for r in good.collect()] == [("42", dt.datetime(2026, 3, 1, 9, 30), "Berlin-Hamburg")]
    assert [tuple(r) for r in latest_booking(good).collect()] == [("42", dt.datetime(2026, 3, 1, 9, 30))]
    letters = bad.collect()
    assert all({"key", "value"} <= set(json.loads(r.record)) for r in letters)  # a null key is kept, as null
    rejected = {(json.loads(r.record)["key"], json.loads(r.record)["value"]): r.reason for r in letters}
    assert rejected == {
        ("42", "2026-03-01T10:00:00Z"): "booking without a trip",
        ("42", "2026-03-01T11:00:00Z "): "booking without a trip",
        ("7", "not-a-time Nowhere"): "booking time does not parse",
        ("8", "2026-13-45T99:00:00Z Atlantis"): "booking time does not parse",
        ("9", None): "booking without a value",
        (None, "2026-03-01T09:30:00Z Bonn-Cologne"): "booking without a customer (null key)",
        ("10", "garbage"): "booking time does not parse",
        ("11", "2026-03-01 09:30 Hamburg-Berlin"): (
            "booking time without a time of day (write it as 2026-03-01T09:30:00Z)"
        ),
        ("12", "12000-03-01T09:30:00Z Far-Future"): "booking time out of range (0001-01-01 to 9999-12-30)",
        ("13", "T09:30 Berlin-Hamburg"): "booking time without a time of day (write it as 2026-03-01T09:30:00Z)",
    }


def test_split_valid_counts_a_null_condition_as_invalid(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([("a", 1), ("b", None)], "k string, n int")
    good, bad = split_valid(df, F.col("n") > 0, F.lit("no n"))
    assert [r.k for r in good.collect()] == ["a"]
    assert [(r.reason, json.loads(r.record)) for r in bad.collect()] == [("no n", {"k": "b", "n": None})]


def test_the_dead_letter_query_writes_what_a_topology_rejects(spark: Any, tmp_path: Path) -> None:
    from topologies.options import TopologyOptions, dead_letter_checkpoint
    from topologies.railway import split_bookings

    _landing_lines(tmp_path, "booking", ["not json at all"])
    write_records(tmp_path, "booking", [Record(k, v) for k, v in BOOKINGS])
    records, unreadable = read_topic_checked(spark, tmp_path, "booking")
    _, unparsable = split_bookings(records)
    options = TopologyOptions(namespace="deadletter-test")
    checkpoint = dead_letter_checkpoint(tmp_path, options.namespace, "bookings", "booking")
    bad = unreadable.unionByName(unparsable)
    query = write_dead_letters(
        bad, tmp_path, "booking", checkpoint, consumer="bookings", trigger={"availableNow": True}
    )
    query.awaitTermination()
    assert query.exception() is None
    letters = read_dead_letters(tmp_path, "booking")
    assert dead_letter_count(tmp_path, "booking") == len(letters) == len(BOOKINGS)  # 7 unusable bookings + 1 line
    assert {letter["topic"] for letter in letters} == {"booking"}
    assert {letter["consumer"] for letter in letters} == {"bookings"}
    assert all(letter["reason"] and letter["dead_at"] for letter in letters)
    assert "not json at all" in {letter["record"] for letter in letters}
    # Nothing half-written is left behind, and running again over the same input adds nothing.
    again = write_dead_letters(
        bad, tmp_path, "booking", checkpoint, consumer="bookings", trigger={"availableNow": True}
    )
    again.awaitTermination()
    assert dead_letter_count(tmp_path, "booking") == len(BOOKINGS)
    assert not [p for p in (tmp_path / "deadletter" / "booking").iterdir() if p.name.startswith(".")]
    # A new checkpoint (its batch ids from 0 again) adds its letters beside the first one's: it overwrote them.
    shutil.rmtree(checkpoint)
    anew = write_dead_letters(bad, tmp_path, "booking", checkpoint, consumer="bookings", trigger={"availableNow": True})
    anew.awaitTermination()
    assert dead_letter_count(tmp_path, "booking") == 2 * len(BOOKINGS)


def test_dead_letter_batches_leave_no_job_in_sparks_scheduler(spark: Any, tmp_path: Path) -> None:
    """Each batch's ``toLocalIterator`` left its jobs in the DAGScheduler's ``activeQueryToJobs`` (an
    iterator's SQL execution never ends), with their lineage and broadcast configuration: about 270 KB of
    driver heap a batch, every 2 s, bad records or not, which filled a soak run's 1 GB heap within the hour.
    Every batch, letters or none, leaves the map as it found it."""
    from pyspark.sql import functions as F

    dag = spark.sparkContext._jsc.sc().dagScheduler()
    before = dag.activeQueryToJobs().size()
    rate = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    bad = rate.select(F.lit("a test").alias("reason"), F.col("value").cast("string").alias("record"))
    query = write_dead_letters(
        bad, tmp_path, "ticks", tmp_path / "cp", consumer="ticks", trigger={"processingTime": "200 milliseconds"}
    )
    try:
        wait_for(lambda: (query.lastProgress or {}).get("batchId", -1) >= 6, timeout=60, what="six batches")
    finally:
        query.stop()
    assert query.exception() is None
    assert dead_letter_count(tmp_path, "ticks") > 0
    assert dag.activeQueryToJobs().size() == before


def test_a_topology_runs_its_dead_letter_queries_at_the_trigger_it_is_given(spark: Any, tmp_path: Path) -> None:
    from topologies.options import TopologyOptions

    write_records(tmp_path, "booking", [Record(k, v) for k, v in BOOKINGS])
    _, unreadable = read_topic_checked(spark, tmp_path, "booking")

    def interval_ms(options: TopologyOptions, consumer: str) -> int:
        [query] = options.dead_letters(tmp_path, "booking", consumer, unreadable)
        try:
            return int(query._jsq.streamingQuery().trigger().intervalMs())
        finally:
            query.stop()

    assert interval_ms(TopologyOptions(namespace="dl-trigger", dead_letter_trigger="7 seconds"), "slow") == 7000
    assert interval_ms(TopologyOptions(namespace="dl-trigger"), "default") == 2000  # DEAD_LETTER_TRIGGER


JVM_PROBE = "riqr: the JVM's stderr is captured"


@contextlib.contextmanager
def _jvm_stderr(spark: Any, path: Path) -> Iterator[Path]:
    """What Spark's JVM writes to its stderr meanwhile (log4j's lines, an uncaught exception's trace) goes to
    ``path`` as well as nowhere else: the JVM's own stderr is not the test's, so ``capfd`` never sees it.
    (riqr's log4j console appender follows ``System.setErr``.)"""
    system = spark._jvm.java.lang.System
    before = system.err
    stream = spark._jvm.java.io.PrintStream(spark._jvm.java.io.FileOutputStream(str(path)), True)
    system.setErr(stream)
    try:
        # Proof that log4j's lines land there (the probe is left out of the tests' noise).
        spark._jvm.org.apache.logging.log4j.LogManager.getLogger("riqr.test").error(JVM_PROBE)
        assert JVM_PROBE in path.read_text(), "log4j did not follow System.setErr"
        yield path
    finally:
        system.setErr(before)
        stream.close()


def _slow_dead_letter_batch(spark: Any, home: Path, count: int) -> Any:
    """A dead-letter query whose first batch (``count`` malformed lines) is running its Spark job inside its
    ``foreachBatch`` function when this returns: each rejected record takes 0.2 s through a Python UDF,
    so the job runs for ``count`` / 5 seconds."""
    from pyspark.sql import functions as F

    from topologies.inflight import IN_FLIGHT

    @F.udf("string")  # type: ignore[misc]
    def slowly(record):  # type: ignore[no-untyped-def]  # (hints would make Spark try a pandas UDF)
        import time

        time.sleep(0.2)
        return record

    _landing_lines(home, "booking", [f"not json {i}" for i in range(count)])
    _, unreadable = read_topic_checked(spark, home, "booking")
    bad = unreadable.withColumn("record", slowly("record"))
    query = write_dead_letters(bad, home, "booking", home / "cp", consumer="bookings")
    try:
        jobs = spark.sparkContext.statusTracker()
        wait_for(lambda: IN_FLIGHT.inside(query.name) and jobs.getActiveJobsIds(), timeout=120, interval=0.005,
                 what="the batch's job running in its function")  # fmt: skip
    except BaseException:
        query.stop()
        raise
    return query


def test_a_dead_letter_query_stopped_during_its_batch_lets_the_batch_end(
    spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A stop (SIGTERM to a topology, Ctrl-C to the demo) that comes while a batch runs inside its
    ``foreachBatch`` function waits for it to end (``topologies.inflight``) instead of cancelling its job,
    which py4j and Spark logged as pages of errors: the batch is written whole and nothing is logged.
    (Each rejected record takes 0.2 s through a Python UDF here, so the batch's job runs for 2 s; a bare
    ``query.stop()`` at the same moment cancels it, and the letters are not written.)"""
    from topologies.inflight import stop_between_batches

    count = 10
    query = _slow_dead_letter_batch(spark, tmp_path, count)
    try:
        with _jvm_stderr(spark, tmp_path / "jvm-stderr.log") as jvm_err:
            assert stop_between_batches([query], timeout=60) == []  # none stopped in its batch
    finally:
        query.stop()
    assert not query.isActive and query.exception() is None
    assert dead_letter_count(tmp_path, "booking") == count  # the batch ran to its end
    out, err = capfd.readouterr()
    noise = re.compile(r"Traceback|CANCELLED|cancelled|py4j|Exception|ERROR")
    jvm_lines = [line for line in jvm_err.read_text().splitlines() if JVM_PROBE not in line]
    assert [line for line in (out + err).splitlines() + jvm_lines if noise.search(line)] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_dead_letter_query_stopped_past_its_grace_ends_the_cancelled_batch_quietly(
    spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The same slow batch, with a stop whose grace is shorter than its job: the stop cancels the job under
    the function, which ends as the stop's interruption (``topologies.inflight.ended_by_stop``). The query
    ends stopped rather than failed, that batch's letters are not written (it runs again at the next
    start), and neither py4j nor Spark logs an error or a traceback for it."""
    from topologies.inflight import stop_between_batches

    query = _slow_dead_letter_batch(spark, tmp_path, 10)
    try:
        with _jvm_stderr(spark, tmp_path / "jvm-stderr.log") as jvm_err:
            with caplog.at_level(logging.INFO, logger="topologies.inflight"):
                assert stop_between_batches([query], timeout=0.1) == [query.name]  # stopped in its batch
            wait_for(lambda: not query.isActive, timeout=30, what="the query ended")
    finally:
        query.stop()
    assert not query.isActive and query.exception() is None  # stopped, not failed
    assert dead_letter_count(tmp_path, "booking") == 0  # the batch was cancelled
    assert "ended as the stop's interruption" in caplog.text, caplog.text
    out, err = capfd.readouterr()
    noise = re.compile(r"Traceback|CANCELLED|cancelled|py4j|Exception|ERROR")
    jvm_lines = [line for line in jvm_err.read_text().splitlines() if JVM_PROBE not in line]
    assert [line for line in (out + err).splitlines() + jvm_lines if noise.search(line)] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_landing_file_older_than_a_week_before_the_newest_is_read(spark: Any, tmp_path: Path) -> None:
    """Spark's file source skipped, after its first batch, a file whose time is over 7 days before the
    newest one's (its maxFileAge): a landing file copied with its time kept was never read, silently."""
    import os
    import time

    from topologies.sources import read_topic

    home = tmp_path
    write_records(home, "aged", [Record("fresh", "1")])
    query = (
        read_topic(spark, home, "aged")
        .writeStream.format("memory")
        .queryName("aged_landing")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        copied = write_records(home, "aged", [Record("copied", "2")])
        assert copied is not None
        month_ago = time.time() - 30 * 86_400
        os.utime(copied, (month_ago, month_ago))  # as cp -p of last month's file would leave it
        write_records(home, "aged", [Record("later", "3")])
        query.processAllAvailable()
        keys = sorted(r["key"] for r in spark.sql("select key from aged_landing").collect())
        assert keys == ["copied", "fresh", "later"]
    finally:
        query.stop()
