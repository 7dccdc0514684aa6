"""Benchmark: stream `all` over a large store, and how much the HTTP verticle and facade grow meanwhile.

    .venv/bin/python -m bench.stream_all [--entries 1000000,5000000]

Loads N small entries into a store (4 partitions, 2 query actors), then
1. streams GET /stores/{store}/all as NDJSON over HTTP (the HTTP verticle's co-located facade merges),
2. iterates the same store through the Python driver API (the node's facade verticle, page by page),
sampling the resident memory of the HTTP verticle, the facade verticle and both query actors every 50 ms
(VmRSS, and its parts: RssAnon, the process's own heap; RssShmem, shared memory such as Ray's object
store; RssFile). Prints entries per second for each, and per process its RSS before, at the peak and
after each stream. With several sizes (``--entries 1000000,5000000``) the same store grows to each in
turn and is measured at each: memory is flat if the peaks do not grow with the number of entries.
The baseline for the rate is the same store's entries per second read inside one query actor (a plain
scan with no merge, no Ray hop and no HTTP), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pyarrow as pa

_PARTS = ("VmRSS", "RssAnon", "RssShmem", "RssFile")


def rss_parts(pid: int) -> dict[str, float]:
    """A process's resident memory in MB: all of it (``VmRSS``) and its parts: ``RssAnon`` (its own heap),
    ``RssShmem`` (shared memory it touched, such as Ray's object store), ``RssFile`` (mapped files)."""
    found = dict.fromkeys(_PARTS, float("nan"))
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in found:
                found[name] = int(rest.split()[0]) / 1024
    return found


def rss_mb(pid: int) -> float:
    return rss_parts(pid)["VmRSS"]


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssWatch:
    """Samples the RSS (and its parts) of some processes every ``every`` seconds in a thread, from
    ``before`` (taken at start) to ``stop()``: the peak of each part per process, and the sample count;
    and the CPU seconds each process used in between (``cpu``, set by ``stop()``)."""

    def __init__(self, pids: dict[str, int], every: float = 0.05) -> None:
        self.pids = pids
        self.cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.before = {name: rss_parts(pid) for name, pid in pids.items()}
        self.peak = {name: dict(parts) for name, parts in self.before.items()}
        self.samples = 0
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                parts, peak = rss_parts(pid), self.peak[name]
                for part, mb in parts.items():
                    peak[part] = max(peak[part], mb)
            self.samples += 1
            self._stop.wait(self._every)

    def stop(self) -> dict[str, dict[str, float]]:
        """Stop sampling; the RSS parts of each process now (``after``)."""
        self._stop.set()
        self._thread.join()
        self.cpu = {name: cpu_seconds(pid) - self.cpu[name] for name, pid in self.pids.items()}
        return {name: rss_parts(pid) for name, pid in self.pids.items()}


def actor_pid(name: str, namespace: str) -> int:
    import ray

    return int(
        ray.get(ray.get_actor(name, namespace=namespace).__ray_call__.remote(lambda self: __import__("os").getpid()))
    )


def _entries(text: str) -> list[int]:
    sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"entries must be positive integers separated by commas, got {text!r}")
    return sizes


def _memory_rows(label: str, watch: RssWatch, after: dict[str, dict[str, float]]) -> list[str]:
    rows = []
    for name in watch.pids:
        b, p, a = watch.before[name], watch.peak[name], after[name]
        rows.append(
            f"    {label:9s} {name:16s} {b['VmRSS']:7.0f} {p['VmRSS']:7.0f} ({p['VmRSS'] - b['VmRSS']:+5.0f})"
            f" {a['VmRSS']:7.0f}   anon {b['RssAnon']:5.0f}->{p['RssAnon']:5.0f}"
            f"  shmem {b['RssShmem']:5.0f}->{p['RssShmem']:5.0f}  file {b['RssFile']:4.0f}->{p['RssFile']:4.0f}"
            f"  cpu {watch.cpu[name]:5.1f} s"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--entries", type=_entries, default=[1_000_000], help="store sizes measured in turn, e.g. 1000000,5000000"
    )
    parser.add_argument(
        "--tuple-pages-max",
        type=int,
        default=1_000_000,
        help="measure the old page(5000) loop only up to this many entries (it is slow)",
    )
    args = parser.parse_args()

    import ray

    import runtime
    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.client import close_in_process_facades
    from runtime.config import REGISTRY_NAME, RuntimeConfig, facade_name, http_name
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from runtime.partitioner import partition_of
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
        owners = view.tables["big"].by_owner()
        owner_uuid, parts = next(iter(owners.items()))
        owner = ray.get_actor(owner_uuid, namespace=namespace)
        http_pid, facade_pid = actor_pid(http_name(node), namespace), actor_pid(facade_name(node), namespace)
        server = {"HTTP verticle": http_pid, "facade verticle": facade_pid}
        server.update({f"query actor {i + 1}": actor_pid(u, namespace) for i, u in enumerate(owners)})
        store = runtime.connect(namespace).store("big")
        started_rss = {name: rss_mb(pid) for name, pid in server.items()}

        chunk, loaded, batch_id, report = 50_000, 0, 0, []
        for entries in args.entries:
            for start in range(loaded, entries, chunk):
                keys = [f"k{i:08d}" for i in range(start, min(entries, start + chunk))]
                table = pa.table(
                    {
                        "key": keys,
                        "value": pa.array(range(start, start + len(keys)), pa.int64()),
                        PARTITION_COLUMN: pa.array([partition_of(spec.key.type, k, 4) for k in keys], pa.int32()),
                    }
                )
                delivery.deliver("bench", batch_id, table)
                batch_id += 1
                print(f"  loaded {start + len(keys):,}/{entries:,}", file=sys.stderr, flush=True)
            loaded = entries
            report += measure(entries, args, server, owner, parts, store, deployment.endpoints[0].url)

        print(f"\nstreaming all over a store of 4 partitions, 2 query actors; sizes {args.entries}")
        print("\n".join(report))
        print("  RSS MB when the runtime was up, before loading: "
              + ", ".join(f"{n} {mb:.0f}" for n, mb in started_rss.items()))  # fmt: skip
    finally:
        close_in_process_facades()  # before the registry goes: its long poll would warn it died
        deploy.down(namespace)
        ray.shutdown()


def measure(
    entries: int,
    args: argparse.Namespace,
    server: dict[str, int],
    owner: Any,
    parts: list[int],
    store: Any,
    url: str,
) -> list[str]:
    """One size: the in-actor baselines, the NDJSON stream, ``iterate()`` and (small sizes) the old page
    loop, with the server processes' RSS sampled during the NDJSON stream and ``iterate()``."""
    import gc

    import ray

    from runtime.config import PAGE_BYTES
    from runtime.scan import Scan

    # Baseline: one query actor scanning its own partitions in-process (no merge, hop or HTTP), as
    # tuples (``QueryCore.scan``); beside it, the same actor producing its packed NDJSON pages.
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

    n_inside, secs_inside = min(
        (ray.get(owner.__ray_call__.remote(inside, parts)) for _ in range(2)), key=lambda r: r[1]
    )

    baseline = n_inside / secs_inside
    n_packed, secs_packed = min(
        (ray.get(owner.__ray_call__.remote(inside_packed, parts, PAGE_BYTES)) for _ in range(2)), key=lambda r: r[1]
    )
    time.sleep(1.0)  # let the actors' heaps settle before "before"

    # NDJSON over HTTP, read by curl (a C client, so the client does not compete for the cores as a
    # Python reader would); the lines are checked afterwards, outside the timing.
    out = f"/tmp/riqr-stream-{uuid.uuid4().hex[:8]}.ndjson"
    watch = RssWatch(server)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        ["curl", "-sS", "--fail", "-o", out, "-H", "Accept: application/x-ndjson", f"{url}/stores/big/all"],
        check=True,
    )
    rest_secs = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    curl_cpu = used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime
    rest_after = watch.stop()
    rest_watch = watch
    count, last = 0, None
    with open(out, "rb") as f:
        for line in f:
            entry = json.loads(line)
            key = entry["key"]
            assert last is None or key > last, (last, key)
            assert entry["value"] == int(key[1:]), entry
            last, count = key, count + 1
    os.unlink(out)
    assert count == entries, count

    gc.collect()
    watch = RssWatch({**server, "driver (bench)": os.getpid()})
    started = time.perf_counter()
    py_count, last = 0, None
    for key, value in store.iterate():
        if last is not None and key <= last:
            raise AssertionError((last, key, value))
        last, py_count = key, py_count + 1
    py_secs = time.perf_counter() - started
    py_after = watch.stop()
    py_watch = watch
    assert py_count == entries, py_count

    old_rate = None
    if entries <= args.tuple_pages_max:
        # The tuple pages that iterate() used before (cursor pages of 5,000 through the facade), same run.
        started = time.perf_counter()
        old_count, page = 0, store.page(5000)
        while True:
            old_count += len(page.entries)
            if page.next is None:
                break
            page = store.page(5000, page.next)
        assert old_count == entries, old_count
        old_rate = old_count / (time.perf_counter() - started)

    rest_rate, py_rate, packed_rate = count / rest_secs, py_count / py_secs, n_packed / secs_packed
    lines = [
        f"\n{entries:,} entries",
        f"  baseline, one query actor scanning its {n_inside:,} entries in-process: {baseline:,.0f} entries/s",
        f"  the same actor producing packed NDJSON pages in-process: {packed_rate:>10,.0f} entries/s"
        f" ({packed_rate / baseline:.2f} of baseline)",
        f"  REST NDJSON (curl):      {rest_rate:>10,.0f} entries/s ({rest_rate / baseline:.2f} of baseline)"
        f"  curl's CPU {curl_cpu:.1f} s",
        f"  Python iterate():        {py_rate:>10,.0f} entries/s ({py_rate / baseline:.2f} of baseline)",
    ]
    if old_rate is not None:
        lines.append(
            f"  Python page(5000) loop:  {old_rate:>10,.0f} entries/s ({old_rate / baseline:.2f} of baseline)"
            "  (tuple pages, as iterate() was)"
        )
    lines.append(
        f"  server RSS MB, sampled every 50 ms ({rest_watch.samples} + {py_watch.samples} samples):"
        " before, peak (growth), after; parts before->peak; CPU seconds used during the stream"
    )
    lines += _memory_rows("NDJSON", rest_watch, rest_after)
    lines += _memory_rows("iterate", py_watch, py_after)
    return lines


if __name__ == "__main__":
    main()
