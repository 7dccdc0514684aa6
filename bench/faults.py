"""Benchmark: query actors killed under load, restarted actors' restore time, and a node lost under load.

    .venv/bin/python -m bench.faults [--scenario kills,nodes] [--duration 60] [--every 10] [--engine rocksdb]
                                     [--sizes 100000,1000000] [--standbys 0,1] [--readers 4]
                                     [--before 10] [--after 30]

Scenario 1 (``kills``) runs the real food-orders topology on a local Ray and Spark: a writer produces orders
for 12 keys every 0.3 s, ``--readers`` readers GET their counts as fast as each goes, and every ``--every``
seconds one of ``order-count``'s two query actors is killed, alternately with ``ray.kill`` (Ray restarts it)
and with SIGKILL of its worker process. Every answer is checked against what was produced: a count that
exceeds the orders produced for its key, goes backwards for the same reader, or a 404 for a key with orders
is a wrong answer; a 503 is honest but not an answer. Per kill it times until the registry promoted a
standby for the victim's partitions (with standbys) and until the victim runs again with every copy it
holds serving (restore). Afterwards every count must equal what was produced, and the feeding query must
still be running. The baseline is the same load with no kill, in the same run.

Scenario 2 (with ``kills``; ``--sizes ""`` skips it) loads one partition with N keys on each engine, kills
its actor, and times until the restarted actor answers a read again: the restore time per partition size.

Scenario 3 (``nodes``) removes a node under load, once per ``--standbys`` count, each in a process of its
own on a three-node ``ray.cluster_utils.Cluster`` (``scenario_node_loss``).

"Answered %" is correct answers over requests; the "longest gap" is the longest time one reader went without
a correct answer (slow answers count, not only 503s); "key dark" is the longest a key went from a request
not answered correctly to its next correct answer.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import key_name

__all__ = ["Ledger", "write_orders", "read_counts", "worker_pid", "SEED_ORDER_COUNTS"]

SEED_ORDER_COUNTS = {"": 1, "1": 1, "2": 1}
KEYS = [str(i) for i in range(1, 13)]


@dataclass(frozen=True)
class Read:
    """One GET as its client saw it: which reader sent it, for which key, when (monotonic seconds), the status,
    and whether the answer was correct (a 503 or 504 is honest but not correct)."""

    reader: int
    key: str
    started: float
    ended: float
    status: int
    correct: bool


@dataclass
class OwnDisks:
    """riqr deployed on a ``ray.cluster_utils.Cluster`` in this process whose nodes each keep their data
    under a directory of their own, as real nodes' disks (``start_on_own_disks``); ``close`` ends it all."""

    cluster: Any
    data: Path
    namespace: str
    workers: list[Any] = field(default_factory=list)
    url: str = ""  # the head node's REST API
    registry: Any = None

    def add_node(self) -> Any:
        """A node with a data directory of its own (its raylet, and so its actors, inherit ``RIQR_DATA``)."""
        os.environ["RIQR_DATA"] = str(self.data / f"node{len(self.workers) + 1}")
        node = self.cluster.add_node(num_cpus=1)
        self.workers.append(node)
        return node

    def close(self) -> None:
        from verticles import deploy

        try:
            deploy.down(self.namespace)
        finally:
            import ray

            ray.shutdown()
            self.cluster.shutdown()


def start_on_own_disks(prefix: str, workers: int) -> OwnDisks:
    """A head and ``workers`` nodes of one CPU each, joined by this process in a new namespace, with riqr
    deployed (REST API on 127.0.0.1 on every node)."""
    import ray
    from ray.cluster_utils import Cluster

    from runtime.config import REGISTRY_NAME, RuntimeConfig
    from verticles import deploy

    data = Path(tempfile.mkdtemp(prefix=f"{prefix}-data-"))
    os.environ["RIQR_DATA"] = str(data / "head")
    on = OwnDisks(
        Cluster(initialize_head=True, head_node_args={"num_cpus": 1}), data, f"{prefix}-{uuid.uuid4().hex[:8]}"
    )
    for _ in range(workers):
        on.add_node()
    on.cluster.wait_for_nodes()
    ray.init(address=on.cluster.address, namespace=on.namespace, log_to_driver=False, configure_logging=False)
    try:
        deployment = deploy.up(
            RuntimeConfig(namespace=on.namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1")
        )
        head = str(ray.get_runtime_context().get_node_id())
        on.url = next(ep.url for ep in deployment.endpoints if ep.node_id == head)
        on.registry = ray.get_actor(REGISTRY_NAME, namespace=on.namespace)
    except BaseException:
        on.close()
        raise
    return on


def longest_gap(correct_ends: Iterable[float], opened: float, closed: float) -> float:
    """The longest stretch of ``[opened, closed]`` in which no correct answer arrived, for one client whose
    correct answers arrived at ``correct_ends``. A slow request counts as much as a run of 503s: the client
    waited either way."""
    last, longest = opened, 0.0
    for at in sorted(correct_ends):
        longest = max(longest, at - last)
        last = max(last, at)
    return max(longest, closed - last)


def longest_dark_key(reads: Iterable[Read], closed: float) -> float:
    """The longest time a key stayed unanswered: from the start of a request for it that was not answered
    correctly to the end of the next one that was (or to ``closed`` if none was)."""
    dark_since: dict[str, float] = {}
    longest = 0.0
    for r in sorted(reads, key=lambda r: r.ended):
        if r.correct:
            since = dark_since.pop(r.key, None)
            if since is not None:
                longest = max(longest, r.ended - since)
        else:
            dark_since.setdefault(r.key, r.started)
    return max([longest, *(closed - since for since in dark_since.values())])


def first_correct_after(reads: Iterable[Read], at: float, keys: Collection[str]) -> float | None:
    """Seconds from ``at`` to the first correct answer for one of ``keys`` to a request sent after ``at``."""
    ends = [r.ended for r in reads if r.started >= at and r.key in keys and r.correct]
    return min(ends) - at if ends else None


def summarize(reads: Sequence[Read], opened: float, closed: float) -> dict[str, Any]:
    """What the readers saw in ``[opened, closed]``: requests, answered % (correct answers / requests), 503s
    and 504s, the longest gap of any one reader, the slowest request, and the longest a key stayed dark."""
    by_reader: dict[int, list[float]] = {}
    for r in reads:
        by_reader.setdefault(r.reader, [])
        if r.correct:
            by_reader[r.reader].append(r.ended)
    statuses = Counter(r.status for r in reads)
    correct = sum(1 for r in reads if r.correct)
    return {
        "requests": len(reads),
        "correct": correct,
        "answered_pct": 100.0 * correct / len(reads) if reads else 0.0,
        "503": statuses[503],
        "504": statuses[504],
        "longest_gap_s": max((longest_gap(ends, opened, closed) for ends in by_reader.values()), default=0.0),
        "slowest_s": max((r.ended - r.started for r in reads), default=0.0),
        "longest_dark_key_s": longest_dark_key(reads, closed) if reads else 0.0,
    }


@dataclass
class Ledger:
    """What was produced (per key, cumulative) and what readers saw, with the wrong answers spelled out.

    Each reader sends one request at a time, and riqr's reads are monotonic per facade, so a count going
    backwards is judged per reader: two readers' answers may arrive in another order than they were served.
    """

    produced: Counter[str] = field(default_factory=lambda: Counter(SEED_ORDER_COUNTS))
    lock: threading.Lock = field(default_factory=threading.Lock)
    reads: list[Read] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    last_seen: dict[tuple[int, str], int] = field(default_factory=dict)
    # What failed inside the load's own threads (a writer that could not write, a reader that broke): a load
    # that stopped unseen would leave a fault unexercised, so its user checks this is empty.
    errors: list[str] = field(default_factory=list)

    @property
    def answers(self) -> Counter[int]:
        """How many answers of each HTTP status the readers got so far."""
        return Counter(r.status for r in list(self.reads))

    @property
    def longest_gap(self) -> float:
        """The longest a key went without a correct answer so far (``longest_dark_key`` up to the last
        answer)."""
        reads = list(self.reads)
        return longest_dark_key(reads, max(r.ended for r in reads)) if reads else 0.0

    def record(self, key: str, status: int, body: Any, *, started: float, ended: float, reader: int = 0) -> bool:
        """Judge one answer; True if it was correct."""
        with self.lock:
            produced = self.produced[key]
        seen = self.last_seen.get((reader, key))
        correct = False
        if status == 200:
            count = body.get("response") if isinstance(body, dict) else None
            if not isinstance(count, int) or isinstance(count, bool):
                self.wrong.append(f"key {key}: a 200 without a count: {body!r}"[:300])
            elif count > produced or count < (seen or 0):
                self.wrong.append(f"key {key}: {count} after {seen}, produced {produced}")
            else:
                correct = True
            if isinstance(count, int):
                self.last_seen[(reader, key)] = count
        elif status == 404:
            # A key whose first order is still on its way is fresh news, not lost data: a 404 is wrong only
            # for a key that was answered before (or is in the seed, loaded before the readers started).
            if seen is not None or key in SEED_ORDER_COUNTS:
                self.wrong.append(f"key {key}: 404 although it was {seen if seen is not None else 'seeded'}")
            else:
                correct = True
        elif status not in (503, 504):
            self.wrong.append(f"key {key}: status {status} {body}")
        self.reads.append(Read(reader, key, started, ended, status, correct))
        return correct


def write_orders(
    home: Path, ledger: Ledger, stop: threading.Event, interval: float = 0.3, keys: Sequence[str] = KEYS
) -> None:
    """Produce five orders for random ``keys`` every ``interval`` seconds until ``stop``."""
    from runtime.landing import parse_console_lines, write_records

    rng = random.Random(7)
    choices = list(keys)
    while not stop.is_set():
        ordered = [rng.choice(choices) for _ in range(5)]
        try:
            with ledger.lock:
                write_records(home, "order", parse_console_lines([f"{k}--dish" for k in ordered]))
                ledger.produced.update(ordered)
        except Exception as err:  # recorded, and the load goes on: its user fails on ``ledger.errors``
            ledger.errors.append(f"writing orders: {type(err).__name__}: {err}")
        stop.wait(interval)


def http_get(url: str, timeout: float = 30.0) -> tuple[int, Any]:
    """Status and decoded JSON body of a GET (errors included: a 503 is an answer here)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")
    except OSError as err:  # the client's own timeout or a refused connection: no answer
        return 599, repr(err)


def user_scores(table: Any, values: Mapping[int, int]) -> Any:
    """A batch of the node-loss and moves benches' store (user -> score): each user's score, and its
    partition in ``table`` (an ``OwnershipTable``), as the sink shapes a batch."""
    import pyarrow as pa

    from runtime.ingest import PARTITION_COLUMN

    users = list(values)
    return pa.table(
        {
            "user": pa.array(users, pa.int64()),
            "score": pa.array([values[u] for u in users], pa.int64()),
            PARTITION_COLUMN: pa.array([table.partition_of(u) for u in users], pa.int32()),
        }
    )


def judge_score(status: int, body: Any, known: Collection[int], last: int | None) -> tuple[int | None, str | None]:
    """A GET of a user's score, judged: ``(score, None)`` when right (a score written, and never older than
    ``last``, the last one this reader saw); ``(None, why)`` when wrong; ``(None, None)`` for an honest 503
    or 504."""
    if status == 200:
        got = body["response"]
        if got not in known or got < (last or 0):
            return None, f"{got} after {last}"
        return got, None
    if status in (503, 504):
        return None, None
    return None, f"status {status} {body}"


def read_counts(
    url: str, ledger: Ledger, stop: threading.Event, reader: int = 0, pause: float = 0.0, keys: Sequence[str] = KEYS
) -> None:
    """GET the order counts of random ``keys`` until ``stop``, recording every answer in ``ledger``; one
    after the other, ``pause`` seconds apart."""
    rng = random.Random(11 + reader)
    choices = list(keys)
    while not stop.is_set():
        key = rng.choice(choices)
        started = time.monotonic()
        try:
            status, body = http_get(f"{url}/stores/order-count/get/{key}")
            ledger.record(key, status, body, started=started, ended=time.monotonic(), reader=reader)
        except Exception as err:  # a body that is not JSON, say: recorded, and the reader reads on
            ledger.errors.append(f"reading {key}: {type(err).__name__}: {err}"[:300])
            stop.wait(0.05)
        if pause:
            stop.wait(pause)


def worker_pid(handle: Any) -> int:
    """The pid of the worker process running an actor (to SIGKILL it)."""
    import ray

    return int(ray.get(handle.__ray_call__.remote(lambda self: os.getpid())))


def _pid_and_positions(self: Any) -> tuple[int, dict[int, dict[str, Any]]]:  # runs in the query actor
    import os

    return os.getpid(), self.positions()


def watch_kill(
    registry: Any, store: str, handle: Any, victim: str, old_pid: int, killed_at: float, *, promote: bool,
    limit: float = 60.0,
) -> dict[str, float | None]:  # fmt: skip
    """After a kill at ``killed_at``: seconds until the registry's view has no partition of ``store`` whose
    active is ``victim`` (when ``promote``: a standby was promoted), and until the victim runs again (another
    pid) with every copy it holds serving (its replicas restored). None for what did not happen in ``limit``."""
    import ray

    promoted: float | None = None
    restored: float | None = None
    while time.monotonic() - killed_at < limit and (restored is None or (promote and promoted is None)):
        if promote and promoted is None:
            try:
                table = ray.get(registry.view.remote(), timeout=5).tables[store]
                if all(owners.active != victim for owners in table.partitions):
                    promoted = time.monotonic() - killed_at
            except Exception:
                pass
        if restored is None:
            try:
                pid, positions = ray.get(handle.__ray_call__.remote(_pid_and_positions), timeout=2)
                if pid != old_pid and positions and all(p["state"] == "serving" for p in positions.values()):
                    restored = time.monotonic() - killed_at
            except Exception:
                pass
        time.sleep(0.02)
    return {"promoted_s": promoted, "restored_s": restored}


def scenario_kills(
    spark: Any, duration: float, every: float, engine: str, *, kill: bool, standbys: int | None = None,
    readers: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """One run of scenario 1 (``standbys`` copies of each partition; None: riqr's default); its figures."""
    import ray

    from runtime.config import REGISTRY_NAME, RuntimeConfig
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
        registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
        start_view: Any = ray.get(registry.view.remote())
        has_standbys = any(o.standbys for o in start_view.tables["order-count"].partitions)
        ledger, stop = Ledger(), threading.Event()
        threads = [threading.Thread(target=write_orders, args=(home, ledger, stop), daemon=True)] + [
            threading.Thread(target=read_counts, args=(url, ledger, stop, i), daemon=True) for i in range(readers)
        ]
        opened = time.monotonic()
        for t in threads:
            t.start()
        kills: list[dict[str, float | None]] = []
        watchers: list[threading.Thread] = []
        next_kill = opened + every
        while time.monotonic() - opened < duration:
            time.sleep(0.1)
            if kill and time.monotonic() >= next_kill:
                name = owners[len(kills) % len(owners)]
                victim = ray.get_actor(name, namespace=namespace)
                old_pid = worker_pid(victim)
                if len(kills) % 2 == 0:
                    ray.kill(victim, no_restart=False)
                else:
                    os.kill(old_pid, signal.SIGKILL)
                killed_at = time.monotonic()
                figures: dict[str, float | None] = {}
                kills.append(figures)

                def watch(
                    figures: dict[str, float | None] = figures,
                    args: tuple[Any, ...] = (victim, name, old_pid, killed_at),
                ) -> None:
                    figures.update(watch_kill(registry, "order-count", *args, promote=has_standbys))

                watchers.append(threading.Thread(target=watch, daemon=True))
                watchers[-1].start()
                print(f"  kill {len(kills)} at {killed_at - opened:.0f}s", file=sys.stderr, flush=True)
                next_kill += every
        stop.set()
        closed = time.monotonic()
        for t in threads + watchers:
            t.join(timeout=60)
        converged = True
        try:
            wait_until(
                lambda: all(orders.get(k) == n for k, n in ledger.produced.items()), 60, "counts equal to produced"
            )
        except TimeoutError:
            converged = False
        return {
            **summarize(ledger.reads, opened, closed),
            "wrong": len(ledger.wrong),
            "wrong_examples": ledger.wrong[:5],
            "kills": len(kills),
            "restored_s": [k.get("restored_s") for k in kills],
            "promoted_s": [k.get("promoted_s") for k in kills] if has_standbys else [],
            "converged": converged,
            "queries_alive": all(q.isActive for q in queries),
        }
    finally:
        for q in queries:
            q.stop()
        deploy.down(namespace)


def median_max(values: Sequence[float | None]) -> str:
    """``median / max`` of the values, with how many never happened; ``-`` for none."""
    done = [v for v in values if v is not None]
    if not values:
        return "-"
    text = f"{statistics.median(done):.2f} / {max(done):.2f}" if done else "never"
    missing = len(values) - len(done)
    return text + (f" ({missing} never)" if missing and done else "")


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
    out: list[tuple[str, int, float, float]] = []
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


NODE_USERS = list(range(300))


def _node_of(self: Any) -> str:  # runs in an actor
    import ray

    return str(ray.get_runtime_context().get_node_id())


def scenario_node_loss(standbys: int, before: float, after: float, readers: int) -> dict[str, Any]:
    """Scenario 3, in a process of its own: a three-node ``Cluster`` (each node with its own data directory),
    a store of 6 partitions on 3 actors (one per node, ``standbys`` copies), a writer delivering a batch of 20
    users every 50 ms, ``readers`` readers GETting from the head node's REST API; after ``before`` seconds the
    node holding one actor (not the head, not the registry's) is removed, and the run goes on ``after`` more
    seconds. Every answer must be a value the writer wrote for that user, never older than one the same reader
    saw; at the end every serving copy must hold exactly the latest values."""
    import pyarrow as pa
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.codec import decode_value
    from runtime.keys import KeySchema
    from runtime.scan import Scan
    from topologies.delivery import BatchDelivery

    on = start_on_own_disks("riqr-nodes", workers=2)
    cluster, namespace, url, registry, workers = on.cluster, on.namespace, on.url, on.registry, on.workers
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        registry_node = str(ray.get(registry.__ray_call__.remote(_node_of)))
        spec = StoreSpec(
            "survivor", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=6, actors=3,
            standbys=standbys,
        )  # fmt: skip
        view = raycalls.get(registry.create_store.remote(spec), "create_store")
        table = view.tables[spec.name]
        mine = {u: info for u, info in view.actors.items() if info.store == spec.name}
        node = next(w for w in workers if w.node_id != registry_node)
        gone = node.node_id
        (lost,) = [u for u, info in mine.items() if info.node_id == gone]
        lost_keys = {str(u) for u in NODE_USERS if table.partitions[table.partition_of(u)].active == lost}

        delivery = BatchDelivery(spec, namespace, checkpoint="unused")
        history: dict[int, set[int]] = {u: {u * 10} for u in NODE_USERS}
        latest = {u: u * 10 for u in NODE_USERS}

        def batch(values: dict[int, int]) -> pa.Table:
            return user_scores(table, values)

        delivery.deliver("q", 0, batch(latest))
        deadline = time.monotonic() + 120
        while http_get(f"{url}/stores/{spec.name}/approximate-num-entries")[1] != {"result": len(NODE_USERS)}:
            if time.monotonic() > deadline:
                raise TimeoutError("the store loaded and visible")
            time.sleep(0.1)

        reads: list[Read] = []
        wrong: list[str] = []
        ingest: dict[str, Any] = {"delivered": 0, "errors": [], "slowest_s": 0.0, "at_removal": 0}

        def write() -> None:
            rng = random.Random(7)
            batch_id = 1
            values: dict[int, int] = {}
            while not stop.is_set():
                if not values:  # a batch that failed is delivered again as it was, as Spark retries one
                    values = {u: u * 10 + batch_id * 100_000 for u in rng.sample(NODE_USERS, 20)}
                    for u, v in values.items():  # known before it is delivered: no read can see an unknown value
                        history[u].add(v)
                started = time.monotonic()
                try:
                    delivery.deliver("q", batch_id, batch(values))
                except Exception as err:
                    ingest["errors"].append(f"batch {batch_id}: {err!r}")
                    stop.wait(1.0)
                    continue
                latest.update(values)
                values = {}
                ingest["slowest_s"] = max(ingest["slowest_s"], time.monotonic() - started)
                ingest["delivered"] = batch_id
                batch_id += 1
                stop.wait(0.05)

        def read(reader: int) -> None:
            rng = random.Random(11 + reader)
            seen: dict[int, int] = {}
            while not stop.is_set():
                u = rng.choice(NODE_USERS)
                started = time.monotonic()
                status, body = http_get(f"{url}/stores/{spec.name}/get/{u}")
                ended = time.monotonic()
                got, why = judge_score(status, body, history[u], seen.get(u))
                if why is not None:
                    wrong.append(f"user {u}: {why}")
                if got is not None:
                    seen[u] = got
                reads.append(Read(reader, str(u), started, ended, status, got is not None))

        threads += [threading.Thread(target=write, daemon=True)] + [
            threading.Thread(target=read, args=(i,), daemon=True) for i in range(readers)
        ]
        opened = time.monotonic()
        for t in threads:
            t.start()
        stop.wait(before)
        print(f"  removing node {gone[:8]} (query actor {lost[:8]}, {len(lost_keys)} of {len(NODE_USERS)} users)",
              file=sys.stderr, flush=True)  # fmt: skip
        ingest["at_removal"] = ingest["delivered"]
        removed_at = time.monotonic()
        cluster.remove_node(node)
        remove_took = time.monotonic() - removed_at

        marks: dict[str, float | None] = {"promoted_s": None, "moved_s": None, "restored_s": None}
        while time.monotonic() - removed_at < after:
            now = time.monotonic() - removed_at
            try:
                current = ray.get(registry.view.remote(), timeout=5)
                if marks["promoted_s"] is None and all(o.active != lost for o in current.tables[spec.name].partitions):
                    marks["promoted_s"] = now
                if marks["moved_s"] is None and current.actors[lost].node_id != gone:
                    marks["moved_s"] = now
            except Exception:
                pass
            if marks["moved_s"] is not None and marks["restored_s"] is None:
                try:  # by name: the re-created actor is another Ray actor under the same name
                    handle = ray.get_actor(lost, namespace=namespace)
                    positions: Any = ray.get(handle.positions.remote(), timeout=2)
                    if positions and all(p["state"] == "serving" for p in positions.values()):
                        marks["restored_s"] = time.monotonic() - removed_at
                except Exception:
                    pass
            time.sleep(0.05)
        stop.set()
        closed = time.monotonic()
        for t in threads:
            t.join(timeout=90)

        # Lost records: every copy that says it serves must hold exactly the latest value of each of its keys.
        final = ray.get(registry.view.remote(), timeout=30)
        lost_records, unchecked = 0, []
        for u, held in final.tables[spec.name].all_owners().items():
            try:
                actor = ray.get_actor(u, namespace=namespace)
                positions = ray.get(actor.positions.remote(), timeout=30)
            except Exception as err:
                unchecked.append(f"{u[:8]}: {type(err).__name__}")
                continue
            for p in held:
                if positions[p]["state"] != "serving":
                    unchecked.append(f"{u[:8]} p{p}: {positions[p]['state']}")
                    continue
                entries, _ = ray.get(actor.scan.remote([p], Scan()), timeout=60)
                copy = {k: decode_value(v) for k, v in entries}
                expected = {k: v for k, v in latest.items() if table.partition_of(k) == p}
                lost_records += sum(1 for k, v in expected.items() if copy.get(k) != v)
                lost_records += sum(1 for k in copy if k not in expected)
        after_reads = [r for r in reads if r.started >= removed_at]
        return {
            "standbys": standbys,
            **summarize(reads, opened, closed),
            "after": summarize(after_reads, removed_at, closed),
            "wrong": len(wrong),
            "wrong_examples": wrong[:5],
            "lost_keys": len(lost_keys),
            "first_lost_ok_s": first_correct_after(reads, removed_at, lost_keys),
            "remove_took_s": remove_took,
            **marks,
            "window_s": after,
            "batches": ingest["delivered"],
            "batches_after_removal": ingest["delivered"] - ingest["at_removal"],
            "ingest_errors": len(ingest["errors"]),
            "ingest_error_examples": ingest["errors"][:3],
            "slowest_batch_s": ingest["slowest_s"],
            "lost_records": lost_records,
            "copies_not_serving": unchecked,
        }
    finally:
        stop.set()  # a thread calling Ray after ray.shutdown would start a Ray of its own
        for t in threads:
            t.join(timeout=90)
        on.close()


def _fmt(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def run_node_loss(standbys: list[int], before: float, after: float, readers: int) -> list[dict[str, Any]]:
    """Scenario 3 once per standby count, each in a process of its own (a ``Cluster`` cannot share a
    process with another Ray), and the figures each printed."""
    import json
    import subprocess

    out = []
    for n in standbys:
        print(f"node loss, {n} standby: {before:g}s of load, then a node removed, {after:g}s more",
              file=sys.stderr, flush=True)  # fmt: skip
        argv = [sys.executable, "-m", "bench.faults", "--scenario", "node-run", "--standbys", str(n),
                "--before", str(before), "--after", str(after), "--readers", str(readers)]  # fmt: skip
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=before + after + 600, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the node-loss run with {n} standby failed (exit {done.returncode})")
        out.append(json.loads(lines[-1][len("RESULT ") :]))
    return out


def print_kills(runs: list[tuple[str, dict[str, Any]]], engine: str, duration: float, readers: int) -> None:
    print(f"\nscenario 1: order-count under GET load ({readers} readers), {engine} engine, {duration:g}s")
    print(f"{'run':<14}{'requests':>9}{'req/s':>7}{'answered %':>11}{'wrong':>6}{'503s':>6}{'kills':>6}"
          f"{'longest gap s':>14}{'slowest s':>10}{'key dark s':>11}{'promoted s (med/max)':>22}"
          f"{'restore s (med/max)':>21}{'converged':>10}{'alive':>6}")  # fmt: skip
    for name, r in runs:
        print(
            f"{name:<14}{r['requests']:>9}{r['requests'] / duration:>7.0f}{r['answered_pct']:>10.3f}%{r['wrong']:>6}"
            f"{r['503']:>6}{r['kills']:>6}{r['longest_gap_s']:>14.2f}{r['slowest_s']:>10.2f}"
            f"{r['longest_dark_key_s']:>11.2f}{median_max(r['promoted_s']):>22}{median_max(r['restored_s']):>21}"
            f"{r['converged']!s:>10}{r['queries_alive']!s:>6}"
        )
        for example in r["wrong_examples"]:
            print(f"    wrong: {example}")


def print_node_loss(runs: list[dict[str, Any]], before: float, after: float, readers: int) -> None:
    print(f"\nscenario 3: a node removed under load ({readers} readers, a batch every 50 ms), 3 nodes, 6 partitions "
          f"on 3 actors; {before:g}s before the removal, {after:g}s after")  # fmt: skip
    print(f"{'standbys':<9}{'requests':>9}{'answered %':>11}{'after %':>9}{'wrong':>6}{'503s':>6}{'504s':>6}"
          f"{'longest gap s':>14}{'slowest s':>10}{'key dark s':>11}{'first lost ok s':>16}{'promoted s':>11}"
          f"{'re-created s':>13}{'restored s':>11}{'batches after':>14}{'lost records':>13}")  # fmt: skip
    for r in runs:
        print(
            f"{r['standbys']:<9}{r['requests']:>9}{r['answered_pct']:>10.3f}%{r['after']['answered_pct']:>8.2f}%"
            f"{r['wrong']:>6}{r['503']:>6}{r['504']:>6}{r['longest_gap_s']:>14.2f}{r['slowest_s']:>10.2f}"
            f"{r['longest_dark_key_s']:>11.2f}{_fmt(r['first_lost_ok_s']):>16}{_fmt(r['promoted_s']):>11}"
            f"{_fmt(r['moved_s']):>13}{_fmt(r['restored_s']):>11}{r['batches_after_removal']:>14}"
            f"{r['lost_records']:>13}"
        )
        notes = [f"wrong: {w}" for w in r["wrong_examples"]] + [f"ingest: {e}" for e in r["ingest_error_examples"]]
        if r["copies_not_serving"]:
            notes.append(f"copies not serving at the end (not checked): {', '.join(r['copies_not_serving'])}")
        notes.append(f"{r['lost_keys']} of {len(NODE_USERS)} users on the lost actor; slowest batch "
                     f"{r['slowest_batch_s']:.2f}s, {r['ingest_errors']} ingest error(s); remove_node took "
                     f"{r['remove_took_s']:.2f}s")  # fmt: skip
        for note in notes:
            print(f"    {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="kills,nodes", help="kills (scenarios 1 and 2), nodes (scenario 3)")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--engine", default="rocksdb", choices=["rocksdb", "memory"])
    parser.add_argument("--sizes", default="100000,1000000", help="keys per partition for the restore timings")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the no-kill baseline")
    parser.add_argument(
        "--standbys", default="0,1", help="comma-separated standby counts: one run each (e.g. 0,1 to compare)"
    )
    parser.add_argument("--readers", type=int, default=4, help="concurrent GET loops")
    parser.add_argument("--before", type=float, default=10.0, help="node loss: seconds of load before the removal")
    parser.add_argument("--after", type=float, default=30.0, help="node loss: seconds of load after the removal")
    args = parser.parse_args()
    scenarios = set(args.scenario.split(","))
    standbys = [int(x) for x in args.standbys.split(",") if x]
    if "node-run" in scenarios:  # one node-loss run, in this process (run_node_loss starts it)
        import json

        print("RESULT " + json.dumps(scenario_node_loss(standbys[0], args.before, args.after, args.readers)))
        return
    runs: list[tuple[str, dict[str, Any]]] = []
    restores: list[tuple[str, int, float, float]] = []
    if "kills" in scenarios:
        runs, restores = run_kills(args, standbys)
        print_kills(runs, args.engine, args.duration, args.readers)
        if restores:
            print("\nscenario 2: after ray.kill (restart) of a one-partition actor: until it serves again, and the")
            print("part of it spent reopening the partition (the rest is Ray restarting the actor's process)")
            print(f"{'engine':<10}{'keys':>12}{'serving again s':>17}{'reopen s':>10}")
            for engine, size, secs, opened in restores:
                print(f"{engine:<10}{size:>12,}{secs:>17.2f}{opened:>10.3f}")
    if "nodes" in scenarios:
        nodes = run_node_loss(standbys, args.before, args.after, args.readers)
        print_node_loss(nodes, args.before, args.after, args.readers)


def run_kills(
    args: argparse.Namespace, standbys: list[int]
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, int, float, float]]]:
    """Scenarios 1 and 2 on a local Ray and Spark."""
    os.environ.setdefault("RIQR_DATA", tempfile.mkdtemp(prefix="riqr-faults-data-"))
    import ray

    from topologies.spark import spark_session

    ray.init(namespace="riqr-bench", log_to_driver=False, configure_logging=False)
    spark = spark_session("local[2]", app_name="riqr-faults", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        runs = []
        if not args.skip_baseline:
            print("baseline: the same load, no kill", file=sys.stderr)
            figures = scenario_kills(spark, args.duration, args.every, args.engine, kill=False, readers=args.readers)
            runs.append(("no kill", figures))
        for n in standbys:
            print(f"kills every {args.every:g}s for {args.duration:g}s ({args.engine} engine, {n} standby)",
                  file=sys.stderr)  # fmt: skip
            figures = scenario_kills(
                spark, args.duration, args.every, args.engine, kill=True, standbys=n, readers=args.readers
            )
            runs.append((f"kills, {n} sb", figures))
        sizes = [int(s) for s in args.sizes.split(",") if s]
        restores = []
        if sizes:
            print("restore time per partition size", file=sys.stderr)
            restores = scenario_restore(sizes, ["memory", "rocksdb"])
    finally:
        spark.stop()
        ray.shutdown()
    return runs, restores


if __name__ == "__main__":
    main()
