"""No acknowledged batch is lost: query actors killed for real while GETs run and batches keep arriving,
and the runtime torn down and brought back under a topology that restarts on its old checkpoint.

Wrong answers are counted, not only errors: a 503 is honest, a count that goes backwards, exceeds what
was produced, or a 404 for a key that exists is not. Owners killed and restarted by Ray (``ray.kill``,
SIGKILL) under load are in test_reclaim.py, which also checks that the sweeper spares their data.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import ray

from bench.faults import worker_pid
from tests.integration.conftest import (
    SEED_CUSTOMERS,
    SLOW_DEAD_LETTERS,
    RayCluster,
    deploy_runtime,
    produce,
    seeded_food_orders,
    start_food_orders,
)
from tests.integration.helpers import (
    http_get,
    orders_under_load,
    supervised,
    wait_for,
    wait_for_every_order_counted,
)

pytestmark = pytest.mark.integration


def _serving_again(namespace: str, name: str, killed: int) -> bool:
    """Whether a new process runs query actor ``name`` and serves every partition it holds."""
    try:
        handle = ray.get_actor(name, namespace=namespace)
        pid = worker_pid(handle)
        positions: dict[int, Any] = ray.get(handle.positions.remote(), timeout=10)
    except Exception:  # not created again yet, or still starting
        return False
    return pid != killed and all(p["state"] == "serving" for p in positions.values())


def _kill_for_good_and_see_it_back(namespace: str, victim: str, ledger: Any) -> None:
    handle = ray.get_actor(victim, namespace=namespace)
    killed = worker_pid(handle)
    ray.kill(handle, no_restart=True)
    wait_for(lambda: _serving_again(namespace, victim, killed), timeout=60, what=f"{victim} created again")
    seen = ledger.answers[200]
    wait_for(lambda: ledger.answers[200] > seen + 20, what="answers after it came back")


def test_owners_killed_for_good_under_load_are_created_again_where_their_data_is_and_lose_nothing(
    ray_cluster: RayCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ray.kill`` without a restart, each owner in turn while orders land and counts are read: Ray will
    not bring it back, so the registry creates it again on its node, where it opens the partitions it had
    (a file planted in its directory is still there). Meanwhile its standby answers and the next batch
    waits for it; the topology never fails."""
    from runtime.config import riqr_data

    # Gone for 1 s rather than 2 before the registry creates it again (`up` passes it to the registry);
    # the registry still needs two checks in a row to see it gone.
    monkeypatch.setenv("RIQR_RECREATE_AFTER", "1")
    with seeded_food_orders(spark, "riqr-gone", tmp_path, keep_running=True) as topology:
        url, ns = topology.runtime.url, topology.runtime.namespace
        owners = [i["actor"] for i in http_get(f"{url}/metadata/stores/order-count")[2]["result"]]
        assert len(owners) == 2
        nodes = {u: a.node_id for u, a in ray.get(topology.runtime.registry().view.remote()).actors.items()}
        homes = {u: riqr_data(ns) / "order-count" / u for u in owners}
        for u, home in homes.items():
            (home / "keepsake").write_text(u)
        with orders_under_load(topology.home, url) as ledger:
            wait_for(lambda: ledger.answers[200] > 20, what="answers before the first kill")
            for victim in owners:
                _kill_for_good_and_see_it_back(ns, victim, ledger)
        wait_for_every_order_counted(url, ledger)
        assert ledger.wrong == []
        assert all(q.isActive for q in topology.queries), [q.exception() for q in topology.queries]
        view = ray.get(topology.runtime.registry().view.remote())
        assert {u: view.actors[u].node_id for u in owners} == {u: nodes[u] for u in owners}
        assert {u: (home / "keepsake").read_text() for u, home in homes.items()} == {u: u for u in owners}


def test_an_owner_whose_process_stops_is_restarted_and_the_topology_goes_on_under_load(
    ray_cluster: RayCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner's worker stopped (SIGSTOP: alive to Ray, answering nothing, as a hung process) while orders
    land and counts are read: its standby answers, each batch waits on it, and the registry, finding its
    pings unanswered, restarts it (``RIQR_RESTART_SILENT_AFTER``, 6 s here) before the batch's minute is
    out. Before, nothing restarted it: the batch failed after a minute, and the topology with it. No
    answer is wrong, nothing is lost, and every query still runs."""
    monkeypatch.setenv("RIQR_RESTART_SILENT_AFTER", "6")  # read where `up` creates the registry
    with seeded_food_orders(spark, "riqr-hung", tmp_path, keep_running=True) as topology:
        url, ns = topology.runtime.url, topology.runtime.namespace
        victim = http_get(f"{url}/metadata/stores/order-count")[2]["result"][0]["actor"]
        stopped = worker_pid(ray.get_actor(victim, namespace=ns))
        with orders_under_load(topology.home, url) as ledger:
            wait_for(lambda: ledger.answers[200] > 20, what="answers before the stop")
            os.kill(stopped, signal.SIGSTOP)
            try:
                wait_for(lambda: _serving_again(ns, victim, stopped), timeout=50, what=f"{victim} restarted")
            finally:
                with contextlib.suppress(ProcessLookupError):  # killed by the restart, as it should be
                    os.kill(stopped, signal.SIGCONT)
            seen = ledger.answers[200]
            wait_for(lambda: ledger.answers[200] > seen + 20, what="answers after the restart")
        wait_for_every_order_counted(url, ledger)
        assert ledger.wrong == []
        assert all(q.isActive for q in topology.queries), [q.exception() for q in topology.queries]


def test_a_store_whose_copies_were_lost_is_rebuilt_in_place_by_the_running_topology_under_load(
    ray_cluster: RayCluster, spark: Any, tmp_path: Path
) -> None:
    """No standbys: an owner's data wiped and its process restarted, so it comes back with nothing to
    reopen and no peer to copy. The topology, run by ``supervise`` as a topology process runs, sees the
    next batch leave those partitions without a serving copy and starts the store's query again on a
    fresh checkpoint: batch 0 re-emits every count. Orders land and counts are read all along; nothing
    is lost, no answer is wrong, and the topology never stops."""
    import shutil

    from runtime.config import riqr_data
    from tests.integration.conftest import Topology, load_seed
    from topologies import food_orders
    from topologies.options import TopologyOptions
    from verticles import deploy

    runtime = deploy_runtime("riqr-heal")
    url, ns = runtime.url, runtime.namespace
    options = TopologyOptions(
        namespace=ns, trigger="200 milliseconds", standbys=0, dead_letter_trigger=SLOW_DEAD_LETTERS
    )
    queries = food_orders.start(spark, tmp_path, options)

    def scenario() -> dict[str, Any]:
        load_seed(Topology(runtime, tmp_path, queries))
        victim = http_get(f"{url}/metadata/stores/order-count")[2]["result"][0]["actor"]
        handle = ray.get_actor(victim, namespace=ns)
        with orders_under_load(tmp_path, url) as ledger:
            wait_for(lambda: ledger.answers[200] > 20, what="answers before the wipe")
            killed = worker_pid(handle)
            shutil.rmtree(riqr_data(ns) / "order-count" / victim)
            ray.kill(handle, no_restart=False)  # Ray restarts it: nothing to reopen, no standby
            wait_for(lambda: _serving_again(ns, victim, killed), timeout=90, what="its partitions rebuilt")
            seen = ledger.answers[200]
            wait_for(lambda: ledger.answers[200] > seen + 20, what="answers after the rebuild")
        wait_for_every_order_counted(url, ledger)
        return {"wrong": ledger.wrong, "running": [q.name for q in queries if q.isActive]}

    try:
        status, outcome = supervised(queries, scenario)
    finally:
        for query in spark.streams.active:
            query.stop()
        deploy.down(ns)
    assert status == 0  # stopped by the test, not by a failure
    assert outcome["wrong"] == []
    assert len(outcome["running"]) == len(queries)  # every query ran to the end, order-count's new one too
    superseded = list((tmp_path / "checkpoints" / ns).glob("order-count.superseded-*"))
    assert len(superseded) == 1, sorted(tmp_path.rglob("*superseded*"))  # rebuilt once, from a fresh checkpoint


def test_a_fresh_checkpoints_first_micro_batch_reads_every_file_of_the_topic(spark: Any, tmp_path: Path) -> None:
    """The rebuild path's batch 0 resets every partition and must carry the whole state: a cap on the
    files per micro-batch (it was 1000) left counts low and keys missing until later batches came."""
    from runtime.landing import Record, write_records
    from topologies.sources import read_topic

    for i in range(1001):  # one more than the old cap
        write_records(tmp_path, "order", [Record(f"k{i % 7}", "dish")])
    query = (
        read_topic(spark, tmp_path, "order")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        batches = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert [b["numInputRows"] for b in batches] == [1001]


def test_an_actor_whose_partition_was_damaged_restarts_and_rebuilds_that_partition_under_load(
    ray_cluster: RayCluster, spark: Any, tmp_path: Path
) -> None:
    """A disk fault in one partition's files, then the actor's process SIGKILLed: Ray restarts it, and it
    must open. (An error in an actor's constructor ends it for good: it had taken every partition of the
    actor dark, with its healthy ones.) The damaged copy is set aside and rebuilt from its peer."""
    from runtime.config import riqr_data

    with seeded_food_orders(spark, "riqr-damage", tmp_path, keep_running=True) as topology:
        url, ns = topology.runtime.url, topology.runtime.namespace
        victim = http_get(f"{url}/metadata/stores/order-count")[2]["result"][0]["actor"]
        handle = ray.get_actor(victim, namespace=ns)
        home = riqr_data(ns) / "order-count" / victim
        partitions = sorted(p for p in home.iterdir() if p.name.startswith("p") and p.is_dir())
        assert partitions, sorted(home.iterdir())
        with orders_under_load(topology.home, url) as ledger:
            wait_for(lambda: ledger.answers[200] > 20, what="answers before the damage")
            killed = worker_pid(handle)
            (partitions[0] / "rocksdb" / "CURRENT").write_bytes(b"\0damaged by the test\n")
            os.kill(killed, signal.SIGKILL)
            wait_for(lambda: worker_pid(handle) != killed, timeout=60, what="the actor running again")
            wait_for(
                lambda: all(p["state"] == "serving" for p in ray.get(handle.positions.remote()).values()),
                timeout=60,
                what="every partition of the restarted actor serving, the damaged one rebuilt",
            )
            seen = ledger.answers[200]
            wait_for(lambda: ledger.answers[200] > seen + 20, what="answers after the rebuild")
        wait_for_every_order_counted(url, ledger)
        assert ledger.wrong == []
        assert list(home.glob(f"{partitions[0].name}.unreadable-*")), sorted(home.iterdir())  # kept aside
        assert all(q.isActive for q in topology.queries), [q.exception() for q in topology.queries]


def test_down_and_up_then_a_restart_on_the_old_checkpoint_rebuilds_the_stores(
    ray_cluster: RayCluster, spark: Any, tmp_path: Path
) -> None:
    from topologies.checkpoint import last_committed
    from topologies.options import checkpoint_for
    from verticles import deploy

    with seeded_food_orders(spark, "riqr-rebuild", tmp_path, keep_running=True) as topology:
        namespace = topology.runtime.namespace
        # Stop only once Spark has committed the seed's batches: a restart then has committed batches
        # the new, empty actors never saw, which is the case the rebuild path is for.
        stores = ["customer-v1-changelog", "order-count"]
        wait_for(
            lambda: all(last_committed(str(checkpoint_for(tmp_path, namespace, s))) is not None for s in stores),
            what="the seed's batches committed",
        )
        topology.stop()
        produce(tmp_path, "order", "1--soup")  # lands in the checkpoint's input, not in the stores yet
        deploy.down(namespace)
        kv = deploy.RayEnv(namespace)
        assert kv.load_membership() is None  # `down` forgets the stores' members with the rest
        runtime = deploy_runtime("unused", namespace=namespace)
        # A new deployment's own record, not the old one's.
        record = kv.load_membership() or {}
        assert isinstance(record.pop("epochs_below", None), int)  # the bound on its epochs (a restart starts there)
        assert record == {"version": 1, "retired": False, "stores": {}}
        again = start_food_orders(spark, runtime, tmp_path)  # the same checkpoints
        try:
            url = runtime.url
            wrong: list[str] = []

            def rebuilt() -> bool:
                done = True
                for key, name in SEED_CUSTOMERS.items():
                    status, _, body = http_get(f"{url}/stores/customer-v1-changelog/get/{key}")
                    if status == 200 and body["response"] != name or status not in (200, 503):
                        wrong.append(f"customer {key}: {status} {body}")
                    done = done and status == 200
                status, _, body = http_get(f"{url}/stores/order-count/get/1")
                if status not in (200, 503) or status == 200 and body["response"] not in (1, 2):
                    wrong.append(f"order-count 1: {status} {body}")
                return done and status == 200 and body["response"] == 2

            wait_for(rebuilt, timeout=120, what="both stores rebuilt from a fresh checkpoint")
            assert wrong == []

            # The sink reports its plan as the query starts, without waiting: to the new registry, though
            # the topology process held the old one's handle (the feeder looks it up again at once).
            def plan() -> Any:
                entry = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}["order-count"]
                return (entry["ingest"] or {}).get("plan")

            assert wait_for(plan, timeout=5, what="the catalog's ingest plan") == "rebuild"

            def all_serving() -> bool:
                # Standbys get each batch first: a read can be answered (by a standby) while the actives
                # are still applying the rebuild's first batch, so the actives' states are waited for.
                entries = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}
                return {p["state"] for p in entries["order-count"]["positions"]} == {"serving"}

            wait_for(all_serving, timeout=30, what="every partition of order-count serving on its active")
            superseded = [p.name for p in (tmp_path / "checkpoints" / namespace).iterdir() if "superseded" in p.name]
            assert len(superseded) == 2  # both stores' old checkpoints kept aside, not deleted
        finally:
            again.stop()
