"""Seed 002: events aggregated per key into a store.

Events arrive on topic ``event`` (key, value). Store ``event-aggregates`` (kv) holds, per key, how many
events it had and the value of its latest one, as a map ``{"events": n, "latest": value}``:

    curl localhost:7400/stores/event-aggregates/get/sensor-1    # {"response":{"events":3,"latest":"21.5"}}

    ray job submit --working-dir . -- python -m topologies.events --namespace riqr
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from topologies.sources import FILES, SourceConfig

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


def start(
    spark: Any,
    home: Path,
    *,
    namespace: str,
    partitions: int = 4,
    actors: int = 2,
    trigger: str | None = None,
    source: SourceConfig = FILES,
) -> list[Any]:
    from topologies.food_orders import checkpoint_for
    from topologies.sink import DEFAULT_TRIGGER, materialize
    from topologies.sources import read_topic

    return [
        materialize(
            aggregate_events(read_topic(spark, home, "event", source)),
            store=EVENT_AGGREGATES_STORE,
            key="key",
            value=["events", "latest"],
            checkpoint=str(checkpoint_for(home, namespace, EVENT_AGGREGATES_STORE)),
            namespace=namespace,
            partitions=partitions,
            actors=actors,
            trigger=trigger or DEFAULT_TRIGGER,
        )
    ]


def main(argv: list[str] | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog="python -m topologies.events", description=__doc__.splitlines()[0])
    return run_topology(parser, argv, lambda spark, home, args: start(spark, home, **args.topology))


if __name__ == "__main__":
    sys.exit(main())
