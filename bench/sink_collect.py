"""Benchmark: what collecting a micro-batch to the driver as Arrow costs, against Spark's noop write of
the same micro-batch, paired.

    flock /tmp/riqr-ray-spark.lock .venv/bin/python -m bench.sink_collect [--records 1000000] [--rounds 3]

No Ray. ``--records`` records with distinct keys land as files of 100,000; the customer topology's query
(``latest_by_key``, with the sink's partition column) runs into ``foreachBatch``, where the one
micro-batch is computed several ways in turn, twice, in alternating order: ``noop`` (written to Spark's
noop sink, what ``bench/ingest.py``'s baseline pays), ``arrow`` (``toArrow``, what riqr's sink pays before
it splits), and ``arrow-1batch`` (``toArrow`` with ``spark.sql.execution.arrow.maxRecordsPerBatch`` 0,
one Arrow batch per task). Each is a full run of the batch's plan (the state store reloads its version),
so the difference between them is the collection alone, measured on the same data at the same moment
of a shared machine. Printed: wall and the driver JVM's CPU seconds, medians over the rounds after the
first (a warm-up).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ingest import land

WAYS = ("noop", "arrow", "arrow-1batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="micro-batches (new checkpoints); the first is a warm-up")
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()

    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import STRING
    from runtime.partitioner import spark_partition_sql
    from topologies.food_orders import latest_by_key
    from topologies.sources import read_topic
    from topologies.spark import spark_session

    work = Path(tempfile.mkdtemp(prefix="riqr-bench-collect-"))
    try:
        land(work / "bulk", "customer", args.records, "k")
        spark = spark_session(conf={"spark.driver.memory": args.driver_memory})
        jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
        tick = os.sysconf("SC_CLK_TCK")

        def jvm_cpu() -> float:
            fields = Path(f"/proc/{jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        wall: dict[str, list[float]] = {w: [] for w in WAYS}
        cpu: dict[str, list[float]] = {w: [] for w in WAYS}

        def compute(way: str, batch: Any) -> None:
            unlimited = way == "arrow-1batch"
            batch.sparkSession.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "0" if unlimited else "10000")
            if way == "noop":
                batch.write.format("noop").mode("overwrite").save()
            else:
                batch.toArrow()

        def each_way(batch: Any, batch_id: int) -> None:
            for turn in range(2):
                for way in WAYS if turn == 0 else WAYS[::-1]:
                    c, t = jvm_cpu(), time.perf_counter()
                    compute(way, batch)
                    wall[way].append(time.perf_counter() - t)
                    cpu[way].append(jvm_cpu() - c)

        partition = spark_partition_sql(STRING, "key", 4)
        for r in range(args.rounds):
            df = latest_by_key(read_topic(spark, work / "bulk", "customer"))
            df = df.selectExpr("key", "value", f"{partition} AS {PARTITION_COLUMN}")
            query = (
                df.writeStream.outputMode("update")
                .option("checkpointLocation", str(work / f"cp-{r}"))
                .foreachBatch(each_way)
                .start()
            )
            query.processAllAvailable()
            query.stop()
            print(f"  round {r + 1}: " + ", ".join(f"{w} {wall[w][-2]:.2f}/{wall[w][-1]:.2f}s" for w in WAYS),
                  file=sys.stderr, flush=True)  # fmt: skip
        print(f"\none micro-batch of {args.records:,} records, each way twice per round, rounds 2-{args.rounds}")
        print(f"{'way':<14}{'wall p50':>10}{'JVM cpu p50':>13}")
        for w in WAYS:
            print(f"{w:<14}{statistics.median(wall[w][2:]):>9.2f}s{statistics.median(cpu[w][2:]):>12.2f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
