"""Benchmark: a query actor that gives no answer (its worker frozen with SIGSTOP) under load.

    .venv/bin/python -m bench.freeze [--freeze 6] [--before 3] [--after 4] [--rate 100] [--scans]

An actor on a node that went away, or on a host that hangs, neither answers nor fails: Ray keeps its
calls waiting until it declares the node dead (about 15 s with its default health checks). SIGSTOP of the
actor's worker process makes that happen on one machine, for as long as wanted, with nothing else told.
Two stores of 4 partitions on 2 actors are fed a batch every 50 ms, one with a standby copy of each
partition (``pair``) and one without (``solo``); each store gets ``--rate`` GETs a second of random users
over REST, open loop (each starts on time, in a pool of 1,000 threads, whatever the earlier ones wait for).
After ``--before`` seconds one actor of each store is frozen for ``--freeze`` seconds, then let go, and the
load runs ``--after`` seconds more. Every answer is judged (a score that was written, never older than the
last one seen); a 503 or 504 is honest but not an answer.

Printed per store, for the GETs of the frozen actor's partitions that started while it was frozen: how
many, by status, and their time to an answer (p50, p99, max); then the wrong answers of the whole run
(which must be 0) and the GETs of the other partitions meanwhile, as the baseline of the same run.

With ``--scans`` the reads are whole scans (``GET /stores/S/all``, ``--rate`` of them a second, no key
lookup to find the frozen actor first), each of which needs every partition: printed per store, the
scans that started while the actor was frozen and, as the baseline, those before; a 200 must hold
every user with a score that was written.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.faults import http_get, judge_score, user_scores, worker_pid

USERS = list(range(300))


@dataclass(frozen=True)
class Get:
    store: str
    user: int
    started: float
    ended: float
    status: int
    value: int | None
    body: object  # an error's body


def judged(gets: list[Get], history: dict[int, set[int]]) -> list[str]:
    """The wrong answers among ``gets``: a score never written, or older than one a GET of the same store
    and user that ended before this one started had seen (open loop: GETs overlap, and only those in
    sequence must not go back)."""
    wrong = []
    by_key: dict[tuple[str, int], list[Get]] = {}
    for g in gets:
        by_key.setdefault((g.store, g.user), []).append(g)
    for (store, user), mine in by_key.items():
        answered = sorted((g for g in mine if g.value is not None), key=lambda g: g.ended)
        for g in mine:
            last = max((a.value for a in answered if a.ended < g.started and a.value is not None), default=None)
            _, why = judge_score(g.status, {"response": g.value} if g.value is not None else g.body,
                                 history[user], last)  # fmt: skip
            if why is not None:
                wrong.append(f"{store} user {user}: {why}")
    return wrong


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(freeze: float, before: float, after: float, rate: float, scans: bool = False) -> None:
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME, RuntimeConfig
    from runtime.keys import KeySchema
    from topologies.delivery import BatchDelivery
    from verticles import deploy

    ray.init(log_to_driver=False)
    namespace = f"riqr-freeze-{uuid.uuid4().hex[:8]}"
    deployment = deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0))
    url = deployment.endpoints[0].url
    registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
    specs = {
        name: StoreSpec(
            name, KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=4, actors=2, standbys=standbys
        )  # fmt: skip
        for name, standbys in (("solo", 0), ("pair", 1))
    }
    stop = threading.Event()
    try:
        tables: dict[str, Any] = {}
        for name, spec in specs.items():
            view = raycalls.get(registry.create_store.remote(spec), "create_store")
            tables[name] = view.tables[name]
        deliveries = {name: BatchDelivery(spec, namespace, checkpoint="unused") for name, spec in specs.items()}
        history: dict[int, set[int]] = {u: {u * 10} for u in USERS}
        for name, delivery in deliveries.items():
            delivery.deliver("q", 0, user_scores(tables[name], {u: u * 10 for u in USERS}))
        for name in specs:
            while http_get(f"{url}/stores/{name}/approximate-num-entries")[1] != {"result": len(USERS)}:
                time.sleep(0.1)
        gets: list[Get] = []
        scanned: list[Get] = []  # with ``scans``: body None for a whole and right answer (or not a 200)

        def write() -> None:
            rng, batch_id = random.Random(7), 1
            while not stop.is_set():
                values = {u: u * 10 + batch_id * 100_000 for u in rng.sample(USERS, 20)}
                for u, v in values.items():  # known before it is delivered: no read can see an unknown value
                    history[u].add(v)
                for name, delivery in deliveries.items():
                    delivery.deliver("q", batch_id, user_scores(tables[name], values))
                batch_id += 1
                stop.wait(0.05)

        def read(store: str, u: int) -> None:
            started = time.monotonic()
            if scans:
                status, body = http_get(f"{url}/stores/{store}/all")
                got = {e["key"]: e["value"] for e in body["result"]} if status == 200 else {}
                whole = status != 200 or (sorted(got) == USERS and all(v in history[k] for k, v in got.items()))
                scanned.append(Get(store, -1, started, time.monotonic(), status, None, None if whole else body))
                return
            status, body = http_get(f"{url}/stores/{store}/get/{u}")
            value = body["response"] if status == 200 and isinstance(body, dict) else None
            gets.append(Get(store, u, started, time.monotonic(), status, value, body if value is None else None))

        def pace(store: str, seed: int) -> None:
            # Open loop, as a service's clients are: GETs start at the rate whatever the earlier ones wait for
            # (a closed loop of a few readers would all sit on the frozen actor and start nothing more).
            rng, gap = random.Random(seed), 1.0 / rate
            with ThreadPoolExecutor(max_workers=1000) as pool:
                due = time.monotonic()
                while not stop.is_set():
                    pool.submit(read, store, rng.choice(USERS))
                    due += gap
                    stop.wait(max(0.0, due - time.monotonic()))

        threads = [threading.Thread(target=write, daemon=True)]
        threads += [threading.Thread(target=pace, args=(s, 11 + i), daemon=True) for i, s in enumerate(specs)]
        for t in threads:
            t.start()
        time.sleep(before)
        frozen: dict[str, set[int]] = {}
        pids = []
        for name, table in tables.items():
            victim = sorted(table.by_owner())[0]
            frozen[name] = set(table.by_owner()[victim])
            pids.append(worker_pid(ray.get_actor(victim, namespace=namespace)))
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        froze = time.monotonic()
        time.sleep(freeze)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        time.sleep(after)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        stop.set()
        deploy.down(namespace)
        ray.shutdown()

    if scans:
        _print_scans(scanned, tables, freeze, rate, froze, thawed)
        return
    print(f"\na query actor of each store frozen (SIGSTOP) for {freeze:g}s under load ({rate:g} GETs/s a store, open "
          "loop; a batch every 50 ms); GETs started while it was frozen")  # fmt: skip
    print(f"{'store':<6}{'partitions':<12}{'GETs':>6}{'200':>6}{'503':>6}{'504':>6}{'other':>6}"
          f"{'p50 s':>8}{'p99 s':>8}{'max s':>8}")  # fmt: skip
    for name, table in tables.items():
        for label, mine in (("frozen", True), ("others", False)):
            window = [g for g in gets if g.store == name and froze <= g.started < thawed
                      and (table.partition_of(g.user) in frozen[name]) == mine]  # fmt: skip
            _print_row(name, label, window)
    wrong = judged(gets, history)
    print(f"wrong answers in the whole run: {len(wrong)} of {len(gets)} GETs")
    for example in wrong[:5]:
        print(f"    wrong: {example}")


def _print_row(store: str, label: str, window: list[Get]) -> None:
    """One line of a table: the reads in ``window``, by status, and their time to an answer."""
    statuses = Counter(g.status for g in window)
    took = [g.ended - g.started for g in window]
    other = len(window) - statuses[200] - statuses[503] - statuses[504]
    print(f"{store:<6}{label:<12}{len(window):>6}{statuses[200]:>6}{statuses[503]:>6}{statuses[504]:>6}"
          f"{other:>6}{statistics.median(took) if took else float('nan'):>8.3f}{_quantile(took, 0.99):>8.3f}"
          f"{max(took, default=float('nan')):>8.3f}")  # fmt: skip


def _print_scans(scanned: list[Get], tables: dict[str, Any], freeze: float, rate: float, froze: float,
                 thawed: float) -> None:  # fmt: skip
    print(f"\na query actor of each store frozen (SIGSTOP) for {freeze:g}s under load ({rate:g} whole scans/s a "
          "store, open loop; a batch every 50 ms)")  # fmt: skip
    print(f"{'store':<6}{'scans':<12}{'count':>6}{'200':>6}{'503':>6}{'504':>6}{'other':>6}"
          f"{'p50 s':>8}{'p99 s':>8}{'max s':>8}")  # fmt: skip
    for name in tables:
        for label, (lo, hi) in (("before", (float("-inf"), froze)), ("frozen", (froze, thawed))):
            _print_row(name, label, [g for g in scanned if g.store == name and lo <= g.started < hi])
    wrong = [g for g in scanned if g.body is not None]
    print(f"wrong or partial answers in the whole run: {len(wrong)} of {len(scanned)} scans")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--freeze", type=float, default=6.0, help="seconds the actors stay frozen")
    parser.add_argument("--before", type=float, default=3.0, help="seconds of load before the freeze")
    parser.add_argument("--after", type=float, default=4.0, help="seconds of load after it")
    parser.add_argument("--rate", type=float, default=100.0, help="reads a second per store, started on time")
    parser.add_argument("--scans", action="store_true", help="whole scans instead of key lookups")
    args = parser.parse_args()
    run(args.freeze, args.before, args.after, args.rate, args.scans)


if __name__ == "__main__":
    main()
