"""The food-orders topology of seed 000, as a PySpark Structured Streaming job.

Sources are two topics: ``customer`` (key user id, value name), read as a table, and ``order`` (key user
id, value food), a stream. Stores:

* ``customer-v1-changelog``: the latest name per user id (a KTable);
* ``order-count``: orders left-joined with customers, grouped by key and counted.

The transforms are pure DataFrame functions (tested on small frames); ``start`` wires them to sources
and to ``materialize``. Run it as a Ray job against a runtime started by ``riqr up``:

    ray job submit --working-dir . -- python -m topologies.food_orders --namespace riqr

or embedded, as ``riqr demo`` does.

About the join: Kafka Streams joins each order with the customer table *as of that order*. Spark has no
stream-to-changing-table join without watermarks, so the customer side here is a static snapshot of the
customer topic taken when the query plans. The left join keeps every order exactly once (customer keys
are unique after ``latest_by_key``), so ``order-count`` is exact whatever the snapshot holds.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from topologies.options import DEFAULTS, TopologyOptions

__all__ = [
    "CUSTOMER_STORE",
    "ORDER_COUNT_STORE",
    "latest_by_key",
    "order_counts",
    "order_counts_frame",
    "start",
    "start_stores",
    "store_frames",
    "start_customers",
    "start_order_counts",
    "main",
]

log = logging.getLogger(__name__)

CUSTOMER_STORE = "customer-v1-changelog"
ORDER_COUNT_STORE = "order-count"


def latest_by_key(records: Any) -> Any:
    """The latest value per key (by ``ts`` then ``seq``); a null latest value means the key is deleted.

    Records with a null key are dropped, as Kafka Streams drops them.
    """
    from pyspark.sql import functions as F

    return (
        records.where(F.col("key").isNotNull())
        .groupBy("key")
        .agg(F.max_by("value", F.struct("ts", "seq")).alias("value"))
    )


def order_counts(orders: Any, customers: Any) -> Any:
    """Orders left-joined with customers (latest name per key), grouped by key, counted. An order with a
    null key or a null value (a Kafka tombstone, ``"value": null``) is not an order: Kafka Streams' join and
    ``count`` skip such records, and so does this."""
    from pyspark.sql import functions as F

    enriched = (
        orders.where(F.col("key").isNotNull() & F.col("value").isNotNull())
        .select("key", F.col("value").alias("food"))
        .join(customers.select("key", F.col("value").alias("customer")), on="key", how="left")
    )
    return enriched.groupBy("key").agg(F.count(F.lit(1)).alias("count"))


def _customers(spark: Any, home: Path, options: TopologyOptions) -> tuple[Any, dict[str, Any], Callable[[], list[Any]]]:
    """``(frame, materialize's options, start its dead-letter query)`` of ``customer-v1-changelog``."""
    records, rejects = options.read(spark, home, "customer")
    sink = {"store": CUSTOMER_STORE, "key": "key", "value": "value", **options.sink(home, CUSTOMER_STORE)}
    return latest_by_key(records), sink, lambda: options.dead_letters(home, "customer", CUSTOMER_STORE, rejects)


def order_counts_frame(spark: Any, home: Path, options: TopologyOptions) -> tuple[Any, Any | None]:
    """``(counts, rejects)``: the streaming DataFrame ``order-count`` is fed from, and the order topic's
    dead letters (``bench/ingest.py`` runs the same frame into Spark's noop sink as its baseline).

    The customer snapshot is not cached: a stream-static join runs the static side's plan again in every
    micro-batch, but caching it measured no faster per micro-batch (docs/design.md, "Ingest").
    """
    from topologies.sources import read_topic_batch

    snapshot = latest_by_key(read_topic_batch(spark, home, "customer", options.source))
    orders, rejects = options.read(spark, home, "order")
    return order_counts(orders, snapshot), rejects


def _order_counts(
    spark: Any, home: Path, options: TopologyOptions
) -> tuple[Any, dict[str, Any], Callable[[], list[Any]]]:
    """As ``_customers``, for ``order-count``."""
    counts, rejects = order_counts_frame(spark, home, options)
    sink = {"store": ORDER_COUNT_STORE, "key": "key", "value": "count", **options.sink(home, ORDER_COUNT_STORE)}
    return counts, sink, lambda: options.dead_letters(home, "order", ORDER_COUNT_STORE, rejects)


def start_customers(spark: Any, home: Path, options: TopologyOptions) -> Any:
    """The query feeding ``customer-v1-changelog``.

    Its dead-letter query runs alongside until the Spark session stops; starting this again reuses it.
    """
    from topologies.sink import materialize

    frame, sink, dead_letters = _customers(spark, home, options)
    query = materialize(frame, **sink)
    dead_letters()
    return query


def start_order_counts(spark: Any, home: Path, options: TopologyOptions) -> Any:
    """The query feeding ``order-count`` (its dead-letter query as for ``start_customers``)."""
    from topologies.sink import materialize

    frame, sink, dead_letters = _order_counts(spark, home, options)
    query = materialize(frame, **sink)
    dead_letters()
    return query


StoreFrames = tuple[list[tuple[Any, dict[str, Any]]], Callable[[], list[Any]]]


def store_frames(spark: Any, home: Path, options: TopologyOptions = DEFAULTS) -> StoreFrames:
    """The two stores' streaming DataFrames with ``materialize``'s options for each (customer store
    first), and a function that starts their dead-letter queries. Spark only, no Ray: ``riqr demo``
    builds them (Spark analyses every frame as it is made) while the verticles start."""
    customers, customer_sink, customer_rejects = _customers(spark, home, options)
    counts, counts_sink, order_rejects = _order_counts(spark, home, options)
    return [(customers, customer_sink), (counts, counts_sink)], lambda: [*customer_rejects(), *order_rejects()]


def start_stores(
    spark: Any, home: Path, options: TopologyOptions = DEFAULTS, frames: StoreFrames | None = None
) -> tuple[list[Any], Callable[[], list[Any]]]:
    """Start the two queries feeding the stores (customer store first), from ``frames`` when given
    (``store_frames``); returns them, and a function that starts their dead-letter queries and returns
    those.

    ``riqr demo`` starts the dead-letter queries once the stores hold the seed: their first batches
    would compete with the stores' for the CPU, and they only matter once a malformed record comes.
    """
    from topologies.sink import materialize_all

    pairs, dead_letters = frames if frames is not None else store_frames(spark, home, options)
    # Both stores' query actors in one round, before either query starts (docs/benchmarks.md).
    return materialize_all(pairs), dead_letters


def start(spark: Any, home: Path, options: TopologyOptions = DEFAULTS) -> list[Any]:
    """Start the two streaming queries; returns them (customer store first), then their dead-letter queries."""
    queries, dead_letters = start_stores(spark, home, options)
    return [*queries, *dead_letters()]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the topology until stopped (SIGTERM or SIGINT stop the queries cleanly)."""
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(
        prog=prog or "python -m topologies.food_orders", description=__doc__.splitlines()[0]
    )
    return run_topology(parser, argv, start)


if __name__ == "__main__":
    sys.exit(main())
