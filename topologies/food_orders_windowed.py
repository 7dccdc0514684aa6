"""Windowed and session variants of the seed-000 food orders, on event time (the record's ``ts``).

Stores:

* ``orders-per-minute`` (window store): orders per user per one-minute tumbling window;
* ``order-sessions`` (session store): orders per user per ordering session, a session closing after
  30 seconds without an order. Spark emits a session once the watermark passes its end (append mode, the
  only mode Spark allows for sessions), so a session appears in the store when it is over.

Both read the ``order`` topic; a record more than ``--watermark`` behind the newest is dropped once the
watermark has passed the end of the window (or session) it would fall in, and counted
(``riqr_late_rows_dropped_total``, ``topologies.lateness``).

    ray job submit --working-dir . -- python -m topologies.food_orders_windowed --namespace riqr
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.options import DEFAULTS, TopologyOptions

__all__ = [
    "ORDERS_PER_MINUTE_STORE",
    "ORDER_SESSIONS_STORE",
    "orders_per_window",
    "order_sessions",
    "materialize_sessions",
    "start",
    "main",
]

ORDERS_PER_MINUTE_STORE = "orders-per-minute"
ORDER_SESSIONS_STORE = "order-sessions"


def _with_event_time(orders: Any, watermark: str) -> Any:
    from pyspark.sql import functions as F

    return (
        orders.where(F.col("key").isNotNull() & F.col("value").isNotNull())  # not orders (``order_counts``)
        .withColumn("event_time", F.timestamp_millis("ts"))
        .withWatermark("event_time", watermark)
    )


def orders_per_window(orders: Any, *, duration: str = "1 minute", slide: str | None = None, watermark: str) -> Any:
    """Orders per user per window (tumbling, or hopping with ``slide``): columns key, window, orders."""
    from pyspark.sql import functions as F

    timed = _with_event_time(orders, watermark)
    window = F.window("event_time", duration, slide) if slide else F.window("event_time", duration)
    return timed.groupBy("key", window).agg(F.count(F.lit(1)).alias("orders"))


def order_sessions(orders: Any, *, gap: str = "30 seconds", watermark: str) -> Any:
    """Orders per user per session (closed after ``gap`` of silence): columns key, session_window, orders."""
    from pyspark.sql import functions as F

    timed = _with_event_time(orders, watermark)
    return timed.groupBy("key", F.session_window("event_time", gap)).agg(F.count(F.lit(1)).alias("orders"))


def start(spark: Any, home: Path, options: TopologyOptions = DEFAULTS, *, watermark: str = "10 seconds") -> list[Any]:
    """Start both queries; returns them (window store first), then their dead-letter queries. Both stores'
    feeds are taken before either query starts (``materialize_all``), and the dead-letter queries start
    after them."""
    from topologies.sink import materialize_all

    window_orders, window_rejects = options.read(spark, home, "order")
    session_orders, session_rejects = options.read(spark, home, "order")
    windows, sessions = materialize_all([
        (orders_per_window(window_orders, watermark=watermark),
         {"store": ORDERS_PER_MINUTE_STORE, "key": "key", "value": "orders", "kind": "window",
          **options.sink(home, ORDERS_PER_MINUTE_STORE)}),
        (order_sessions(session_orders, watermark=watermark), _sessions_sink(home, options)),
    ])  # fmt: skip
    dead_letters = [
        *options.dead_letters(home, "order", ORDERS_PER_MINUTE_STORE, window_rejects),
        *options.dead_letters(home, "order", ORDER_SESSIONS_STORE, session_rejects),
    ]
    return [windows, sessions, *dead_letters]


def _sessions_sink(home: Path, options: TopologyOptions) -> dict[str, Any]:
    """``materialize``'s options for ``order-sessions``."""
    return {"store": ORDER_SESSIONS_STORE, "key": "key", "value": "orders", "kind": "session",
            **options.sink(home, ORDER_SESSIONS_STORE)}  # fmt: skip


def materialize_sessions(orders: Any, home: Path, options: TopologyOptions, *, watermark: str) -> Any:
    """Start the query feeding ``order-sessions`` from the parsed ``orders``; returns it."""
    from topologies.sink import materialize

    return materialize(order_sessions(orders, watermark=watermark), **_sessions_sink(home, options))


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(
        prog=prog or "python -m topologies.food_orders_windowed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--watermark", default="10 seconds", help="how late an order may arrive")
    return run_topology(parser, argv, start, lambda args: {"watermark": args.watermark})


if __name__ == "__main__":
    sys.exit(main())
