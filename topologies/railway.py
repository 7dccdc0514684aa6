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
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.options import DEFAULTS, TopologyOptions

__all__ = ["LATEST_BOOKING_STORE", "BOOKINGS_STORE", "parse_bookings", "latest_booking", "start", "main"]

LATEST_BOOKING_STORE = "latest-booking"
BOOKINGS_STORE = "bookings"


def parse_bookings(records: Any) -> Any:
    """Booking records as columns customer, booked_at (timestamp), trip; unparsable ones are dropped."""
    from pyspark.sql import functions as F

    parts = F.split(F.col("value"), " ", 2)
    return (
        records.where(F.col("key").isNotNull())
        .select(
            F.col("key").alias("customer"),
            F.try_to_timestamp(parts.getItem(0)).alias("booked_at"),
            F.coalesce(parts.getItem(1), F.lit("")).alias("trip"),
        )
        .where(F.col("booked_at").isNotNull())
    )


def latest_booking(bookings: Any) -> Any:
    """The latest booking time per customer."""
    from pyspark.sql import functions as F

    return bookings.groupBy("customer").agg(F.max("booked_at").alias("latest"))


def start(spark: Any, home: Path, options: TopologyOptions = DEFAULTS) -> list[Any]:
    """Start both queries; returns them (latest-booking first)."""
    from topologies.sink import materialize
    from topologies.sources import read_topic

    def bookings() -> Any:
        return parse_bookings(read_topic(spark, home, "booking", options.source))

    latest = materialize(
        latest_booking(bookings()),
        store=LATEST_BOOKING_STORE,
        key="customer",
        value="latest",
        **options.sink(home, LATEST_BOOKING_STORE),
    )
    every = materialize(
        bookings(),
        store=BOOKINGS_STORE,
        key=["customer", "booked_at"],
        value="trip",
        **options.sink(home, BOOKINGS_STORE),
    )
    return [latest, every]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog=prog or "python -m topologies.railway", description=__doc__.splitlines()[0])
    return run_topology(parser, argv, start)


if __name__ == "__main__":
    sys.exit(main())
