"""Benchmark: query actors moved between nodes under load (``riqr rebalance``, ``riqr drain``).

    .venv/bin/python -m bench.moves [--keys 200000] [--readers 4] [--before 10] [--after 5]

A ``ray.cluster_utils.Cluster`` of two nodes (each with its own data directory) runs riqr with two stores
of 8 partitions on 4 actors, one with a standby copy of each partition and one without, each loaded with
``--keys`` keys. A writer delivers a batch of 20 keys to both every 50 ms and ``--readers`` readers GET
random keys of both from the head node's REST API. After ``--before`` seconds of that (the baseline) a
third node joins and ``rebalance`` moves one actor of each store to it; then ``drain`` moves them off
again, and the node is removed; ``--after`` seconds more. The figures per phase: requests, answered %
(correct answers over requests: a value the writer wrote for that key, never older than one the same
reader saw), latency percentiles, wrong answers, 503s; each move's time; the batches delivered and any
that failed; and at the end, the records any copy lacks or has wrong. The ratios compare each phase with
the baseline of the same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from typing import Any

from bench.faults import Read, http_get, judge_score, start_on_own_disks, summarize, user_scores

PARTITIONS, ACTORS = 8, 4


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def phase(reads: list[Read], opened: float, closed: float) -> dict[str, Any]:
    """``summarize`` of the reads started in ``[opened, closed)``, with their rate and latency percentiles."""
    mine = [r for r in reads if opened <= r.started < closed]
    took = [(r.ended - r.started) * 1000 for r in mine]
    out = summarize(mine, opened, closed)
    out.update(
        seconds=closed - opened,
        rate=len(mine) / (closed - opened) if closed > opened else 0.0,
        p50_ms=_percentile(took, 0.50),
        p99_ms=_percentile(took, 0.99),
        not_200=sum(1 for r in mine if r.status != 200),
    )
    return out


def run(keys: int, readers: int, before: float, after: float) -> dict[str, Any]:
    import pyarrow as pa
    import ray

    from riqr import moves
    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.codec import decode_value
    from runtime.keys import KeySchema
    from runtime.scan import Scan
    from topologies.delivery import BatchDelivery

    on = start_on_own_disks("riqr-moves", workers=1)
    cluster, namespace, url, registry = on.cluster, on.namespace, on.url, on.registry
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        key, value = KeySchema("user", "long"), (ValueField("score", "bigint"),)
        specs = [
            StoreSpec(f"moving-{n}sb", key, value, partitions=PARTITIONS, actors=ACTORS, standbys=n) for n in (1, 0)
        ]
        tables = {}
        for spec in specs:
            tables[spec.name] = raycalls.get(registry.create_store.remote(spec), "create_store").tables[spec.name]
        deliveries = {spec.name: BatchDelivery(spec, namespace, checkpoint="unused") for spec in specs}
        users = list(range(keys))
        history: dict[int, set[int]] = {}
        first = {u: u * 10 for u in users}
        latest = {spec.name: dict(first) for spec in specs}
        lock = threading.Lock()

        def batch(store: str, values: dict[int, int]) -> pa.Table:
            return user_scores(tables[store], values)

        print(f"loading {keys:,} keys into each store", file=sys.stderr, flush=True)
        for name, delivery in deliveries.items():
            delivery.deliver("q", 0, batch(name, first))

        reads: list[Read] = []
        wrong: list[str] = []
        ingest: dict[str, Any] = {"delivered": 0, "errors": [], "failed": 0, "slowest_s": 0.0}

        def write() -> None:
            rng = random.Random(7)
            batch_id = 1
            while not stop.is_set():
                values = {u: u * 10 + batch_id * 10_000_000 for u in rng.sample(users, 20)}
                with lock:  # known before it is delivered: no read can see an unknown value
                    for u, v in values.items():
                        history.setdefault(u, {u * 10}).add(v)
                started = time.monotonic()
                for name, delivery in deliveries.items():
                    while not stop.is_set():  # a batch that failed is delivered again, as Spark retries one
                        try:
                            delivery.deliver("q", batch_id, batch(name, values))
                            latest[name].update(values)  # each store's own: the run may end between two
                            break
                        except Exception as err:
                            ingest["errors"].append(f"{name} batch {batch_id}: {err!r}")
                            ingest["failed"] += 1
                            stop.wait(1.0)
                ingest["slowest_s"] = max(ingest["slowest_s"], time.monotonic() - started)
                ingest["delivered"] = batch_id
                batch_id += 1
                stop.wait(0.05)

        def read(reader: int) -> None:
            rng = random.Random(11 + reader)
            seen: dict[tuple[str, int], int] = {}
            while not stop.is_set():
                store, u = rng.choice(specs).name, rng.choice(users)
                started = time.monotonic()
                status, body = http_get(f"{url}/stores/{store}/get/{u}")
                ended = time.monotonic()
                with lock:
                    got, why = judge_score(status, body, history.get(u, {u * 10}), seen.get((store, u)))
                if why is not None:
                    wrong.append(f"{store} user {u}: {why}")
                if got is not None:
                    seen[(store, u)] = got
                reads.append(Read(reader, f"{store}/{u}", started, ended, status, got is not None))

        threads += [threading.Thread(target=write, daemon=True)] + [
            threading.Thread(target=read, args=(i,), daemon=True) for i in range(readers)
        ]
        opened = time.monotonic()
        for t in threads:
            t.start()
        stop.wait(before)
        baseline_closed = time.monotonic()
        node = on.add_node()
        cluster.wait_for_nodes()
        third = node.node_id
        said: list[str] = []
        moves_opened = time.monotonic()
        rebalanced = moves.rebalance(namespace, say=said.append)
        rebalanced_at = time.monotonic()
        drained = moves.rebalance(namespace, drain=[third], say=said.append)
        moves_closed = time.monotonic()
        cluster.remove_node(node)
        removed_at = time.monotonic()
        stop.wait(after)
        stop.set()
        closed = time.monotonic()
        for t in threads:
            t.join(timeout=90)

        lost = 0
        final: Any = ray.get(registry.view.remote(), timeout=30)
        for spec in specs:
            table = final.tables[spec.name]
            for u, held in table.all_owners().items():
                scanned: Any = ray.get(ray.get_actor(u, namespace=namespace).scan.remote(held, Scan()), timeout=120)
                copy = {k: decode_value(v) for k, v in scanned[0]}
                expected = {k: v for k, v in latest[spec.name].items() if table.partition_of(k) in held}
                lost += sum(1 for k, v in expected.items() if copy.get(k) != v) + len(set(copy) - set(expected))
        return {
            "keys": keys,
            "readers": readers,
            "baseline": phase(reads, opened, baseline_closed),
            "moving": phase(reads, moves_opened, moves_closed),
            "after": phase(reads, removed_at, closed),
            "rebalance_s": rebalanced_at - moves_opened,
            "drain_s": moves_closed - rebalanced_at,
            "moves": [(d.move.store, "rebalance", d.seconds) for d in rebalanced]
            + [(d.move.store, "drain", d.seconds) for d in drained],
            "wrong": len(wrong),
            "wrong_examples": wrong[:5],
            "batches": ingest["delivered"],
            "ingest_errors": ingest["errors"][:5],
            "failed_deliveries": ingest["failed"],
            "slowest_batch_s": ingest["slowest_s"],
            "lost_records": lost,
            "said": said,
        }
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
        on.close()


def report(r: dict[str, Any]) -> None:
    base = r["baseline"]
    print(
        f"\nmoves under load: {r['keys']:,} keys per store, {r['readers']} readers, a batch every 50 ms to both stores"
    )
    print(f"{'phase':<10}{'seconds':>8}{'requests':>9}{'req/s':>7}{'vs base':>8}{'answered %':>11}{'not 200':>8}"
          f"{'p50 ms':>8}{'p99 ms':>8}{'p99 vs base':>12}{'slowest s':>10}{'longest gap s':>14}")  # fmt: skip
    for name in ("baseline", "moving", "after"):
        p = r[name]
        ratio = p["rate"] / base["rate"] if base["rate"] else 0.0
        p99 = p["p99_ms"] / base["p99_ms"] if base["p99_ms"] else 0.0
        print(f"{name:<10}{p['seconds']:>8.1f}{p['requests']:>9}{p['rate']:>7.0f}{ratio:>8.2f}"
              f"{p['answered_pct']:>10.3f}%{p['not_200']:>8}{p['p50_ms']:>8.2f}{p['p99_ms']:>8.2f}{p99:>12.2f}"
              f"{p['slowest_s']:>10.2f}{p['longest_gap_s']:>14.2f}")  # fmt: skip
    times = [s for _, _, s in r["moves"]]
    print(f"moves: {len(times)} ({', '.join(f'{store} {kind} {s:.1f}s' for store, kind, s in r['moves'])}); "
          f"median {statistics.median(times) if times else 0:.1f}s; rebalance {r['rebalance_s']:.1f}s, drain "
          f"{r['drain_s']:.1f}s")  # fmt: skip
    print(
        f"wrong answers: {r['wrong']}; batches: {r['batches']} (slowest {r['slowest_batch_s']:.2f}s, "
        f"{r['failed_deliveries']} deliveries failed); records lost or wrong in any copy at the end: "
        f"{r['lost_records']}"
    )
    for example in r["wrong_examples"] + r["ingest_errors"]:
        print(f"    {example}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="keys per store")
    parser.add_argument("--readers", type=int, default=4, help="concurrent GET loops")
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the node joins")
    parser.add_argument("--after", type=float, default=5.0, help="seconds of load after the node is removed")
    args = parser.parse_args()
    report(run(args.keys, args.readers, args.before, args.after))


if __name__ == "__main__":
    main()
