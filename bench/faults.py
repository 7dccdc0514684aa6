"""Benchmark: query actors killed every 10 s under load, and how long a restarted actor takes to serve.

    .venv/bin/python -m bench.faults [--duration 60] [--every 10] [--engine rocksdb] [--sizes 100000,1000000]
                                     [--standbys 0,1]

Scenario 1 runs the real food-orders topology on a local Ray and Spark: a writer produces orders for 12
keys every 0.3 s, a reader GETs their counts as fast as one client goes, and every ``--every`` seconds one
of ``order-count``'s two query actors is killed, alternately with ``ray.kill`` (Ray restarts it) and with
SIGKILL of its worker process. Every answer is checked against what was produced: a count that exceeds the
orders produced for its key, goes backwards, or a 404 for a key with orders is a wrong answer; a 503 is
honest but counted. Afterwards every count must equal what was produced, and the feeding query must still
be running.

Scenario 2 loads one partition with N keys (per ``--sizes``) on each engine, kills its actor, and times
until the restarted actor answers a read again: the restore time per partition size.

The baseline of scenario 1 is the same load with no kill, in the same run.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import key_name

__all__ = ["Ledger", "write_orders", "read_counts", "worker_pid", "SEED_ORDER_COUNTS"]

SEED_ORDER_COUNTS = {"": 1, "1": 1, "2": 1}
KEYS = [str(i) for i in range(1, 13)]


@dataclass
class Ledger:
    """What was produced (per key, cumulative) and what readers saw, with the wrong answers spelled out."""

    produced: Counter[str] = field(default_factory=lambda: Counter(SEED_ORDER_COUNTS))
    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: Counter[int] = field(default_factory=Counter)
    correct: int = 0
    wrong: list[str] = field(default_factory=list)
    last_seen: dict[str, int] = field(default_factory=dict)
    unavailable_since: dict[str, float] = field(default_factory=dict)
    unavailable_seconds: float = 0.0
    longest_gap: float = 0.0

    def record(self, key: str, status: int, body: Any) -> None:
        now = time.monotonic()
        with self.lock:
            produced = self.produced[key]
        self.answers[status] += 1
        if status == 200:
            count = body["response"]
            if count > produced or count < self.last_seen.get(key, 0):
                self.wrong.append(f"key {key}: {count} after {self.last_seen.get(key)}, produced {produced}")
            else:
                self.correct += 1
            self.last_seen[key] = count
            since = self.unavailable_since.pop(key, None)
            if since is not None:
                self.unavailable_seconds += now - since
                self.longest_gap = max(self.longest_gap, now - since)
        elif status == 404:
            # A key whose first order is still on its way is fresh news, not lost data: a 404 is wrong only
            # for a key that was answered before (or is in the seed, loaded before the readers started).
            if key in self.last_seen or key in SEED_ORDER_COUNTS:
                self.wrong.append(f"key {key}: 404 although it was {self.last_seen.get(key, 'seeded')}")
            else:
                self.correct += 1
        elif status == 503:
            self.unavailable_since.setdefault(key, now)
        else:
            self.wrong.append(f"key {key}: status {status} {body}")


def write_orders(home: Path, ledger: Ledger, stop: threading.Event, interval: float = 0.3) -> None:
    """Produce five orders for random keys every ``interval`` seconds until ``stop``."""
    from runtime.landing import parse_console_lines, write_records

    rng = random.Random(7)
    while not stop.is_set():
        keys = [rng.choice(KEYS) for _ in range(5)]
        with ledger.lock:
            write_records(home, "order", parse_console_lines([f"{k}--dish" for k in keys]))
            ledger.produced.update(keys)
        stop.wait(interval)


def read_counts(url: str, ledger: Ledger, stop: threading.Event) -> None:
    """GET the order counts of random keys until ``stop``, recording every answer in ``ledger``."""
    import json
    import urllib.error
    import urllib.request

    rng = random.Random(11)
    while not stop.is_set():
        key = rng.choice(KEYS)
        try:
            with urllib.request.urlopen(f"{url}/stores/order-count/get/{key}", timeout=30) as resp:
                status, body = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            status, body = err.code, json.loads(err.read() or b"null")
        ledger.record(key, status, body)


def worker_pid(handle: Any) -> int:
    """The pid of the worker process running an actor (to SIGKILL it)."""
    import ray

    return int(ray.get(handle.__ray_call__.remote(lambda self: os.getpid())))


def scenario_kills(
    spark: Any, duration: float, every: float, engine: str, *, kill: bool, standbys: int | None = None
) -> dict[str, Any]:
    """One run of scenario 1 (``standbys`` copies of each partition; None: riqr's default); its figures."""
    import ray

    from runtime.config import RuntimeConfig
    from topologies import food_orders
    from topologies.options import TopologyOptions
    from verticles import deploy

    namespace = f"riqr-faults-{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="riqr-faults-"))
    deployment = deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0))
    url = deployment.endpoints[0].url
    options = TopologyOptions(namespace=namespace, trigger="250 milliseconds", engine=engine, standbys=standbys)
    queries = food_orders.start(spark, home, options)
    try:
        from riqr.demo import load_seed, wait_until

        load_seed(home)
        from runtime.client import connect

        orders = connect(namespace).store(food_orders.ORDER_COUNT_STORE)
        wait_until(lambda: orders.approximate_num_entries() == 3, 120, "the seed orders")
        owners = [i["actor"] for i in connect(namespace).metadata() if i["state-store-names"] == ["order-count"]]
        ledger, stop = Ledger(), threading.Event()
        threads = [
            threading.Thread(target=write_orders, args=(home, ledger, stop), daemon=True),
            threading.Thread(target=read_counts, args=(url, ledger, stop), daemon=True),
        ]
        for t in threads:
            t.start()
        kills = 0
        started = time.monotonic()
        next_kill = started + every
        while time.monotonic() - started < duration:
            time.sleep(0.1)
            if kill and time.monotonic() >= next_kill:
                victim = ray.get_actor(owners[kills % len(owners)], namespace=namespace)
                if kills % 2 == 0:
                    ray.kill(victim, no_restart=False)
                else:
                    os.kill(worker_pid(victim), signal.SIGKILL)
                kills += 1
                print(f"  kill {kills} at {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
                next_kill += every
        stop.set()
        for t in threads:
            t.join(timeout=60)
        converged = True
        try:
            wait_until(
                lambda: all(orders.get(k) == n for k, n in ledger.produced.items()), 60, "counts equal to produced"
            )
        except TimeoutError:
            converged = False
        total = sum(ledger.answers.values())
        return {
            "requests": total,
            "correct": ledger.correct,
            "wrong": len(ledger.wrong),
            "wrong_examples": ledger.wrong[:5],
            "503": ledger.answers[503],
            "kills": kills,
            "unavailable_s": ledger.unavailable_seconds,
            "longest_gap_s": ledger.longest_gap,
            "converged": converged,
            "queries_alive": all(q.isActive for q in queries),
        }
    finally:
        for q in queries:
            q.stop()
        deploy.down(namespace)


def scenario_restore(sizes: list[int], engines: list[str]) -> list[tuple[str, int, float, float]]:
    """Restore time of a one-partition store of each size on each engine, after ray.kill with restart."""
    import pyarrow as pa
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME, RuntimeConfig
    from runtime.errors import RiqrError
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from topologies.delivery import BatchDelivery
    from verticles import deploy

    namespace = f"riqr-restore-{uuid.uuid4().hex[:8]}"
    deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0))
    registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
    out = []
    try:
        for engine in engines:
            for size in sizes:
                name = f"restore-{engine}-{size}"
                spec = StoreSpec(
                    name, KeySchema("key", "string"), (ValueField("value", "bigint"),), partitions=1, actors=1,
                    engine=engine,
                )  # fmt: skip
                view = raycalls.get(registry.create_store.remote(spec), "create_store")
                delivery = BatchDelivery(spec, namespace, "unused")
                step = 100_000
                for batch_id, start in enumerate(range(0, size, step)):
                    keys = [key_name(i) for i in range(start, min(start + step, size))]
                    table = pa.table(
                        {
                            "key": keys,
                            "value": pa.array(range(start, start + len(keys)), pa.int64()),
                            PARTITION_COLUMN: pa.array([0] * len(keys), pa.int32()),
                        }
                    )
                    delivery.deliver("bench", batch_id, table)
                uuid_ = view.tables[name].partitions[0].active
                handle = ray.get_actor(uuid_, namespace=namespace)
                old_pid = worker_pid(handle)
                last_key = key_name(size - 1)

                def probe(self: Any, key: str = last_key) -> tuple[int, Any]:  # runs in the actor
                    return os.getpid(), self.get_many([(0, key)])[0][0]

                ray.kill(handle, no_restart=False)
                started = time.monotonic()
                while True:
                    try:
                        pid, value = raycalls.get(handle.__ray_call__.remote(probe), "probe", timeout=60)
                        if pid != old_pid and value is not None:
                            break
                    except RiqrError:
                        time.sleep(0.01)
                secs = time.monotonic() - started
                opened = raycalls.get(handle.info.remote(), "info")["opened_in"]
                out.append((engine, size, secs, opened))
                print(
                    f"  {engine:<8} {size:>10,} keys: serving again {secs:.2f}s after the kill "
                    f"(partitions reopened in {opened:.3f}s)",
                    file=sys.stderr,
                )
                raycalls.get(registry.drop_store.remote(name), "drop_store")
    finally:
        deploy.down(namespace)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--engine", default="rocksdb", choices=["rocksdb", "memory"])
    parser.add_argument("--sizes", default="100000,1000000", help="keys per partition for the restore timings")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the no-kill baseline")
    parser.add_argument(
        "--standbys", default="0", help="comma-separated standby counts: one kill run each (e.g. 0,1 to compare)"
    )
    args = parser.parse_args()
    os.environ.setdefault("RIQR_DATA", tempfile.mkdtemp(prefix="riqr-faults-data-"))

    import ray

    from topologies.spark import spark_session

    ray.init(namespace="riqr-bench", log_to_driver=False, configure_logging=False)
    spark = spark_session("local[2]", app_name="riqr-faults", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        runs = []
        if not args.skip_baseline:
            print("baseline: the same load, no kill", file=sys.stderr)
            runs.append(("no kill", scenario_kills(spark, args.duration, args.every, args.engine, kill=False)))
        for n in [int(x) for x in args.standbys.split(",") if x]:
            print(f"kills every {args.every:g}s for {args.duration:g}s ({args.engine} engine, {n} standby)",
                  file=sys.stderr)  # fmt: skip
            figures = scenario_kills(spark, args.duration, args.every, args.engine, kill=True, standbys=n)
            runs.append((f"kills, {n} sb", figures))
        print("restore time per partition size", file=sys.stderr)
        restores = scenario_restore([int(s) for s in args.sizes.split(",") if s], ["memory", "rocksdb"])
    finally:
        spark.stop()
        ray.shutdown()

    print(f"\nscenario 1: order-count under GET load, {args.engine} engine, {args.duration:g}s")
    print(f"{'run':<14}{'requests':>10}{'correct %':>11}{'wrong':>7}{'503s':>7}{'kills':>7}{'503 s/kill':>12}"
          f"{'longest gap s':>15}{'converged':>11}{'query alive':>13}")  # fmt: skip
    for name, r in runs:
        per_kill = r["unavailable_s"] / r["kills"] if r["kills"] else 0.0
        print(
            f"{name:<14}{r['requests']:>10}{100 * r['correct'] / max(r['requests'], 1):>10.2f}%{r['wrong']:>7}"
            f"{r['503']:>7}{r['kills']:>7}{per_kill:>12.2f}{r['longest_gap_s']:>15.2f}{r['converged']!s:>11}"
            f"{r['queries_alive']!s:>13}"
        )
        for example in r["wrong_examples"]:
            print(f"    wrong: {example}")
    print("\nscenario 2: after ray.kill (restart) of a one-partition actor: until it serves again, and the")
    print("part of it spent reopening the partition (the rest is Ray restarting the actor's process)")
    print(f"{'engine':<10}{'keys':>12}{'serving again s':>17}{'reopen s':>10}")
    for engine, size, secs, opened in restores:
        print(f"{engine:<10}{size:>12,}{secs:>17.2f}{opened:>10.3f}")


if __name__ == "__main__":
    main()
