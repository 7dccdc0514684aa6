"""Benchmark: state larger than memory on the rocksdb engine: load ``--keys`` keys (50 million by default)
into one store through its query actor, and sample the actor's memory as the key count grows.

    .venv/bin/python -m bench.large_state [--keys 50000000] [--batch 500000]

The store has one partition on one query actor, so every key lands in one RocksDB. Every ``--report``
keys it prints the actor's resident memory, split into its own heap, what RocksDB itself accounts for in
it (block cache, pinned blocks, memtables, table readers: bounded by the engine's options) and the rest,
plus the partition's size on disk. The baseline is the actor before the first key, in the same run. A
last step reads keys back from the start, middle and end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid

from bench.faults import worker_pid
from bench.loadgen import key_name
from bench.stream_all import rss_parts

__all__ = ["main"]


def disk_mb(path: str) -> float:
    done = subprocess.run(["du", "-sm", path], capture_output=True, text=True, check=False)
    return float(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else float("nan")


def memory(pid: int) -> tuple[float, float, float]:
    """A process's resident memory in MB: all of it, its own heap (anonymous), shared memory it touched."""
    parts = rss_parts(pid)
    return parts["VmRSS"], parts["RssAnon"], parts["RssShmem"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=50_000_000)
    parser.add_argument("--batch", type=int, default=500_000)
    parser.add_argument("--report", type=int, default=5_000_000)
    args = parser.parse_args()
    data = os.environ.setdefault("RIQR_DATA", tempfile.mkdtemp(prefix="riqr-large-data-"))

    import pyarrow as pa
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME, RuntimeConfig
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from topologies.delivery import BatchDelivery
    from verticles import deploy

    ray.init(namespace="riqr-bench", log_to_driver=False, configure_logging=False)
    namespace = f"riqr-large-{uuid.uuid4().hex[:8]}"
    deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0))
    rows: list[tuple[int, float, float, float, float, float]] = []
    try:
        spec = StoreSpec("large", KeySchema("key", "string"), (ValueField("value", "bigint"),), partitions=1, actors=1)
        registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
        view = raycalls.get(registry.create_store.remote(spec), "create_store")
        uuid_ = view.tables["large"].partitions[0].active
        handle = ray.get_actor(uuid_, namespace=namespace)
        pid = worker_pid(handle)
        where = os.path.join(data, namespace, "large", uuid_)
        delivery = BatchDelivery(spec, namespace, "unused")

        def rocksdb_mb() -> float:
            usage = raycalls.get(handle.engine_memory.remote(), "engine_memory")[0]
            return sum(usage.values()) / (1 << 20)

        rows.append((0, *memory(pid), rocksdb_mb(), 0.0))
        started = time.monotonic()
        for batch_id, start in enumerate(range(0, args.keys, args.batch)):
            n = min(args.batch, args.keys - start)
            table = pa.table(
                {
                    "key": [key_name(i) for i in range(start, start + n)],
                    "value": pa.array(range(start, start + n), pa.int64()),
                    PARTITION_COLUMN: pa.array([0] * n, pa.int32()),
                }
            )
            delivery.deliver("bench", batch_id, table)
            loaded = start + n
            if loaded % args.report == 0 or loaded == args.keys:
                rows.append((loaded, *memory(pid), rocksdb_mb(), disk_mb(where)))
                rate = loaded / (time.monotonic() - started)
                print(f"  {loaded:>12,} keys  actor RSS {rows[-1][1]:>7.0f} MB (own heap {rows[-1][2]:>5.0f}, shared "
                      f"{rows[-1][3]:>5.0f}, rocksdb {rows[-1][4]:>5.0f})  on disk {rows[-1][5]:>7.0f} MB"
                      f"  ({rate:,.0f} keys/s)", file=sys.stderr, flush=True)  # fmt: skip
        probes = [0, args.keys // 2, args.keys - 1]
        answers, _ = raycalls.get(handle.get_many.remote([(0, key_name(i)) for i in probes]), "get_many")
        assert all(a is not None for a in answers), answers
        count, _ = raycalls.get(handle.count.remote([0]), "count")
        assert count == args.keys, count
    finally:
        deploy.down(namespace)
        ray.shutdown()
    base = rows[0][2]
    print(f"\n{args.keys:,} keys into one rocksdb partition through its query actor")
    print("RSS = own heap (RssAnon) + shared memory touched (RssShmem: Ray's object store, which the batches")
    print("arrive through) + mapped files. 'rocksdb' is RocksDB's own accounting within the heap (block cache,")
    print("pinned blocks, memtables, table readers: bounded by its options); 'rest' is the heap without it.")
    print(f"{'keys':>14}{'RSS MB':>9}{'own heap MB':>13}{'rocksdb MB':>12}{'rest MB':>9}{'vs empty':>10}"
          f"{'shared MB':>11}{'disk MB':>10}")  # fmt: skip
    for keys, rss, anon, shmem, rocks, disk in rows:
        rest = anon - rocks
        print(f"{keys:>14,}{rss:>9.0f}{anon:>13.0f}{rocks:>12.0f}{rest:>9.0f}{rest / (base - rows[0][4]):>10.2f}"
              f"{shmem:>11.0f}{disk:>10.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
