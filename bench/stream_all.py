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
import os
import subprocess
import sys
import threading
import time
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
    # address="local": a Ray of its own, never a cluster another process left behind on this machine.
    logs = bool(os.environ.get("RIQR_BENCH_LOGS"))
    ray.init(address="local", namespace=namespace, log_to_driver=logs, include_dashboard=False)
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

        # Baseline: one query actor scanning its own partitions in-process (no merge, hop or HTTP), as
        # tuples (``QueryCore.scan``); beside it, the same actor producing its packed NDJSON pages.
        owners = view.tables["big"].by_owner()
        owner_uuid, parts = next(iter(owners.items()))
        owner = ray.get_actor(owner_uuid, namespace=namespace)

        def inside(self, parts):  # runs in the query actor
            t = time.perf_counter()
            n = len(self.core.scan(parts, Scan())[0])
            return n, time.perf_counter() - t

        def inside_packed(self, parts, page_bytes):  # runs in the query actor: every packed page in turn
            from runtime.engines.keycodec import KeyCodec

            codec, scan, n = KeyCodec(self.core.spec.key), Scan(), 0
            t = time.perf_counter()
            while True:
                page, _ = self.core.scan_packed(parts, scan, None, page_bytes, "ndjson")
                n += len(page)
                if not page.more:
                    return n, time.perf_counter() - t
                scan = scan.after(codec.decode(page.keys[-1]))

        from runtime.config import PAGE_BYTES

        n_inside, secs_inside = min(
            (ray.get(owner.__ray_call__.remote(inside, parts)) for _ in range(2)), key=lambda r: r[1]
        )
        baseline = n_inside / secs_inside
        n_packed, secs_packed = min(
            (ray.get(owner.__ray_call__.remote(inside_packed, parts, PAGE_BYTES)) for _ in range(2)),
            key=lambda r: r[1],
        )

        http_pid, facade_pid = actor_pid(http_name(node), namespace), actor_pid(facade_name(node), namespace)
        query_pids = [actor_pid(u, namespace) for u in owners]
        server = {"HTTP verticle": http_pid, "facade verticle": facade_pid}
        server.update({f"query actor {i + 1}": pid for i, pid in enumerate(query_pids)})
        rss_before = {name: rss_mb(pid) for name, pid in server.items()}

        # NDJSON over HTTP, read by curl (a C client, so the client does not compete for the cores as a
        # Python reader would); the lines are checked afterwards, outside the timing.
        out = f"/tmp/riqr-stream-{namespace}.ndjson"
        watches = {name: PeakRss(pid) for name, pid in server.items()}
        started = time.perf_counter()
        subprocess.run(
            ["curl", "-sS", "--fail", "-o", out, "-H", "Accept: application/x-ndjson",
             f"{deployment.endpoints[0].url}/stores/big/all"],
            check=True,
        )  # fmt: skip
        rest_secs = time.perf_counter() - started
        growth_rest = {name: w.stop() for name, w in watches.items()}
        count, last = 0, None
        with open(out, "rb") as f:
            for line in f:
                entry = json.loads(line)
                key = entry["key"]
                assert last is None or key > last, (last, key)
                assert entry["value"] == int(key[1:]), entry
                last, count = key, count + 1
        os.unlink(out)
        assert count == args.entries, count

        store = runtime.connect(namespace).store("big")
        watches = {name: PeakRss(pid) for name, pid in server.items()}
        started = time.perf_counter()
        py_count, last = 0, None
        for key, value in store.iterate():
            if last is not None and key <= last:
                raise AssertionError((last, key, value))
            last, py_count = key, py_count + 1
        py_secs = time.perf_counter() - started
        growth_py = {name: w.stop() for name, w in watches.items()}
        assert py_count == args.entries, py_count

        # The tuple pages that iterate() used before (cursor pages of 5,000 through the facade), same run.
        started = time.perf_counter()
        old_count, page = 0, store.page(5000)
        while True:
            old_count += len(page.entries)
            if page.next is None:
                break
            page = store.page(5000, page.next)
        old_secs = time.perf_counter() - started
        assert old_count == args.entries, old_count
        rss_after = {name: rss_mb(pid) for name, pid in server.items()}

        rest_rate, py_rate, old_rate = count / rest_secs, py_count / py_secs, old_count / old_secs
        packed_rate = n_packed / secs_packed
        print(f"\nstreaming all over {args.entries:,} entries (4 partitions, 2 query actors)")
        print(f"  baseline, one query actor scanning its {n_inside:,} entries in-process: {baseline:,.0f} entries/s")
        print(f"  the same actor producing packed NDJSON pages in-process: {packed_rate:>10,.0f} entries/s"
              f" ({packed_rate / baseline:.2f} of baseline)")  # fmt: skip
        print(f"  REST NDJSON (curl):      {rest_rate:>10,.0f} entries/s ({rest_rate / baseline:.2f} of baseline)")
        print(f"  Python iterate():        {py_rate:>10,.0f} entries/s ({py_rate / baseline:.2f} of baseline)")
        print(f"  Python page(5000) loop:  {old_rate:>10,.0f} entries/s ({old_rate / baseline:.2f} of baseline)"
              "  (tuple pages, as iterate() was)")  # fmt: skip
        print("  server memory, RSS MB: before -> after all streams; peak growth during NDJSON / iterate()")
        for name in server:
            print(f"    {name:16s} {rss_before[name]:7.0f} -> {rss_after[name]:7.0f};"
                  f"  +{growth_rest[name]:.0f} / +{growth_py[name]:.0f}")  # fmt: skip
    finally:
        deploy.down(namespace)
        ray.shutdown()


if __name__ == "__main__":
    main()
