"""A topology process killed with SIGKILL under load, its Python driver and Spark's JVM at once, and started
again on its checkpoint: no acknowledged record is lost, none is counted twice, and no answer is wrong
meanwhile (a 503 is honest; a count that goes backwards, exceeds what was produced, or a store showing fewer
sessions than it had is not).

The topologies run as their users run them: ``python -m topologies.<name>`` in a process of its own (what
``ray job submit`` starts), joined to the session's Ray cluster, with a Spark of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.faults import KEYS
from bench.soak_cluster import alive, processes_under
from riqr.demo import SEED_CUSTOMERS as SEED_CUSTOMERS_LINES
from riqr.demo import SEED_ORDERS as SEED_ORDERS_LINES
from runtime import raycalls
from runtime.landing import Record, write_records
from tests.integration.conftest import REPO, SEED_ORDER_COUNTS, RayCluster, Runtime, deploy_runtime, produce
from tests.integration.helpers import (
    SessionReader,
    at,
    http_get,
    iso,
    orders_under_load,
    session_triples,
    wait_for,
    wait_for_every_order_counted,
)

pytestmark = pytest.mark.integration


class TopologyDied(AssertionError):
    """The topology process ended by itself: every wait on it ends at once, with its log."""


class TopologyProcess:
    """``python -m <module>`` (a topology's ``main``) on the session's cluster, in a process group of its
    own (the Python driver and Spark's JVM below it), its output in a log file kept for a failed test."""

    def __init__(self, module: str, cluster: RayCluster, runtime: Runtime, home: Path, *flags: str) -> None:
        # Dead letters every 10 s rather than 2: fewer micro-batches beside the store's on two cores.
        self.argv = [sys.executable, "-m", module, "--address", cluster.address, "--namespace", runtime.namespace,
                     "--home", str(home), "--master", "local[2]", "--dead-letter-trigger", "10 seconds",
                     *flags]  # fmt: skip
        self.logs = home / "topology-logs"
        self.logs.mkdir(exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0

    def start(self, *flags: str) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.started += 1
        with open(self.logs / f"run-{self.started}.log", "wb") as out:
            self.proc = subprocess.Popen(
                [*self.argv, *flags], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                env=os.environ | {"PYTHONPATH": str(REPO)},
            )  # fmt: skip

    def sigkill(self, tree: list[int] | None = None) -> None:
        """SIGKILL the whole process group at once (no handler runs, no last word to the registry), and make
        sure Spark's JVM went with it. ``tree``: the process's descendants, found beforehand (``processes_under``
        reads all of /proc: a kill meant to land inside a batch cannot wait for it)."""
        assert self.proc is not None and self.proc.poll() is None, self.log()
        tree = processes_under(self.proc.pid) if tree is None else tree
        assert tree, "the topology process started no JVM"
        os.killpg(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: not any(alive(p) for p in tree), timeout=30, what="the topology's JVM gone")

    def running(self) -> bool:
        """True while the process started last runs; raises ``TopologyDied`` if it ended by itself."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise TopologyDied(f"the topology process exited with {self.proc.returncode}:\n{self.log()}")
        return True

    def wait_for(self, condition: Callable[[], Any], what: str, **kwargs: Any) -> Any:
        """``wait_for(condition)`` that ends at once, with the process's log, if the topology died."""
        return wait_for(lambda: self.running() and condition(), what=what, fatal=(TopologyDied,), **kwargs)

    def log(self, tail: int | None = 6000) -> str:
        """The last run's output: its last ``tail`` characters (None: all of it)."""
        text = (self.logs / f"run-{self.started}.log").read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def kill(self) -> None:
        """SIGKILL whatever of it still runs."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM, as ``ray job stop`` sends it: the topology stops its queries and Spark; anything of it
        still alive 90 s later is SIGKILLed."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=90)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def runtime_ns(ray_cluster: RayCluster) -> Iterator[Runtime]:
    """One deployment for the module: its tests feed stores of their own (order-count and the customers',
    order-sessions) and look only at those."""
    from verticles import deploy

    runtime = deploy_runtime("riqr-kill9")
    yield runtime
    deploy.down(runtime.namespace)


def _caught_up(url: str, produced: dict[str, int]) -> Callable[[], bool]:
    """Whether every key's count has reached what was produced for it at the time this was made: the
    topology running now has fed everything produced before."""

    def check() -> bool:
        for key, count in produced.items():
            status, _, body = http_get(f"{url}/stores/order-count/get/{key}")
            if status != 200 or body["response"] < count:
                return False
        return True

    return check


def _ingest_state(url: str, store: str) -> str:
    """The state of ``store``'s feed in the catalog (``GET /stores``)."""
    return str({s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}[store]["ingest"]["state"])


def _split_batches(owners: dict[str, Any]) -> dict[str, dict[int, int]] | None:
    """Each owner's copies and their batch ids, if some owner holds copies at different batches: a batch
    is being delivered (standbys get it first, then actives; every copy gets every batch id). Each owner
    answers from one consistent look at its own copies. ``owners``: name -> actor handle (looked up once:
    this is polled every few milliseconds, beside the topology)."""
    import ray

    answers: list[dict[int, dict[str, Any]]] = ray.get([h.positions.remote() for h in owners.values()], timeout=10)
    batches = {name: {p: pos["batch_id"] for p, pos in a.items()} for name, a in zip(owners, answers)}
    return batches if any(len(set(b.values())) > 1 for b in batches.values()) else None


def test_food_orders_killed_with_sigkill_under_load_and_restarted_on_its_checkpoint_lose_nothing(
    ray_cluster: RayCluster, spark: Any, runtime_ns: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topology SIGKILLed while orders land every 0.3 s and counts are read, the moment a batch is seen
    half delivered (some copies have it, others not yet). Spark plays the interrupted batch again on
    restart and the copies that had it skip it: no answer is wrong meanwhile, and at the end every count is
    exactly what was produced. Before the kill, a second topology over another home asks for the store and
    is refused. Last, idle, its store is dropped with --force and at once declared again by another
    topology over input of its own: the old one ends by itself, and never feeds the new store."""
    url, ns = runtime_ns.url, runtime_ns.namespace
    topology = TopologyProcess(
        "topologies.food_orders", ray_cluster, runtime_ns, tmp_path, "--trigger", "200 milliseconds"
    )
    try:
        topology.start()
        produce(tmp_path, "customer", SEED_CUSTOMERS_LINES)
        produce(tmp_path, "order", SEED_ORDERS_LINES)
        topology.wait_for(_caught_up(url, SEED_ORDER_COUNTS), timeout=180, what="the seed's orders counted")
        import ray

        owners = {
            i["actor"]: ray.get_actor(i["actor"], namespace=ns)
            for i in http_get(f"{url}/metadata/stores/order-count")[2]["result"]
        }
        with orders_under_load(tmp_path, url, read_pause=0.02) as ledger:
            with ledger.lock:
                produced = dict(ledger.produced)
            topology.wait_for(_caught_up(url, produced), timeout=180, what="every order produced before counted")
            _a_second_feed_is_refused(spark, runtime_ns, tmp_path, monkeypatch)
            for attempt in range(1, 4):
                assert topology.proc is not None
                tree = processes_under(topology.proc.pid)
                split = topology.wait_for(lambda: _split_batches(owners), timeout=120, interval=0.005,
                                          what="a batch half delivered")  # fmt: skip
                topology.sigkill(tree)
                left_split = _split_batches(owners)  # still split: the kill fell inside the batch's delivery
                answered = ledger.answers[200]
                with ledger.lock:
                    produced_at_kill = sum(ledger.produced.values())

                def more_orders(than: int = produced_at_kill) -> bool:
                    with ledger.lock:
                        return sum(ledger.produced.values()) > than

                wait_for(more_orders, timeout=30, what="orders landing while no topology runs")
                topology.start()
                with ledger.lock:
                    produced = dict(ledger.produced)
                topology.wait_for(_caught_up(url, produced), timeout=180, what="the restarted topology feeding")
                # It took its stores back without waiting: the killed run's process gone from this host, it is
                # displaced at once ("had ended"), or the registry had called it stale already (a restart
                # slower than the bound). Never refused as if the killed run still fed them.
                restarted = topology.log(tail=None)
                assert "waiting up to" not in restarted and "fed by another topology" not in restarted, restarted
                print("the restart", "displaced the killed run" if "had ended" in restarted else "found it stale")
                # The reads go on after the restart (they were not just the ones before the kill).
                wait_for(lambda n=answered: ledger.answers[200] > n + 20, timeout=60, what="reads after the restart")
                if left_split is not None:
                    break
                print(f"kill {attempt} fell after the batch's delivery (copies were at {split}): again")
            else:
                pytest.fail("three kills, none inside a batch's delivery: the replay of a half-delivered batch "
                            "was not exercised")  # fmt: skip
        wait_for_every_order_counted(url, ledger)
        assert ledger.wrong == []
        print(f"killed with copies at {split}; right after the kill: {left_split}")
        # Every store of the topology came back: the customers' store too, fed by another query.
        assert http_get(f"{url}/stores/customer-v1-changelog/approximate-num-entries")[2] == {"result": 7}
        # The feed is the last process's, running; the killed ones had no last word to say.
        assert _ingest_state(url, "order-count") == "running"

        _dropped_and_declared_again(spark, runtime_ns, topology, tmp_path / "another")
    finally:
        topology.stop()


def _a_second_feed_is_refused(spark: Any, runtime: Runtime, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topology over ``home`` runs and feeds ``order-count``; the same topology started again over
    another home (another checkpoint: started twice by mistake) is refused before it touches anything,
    naming the one that feeds the store, which feeds on."""
    from runtime.errors import StoreInUse
    from topologies import sink
    from topologies.feeder import feeder_for
    from topologies.food_orders import CUSTOMER_STORE, ORDER_COUNT_STORE, order_counts_frame, store_frames
    from topologies.options import TopologyOptions, checkpoint_for

    url, ns = runtime.url, runtime.namespace
    monkeypatch.setattr(sink, "CLAIM_WAIT", 1.0)  # the other feed is heard every 2 s: it never lets go
    options = TopologyOptions(namespace=ns, trigger="200 milliseconds")
    second = home / "second"
    counts, _ = order_counts_frame(spark, second, options)
    feeding = os.path.realpath(checkpoint_for(home, ns, ORDER_COUNT_STORE))  # the feed's lineage
    refused = f"'order-count' is fed by another topology: .* from checkpoint {re.escape(feeding)}"
    with pytest.raises(StoreInUse, match=refused):
        sink.materialize(counts, store=ORDER_COUNT_STORE, key="key", value="count",
                         **options.sink(second, ORDER_COUNT_STORE))  # fmt: skip
    assert not [q for q in spark.streams.active if q.name.endswith(ORDER_COUNT_STORE)]
    assert not (checkpoint_for(second, ns, ORDER_COUNT_STORE) / "offsets").exists()  # never started
    ingest = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}[ORDER_COUNT_STORE]["ingest"]
    assert ingest["state"] == "running" and ingest["feeder"] != feeder_for(ns).id, ingest
    assert ingest["checkpoint"] == feeding
    # The whole topology over the second home: both its stores refused in one claim (the registry's
    # claim_feeds, all or none), both named, neither started nor held.
    before = {s["name"]: s["ingest"] for s in http_get(f"{url}/stores")[2]["result"]}
    pairs, _ = store_frames(spark, second, options)
    with pytest.raises(StoreInUse, match="2 of this topology's 2 stores are refused, so it feeds none") as both:
        sink.materialize_all(pairs)
    assert f"(1) store '{CUSTOMER_STORE}' is fed by another topology" in str(both.value)
    assert f"(2) store '{ORDER_COUNT_STORE}' is fed by another topology" in str(both.value)
    assert both.value.details["stores"] == [CUSTOMER_STORE, ORDER_COUNT_STORE]
    assert not [q for q in spark.streams.active if q.name.endswith((ORDER_COUNT_STORE, CUSTOMER_STORE))]
    assert not set(feeder_for(ns).live_stores()) & {CUSTOMER_STORE, ORDER_COUNT_STORE}
    after = {s["name"]: s["ingest"] for s in http_get(f"{url}/stores")[2]["result"]}
    for store in (CUSTOMER_STORE, ORDER_COUNT_STORE):
        assert (after[store]["feeder"], after[store]["checkpoint"]) == (
            before[store]["feeder"],
            before[store]["checkpoint"],
        ), after[store]


def _dropped_and_declared_again(spark: Any, runtime: Runtime, old: TopologyProcess, home: Path) -> None:
    """``old``, idle, has its store dropped with --force and declared again at once by another topology
    (here, in this process) over ``home``, whose orders (keys of their own) land and are counted and read
    all along. No batch fails the old topology: a look at its copies finds the store of that name another
    one, and it ends as for a failed query, without feeding it; its heartbeat and last words do not take
    over the new store's feed record. The new store never answers a key of the old input and ends holding
    exactly its own."""
    from topologies.feeder import feeder_for
    from topologies.food_orders import ORDER_COUNT_STORE, order_counts_frame
    from topologies.options import TopologyOptions
    from topologies.sink import materialize

    url, ns = runtime.url, runtime.namespace
    old_actors = {i["actor"] for i in http_get(f"{url}/metadata/stores/{ORDER_COUNT_STORE}")[2]["result"]}
    old_keys = sorted(set(KEYS) | (set(SEED_ORDER_COUNTS) - {""}))
    options = TopologyOptions(namespace=ns, trigger="200 milliseconds")
    counts, _ = order_counts_frame(spark, home, options)  # its rejects unread: no malformed order lands here
    new_keys = [f"n{i}" for i in range(8)]
    registry, this_feeder = runtime.registry(), feeder_for(ns).id
    old_answered, foreign_feeds, stop = list[str](), list[dict[str, Any]](), threading.Event()

    def watch(since: float) -> None:
        """Between reads of the old keys (asked after the drop returned: never answered from the old store's
        state), the registry's record of the store's feed, which from the drop on only this process feeds."""
        import ray

        while not stop.is_set():
            for key in old_keys:
                started = time.monotonic()
                status, _, body = http_get(f"{url}/stores/{ORDER_COUNT_STORE}/get/{key}")
                if status == 200 and started > since:
                    old_answered.append(f"{key}: {body}")
                feed = ray.get(registry.status.remote(), timeout=10)["ingest"].get(ORDER_COUNT_STORE)
                if feed is not None and feed["feeder"] != this_feeder:
                    foreign_feeds.append(feed)
            stop.wait(0.02)

    query = None
    with orders_under_load(home, url, read_pause=0.02, keys=new_keys) as ledger:
        raycalls.get(runtime.registry().drop_store.remote(ORDER_COUNT_STORE), "dropping order-count")
        dropped = time.monotonic()
        watcher = threading.Thread(target=watch, args=(dropped,), daemon=True)
        watcher.start()
        try:
            query = materialize(counts, store=ORDER_COUNT_STORE, key="key", value="count",
                                **options.sink(home, ORDER_COUNT_STORE))  # fmt: skip
            assert old.proc is not None and old.proc.wait(timeout=60) == 1, old.log()
            print(f"the idle topology ended {time.monotonic() - dropped:.1f}s after the drop and the new declaration")
            assert "store 'order-count' was dropped and declared again" in old.log(tail=None), old.log()
            new_actors = {i["actor"] for i in http_get(f"{url}/metadata/stores/{ORDER_COUNT_STORE}")[2]["result"]}
            assert new_actors and not new_actors & old_actors
            with ledger.lock:
                produced = dict(ledger.produced)
            wait_for(_caught_up(url, produced), timeout=60, what="the new store feeding")
            ingest = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}[ORDER_COUNT_STORE]["ingest"]
            assert (ingest["state"], ingest["feeder"]) == ("running", this_feeder), ingest
            wait_for(lambda: ledger.answers[200] > 20, what="reads answered by the new store")
        finally:
            stop.set()
            watcher.join(30)
    try:
        wait_for_every_order_counted(url, ledger)
        assert ledger.wrong == [] and old_answered == []
        # The old topology beat (every 2 s) and said its last words (failed) while it still took the store
        # for its own; none of it was taken as the new store's feed, even for a moment.
        assert foreign_feeds == [], foreign_feeds[:3]
        assert all(http_get(f"{url}/stores/{ORDER_COUNT_STORE}/get/{k}")[0] == 404 for k in old_keys)
    finally:
        if query is not None:
            query.stop()


SESSIONS = "order-sessions"


def _session_load(home: Path, stop: threading.Event, written: list[int]) -> None:
    """An order for a key of its own every 0.5 s, 40 s of event time after the last: each its own session,
    closed once a later order moves the watermark past its end."""
    while not stop.is_set():
        i = len(written)
        write_records(home, "order", [Record(f"load-{i:04d}", "dish", at(700 + 40 * i))])
        written.append(i)
        stop.wait(0.5)


def test_a_session_store_rebuilding_from_a_fresh_checkpoint_survives_a_sigkill_between_its_first_batches(
    ray_cluster: RayCluster, spark: Any, runtime_ns: Runtime, tmp_path: Path
) -> None:
    """A fresh checkpoint's batch 0 resets a session store's partitions but runs with no watermark, so they
    answer 503 until a batch that has one. The topology is SIGKILLed in that window, after Spark committed
    batch 0, while orders land and sessions are read. Started again, it finds the partitions still waiting
    for a watermark that its restarted query will not bring without new input, and rebuilds the store once
    more from a fresh checkpoint (``topologies.sink.plan_start``): the store never showed fewer sessions than
    it had, and lost none of the orders that landed meanwhile. Last, paused with SIGSTOP past the bound while
    another topology takes its store, and resumed, it ends without feeding the store again.

    The store is first fed from another home than the topology's, so the topology takes it over: without
    ``--take-over`` it is refused (exit 1) before it touches the store, which serves the first feed's sessions
    on; with it, it feeds, and every start after that passes it too (a start on its own checkpoint emptied
    by hand would be refused as well)."""
    from topologies.checkpoint import last_committed, last_planned
    from topologies.feeder import feeder_for
    from topologies.food_orders_windowed import materialize_sessions
    from topologies.options import TopologyOptions, checkpoint_for

    url = runtime_ns.url
    write_records(tmp_path, "order", [Record("alice", "pizza", at(0)), Record("alice", "soup", at(10)),
                                      Record("bob", "pasta", at(20)), Record("alice", "salad", at(70))])  # fmt: skip
    write_records(tmp_path, "order", [Record("carol", "tea", at(600))])  # moves the watermark on
    expected = {"alice": [(iso(0), iso(40), 2), (iso(70), iso(100), 1)], "bob": [(iso(20), iso(50), 1)]}

    def sessions(key: str) -> Any:
        status, _, body = http_get(f"{url}/stores/{SESSIONS}/sessions/{key}")
        return session_triples(body) if status == 200 else None

    # The store first fed by a query in this process (no JVM to start), as the topology's would, with its
    # checkpoint under another home than the topology's.
    options = TopologyOptions(namespace=runtime_ns.namespace, trigger="200 milliseconds")
    orders = options.read(spark, tmp_path, "order")[0]
    first = materialize_sessions(orders, tmp_path / "first", options, watermark="5 seconds")
    try:
        wait_for(lambda: all(sessions(k) == v for k, v in expected.items()), what="the closed sessions")
    finally:
        first.stop()

    # The topology's own checkpoint does not exist yet: its batch 0 resets the store's partitions. With a
    # 5-minute trigger, Spark runs batch 1 at the next whole 5 minutes of the clock, 0-300 s after batch 0
    # started: the kill falls between them unless batch 0 straddles such a boundary (a few seconds in 300;
    # with 30 s, one run in six or so had to start the topology again).
    topology = TopologyProcess("tests.integration.session_topology", ray_cluster, runtime_ns, tmp_path,
                               "--watermark", "5 seconds")  # fmt: skip
    checkpoint = checkpoint_for(tmp_path, runtime_ns.namespace, SESSIONS)

    # Another checkpoint's sessions in the store: not taken over unless said so.
    topology.start("--trigger", "5 minutes")
    assert topology.proc is not None and topology.proc.wait(timeout=180) == 1, topology.log()
    said = topology.log(tail=None)
    assert f"store '{SESSIONS}' holds what checkpoint {os.path.realpath(tmp_path / 'first')}" in said, said
    assert "--take-over" in said and "Traceback" not in said, said
    assert not (checkpoint / "offsets").exists()  # refused before its query started
    assert all(sessions(k) == v for k, v in expected.items())  # the store serves what it held
    assert _ingest_state(url, SESSIONS) == "stopped"  # the first feed's record, as it was

    def batch_0_done() -> str | None:
        """Where the new checkpoint is: "window" while Spark has committed batch 0 and the store's partitions
        wait for a watermark (503), "missed" once batch 1 ran, None before."""
        committed, planned = last_committed(str(checkpoint)), last_planned(str(checkpoint))
        if committed == 0 and planned == 0 and sessions("alice") is None:
            return "window"
        # Batch 1 planned (it would run again at the restart) or run.
        return "missed" if (planned or 0) >= 1 or (committed or 0) >= 1 else None

    stop, written = threading.Event(), list[int]()
    loader = threading.Thread(target=_session_load, args=(tmp_path, stop, written), daemon=True)
    try:
        loader.start()
        with SessionReader(url, SESSIONS, expected, pause=0.02) as reader:
            for attempt in range(3):
                topology.start("--trigger", "5 minutes", "--take-over")
                seen = topology.wait_for(batch_0_done, timeout=180, interval=0.02, what="batch 0 of the new checkpoint")
                if seen == "window":
                    topology.sigkill()
                    # The feed said so while the partitions waited (its last report before the kill; the
                    # registry calls it stale 6 s after the last heartbeat).
                    wait_for(
                        lambda: _ingest_state(url, SESSIONS) == "rebuilding", timeout=5, what="the feed rebuilding"
                    )
                    break
                topology.stop()  # and the checkpoint set aside: the next run starts from a fresh one again
                shutil.move(checkpoint, checkpoint.with_name(f"{SESSIONS}.missed-{attempt}"))
            else:
                pytest.fail("batch 1 came too soon after batch 0 to be seen between them, three times")
            # Killed between batch 0 and batch 1. Should Spark have planned batch 1 in the few milliseconds
            # between the look and the kill, the restart runs it again (with its watermark) and resumes
            # instead of rebuilding: also right, and the checks below accept either.
            assert last_committed(str(checkpoint)) == 0
            topology.start("--trigger", "500 milliseconds", "--take-over")

            def rebuilt() -> bool:
                superseded = list(checkpoint.parent.glob(f"{SESSIONS}.superseded-*"))
                resumed = (last_committed(str(checkpoint)) or 0) >= 1
                return bool(superseded or resumed) and all(sessions(k) == v for k, v in expected.items())

            topology.wait_for(rebuilt, timeout=180, what="the sessions again after the restarted topology's rebuild")

            topology.wait_for(
                lambda: _ingest_state(url, SESSIONS) == "running", timeout=30, what="the feed running again"
            )
            reader.more(2 * len(expected), "reads after the rebuild")  # and they stay
        stop.set()
        loader.join(10)
        assert reader.wrong == []
        assert reader.answers[503] > 0 and reader.answers[200] > 0  # the reads overlapped the rebuilds

        # Nothing that landed while the topology was down or rebuilding is lost: every load order but the
        # newest few (whose sessions the watermark has not closed yet) is a closed session of one order.
        last = written[-1]
        closed = [i for i in written if at(700 + 40 * i) + 30_000 + 5_000 < at(700 + 40 * last)]

        def every_load_session() -> bool:
            return all(sessions(f"load-{i:04d}") == [(iso(700 + 40 * i), iso(730 + 40 * i), 1)] for i in closed)

        topology.wait_for(every_load_session, timeout=120, what="a closed session for every load order")
        assert len(closed) > 5, written

        # Last, the topology paused (SIGSTOP: as a long GC pause or a node cut off looks) past the bound, and
        # its store taken meanwhile by another topology over the same input from another checkpoint. Resumed,
        # it must not feed the store again: its next batch is refused (or its look ends it), and it exits;
        # the sessions are the taker's, and never wrong meanwhile.
        assert topology.proc is not None
        with SessionReader(url, SESSIONS, expected, pause=0.02) as reader:
            os.killpg(topology.proc.pid, signal.SIGSTOP)
            try:
                wait_for(lambda: _ingest_state(url, SESSIONS) == "stale", timeout=30, what="the paused feed stale")
                taker = materialize_sessions(orders, tmp_path / "taker", replace(options, take_over=True),
                                             watermark="5 seconds")  # fmt: skip
            finally:
                os.killpg(topology.proc.pid, signal.SIGCONT)
            try:
                # A batch for both: the old topology's first since its pause, and the taker's first with a
                # watermark after its batch 0 (which reset the partitions, 503 until then).
                write_records(tmp_path, "order", [Record("late", "dish", at(700 + 40 * (last + 5)))])
                assert topology.proc.wait(timeout=60) == 1, topology.log()
                assert f"store '{SESSIONS}' is fed by another topology" in topology.log(tail=None), topology.log()
                print("the resumed topology:", *[ln[:240] for ln in topology.log().splitlines() if "another" in ln])
                wait_for(lambda: all(sessions(k) == v for k, v in expected.items()), timeout=120,
                         what="the sessions served from the taker's feed")  # fmt: skip
                ingest = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}[SESSIONS]["ingest"]
                assert ingest["feeder"] == feeder_for(runtime_ns.namespace).id, ingest
                assert ingest["state"] in ("running", "rebuilding"), ingest
            finally:
                taker.stop()
        assert reader.wrong == []
    finally:
        stop.set()
        topology.kill()  # nothing here is about its stop (the other test's drop and test_job_submit's are)
