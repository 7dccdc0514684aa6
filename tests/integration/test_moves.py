"""Moving query actors between nodes on a real Ray cluster while GETs run and batches keep arriving
(docs/design.md, "Moving copies"): a node joins and `rebalance` gives it a share of each store's actors,
then `riqr drain` (the command, as its own Ray driver) takes them off again and the node is removed.
Queries must keep being answered throughout (every GET a 200, none wrong), no batch may be lost, and a
store without standbys moves as well as one with them."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import time
from typing import Any

import pyarrow as pa
import pytest
import ray

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.codec import decode_value
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.ownership import ClusterView
from runtime.scan import Scan
from tests.integration.conftest import REPO, RayCluster, deploy_runtime
from tests.integration.helpers import GrowingReads, Load, http_get, wait_for
from topologies.delivery import BatchDelivery

pytestmark = pytest.mark.integration

# Four actors with a standby copy of each partition, and three without, on the session's two nodes first.
SPECS = (
    StoreSpec(
        "moving", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=8, actors=4, standbys=1
    ),
    StoreSpec("alone", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=6, actors=3, standbys=0),
)
USERS = list(range(200))


def _add_node_with_its_own_disk(ray_cluster: RayCluster, data: Any) -> Any:
    saved = os.environ["RIQR_DATA"]
    os.environ["RIQR_DATA"] = str(data)  # the node inherits this environment: its own disk
    try:
        return ray_cluster.cluster.add_node(num_cpus=1)
    finally:
        os.environ["RIQR_DATA"] = saved


def _view(registry: Any) -> ClusterView:
    view: ClusterView = raycalls.get(registry.view.remote(), "view", timeout=30)
    return view


def test_a_node_that_joins_gets_copies_and_a_drained_one_gives_them_back_while_every_query_is_answered(
    ray_cluster: RayCluster, tmp_path: Any
) -> None:
    from riqr import moves
    from verticles import deploy

    runtime = deploy_runtime("riqr-moves")
    registry = runtime.registry()
    for spec in SPECS:
        raycalls.get(registry.create_store.remote(spec), "create_store")
    node = _add_node_with_its_own_disk(ray_cluster, tmp_path / "third-node-data")
    removed = False
    try:
        ray_cluster.cluster.wait_for_nodes()
        third = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in ray_cluster.node_ids)
        first = _view(registry)
        assert {info.node_id for info in first.actors.values()} == set(ray_cluster.node_ids)
        deliveries = {spec.name: BatchDelivery(spec, runtime.namespace, checkpoint="unused") for spec in SPECS}
        history: dict[int, set[int]] = {u: {u * 10} for u in USERS}
        latest = {u: u * 10 for u in USERS}
        judges = {spec.name: GrowingReads(history) for spec in SPECS}  # one reader thread a store
        tables = {spec.name: first.tables[spec.name] for spec in SPECS}

        def batch(store: str, users: list[int]) -> pa.Table:
            table = tables[store]
            return pa.table(
                {
                    "user": pa.array(users, pa.int64()),
                    "score": pa.array([latest[u] for u in users], pa.int64()),
                    PARTITION_COLUMN: pa.array([table.partition_of(u) for u in users], pa.int32()),
                }
            )

        for name, delivery in deliveries.items():
            delivery.deliver("q", 0, batch(name, USERS))
        url = runtime.url
        for spec in SPECS:
            wait_for(
                lambda s=spec.name: http_get(f"{url}/stores/{s}/approximate-num-entries")[2] == {"result": len(USERS)},
                what="the stores loaded and visible",
            )

        reads: list[tuple[str, int]] = []  # store, status
        delivered = [0]
        batches = itertools.count(1)
        picks, choices = random.Random(5), random.Random(9)

        def write() -> None:  # a delivery raising (a batch lost to a move) ends the load, asserted below
            batch_id = next(batches)
            users = picks.sample(USERS, 20)
            for u in users:  # known before it is delivered, so a read can never see an unknown value
                latest[u] = u * 10 + batch_id * 100_000
                history[u].add(latest[u])
            for name, delivery in deliveries.items():
                delivery.deliver("q", batch_id, batch(name, users))
            delivered[0] = batch_id
            time.sleep(0.05)

        def reader(store: str) -> Any:
            def read() -> str | None:
                u = choices.choice(USERS)
                status, _, body = http_get(f"{url}/stores/{store}/get/{u}")
                reads.append((store, status))
                return judges[store].judge(u, status, body)

            return read

        said: list[str] = []
        with Load() as load:
            load.every(write)
            for spec in SPECS:
                load.every(reader(spec.name))
            wait_for(lambda: delivered[0] >= 5 and len(reads) > 100, what="batches and reads before the moves")
            done = moves.rebalance(runtime.namespace, say=said.append)
            after_join = _view(registry)
            at_join = len(reads)
            wait_for(lambda: len(reads) > at_join + 100, what="reads after the rebalance")

            # A move given up while its new actor starts (its mover stopped before the admit): the registry
            # answered the join without waiting for the start, and the new actor is destroyed, never listed.
            mover = next(u for u, i in after_join.actors.items() if i.node_id != third)
            starting = raycalls.get(registry.join.remote(mover, third), "join")["uuid"]
            assert starting not in _view(registry).actors
            given_up = raycalls.get(registry.abandon_move.remote(mover, starting), "abandon_move")
            assert given_up["outcome"] == "given-up" and _view(registry).tables == after_join.tables
            wait_for(lambda: starting not in deploy._named_in(runtime.namespace), what="the new actor destroyed")

            # The command line, as an operator runs it, in a Ray driver of its own.
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            drain = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "riqr",
                    "drain",
                    third[:12],
                    "--address",
                    ray_cluster.address,
                    "--namespace",
                    runtime.namespace,
                ],  # fmt: skip
                env=env,
                capture_output=True,
                text=True,
                timeout=600,  # fmt: skip
            )
            assert drain.returncode == 0, drain.stderr
            drained = _view(registry)
            at_drain = len(reads)
            wait_for(lambda: len(reads) > at_drain + 100, what="reads after the drain")
            ray_cluster.cluster.remove_node(node)
            removed = True
            at_removal = len(reads)
            wait_for(lambda: len(reads) > at_removal + 100 and delivered[0] > 0, what="reads after the removal")
            last = delivered[0]
            wait_for(lambda: delivered[0] >= last + 3, what="batches after the removal")

        assert load.errors == [], f"ingest must never fail: {load.errors[:3]}"
        assert load.wrong == [], load.wrong[:10]
        not_ok = [r for r in reads if r[1] != 200]
        print(f"\nmoves: {len(done)} by rebalance, then the drain; {len(reads)} reads, {len(not_ok)} not 200;"
              f" {delivered[0]} batches\n" + "\n".join(said) + "\n" + drain.stderr)  # fmt: skip
        assert not_ok == [], not_ok[:10]  # every query answered, throughout

        # The joined node got a share of each store's actors, and the drain took them all off again.
        assert {m.move.store for m in done} == {"moving", "alone"} and all(m.move.target == third for m in done)
        for spec in SPECS:
            on_third = [u for u, i in after_join.actors.items() if i.store == spec.name and i.node_id == third]
            assert len(on_third) == 1, (spec.name, on_third)
        assert third not in {info.node_id for info in drained.actors.values()}
        assert "drained: no query actor runs on" in drain.stderr
        assert "and the old copies are deleted: it can be stopped" in drain.stderr  # waited for, not guessed

        # No batch lost: every copy of each store holds the latest value of each of its keys.
        final = _view(registry)
        for spec in SPECS:
            table = final.tables[spec.name]
            assert len([i for i in final.actors.values() if i.store == spec.name]) == spec.actors
            for uuid, held in table.all_owners().items():
                actor = ray.get_actor(uuid, namespace=runtime.namespace)
                positions = raycalls.get(actor.positions.remote(), "positions")
                assert {p["state"] for p in positions.values()} == {"serving"}
                copy, _ = raycalls.get(actor.scan.remote(held, Scan()), "scan")
                assert {k: decode_value(v) for k, v in copy} == {
                    k: v for k, v in latest.items() if table.partition_of(k) in held
                }, (spec.name, uuid)
        # The replaced actors are gone with their data.
        replaced = {m.move.uuid for m in done}
        wait_for(lambda: not (replaced & set(deploy._named_in(runtime.namespace))), what="replaced actors destroyed")
    finally:
        if not removed:
            ray_cluster.cluster.remove_node(node)
        deploy.down(runtime.namespace)


def test_standbys_added_to_a_store_made_without_them_catch_up_take_over_when_an_owner_dies_and_go_again(
    ray_cluster: RayCluster,
) -> None:
    """`riqr standbys` (the command, as its own Ray driver) gives a store created with no standby one copy
    of each partition on the other node while batches and GETs go on; then an active owner is killed for
    good and its partitions are answered by the new copies; then `riqr standbys STORE 0` removes the
    copies: every GET a 200, none wrong, no batch lost."""
    from bench.faults import user_scores
    from verticles import deploy

    spec = StoreSpec(
        "growing", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=4, actors=2, standbys=0
    )
    runtime = deploy_runtime("riqr-standbys")
    registry = runtime.registry()
    try:
        first = raycalls.get(registry.create_store.remote(spec), "create_store")
        assert first.tables["growing"].fewest_standbys() == 0
        delivery = BatchDelivery(spec, runtime.namespace, checkpoint="unused")
        table = first.tables["growing"]
        history: dict[int, set[int]] = {u: {u * 10} for u in USERS}
        latest = {u: u * 10 for u in USERS}
        judge = GrowingReads(history)

        def batch(users: list[int]) -> pa.Table:
            return user_scores(table, {u: latest[u] for u in users})

        delivery.deliver("q", 0, batch(USERS))
        url = runtime.url
        wait_for(
            lambda: http_get(f"{url}/stores/growing/approximate-num-entries")[2] == {"result": len(USERS)},
            what="the store loaded and visible",
        )
        reads: list[int] = []
        delivered = [0]
        batches = itertools.count(1)
        picks, choices = random.Random(7), random.Random(11)

        def write() -> None:
            batch_id = next(batches)
            users = picks.sample(USERS, 20)
            for u in users:  # known before it is delivered, so a read can never see an unknown value
                latest[u] = u * 10 + batch_id * 100_000
                history[u].add(latest[u])
            delivery.deliver("q", batch_id, batch(users))
            delivered[0] = batch_id
            time.sleep(0.05)

        def read() -> str | None:
            u = choices.choice(USERS)
            status, _, body = http_get(f"{url}/stores/growing/get/{u}")
            reads.append(status)
            return judge.judge(u, status, body)

        with Load() as load:
            load.every(write)
            load.every(read)
            wait_for(lambda: delivered[0] >= 5 and len(reads) > 100, what="batches and reads before the copies")
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            command = [sys.executable, "-m", "riqr", "standbys", "growing", "1", "--address", ray_cluster.address,
                       "--namespace", runtime.namespace]  # fmt: skip
            added = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            assert added.returncode == 0, added.stderr
            grown = _view(registry)
            _, _, stores = http_get(f"{url}/stores")
            listed_standbys = [s["standbys"] for s in stores["result"] if s["name"] == "growing"]
            at_add = len(reads)
            wait_for(lambda: len(reads) > at_add + 100, what="reads after the copies were added")

            # An owner killed for good: its partitions fail over to the copies just added.
            victim = sorted(u for u in first.actors)[0]
            ray.kill(ray.get_actor(victim, namespace=runtime.namespace), no_restart=True)
            at_kill = len(reads)
            wait_for(lambda: len(reads) > at_kill + 200, what="reads after the owner's death")
            last = delivered[0]
            wait_for(lambda: delivered[0] >= last + 3, what="batches after the owner's death")
            again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
            assert again.returncode == 0 and "nothing to add" in again.stderr, again.stderr

            # Back to none, under the same load, once the re-created owner answers for its partitions again:
            # the copies riqr standbys added go, whole, and their data with them; the store's own actors stay.
            wait_for(
                lambda: {o.active for o in _view(registry).tables["growing"].partitions} <= set(first.actors),
                what="the re-created owner answering for its partitions again",
            )
            fewer_command = [*command[:5], "0", *command[6:]]
            dry = subprocess.run([*fewer_command, "--dry-run"], env=env, capture_output=True, text=True, timeout=300)
            assert dry.returncode == 0 and dry.stderr.count("would remove store growing") == 2, dry.stderr
            assert "2 standby copies to remove" in dry.stderr, dry.stderr
            at_remove = len(reads)
            fewer = subprocess.run(fewer_command, env=env, capture_output=True, text=True, timeout=300)
            assert fewer.returncode == 0, fewer.stderr
            wait_for(lambda: len(reads) > at_remove + 100, what="reads after the copies were removed")
            last = delivered[0]
            wait_for(lambda: delivered[0] >= last + 3, what="batches after the copies were removed")

        assert load.errors == [], f"ingest must never fail: {load.errors[:3]}"
        assert load.wrong == [], load.wrong[:10]
        not_ok = [r for r in reads if r != 200]
        print(f"\nstandbys: {len(reads)} reads, {len(not_ok)} not 200; {delivered[0]} batches\n{added.stderr}")
        assert not_ok == [], not_ok[:10]
        assert "2 standby copies to add to store growing" in added.stderr, added.stderr
        assert "every partition of store growing has 1 standby copy" in added.stderr, added.stderr

        # Each partition has one standby, on the node its active is not on; the original actors stayed.
        grown_table = grown.tables["growing"]
        assert grown_table.spec.standbys == 1 and grown_table.fewest_standbys() == 1
        for owners in grown_table.partitions:
            nodes = [grown.actors[u].node_id for u in (owners.active, *owners.standbys) if u]
            assert len(nodes) == 2 and len(set(nodes)) == 2, nodes
        assert set(first.actors) < set(grown.actors) and len(grown.actors) == 4
        assert listed_standbys == [1]
        print(fewer.stderr)
        assert "2 standby copies to remove from store growing" in fewer.stderr, fewer.stderr
        assert "no partition of store growing has more than 0 standby copies" in fewer.stderr, fewer.stderr
        shrunk = _view(registry).tables["growing"]
        assert set(shrunk.all_owners()) == set(first.actors) and shrunk.spec.standbys == 0
        named = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
        assert not (set(grown.actors) - set(first.actors)) & named  # the copies' actors are gone
        _, _, stores = http_get(f"{url}/stores")
        assert [s["standbys"] for s in stores["result"] if s["name"] == "growing"] == [0]

        # No batch lost: every copy still listed that answers holds the latest value of each of its keys.
        final = _view(registry)
        for uuid, held in final.tables["growing"].all_owners().items():
            if uuid == victim:
                continue
            actor = ray.get_actor(uuid, namespace=runtime.namespace)
            copy, _ = raycalls.get(actor.scan.remote(held, Scan()), "scan")
            assert {k: decode_value(v) for k, v in copy} == {
                k: v for k, v in latest.items() if table.partition_of(k) in held
            }, uuid
    finally:
        deploy.down(runtime.namespace)
