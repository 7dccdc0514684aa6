"""Node loss on a real Ray cluster: a node holding copies of a store is removed while GETs run and batches
keep arriving. Reads of its keys fail over to standbys at once, its query actors are re-created on the
remaining nodes under the same names, rebuild from their peers, and serve again (docs/design.md, "Node
loss").

The test adds a third node to the session's cluster (with a data directory of its own, as a real node
has) and removes only that node."""

from __future__ import annotations

import itertools
import os
import random
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
import ray

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.codec import decode_value
from runtime.errors import DeadlineExceeded, Unavailable
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.scan import Scan
from tests.integration.conftest import SLOW_DEAD_LETTERS, RayCluster, deploy_runtime
from tests.integration.helpers import GrowingReads, Load, http_get, wait_for
from topologies.delivery import BatchDelivery

pytestmark = pytest.mark.integration

# Three actors on three nodes, each holding its partitions and a standby copy of another actor's.
SPEC = StoreSpec(
    "survivor", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=6, actors=3, standbys=1
)
USERS = list(range(300))


def _serving(handle: Any, batch_id: int) -> bool:
    positions = raycalls.get(handle.positions.remote(), "positions", timeout=10)
    return all(pos["state"] == "serving" and pos["batch_id"] >= batch_id for pos in positions.values())


def _add_node_with_its_own_disk(ray_cluster: RayCluster, data: Any, **node_args: Any) -> Any:
    """A node whose query actors keep their partitions under ``data``, as a real node's own disk."""
    saved = os.environ["RIQR_DATA"]
    os.environ["RIQR_DATA"] = str(data)  # the node inherits this environment
    try:
        return ray_cluster.cluster.add_node(num_cpus=1, **node_args)
    finally:
        os.environ["RIQR_DATA"] = saved


def test_a_lost_nodes_copies_are_re_created_elsewhere_and_rebuilt_while_reads_and_batches_go_on(
    ray_cluster: RayCluster, tmp_path: Any
) -> None:
    from verticles import deploy

    runtime = deploy_runtime("riqr-node-loss")  # registry and REST API on the session's two nodes
    node = _add_node_with_its_own_disk(ray_cluster, tmp_path / "third-node-data")
    removed = False
    try:
        ray_cluster.cluster.wait_for_nodes()
        third = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in ray_cluster.node_ids)
        registry = runtime.registry()
        view = raycalls.get(registry.create_store.remote(SPEC), "create_store")
        table = view.tables[SPEC.name]
        mine = {u: info for u, info in view.actors.items() if info.store == SPEC.name}
        assert sorted(info.node_id for info in mine.values()) == sorted([*ray_cluster.node_ids, third])
        (lost,) = [u for u, info in mine.items() if info.node_id == third]
        lost_keys = [u for u in USERS if table.partitions[table.partition_of(u)].active == lost]
        assert lost_keys

        delivery = BatchDelivery(SPEC, runtime.namespace, checkpoint="unused")
        history: dict[int, set[int]] = {u: {u * 10} for u in USERS}
        judged = GrowingReads(history)  # one reader thread (Load), through one REST node
        latest = {u: u * 10 for u in USERS}

        def batch(batch_id: int, users: list[int]) -> pa.Table:
            parts = [table.partition_of(u) for u in users]
            return pa.table(
                {
                    "user": pa.array(users, pa.int64()),
                    "score": pa.array([latest[u] for u in users], pa.int64()),
                    PARTITION_COLUMN: pa.array(parts, pa.int32()),
                }
            )

        delivery.deliver("q", 0, batch(0, USERS))
        url = runtime.url
        wait_for(
            lambda: http_get(f"{url}/stores/{SPEC.name}/approximate-num-entries")[2] == {"result": len(USERS)},
            what="the store loaded and visible",
        )

        reads: list[tuple[float, float, int, bool]] = []  # start, end, status, key held by the lost actor
        delivered = [0]
        batches = itertools.count(1)
        picks, choices = random.Random(7), random.Random(11)
        lost_set = set(lost_keys)

        def write() -> None:  # a step raising (ingest failing) ends the load and is asserted below
            batch_id = next(batches)
            users = picks.sample(USERS, 20)
            for u in users:  # known before it is delivered, so a read can never see an unknown value
                latest[u] = u * 10 + batch_id * 100_000
                history[u].add(latest[u])
            delivery.deliver("q", batch_id, batch(batch_id, users))
            delivered[0] = batch_id
            time.sleep(0.05)

        def read() -> str | None:
            u = choices.choice(USERS)
            started = time.monotonic()
            status, _, body = http_get(f"{url}/stores/{SPEC.name}/get/{u}")
            reads.append((started, time.monotonic(), status, u in lost_set))
            return judged.judge(u, status, body)

        with Load() as load:
            load.every(write)
            load.every(read)
            wait_for(lambda: delivered[0] >= 10 and len(reads) > 100, what="batches and reads before the loss")
            removed_at = time.monotonic()
            ray_cluster.cluster.remove_node(node)
            removed = True
            gone_in = time.monotonic() - removed_at

            def moved() -> bool:
                now = raycalls.get(registry.view.remote(), "view", timeout=10)
                return bool(now.actors[lost].node_id in ray_cluster.node_ids)

            wait_for(moved, timeout=30, interval=0.05, what="the lost actor re-created on a live node")
            moved_in = time.monotonic() - removed_at
            handle = ray.get_actor(lost, namespace=runtime.namespace)
            at_move = delivered[0]
            wait_for(lambda: _serving(handle, at_move), timeout=40, interval=0.1, what="the re-created copies serving")
            restored_in = time.monotonic() - removed_at

            def given_back() -> bool:  # promoted away from while it was gone, its partitions come back
                now = raycalls.get(registry.view.remote(), "view").tables[SPEC.name]
                return [o.active for o in now.partitions] == [o.active for o in table.partitions]

            wait_for(given_back, timeout=30, what="the re-created actor answering for its partitions again")
            seen = len(reads)
            wait_for(lambda: len(reads) > seen + 100, what="reads after the replica count is restored")

        assert load.errors == [], "ingest must never fail"
        assert load.wrong == [], load.wrong[:10]
        after = [r for r in reads if r[0] >= removed_at]
        failed_late = [r for r in after if r[2] != 200 and r[0] >= removed_at + 2.0]
        first_lost_ok = min((r[1] for r in after if r[3] and r[2] == 200), default=float("inf")) - removed_at
        longest = max((r[1] - r[0] for r in after), default=0.0)
        print(
            f"\nnode loss: remove_node took {gone_in:.2f}s; first answer for a lost key {first_lost_ok:.2f}s after "
            f"the removal; slowest read {longest:.2f}s; actor re-created after {moved_in:.2f}s; replica count "
            f"restored after {restored_in:.2f}s; {len(after)} reads after the removal, "
            f"{sum(1 for r in after if r[2] != 200)} not 200 ({len(failed_late)} later than 2 s)"
        )
        # How soon is bench/faults.py's to measure (no timed assert on a shared machine): here, that the lost
        # keys were answered again, and that once the copies are back every read is answered.
        assert first_lost_ok != float("inf"), "no key of the lost node was answered after the removal"
        settled = reads[seen:]
        assert settled and [r for r in settled if r[2] != 200] == [], settled[:10]

        # Every copy agrees and is complete: the re-created one holds what its peers hold.
        final = raycalls.get(registry.view.remote(), "view")
        assert {info.node_id for u, info in final.actors.items() if info.store == SPEC.name} <= set(
            ray_cluster.node_ids
        )
        assert third not in final.endpoints
        for u in mine:
            positions = raycalls.get(ray.get_actor(u, namespace=runtime.namespace).positions.remote(), "positions")
            assert {pos["state"] for pos in positions.values()} == {"serving"}
            assert {pos["batch_id"] for pos in positions.values()} == {delivered[0]}
        body = http_get(f"{url}/stores/{SPEC.name}/all?limit=1000")[2]
        assert [e["key"] for e in body["result"]] == USERS
        for u, held in table.all_owners().items():  # every copy, the re-created one included, holds the latest
            copy, _ = raycalls.get(ray.get_actor(u, namespace=runtime.namespace).scan.remote(held, Scan()), "scan")
            assert {k: decode_value(v) for k, v in copy} == {
                k: v for k, v in latest.items() if table.partition_of(k) in held
            }
    finally:
        if not removed:
            ray_cluster.cluster.remove_node(node)
        deploy.down(runtime.namespace)


def test_a_lost_nodes_partitions_without_standbys_are_rebuilt_in_place_by_the_running_topology(
    ray_cluster: RayCluster, spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No standbys: the node holding one of each store's three actors is removed while orders land and
    counts are read. The registry re-creates those actors on the other nodes, with nothing to reopen and
    no peer to copy; the topology, run by ``supervise`` as a topology process runs, rebuilds both stores
    in place from the input: order-count as its next batch finds the hole, the customer store (no new
    input, so no batch) as its copies are looked at. No count is lost, none is wrong, the topology never
    stops."""
    from runtime.config import REGISTRY_NAME
    from tests.integration.conftest import Topology, load_seed
    from tests.integration.helpers import orders_under_load, supervised, wait_for_every_order_counted
    from topologies import food_orders
    from topologies.options import TopologyOptions
    from verticles import deploy

    # The customer store gets no batch: its hole is found by looks at its copies, two in a row, 5 s
    # apart by default. A look a second here; the rule (two in a row) is the same.
    monkeypatch.setattr("topologies.sink.PROBE_EVERY", 1.0)
    runtime = deploy_runtime("riqr-node-heal")  # registry and REST API on the session's two nodes
    url, ns = runtime.url, runtime.namespace
    node = _add_node_with_its_own_disk(ray_cluster, tmp_path / "third-node-data")
    ray_cluster.cluster.wait_for_nodes()
    removed = False
    home = tmp_path / "home"
    options = TopologyOptions(
        namespace=ns, actors=3, trigger="200 milliseconds", standbys=0, dead_letter_trigger=SLOW_DEAD_LETTERS
    )
    queries = food_orders.start(spark, home, options)

    def view() -> Any:
        return ray.get(ray.get_actor(REGISTRY_NAME, namespace=ns).view.remote())

    def all_serving() -> bool:
        return all(
            all(p["state"] == "serving" for p in ray.get(ray.get_actor(u, namespace=ns).positions.remote()).values())
            for u in view().actors
        )

    def scenario() -> dict[str, Any]:
        nonlocal removed
        load_seed(Topology(runtime, home, queries))
        third = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in ray_cluster.node_ids)
        on_third = {a.store for a in view().actors.values() if a.node_id == third}
        assert on_third == {"order-count", "customer-v1-changelog"}, on_third  # one actor of each store
        with orders_under_load(home, url) as ledger:
            wait_for(lambda: ledger.answers[200] > 20, what="answers before the node goes")
            ray_cluster.cluster.remove_node(node)
            removed = True
            wait_for(all_serving, timeout=120, what="every copy serving again, the lost ones rebuilt")
            seen = ledger.answers[200]
            wait_for(lambda: ledger.answers[200] > seen + 20, what="answers after the rebuild")
        wait_for_every_order_counted(url, ledger)
        return {
            "wrong": ledger.wrong,
            "running": [q.name for q in queries if q.isActive],
            "nodes": {a.node_id for a in view().actors.values()},
        }

    try:
        status, outcome = supervised(queries, scenario)
    finally:
        for query in spark.streams.active:
            query.stop()
        if not removed:
            ray_cluster.cluster.remove_node(node)
        deploy.down(ns)
    assert status == 0  # stopped by the test, not by a failure
    assert outcome["wrong"] == []
    assert len(outcome["running"]) == len(queries)
    assert outcome["nodes"] <= set(ray_cluster.node_ids)  # the lost node's actors live elsewhere now
    superseded = sorted(p.name for p in (home / "checkpoints" / ns).glob("*.superseded-*"))
    assert [p.split(".superseded-")[0] for p in superseded] == ["customer-v1-changelog", "order-count"], superseded


def test_a_registry_lost_with_a_node_re_creates_that_nodes_query_actor_from_the_members_it_saved(
    ray_cluster: RayCluster, tmp_path: Any
) -> None:
    """The registry and a query actor are on one node, which is removed while reads and batches go on.
    Ray restarts the registry on a live node, where the lost actor cannot answer it; the members it saved
    say the actor existed, so it is re-created on a live node and catches up from its peers. Without the
    saved members the restarted registry knew only the actors that answered: the store served on with a
    single copy of the lost actor's partitions, for good."""
    from runtime.config import RuntimeConfig
    from tests.integration.conftest import Runtime
    from verticles import deploy

    namespace = f"riqr-registry-loss-{uuid.uuid4().hex[:8]}"
    # Only the nodes with this resource can hold the registry: the third, then a fourth added later, where
    # Ray restarts it once the third is gone. (A soft node affinity put it elsewhere in 4 of 6 tries.)
    here = {"riqr-registry-test": 1.0}
    node = _add_node_with_its_own_disk(ray_cluster, tmp_path / "third-node-data", resources=here)
    fourth_node = None
    removed = False

    def node_of(handle: Any) -> str:
        return str(ray.get(handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())))

    try:
        ray_cluster.cluster.wait_for_nodes()
        third = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in ray_cluster.node_ids)
        registry = deploy.ensure_registry(namespace, {"resources": here})
        assert node_of(registry) == third
        # The REST API on the session's two nodes only: its URLs outlive the third node.
        deployment = deploy.up(
            RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1"),
            nodes=ray_cluster.node_ids,
        )
        runtime = Runtime(namespace, {ep.node_id: ep.url for ep in deployment.endpoints})
        view = raycalls.get(registry.create_store.remote(SPEC), "create_store")
        table = view.tables[SPEC.name]
        (lost,) = [u for u, info in view.actors.items() if info.store == SPEC.name and info.node_id == third]
        fourth_node = _add_node_with_its_own_disk(ray_cluster, tmp_path / "fourth-node-data", resources=here)
        ray_cluster.cluster.wait_for_nodes()
        fourth = fourth_node.node_id
        alive = [*ray_cluster.node_ids, fourth]

        delivery = BatchDelivery(SPEC, namespace, checkpoint="unused")
        history: dict[int, set[int]] = {u: {u} for u in USERS}
        judged = GrowingReads(history)  # one reader thread (Load), through one REST node
        latest = {u: u for u in USERS}

        def batch(users: list[int]) -> pa.Table:
            return pa.table(
                {
                    "user": pa.array(users, pa.int64()),
                    "score": pa.array([latest[u] for u in users], pa.int64()),
                    PARTITION_COLUMN: pa.array([table.partition_of(u) for u in users], pa.int32()),
                }
            )

        delivery.deliver("q", 0, batch(USERS))
        url = runtime.url
        wait_for(
            lambda: http_get(f"{url}/stores/{SPEC.name}/approximate-num-entries")[2] == {"result": len(USERS)},
            what="the store loaded and visible",
        )
        delivered = [0]
        picks, choices = random.Random(5), random.Random(13)

        def write() -> None:
            # Spark's way: a batch that fails (the registry restarting) is delivered again with its id.
            batch_id = delivered[0] + 1
            users = picks.sample(USERS, 20)
            for u in users:
                latest[u] = u + batch_id * 100_000
                history[u].add(latest[u])
            gives_up = time.monotonic() + 60
            while True:
                try:
                    delivery.deliver("q", batch_id, batch(users))
                    break
                except (Unavailable, DeadlineExceeded):  # the registry restarting; else, or after a minute, raise
                    if time.monotonic() > gives_up:
                        raise
                    time.sleep(0.2)
            delivered[0] = batch_id
            time.sleep(0.05)

        def read() -> str | None:
            u = choices.choice(USERS)
            status, _, body = http_get(f"{url}/stores/{SPEC.name}/get/{u}")
            return judged.judge(u, status, body)

        def registry_view() -> Any:
            return raycalls.get(runtime.registry().view.remote(), "view", timeout=10)

        with Load() as load:
            load.every(write)
            load.every(read)
            wait_for(lambda: delivered[0] >= 5, what="batches before the loss")
            ray_cluster.cluster.remove_node(node)
            removed = True
            wait_for(
                lambda: registry_view().actors[lost].node_id in alive,
                timeout=60,
                what="the restarted registry re-creating the lost node's actor on a live one",
            )
            at_move = delivered[0]
            handle = ray.get_actor(lost, namespace=namespace)
            wait_for(lambda: _serving(handle, at_move), timeout=40, interval=0.1, what="the re-created copies serving")
            load.wait_more(200, what="reads and batches after the replica count is restored")
            wait_for(lambda: delivered[0] >= at_move + 5, what="batches after the replica count is restored")

        assert load.errors == [], load.errors
        assert load.wrong == [], load.wrong[:10]
        assert node_of(runtime.registry()) == fourth  # it did restart, on the other node that can hold it
        final = registry_view()
        assert sorted(u for u, info in final.actors.items() if info.store == SPEC.name) == sorted(table.all_owners())
        for u, held in table.all_owners().items():  # every copy, the re-created one included, holds the latest
            copy, _ = raycalls.get(ray.get_actor(u, namespace=namespace).scan.remote(held, Scan()), "scan")
            assert {k: decode_value(v) for k, v in copy} == {
                k: v for k, v in latest.items() if table.partition_of(k) in held
            }
    finally:
        # riqr down first: with the third node gone and no fourth, the registry could not restart anywhere.
        try:
            deploy.down(namespace)
        finally:
            try:
                if not removed:
                    ray_cluster.cluster.remove_node(node)
            finally:
                if fourth_node is not None:
                    ray_cluster.cluster.remove_node(fourth_node)


def test_a_node_that_joins_after_riqr_up_gets_a_facade_and_a_rest_api_with_the_same_auth(
    ray_cluster: RayCluster, tmp_path: Any
) -> None:
    """`riqr up` for every node (no node list): the registry gives a node that joins later its own facade
    and REST API, started with the settings the running ones serve with (here auth on, one key), lists
    its endpoint, and unlists it when the node goes."""
    from runtime.auth import AuthConfig, generate_secret, mint_token
    from runtime.config import REGISTRY_NAME, RuntimeConfig, facade_name
    from verticles import deploy

    namespace = f"riqr-follow-{uuid.uuid4().hex[:8]}"
    secret = generate_secret()
    config = RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1",
                           auth=AuthConfig(enabled=True, secret=secret))  # fmt: skip
    node = None
    try:
        assert len(deploy.up(config).endpoints) == 2
        registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
        added = time.monotonic()
        node = _add_node_with_its_own_disk(ray_cluster, tmp_path / "joined-node-data")
        ray_cluster.cluster.wait_for_nodes()
        joined = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in ray_cluster.node_ids)

        def endpoint() -> Any:
            return raycalls.get(registry.view.remote(), "view", timeout=10).endpoints.get(joined)

        found = wait_for(endpoint, timeout=120, what="the joined node's REST API listed by the registry")
        print(f"\nnode join: its REST API listed {time.monotonic() - added:.2f}s after add_node began")
        url = f"http://{found.host}:{found.port}"
        assert http_get(f"{url}/stores")[0] == 401  # the others' auth: no token, no answer
        status, _, body = http_get(f"{url}/stores", {"Authorization": "Bearer " + mint_token(secret)})
        assert status == 200 and body == {"result": []}, body
        assert ray.get(ray.get_actor(facade_name(joined), namespace=namespace).ready.remote(), timeout=30)
        ray_cluster.cluster.remove_node(node)
        node = None
        wait_for(lambda: endpoint() is None, timeout=60, what="the gone node's REST API unlisted")
    finally:
        if node is not None:
            ray_cluster.cluster.remove_node(node)
        deploy.down(namespace)
