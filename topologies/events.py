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
    from topologies.sink import materialize
    from topologies.sources import read_topic

    aggregates = aggregate_events(read_topic(spark, home, "event", options.source))
    sink = options.sink(home, EVENT_AGGREGATES_STORE)
    return [materialize(aggregates, store=EVENT_AGGREGATES_STORE, key="key", value=["events", "latest"], **sink)]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog=prog or "python -m topologies.events", description=__doc__.splitlines()[0])
    return run_topology(parser, argv, start)


if __name__ == "__main__":
    sys.exit(main())
