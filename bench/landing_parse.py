"""Benchmark: what parsing landing lines costs, riqr's way against Spark's JSON source, paired.

    flock /tmp/riqr-ray-spark.lock .venv/bin/python -m bench.landing_parse [--records 1000000] [--rounds 3]

No Ray. ``--records`` records land as files of 100,000 (``riqr produce``'s format); each way reads them
in one static batch and runs the customer topology's aggregation (``latest_by_key``) into Spark's noop
sink, in alternating order after a warm-up, so every way sees the same data at the same moments of a
shared machine:

* ``json-source``: Spark's JSON source with the landing schema (what ``topologies.sources`` did before
  2026-11-28: a record without a ``value`` field read as a null value, which deleted its key);
* ``text+from_json``: the text source and ``from_json``, without the fields check (the cost of reading
  lines as text and parsing them in an expression);
* ``variant``: the JSON source parsing each line into one VARIANT (``singleVariantColumn``), fields and
  their presence read from it: exact too, but a malformed line loses its text;
* ``riqr``: ``topologies.sources.check_landing_records`` as topologies run it (``from_json`` and
  ``json_object_keys``: a record without a ``key`` or ``value`` field is a dead letter).

Printed: each way's seconds per round, medians, and the ratio of each median to ``json-source``'s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ingest import land


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from runtime.landing import topic_dir
    from topologies.food_orders import latest_by_key
    from topologies.sources import CORRUPT_COLUMN, LANDING_SCHEMA_DDL, check_landing_records, landing_lines
    from topologies.spark import spark_session

    home = Path(tempfile.mkdtemp(prefix="riqr-bench-parse-"))
    spark = spark_session(app_name="riqr-bench-landing-parse")
    try:
        land(home, "customer", args.records, "k")
        directory = str(topic_dir(home, "customer"))
        print(f"  landed {args.records:,} records", file=sys.stderr, flush=True)

        def json_source() -> Any:
            rows = (
                spark.read.schema(LANDING_SCHEMA_DDL)
                .option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
                .json(directory)
            )
            usable = F.col(CORRUPT_COLUMN).isNull() & F.col("ts").isNotNull() & F.col("seq").isNotNull()
            return rows.where(usable).select("key", "value", "ts", "seq")

        def text_from_json() -> Any:
            lines = spark.read.text(directory).withColumnRenamed("value", "_line")
            options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
            rows = lines.select(F.from_json("_line", LANDING_SCHEMA_DDL, options).alias("r")).select("r.*")
            usable = F.col(CORRUPT_COLUMN).isNull() & F.col("ts").isNotNull() & F.col("seq").isNotNull()
            return rows.where(usable).select("key", "value", "ts", "seq")

        def variant() -> Any:
            v = spark.read.option("singleVariantColumn", "v").json(directory)
            rows = v.select(
                F.expr("variant_get(v, '$.key', 'string')").alias("key"),
                F.expr("variant_get(v, '$.value', 'string')").alias("value"),
                F.expr("try_variant_get(v, '$.ts', 'bigint')").alias("ts"),
                F.expr("try_variant_get(v, '$.seq', 'bigint')").alias("seq"),
                F.expr("v:key IS NOT NULL AND v:value IS NOT NULL").alias("both"),
            )
            return rows.where(F.col("both") & F.col("ts").isNotNull() & F.col("seq").isNotNull()).select(
                "key", "value", "ts", "seq"
            )

        def riqr() -> Any:
            return check_landing_records(landing_lines(spark.read, Path(directory)))[0]

        ways: dict[str, Callable[[], Any]] = {
            "json-source": json_source,
            "text+from_json": text_from_json,
            "variant": variant,
            "riqr": riqr,
        }

        def run(make: Callable[[], Any]) -> float:
            started = time.perf_counter()
            latest_by_key(make()).write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        for make in ways.values():
            run(make)  # warm-up: the JVM's first plans of each
        times: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(args.rounds):
            order = list(ways.items()) if r % 2 == 0 else list(reversed(ways.items()))
            for name, make in order:
                times[name].append(run(make))
            print(f"  round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in ways), file=sys.stderr)
        base = statistics.median(times["json-source"])
        print(f"\nlanding parse: {args.records:,} records, latest_by_key into noop, medians of {args.rounds}")
        for name, values in times.items():
            median = statistics.median(values)
            rounds = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {name:<15} {median:6.2f} s  ratio {median / base:.3f}  (rounds {rounds})")
    finally:
        spark.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
