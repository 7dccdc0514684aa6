"""Benchmark: stream `all` over a large store, and how much the HTTP verticle and facade grow meanwhile.

    .venv/bin/python -m bench.stream_all [--entries 1000000]

Loads N small entries into a store (4 partitions, 2 query actors), then
1. streams GET /stores/{store}/all as NDJSON over HTTP (the HTTP verticle's co-located facade merges),
2. iterates the same store through the Python driver API (the node's facade verticle, page by page),
sampling the resident memory (VmRSS) of the HTTP verticle and the facade verticle every 20 ms. Prints
entries per second for each, and each process's memory growth: peak during the stream minus before.
The baseline for the rate is the same store's entries per second read inside one query actor (a plain
scan with no merge, no Ray hop and no HTTP), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
import uuid

import pyarrow as pa


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory in MB: all of it (``VmRSS``), or one part of it: ``RssAnon`` (its own
    heap), ``RssShmem`` (shared memory it touched, such as Ray's object store), ``RssFile``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


class PeakRss:
    """Samples a process's RSS in a thread; ``peak`` is the largest value seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss_mb(pid)
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak - self.before


def actor_pid(name: str, namespace: str) -> int:
    import ray

    return int(
        ray.get(ray.get_actor(name, namespace=namespace).__ray_call__.remote(lambda self: __import__("os").getpid()))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()

    import ray

    import runtime
    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME, RuntimeConfig, facade_name, http_name
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from runtime.partitioner import partition_of
    from runtime.scan import Scan
    from topologies.sink import BatchDelivery
    from verticles import deploy

    namespace = f"riqr-bench-{uuid.uuid4().hex[:8]}"
    ray.init(namespace=namespace, log_to_driver=False, include_dashboard=False)
    try:
        deployment = deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0))
        node = deployment.endpoints[0].node_id
        spec = StoreSpec("big", KeySchema("key", "string"), (ValueField("value", "bigint"),), partitions=4, actors=2)
        view = raycalls.get(ray.get_actor(REGISTRY_NAME, namespace=namespace).create_store.remote(spec), "create_store")
        delivery = BatchDelivery(spec, namespace, checkpoint="unused")
        chunk = 50_000
        for batch_id, start in enumerate(range(0, args.entries, chunk)):
            keys = [f"k{i:08d}" for i in range(start, min(args.entries, start + chunk))]
            table = pa.table(
                {
                    "key": keys,
                    "value": pa.array(range(start, start + len(keys)), pa.int64()),
                    PARTITION_COLUMN: pa.array([partition_of(spec.key.type, k, 4) for k in keys], pa.int32()),
                }
            )
            delivery.deliver("bench", batch_id, table)
            print(f"  loaded {start + len(keys):,}/{args.entries:,}", file=sys.stderr, flush=True)

        # Baseline: one query actor scanning its own partitions in-process (no merge, hop or HTTP).
        owner_uuid, parts = next(iter(view.tables["big"].by_owner().items()))
        owner = ray.get_actor(owner_uuid, namespace=namespace)

        def inside(self, parts):  # runs in the query actor
            t = time.perf_counter()
            n = len(self.core.scan(parts, Scan())[0])
            return n, time.perf_counter() - t

        n_inside, secs_inside = ray.get(owner.__ray_call__.remote(inside, parts))
        baseline = n_inside / secs_inside

        http_pid, facade_pid = actor_pid(http_name(node), namespace), actor_pid(facade_name(node), namespace)

        watch_http, watch_facade = PeakRss(http_pid), PeakRss(facade_pid)
        started = time.perf_counter()
        request = urllib.request.Request(
            f"{deployment.endpoints[0].url}/stores/big/all", headers={"Accept": "application/x-ndjson"}
        )
        count, last = 0, None
        with urllib.request.urlopen(request, timeout=600) as resp:
            for line in resp:
                key = json.loads(line)["key"]
                assert last is None or key > last
                last, count = key, count + 1
        rest_secs = time.perf_counter() - started
        http_growth = watch_http.stop()
        watch_facade.stop()
        assert count == args.entries, count

        watch_facade = PeakRss(facade_pid)
        started = time.perf_counter()
        py_count = sum(1 for _ in runtime.connect(namespace).store("big").iterate(page_size=5000))
        py_secs = time.perf_counter() - started
        facade_growth = watch_facade.stop()
        assert py_count == args.entries, py_count

        rest_rate, py_rate = count / rest_secs, py_count / py_secs
        print(f"\nstreaming all over {args.entries:,} entries (4 partitions, 2 query actors)")
        print(f"  baseline, one query actor scanning its {n_inside:,} entries in-process: {baseline:,.0f} entries/s")
        print(
            f"  REST NDJSON:      {rest_rate:>10,.0f} entries/s ({rest_rate / baseline:.2f} of baseline)"
            f"  HTTP verticle RSS growth {http_growth:.0f} MB"
        )
        print(
            f"  Python iterate(): {py_rate:>10,.0f} entries/s ({py_rate / baseline:.2f} of baseline)"
            f"  facade verticle RSS growth {facade_growth:.0f} MB"
        )
    finally:
        deploy.down(namespace)
        ray.shutdown()


if __name__ == "__main__":
    main()
