"""Benchmark: what Spark itself costs per micro-batch of the order-count query, under settings to compare.

    .venv/bin/python -m bench.spark_batch [--batches 15] [--configs default,partitions2,...] [--load 10000]

No Ray, no riqr sink: the order-count query of food-orders (orders left-joined with the customer snapshot,
counted by key, with its dead-letter query, as the topology runs it) into Spark's ``noop`` sink at the
default trigger, fed one small file at a time (the idle case of freshness): one file, wait for the batch
that read it, pause, again. Each configuration starts a new query on a new checkpoint in the same Spark
session (SQL settings are read when a query starts; ``spark.sql.shuffle.partitions`` is fixed in a new
checkpoint). Printed per configuration: Spark's own durations (``durationMs``) per micro-batch with input,
medians, and the median from writing the file to the batch's progress event.

Freshness at the default trigger is about one trigger interval's wait plus this batch time (plus the
sink's delivery), so this says which settings can bring it down, without the sink in the way.

``stateless`` is not a setting but another shape of the same work, the one Kafka Streams has (the count
kept by the store, not by Spark): one query with no state of Spark's, reading the raw landing lines, whose
``foreachBatch`` splits off the dead letters, joins and counts the batch's orders per key, and collects both
(one job, a union), as a sink that adds each batch's counts to the store's would. It has no dead-letter
query beside it and no state store (docs/benchmarks.md, "Thirteenth pass").

With ``--load R``, ``R`` records/s of other keys land beside the probes (``bench/ingest.py``'s writer: a
file of ``R/10`` records every 100 ms), the loaded case of freshness: the durations are then the medians
of every batch that ended while the probes ran, and written -> progress is not printed (a probe's file
can land after the listing of the batch that ends next).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.ingest import Writer
from runtime.landing import Record, write_records

# Settings applied with spark.conf.set before the query starts (and reset after).
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "partitions2": {"spark.sql.shuffle.partitions": "2"},
    "partitions1": {"spark.sql.shuffle.partitions": "1"},
    "nocodegen": {"spark.sql.codegen.wholeStage": "false"},
    "rocksdb-state": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
    "no-dead-letters": {},
    "stateless": {},
    "broadcast": {"spark.sql.autoBroadcastJoinThreshold": "104857600"},
    # Checkpoint and state files through Hadoop's raw local file system: no .crc file beside each.
    "rawlocal": {
        "fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
        "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    },
}

# The ``stateless`` shape's time to build each batch's plan in Python (seconds), for the run going on.
PLANNED: list[float] = []


def say(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def run(spark: Any, work: Path, name: str, config: str, batches: int, trigger: str, load: int = 0) -> dict[str, float]:
    from pyspark.sql.streaming import StreamingQueryListener

    from topologies.food_orders import order_counts_frame
    from topologies.inflight import stop_between_batches
    from topologies.options import TopologyOptions

    home = work / f"home-{name}"
    write_records(home, "customer", [Record(str(i), f"name{i}") for i in range(7)])
    write_records(home, "order", [Record("warm", "soup")])
    ended: list[tuple[float, dict[str, int]]] = []
    cond = threading.Condition()

    class Listener(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            p = event.progress
            if p.name == f"sb-{name}" and p.numInputRows > 0:
                with cond:
                    ended.append((time.monotonic(), dict(p.durationMs)))
                    cond.notify_all()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    conf = CONFIGS[config]
    previous = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        options = TopologyOptions(trigger=trigger)
        if config == "stateless":
            writer = stateless_counts(spark, home, f"sb-{name}")
        else:
            counts, rejects = order_counts_frame(spark, home, options)
            if config != "no-dead-letters":
                options.dead_letters(home, "order", f"sb-{name}-order-count", rejects)
            writer = counts.writeStream.format("noop").outputMode("update")
        query = (
            writer.queryName(f"sb-{name}")
            .option("checkpointLocation", str(work / f"cp-{name}"))
            .trigger(processingTime=trigger)
            .start()
        )
        query.processAllAvailable()
        time.sleep(1.0)  # progress events reach the listener asynchronously: let the start-up batch's land
        with cond:
            ended.clear()
        PLANNED.clear()  # the batches the probes see, as ``ended``
        lags = []
        with Writer(home, load):
            for i in range(batches):
                with cond:
                    seen = len(ended)
                written = time.monotonic()
                write_records(home, "order", [Record(f"probe{i}", "soup")])
                with cond:
                    if not cond.wait_for(lambda seen=seen: len(ended) > seen, timeout=60):  # type: ignore[misc]
                        raise SystemExit(f"{name}: no batch after 60 s")
                    lags.append(ended[seen][0] - written)
                time.sleep(0.13 + 0.05 * (i % 5))
        stop_between_batches(spark.streams.active)
    finally:
        spark.streams.removeListener(listener)
        for k, v in previous.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    stages = sorted({k for _, d in ended for k in d})
    out = {k: float(statistics.median(d.get(k, 0) for _, d in ended)) for k in stages}
    out["written->progress"] = float("nan") if load else statistics.median(lags) * 1000
    if PLANNED:
        out["planInPython"] = statistics.median(PLANNED) * 1000
    return out


def stateless_counts(spark: Any, home: Path, name: str) -> Any:
    """The ``stateless`` shape: the order topic's raw lines, each batch split, joined, counted and
    collected in ``foreachBatch`` (the time to build that batch's plan, the customer snapshot's reader
    and its listing included, goes to ``PLANNED``)."""
    from pyspark.sql import functions as F

    from runtime.landing import topic_dir
    from topologies.food_orders import latest_by_key, order_counts
    from topologies.inflight import IN_FLIGHT
    from topologies.sources import CORRUPT_COLUMN, LANDING_SCHEMA_DDL, check_landing_records, read_topic_batch

    raw = (
        spark.readStream.schema(LANDING_SCHEMA_DDL)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .json(str(topic_dir(home, "order")))
    )

    def count_batch(batch: Any, batch_id: int) -> None:
        with IN_FLIGHT.batch(name, jvm=lambda: spark._jvm):  # stopped between batches, as the sink is
            began = time.monotonic()
            good, bad = check_landing_records(batch)
            snapshot = latest_by_key(read_topic_batch(spark, home, "customer"))
            counts = order_counts(good, snapshot).select("key", "count", F.lit(None).cast("string").alias("letter"))
            letters = bad.select(
                F.lit(None).cast("string").alias("key"),
                F.lit(None).cast("long").alias("count"),
                F.to_json(F.struct("reason", "record")).alias("letter"),
            )
            both = counts.unionByName(letters)
            PLANNED.append(time.monotonic() - began)
            both.toArrow()

    return raw.writeStream.foreachBatch(count_batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--trigger", default="250 milliseconds")
    parser.add_argument("--rounds", type=int, default=1, help="run the configurations in turn this many times")
    parser.add_argument("--warmup", type=int, default=5, help="batches of an uncounted first run (JVM warm-up)")
    parser.add_argument("--load", type=int, default=0, help="records/s of other keys landing beside the probes")
    args = parser.parse_args()
    from topologies.spark import spark_session

    work = Path(tempfile.mkdtemp(prefix="riqr-bench-spark-"))
    spark = spark_session()
    results: dict[str, list[dict[str, float]]] = {}
    try:
        names = [c for c in args.configs.split(",") if c]
        if args.warmup:  # the JVM's first query runs each batch much slower: not counted
            say("warm-up: " + str(run(spark, work, "warmup", "default", args.warmup, args.trigger)))
        for r in range(args.rounds):
            for name in names:
                tag = f"{name}-{r}"
                results.setdefault(name, []).append(run(spark, work, tag, name, args.batches, args.trigger, args.load))
                say(f"{tag}: " + ", ".join(f"{k} {v:.0f}" for k, v in results[name][-1].items()))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    keys = ["triggerExecution", "addBatch", "latestOffset", "queryPlanning", "walCommit", "commitOffsets"]
    keys += ["planInPython"] if any("planInPython" in r for runs in results.values() for r in runs) else []
    load = f", {args.load} records/s beside" if args.load else ""
    print(
        "\nSpark per micro-batch of order-count into noop (stateless: its foreachBatch), medians of the "
        f"batches that ended while {args.batches} probes ran (ms), {args.trigger}{load}"
    )
    print(f"{'config':<18}" + "".join(f"{k:>18}" for k in [*keys, "written->progress"]))
    for name, runs in results.items():
        row = [
            statistics.median(r[k] for r in runs) if all(k in r for r in runs) else None
            for k in [*keys, "written->progress"]
        ]
        print(f"{name:<18}" + "".join(f"{'-':>18}" if v is None else f"{v:>18.0f}" for v in row))


if __name__ == "__main__":
    main()
