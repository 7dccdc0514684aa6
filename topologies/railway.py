"""Seed 004: queryable railway bookings.

Every booking is a record on topic ``booking``: key the customer id, value
``<booked-at ISO-8601> <trip>`` (for example ``2026-03-01T09:30:00Z Berlin-Hamburg``). Stores:

* ``latest-booking`` (kv): the time of each customer's latest booking, as in the seed's KTable;
* ``bookings`` (kv, composite key customer id + booking time): every booking, so "all bookings of a
  customer in a period" is one range over the key's leading part, answered by the one partition that
  holds the customer:

      curl 'localhost:7400/stores/bookings/range?from=42/2026-03-01T00:00:00Z&to=42/2026-04-01T00:00:00Z'
      curl 'localhost:7400/stores/bookings/range?from=42&to=42'          # every booking of customer 42

    ray job submit --working-dir . -- python -m topologies.railway --namespace riqr

A booking without a customer (null key), with a time that does not parse, has no time of day (a date
alone) or lies outside 0001-01-01 to 9999-12-30, or without a trip is not stored: it goes, with the reason, to the
dead letters of topic ``booking`` (``topologies.deadletter``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.options import DEFAULTS, TopologyOptions

__all__ = [
    "LATEST_BOOKING_STORE",
    "BOOKINGS_STORE",
    "split_bookings",
    "parse_bookings",
    "latest_booking",
    "start",
    "main",
]

LATEST_BOOKING_STORE = "latest-booking"
BOOKINGS_STORE = "bookings"


def split_bookings(records: Any) -> tuple[Any, Any]:
    """``(bookings, rejects)``: bookings as columns customer, booked_at (timestamp), trip; rejects as dead letters.

    Parsing is null-safe (``try_element_at``, ``try_to_timestamp``): under Spark's ANSI mode a plain
    index past the end of the split, or a strict timestamp cast, would fail the whole query.
    """
    from pyspark.sql import functions as F

    from topologies.deadletter import record_json, split_valid
    from topologies.sources import MAX_TS, MIN_TS

    parts = F.split(F.col("value"), " ", 2)
    when = F.try_element_at(parts, F.lit(1))
    parsed = records.select(
        "*",
        F.try_to_timestamp(when).alias("booked_at"),
        F.try_element_at(parts, F.lit(2)).alias("trip"),
    )
    # A date alone ("2026-03-01 09:30 Berlin", a space for the T) parses as midnight, the clock time going
    # into the trip: two bookings of a day became one key. A time alone parses as today. Both refused.
    timed = when.rlike(r"^[+-]?[0-9]{4,}-[0-9]{1,2}-[0-9]{1,2}T[0-9]")  # a date, then T and a time
    # Spark parses years of up to six digits; Python (the store's reads) holds 1 to 9999 only.
    in_range = F.col("booked_at").between(F.timestamp_millis(F.lit(MIN_TS)), F.timestamp_millis(F.lit(MAX_TS)))
    valid = (
        F.col("key").isNotNull()
        & F.col("booked_at").isNotNull()
        & timed
        & in_range
        & F.col("trip").isNotNull()
        & (F.trim(F.col("trip")) != "")
    )
    reason = (
        F.when(F.col("key").isNull(), F.lit("booking without a customer (null key)"))
        .when(F.col("value").isNull(), F.lit("booking without a value"))
        .when(F.col("booked_at").isNull(), F.lit("booking time does not parse"))
        .when(~timed, F.lit("booking time without a time of day (write it as 2026-03-01T09:30:00Z)"))
        .when(~in_range, F.lit("booking time out of range (0001-01-01 to 9999-12-30)"))
        .otherwise(F.lit("booking without a trip"))
    )
    original = record_json(*records.columns)
    good, bad = split_valid(parsed, valid, reason, record=original)
    return good.select(F.col("key").alias("customer"), "booked_at", "trip"), bad


def parse_bookings(records: Any) -> Any:
    """The bookings of ``split_bookings``, rejects left out."""
    return split_bookings(records)[0]


def latest_booking(bookings: Any) -> Any:
    """The latest booking time per customer."""
    from pyspark.sql import functions as F

    return bookings.groupBy("customer").agg(F.max("booked_at").alias("latest"))


def start(spark: Any, home: Path, options: TopologyOptions = DEFAULTS) -> list[Any]:
    """Start both queries; returns them (latest-booking first), then their dead-letter queries. Both
    stores' feeds are taken before either query starts (``materialize_all``), and the dead-letter queries
    start after them."""
    from topologies.sink import materialize_all

    def bookings() -> tuple[Any, tuple[Any, Any]]:
        # Each store's query reads the topic itself, so each sends what it rejects to the dead letters.
        records, unreadable = options.read(spark, home, "booking")
        good, unparsable = split_bookings(records)
        return good, (unreadable, unparsable)

    latest_bookings, latest_rejects = bookings()
    every_booking, every_rejects = bookings()
    latest_sink = {"store": LATEST_BOOKING_STORE, "key": "customer", "value": "latest",
                   **options.sink(home, LATEST_BOOKING_STORE)}  # fmt: skip
    every_sink = {"store": BOOKINGS_STORE, "key": ["customer", "booked_at"], "value": "trip",
                  **options.sink(home, BOOKINGS_STORE)}  # fmt: skip
    latest, every = materialize_all([(latest_booking(latest_bookings), latest_sink), (every_booking, every_sink)])
    dead_letters = [
        *options.dead_letters(home, "booking", LATEST_BOOKING_STORE, *latest_rejects),
        *options.dead_letters(home, "booking", BOOKINGS_STORE, *every_rejects),
    ]
    return [latest, every, *dead_letters]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog=prog or "python -m topologies.railway", description=__doc__.splitlines()[0])
    return run_topology(parser, argv, start)


if __name__ == "__main__":
    sys.exit(main())
