"""Benchmark: applying a batch of random new keys to a large partition, and reads to that actor meanwhile.

    .venv/bin/python -m bench.apply_reads [--keys 1000000] [--new 50000] [--engines rocksdb,memory]

For each engine, one store of one partition on one query actor is loaded with ``--keys`` keys (the even
numbers), then a batch of ``--new`` random odd-numbered keys (each sorting between existing ones) is
delivered while a reader thread keeps asking the actor for single keys over Ray. It prints how long the
apply took, and the read latency during the apply against the same reader's latency with no apply, in the
same run (the baseline).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from bench.loadgen import key_name

__all__ = ["main"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


class Reader:
    """Asks the actor for random existing keys, one per call, recording (start time, latency)."""

    def __init__(self, handle: Any, keys: int) -> None:
        self.handle = handle
        self.keys = keys
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import ray

        rng = random.Random(3)
        while not self._stop.is_set():
            key = key_name(2 * rng.randrange(self.keys))
            started = time.perf_counter()
            answer, _ = ray.get(self.handle.get_many.remote([(0, key)]))
            assert answer[0] is not None, key
            self.samples.append((started, time.perf_counter() - started))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[float]:
        return [lat for started, lat in self.samples if t0 <= started <= t1]


def run_engine(engine: str, keys: int, new: int) -> dict[str, float]:
    import pyarrow as pa
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME, RuntimeConfig
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from topologies.delivery import BatchDelivery
    from verticles import deploy

    namespace = f"riqr-apply-{uuid.uuid4().hex[:8]}"
    deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0))
    try:
        spec = StoreSpec(
            "big", KeySchema("key", "string"), (ValueField("value", "bigint"),), partitions=1, actors=1, engine=engine
        )
        registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
        view = raycalls.get(registry.create_store.remote(spec), "create_store")
        delivery = BatchDelivery(spec, namespace, "unused")

        def batch(names: list[str], base: int) -> Any:
            return pa.table(
                {
                    "key": names,
                    "value": pa.array(range(base, base + len(names)), pa.int64()),
                    PARTITION_COLUMN: pa.array([0] * len(names), pa.int32()),
                }
            )

        step, batch_id = 200_000, 0
        for start in range(0, keys, step):
            delivery.deliver(
                "bench", batch_id, batch([key_name(2 * i) for i in range(start, min(start + step, keys))], 0)
            )
            batch_id += 1
            print(f"  {engine}: loaded {min(start + step, keys):,}/{keys:,}", file=sys.stderr, flush=True)
        handle = ray.get_actor(view.tables["big"].partitions[0].active, namespace=namespace)
        reader = Reader(handle, keys)
        reader.start()
        time.sleep(3)
        idle_end = time.perf_counter()
        rng = random.Random(5)
        fresh = sorted({key_name(2 * rng.randrange(keys) + 1) for _ in range(new * 2)})[:new]
        rng.shuffle(fresh)
        applying = time.perf_counter()
        delivery.deliver("bench", batch_id, batch(fresh, 0))
        applied = time.perf_counter()
        time.sleep(0.5)
        reader.stop()
        idle = reader.between(idle_end - 3, idle_end)
        during = reader.between(applying, applied)
        return {
            "apply_s": applied - applying,
            "idle_p50": statistics.median(idle) * 1000,
            "idle_p99": _percentile(idle, 0.99) * 1000,
            "during_n": len(during),
            "during_p50": (statistics.median(during) if during else float("nan")) * 1000,
            "during_p99": _percentile(during, 0.99) * 1000,
            "during_max": (max(during) if during else float("nan")) * 1000,
        }
    finally:
        deploy.down(namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--new", type=int, default=50_000)
    parser.add_argument("--engines", default="rocksdb,memory")
    args = parser.parse_args()
    os.environ.setdefault("RIQR_DATA", tempfile.mkdtemp(prefix="riqr-apply-data-"))
    import ray

    ray.init(namespace="riqr-bench", log_to_driver=False, configure_logging=False)
    try:
        results = [(engine, run_engine(engine, args.keys, args.new)) for engine in args.engines.split(",")]
    finally:
        ray.shutdown()
    print(f"\n{args.new:,} random new keys applied to one partition of {args.keys:,} keys, reads meanwhile")
    print(f"{'engine':<9}{'apply s':>9}{'idle p50':>10}{'idle p99':>10}{'reads':>7}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'max ms':>8}{'p99/idle':>10}")  # fmt: skip
    for engine, r in results:
        print(
            f"{engine:<9}{r['apply_s']:>9.2f}{r['idle_p50']:>10.2f}{r['idle_p99']:>10.2f}{r['during_n']:>7}"
            f"{r['during_p50']:>8.2f}{r['during_p99']:>8.2f}{r['during_max']:>8.2f}"
            f"{r['during_p99'] / r['idle_p99']:>10.1f}"
        )


if __name__ == "__main__":
    main()
