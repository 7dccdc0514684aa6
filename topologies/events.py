"""Seed 002: events aggregated per key into a store.

Events arrive on topic ``event`` (key, value). Store ``event-aggregates`` (kv) holds, per key, how many
events it had and the value of its latest one, as a map ``{"events": n, "latest": value}``:

    curl localhost:7400/stores/event-aggregates/get/sensor-1    # {"response":{"events":3,"latest":"21.5"}}

    ray job submit --working-dir . -- python -m topologies.events --namespace riqr
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.options import DEFAULTS, TopologyOptions

__all__ = ["EVENT_AGGREGATES_STORE", "aggregate_events", "start", "main"]

EVENT_AGGREGATES_STORE = "event-aggregates"


def aggregate_events(events: Any) -> Any:
    """Per key: the number of events and the latest value (by ``ts``, then ``seq``)."""
    from pyspark.sql import functions as F

    return (
        events.where(F.col("key").isNotNull())
        .groupBy("key")
        .agg(F.count(F.lit(1)).alias("events"), F.max_by("value", F.struct("ts", "seq")).alias("latest"))
    )


def start(spark: Any, home: Path, options: TopologyOptions = DEFAULTS) -> list[Any]:
    """Start the query, then its dead-letter query (for malformed landing lines)."""
    from topologies.sink import materialize

    events, rejects = options.read(spark, home, "event")
    aggregates = aggregate_events(events)
    sink = options.sink(home, EVENT_AGGREGATES_STORE)
    query = materialize(aggregates, store=EVENT_AGGREGATES_STORE, key="key", value=["events", "latest"], **sink)
    return [query, *options.dead_letters(home, "event", EVENT_AGGREGATES_STORE, rejects)]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog=prog or "python -m topologies.events", description=__doc__.splitlines()[0])
    return run_topology(parser, argv, start)


if __name__ == "__main__":
    sys.exit(main())
