"""Benchmark: a query actor's apply of one micro-batch, in process (no Ray, no Spark).

    .venv/bin/python -m bench.apply_batch [--rows 500000] [--repeat 3]

The part of the sink's cost that runs in the query actors: an Arrow batch of ``--rows`` string keys and
values split into 4 partitions; the 2 partitions one actor holds are applied to rocksdb partitions
(synced writes, as deployed), first into empty partitions (a new store, or a rebuild's batch 0), then
the same keys again into full ones (every key's old presence is read to keep the count). Prints the
best of ``--repeat`` for each step: converting a slice to rows (Python keys, as the memory engine takes
them), encoding it from Arrow (encoded keys and packed values, as the rocksdb engine takes them), and
the whole apply.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from runtime.batchrows import BatchRows
from runtime.catalog import StoreSpec, ValueField
from runtime.ingest import PARTITION_COLUMN, split_by_partition
from runtime.keys import KeySchema
from runtime.partitioner import partition_of
from runtime.query import QueryCore, rows_from_arrow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--order",
        choices=("hash", "key"),
        default="hash",
        help="the batch's row order: Spark's hash order (hash aggregations), or key order (sort-based ones)",
    )
    args = parser.parse_args()
    spec = StoreSpec("b", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=4, actors=2)
    keys = sorted(f"k{i}" for i in range(args.rows))
    if args.order == "hash":
        random.Random(7).shuffle(keys)  # Spark hands a hash aggregation's batch over in its hash order
    table = pa.table(
        {
            "key": keys,
            "value": [f"v{i}" for i in range(args.rows)],
            PARTITION_COLUMN: pa.array([partition_of(spec.key.type, k, 4) for k in keys], pa.int32()),
        }
    )
    split = split_by_partition(table, 4)
    mine = {0: split[0], 2: split[2]}
    rows = sum(t.num_rows for t in mine.values())
    best: dict[str, float] = {}

    def timed(name: str, start: float) -> None:
        best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)

    for _ in range(args.repeat):
        started = time.perf_counter()
        rows_from_arrow(spec, mine[0])
        rows_from_arrow(spec, mine[2])
        timed("convert", started)
        started = time.perf_counter()
        for table in mine.values():
            BatchRows(spec, table).encoded()
        timed("encode from Arrow", started)
        directory = Path(tempfile.mkdtemp(prefix="riqr-apply-"))
        try:
            core = QueryCore(spec, [0, 2], directory=directory)
            core.begin("s")
            started = time.perf_counter()
            core.apply("s", 0, mine)
            timed("apply into empty", started)
            started = time.perf_counter()
            core.apply("s", 1, mine)
            timed("apply into full", started)
            core.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    print(
        f"one actor's share of a {args.rows:,}-row batch in {args.order} order: {rows:,} rows, 2 rocksdb "
        f"partitions, best of {args.repeat}"
    )
    for name, seconds in best.items():
        print(f"{name:<18}{seconds:>8.3f} s{rows / seconds:>12,.0f} rows/s")


if __name__ == "__main__":
    main()
