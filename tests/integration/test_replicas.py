"""Standby replicas on a real two-node Ray: placed on the other node, fed every batch, and answering
inside the same request when the active owner is dead or restarting: lookups, scans, pages, counts; and
reads that never go back in time while owners are killed again and again under batches (monotonic reads,
runtime/monotonic.py)."""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
import ray

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.partitioner import partition_of, spark_partition_sql
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import GrowingReads, Load, http_get, wait_for
from topologies.delivery import BatchDelivery

pytestmark = pytest.mark.integration

SPEC = StoreSpec(
    "replicated", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=4, actors=2, standbys=1
)
USERS = range(0, 400)


@pytest.fixture(scope="module")
def runtime_ns(ray_cluster: RayCluster) -> Iterator[Runtime]:
    from verticles import deploy

    runtime = deploy_runtime("riqr-replicas")
    yield runtime
    deploy.down(runtime.namespace)


@pytest.fixture
def store(runtime_ns: Runtime, spark: Any) -> Iterator[BatchDelivery]:
    registry = runtime_ns.registry()
    view = raycalls.get(registry.create_store.remote(SPEC), "create_store")
    delivery = BatchDelivery(SPEC, runtime_ns.namespace, checkpoint="unused")
    df = spark.createDataFrame([(u, u * 10) for u in USERS], "user bigint, score bigint")
    partition = spark_partition_sql(SPEC.key.type, "user", 4)
    delivery.deliver("q", 0, df.selectExpr("user", "score", f"{partition} AS {PARTITION_COLUMN}").toArrow())
    actors = {u for u, info in view.actors.items() if info.store == SPEC.name}
    for url in runtime_ns.endpoints.values():
        wait_for(
            lambda url=url: {i["actor"] for i in http_get(f"{url}/metadata/stores/replicated")[2]["result"]} == actors,
            what="the REST API seeing the store",
        )
    yield delivery
    raycalls.get(registry.drop_store.remote(SPEC.name), "drop_store")


def test_each_partition_has_a_standby_on_the_other_node(runtime_ns: Runtime, store: BatchDelivery) -> None:
    view = raycalls.get(runtime_ns.registry().view.remote(), "view")
    table = view.tables["replicated"]
    assert table.spec.standbys == 1
    for owners in table.partitions:
        assert owners.active is not None and len(owners.standbys) == 1
        assert view.actors[owners.active].node_id != view.actors[owners.standbys[0]].node_id
    catalog = {s["name"]: s for s in http_get(f"{runtime_ns.url}/stores")[2]["result"]}
    assert catalog["replicated"]["standbys"] == 1


def _copies_of_7(url: str) -> list[dict[str, Any]]:
    """Every copy of key 7's partition as ``/metadata/stores/replicated/key/7`` shows them."""
    replicas: list[dict[str, Any]] = http_get(f"{url}/metadata/stores/replicated/key/7")[2]["result"]["replicas"]
    return replicas


def test_metadata_and_the_catalog_show_each_copys_position_lag_and_state(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    """Lag is visible per copy: a standby that lacks the newest acknowledged batch shows it in batches and
    in seconds (growing while it lacks it), and shows 0 once it has it; every form of /metadata and the
    catalog agree."""
    from runtime.ingest import slices_for_owners, split_by_partition

    url, ns = runtime_ns.url, runtime_ns.namespace
    # Batch 0 (the fixture's) is acknowledged once the sink's report reaches the registry (asynchronously).
    wait_for(
        lambda: (
            [(c["role"], c["replica_state"], c["lag_batches"], c["lag_seconds"]) for c in _copies_of_7(url)]
            == [("active", "active", 0, 0.0), ("standby", "in-sync", 0, 0.0)]
        ),
        what="both copies of key 7's partition in sync, at the acknowledged batch 0",
    )
    copies = _copies_of_7(url)
    assert [(c["source"], c["batch_id"], c["state"]) for c in copies] == [("q", 0, "serving")] * 2
    assert copies[0]["node"] != copies[1]["node"]
    # Batch 1 reaches the active copies only (as if a standby had missed it), and the sink reports it.
    view = raycalls.get(runtime_ns.registry().view.remote(), "view")
    table = view.tables[SPEC.name]
    split = split_by_partition(_batch(1, [7, 8, 9], 1), SPEC.partitions)
    for uuid, slices in slices_for_owners(table, split, "active").items():
        raycalls.get(ray.get_actor(uuid, namespace=ns).apply.remote("q", 1, slices), "apply")
    store.report(state="running", batch_id=1, source="q", rows=3)

    def standby_behind() -> bool:
        active, standby = _copies_of_7(url)
        return active["lag_batches"] == 0 and standby["lag_batches"] == 1

    wait_for(standby_behind, what="the standby shown one batch behind")
    active, standby = _copies_of_7(url)
    assert (active["batch_id"], standby["batch_id"]) == (1, 0)
    assert standby["replica_state"] == "in-sync"  # it serves: complete at batch 0, by the gap rule
    first = standby["lag_seconds"]
    assert isinstance(first, float) and 0.0 <= first < 120.0
    # Lag in seconds is the time since batch 1 was acknowledged: it grows while the standby lacks it.
    wait_for(lambda: _copies_of_7(url)[1]["lag_seconds"] > first, what="the standby's lag in seconds growing")
    # /metadata, /metadata/stores/{store} and the catalog say the same of every copy.
    for path in ("/metadata", "/metadata/stores/replicated"):
        seen = {
            (i["actor"], p["partition"]): (p["role"], p["lag_batches"], p["replica_state"])
            for i in http_get(f"{url}{path}")[2]["result"]
            if i["state-store-names"] == ["replicated"]
            for p in i["positions"]
        }
        assert len(seen) == 2 * SPEC.partitions
        for p, owners in enumerate(table.partitions):  # every partition sees every batch id, rows or not
            assert seen[(owners.active, p)] == ("active", 0, "active")
            assert seen[(owners.standbys[0], p)] == ("standby", 1, "in-sync")
    catalog = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}["replicated"]
    assert "acked" not in catalog["ingest"]
    for entry in catalog["positions"]:
        p = entry["partition"]
        assert (entry["actor"], entry["lag_batches"], entry["replica_state"]) == (
            table.partitions[p].active,
            0,
            "active",
        )
        assert [(c["actor"], c["role"], c["lag_batches"]) for c in entry["replicas"]] == [
            (table.partitions[p].active, "active", 0),
            (table.partitions[p].standbys[0], "standby", 1),
        ]
    # The standbys get batch 1: in sync, no lag, everywhere.
    for uuid, slices in slices_for_owners(table, split, "standby").items():
        raycalls.get(ray.get_actor(uuid, namespace=ns).apply.remote("q", 1, slices), "apply")
    wait_for(
        lambda: (
            [(c["batch_id"], c["replica_state"], c["lag_batches"], c["lag_seconds"]) for c in _copies_of_7(url)]
            == [(1, "active", 0, 0.0), (1, "in-sync", 0, 0.0)]
        ),
        what="the standby in sync again",
    )
    catalog = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}["replicated"]
    assert {(c["lag_batches"], c["lag_seconds"]) for e in catalog["positions"] for c in e["replicas"]} == {(0, 0.0)}


def test_a_dead_active_is_answered_for_by_its_standby_in_the_same_request(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    url = runtime_ns.url
    owner = http_get(f"{url}/metadata/stores/replicated/key/7")[2]["result"]
    assert len(owner["standbys"]) == 1
    with Load() as load:
        load.every(_reads_of_the_loaded_scores(url))
        load.wait_more(50, "load before the kill")
        ray.kill(ray.get_actor(owner["actor"], namespace=runtime_ns.namespace), no_restart=True)
        # The registry promotes the standby: lookups no longer ask the dead actor first.
        standby = owner["standbys"][0]["actor"]
        wait_for(
            lambda: _actives(runtime_ns) == [standby] * SPEC.partitions, interval=0.02, what="the standby promoted"
        )
        load.wait_more(200, "answers after the kill")
        # Ray will not restart it: the registry creates it again on its node (RIQR_RECREATE_AFTER, 2 s) and
        # gives its partitions back once its copies serve.
        wait_for(lambda: owner["actor"] in _actives(runtime_ns), timeout=60, what="the actor back as an active")
        load.wait_more(100, "answers after it came back")
    assert (load.wrong, load.errors) == ([], [])
    body = http_get(f"{url}/stores/replicated/all")[2]
    assert [e["key"] for e in body["result"]] == list(USERS)
    assert http_get(f"{url}/stores/replicated/approximate-num-entries")[2] == {"result": len(USERS)}


def _reads_of_the_loaded_scores(url: str) -> Callable[[], str | None]:
    """A reader's step: every 7th user in turn must have the score the fixture loaded."""
    picks = itertools.count(0, 7)

    def step() -> str | None:
        user = USERS[next(picks) % len(USERS)]
        status, _, body = http_get(f"{url}/stores/replicated/get/{user}")
        return None if status == 200 and body == {"response": user * 10} else f"{user}: {status} {body}"

    return step


def _actives(runtime: Runtime) -> list[str | None]:
    view = raycalls.get(runtime.registry().view.remote(), "view")
    return [owners.active for owners in view.tables[SPEC.name].partitions]


def test_a_restarting_active_is_promoted_away_from_and_given_its_partitions_back_once_it_serves(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    url = runtime_ns.url
    before = _actives(runtime_ns)
    victim = http_get(f"{url}/metadata/stores/replicated/key/7")[2]["result"]["actor"]
    with Load() as load:  # reads of the victim's keys while it restarts (they also tell the registry)
        load.every(_reads_of_the_loaded_scores(url))
        # The registry promotes when its check (about every second, or at once when a facade finds the
        # actor unreachable) sees the actor down. Ray may restart it before any check does: then nothing
        # needed promoting and no read went wrong (the load says), so it is killed again, a few times.
        for attempt in itertools.count(1):
            ray.kill(ray.get_actor(victim, namespace=runtime_ns.namespace), no_restart=False)  # Ray restarts it
            try:
                wait_for(lambda: victim not in _actives(runtime_ns), timeout=30, interval=0.02, what="promoted")
                break
            except AssertionError:
                if attempt == 3:
                    raise AssertionError("3 kills of the active and its standby was never promoted") from None
        wait_for(lambda: _actives(runtime_ns) == before, timeout=120, what="its partitions given back")
    assert (load.wrong, load.errors) == ([], [])
    # The facades follow the registry's view (pushed through their long poll, a moment later).
    wait_for(
        lambda: http_get(f"{url}/metadata/stores/replicated/key/7")[2]["result"]["actor"] == victim,
        what="the REST API routing key 7 to its first active again",
    )


def test_a_stream_whose_owner_dies_midway_completes_with_every_key_once(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    from runtime.config import PAGE_BYTES

    url, ns = runtime_ns.url, runtime_ns.namespace
    # Enough rows that each owner's share is many pages of PAGE_BYTES (one is fetched ahead): most of the
    # victim's rows can only come from its standbys once it is dead.
    extra = list(range(1_000, 1_000 + 200_000))
    store.deliver("q", 1, _batch(1, extra, 1))
    everyone = sorted([*USERS, *extra])
    victim = http_get(f"{url}/metadata/stores/replicated/key/7")[2]["result"]["actor"]
    view = raycalls.get(runtime_ns.registry().view.remote(), "view")
    victims = set(view.tables[SPEC.name].by_owner()[victim])
    share = sum(1 for u in everyone if partition_of(SPEC.key.type, u, SPEC.partitions) in victims)
    assert share * 16 > 6 * PAGE_BYTES  # at least 16 bytes a row as a page carries it: six pages or more

    def dead() -> bool:
        try:
            ray.get_actor(victim, namespace=ns)
        except ValueError:
            return True
        return False

    request = urllib.request.Request(f"{url}/stores/replicated/all", headers={"Accept": "application/x-ndjson"})
    keys = []
    with urllib.request.urlopen(request, timeout=60) as resp:
        for n, line in enumerate(resp):
            keys.append(json.loads(line)["key"])
            if n == 10:  # the first pages are out: the owner dies while the stream goes on
                ray.kill(ray.get_actor(victim, namespace=ns), no_restart=True)
                wait_for(dead, what="the victim gone before the stream reads on")
    assert keys == everyone  # every key once, in order: the victim's later pages came from its standbys
    # Pages with cursors go on too.
    first = http_get(f"{url}/stores/replicated/all?limit=150")[2]
    rest = http_get(f"{url}/stores/replicated/all?limit=1000&cursor={first['next']}")[2]
    assert [e["key"] for e in first["result"] + rest["result"]] == everyone[:1150]


def test_a_batch_delivered_while_an_owner_restarts_reaches_every_copy(
    runtime_ns: Runtime, store: BatchDelivery, spark: Any
) -> None:
    import os
    import signal

    from bench.faults import worker_pid

    url = runtime_ns.url
    owner = http_get(f"{url}/metadata/stores/replicated/key/7")[2]["result"]
    handle = ray.get_actor(owner["actor"], namespace=runtime_ns.namespace)
    killed = worker_pid(handle)
    os.kill(killed, signal.SIGKILL)  # dead before the batch is sent (ray.kill only asks): Ray restarts it
    wait_for(lambda: not os.path.exists(f"/proc/{killed}"), what="the owner's process gone")
    store.deliver("q", 1, _batch(1, [7], 777))
    assert worker_pid(handle) != killed  # the batch went to the restarted actor
    copies = _every_copy(runtime_ns, [7])
    assert len(copies) == 2 and all(values == [777] for values in copies.values()), copies
    assert http_get(f"{url}/stores/replicated/get/7")[2] == {"response": 777}


def test_a_copy_whose_data_was_wiped_is_rebuilt_from_its_peer_while_batches_and_reads_go_on(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    import random
    import shutil
    import time

    from runtime.config import riqr_data
    from runtime.scan import Scan

    url, ns = runtime_ns.url, runtime_ns.namespace
    view = raycalls.get(runtime_ns.registry().view.remote(), "view")
    victim, peer = sorted(u for u, info in view.actors.items() if info.store == SPEC.name)
    history: dict[int, set[int]] = {u: {u * 10} for u in USERS}
    judged = GrowingReads(history)  # one reader thread (Load), through one REST node
    latest = {u: u * 10 for u in USERS}
    delivered = [0]
    batches = itertools.count(1)
    picks, reads = random.Random(7), random.Random(11)

    def write() -> None:  # a step raising (ingest failing) ends the load and is asserted below
        batch = next(batches)
        users = picks.sample(list(USERS), 20)
        for u in users:  # known before it is delivered, so a read can never see an unknown value
            latest[u] = u * 10 + batch * 100_000
            history[u].add(latest[u])
        table = pa.table({"user": pa.array(users, pa.int64()), "score": pa.array([latest[u] for u in users])})
        parts = [view.tables[SPEC.name].partition_of(u) for u in users]
        store.deliver("q", batch, table.append_column(PARTITION_COLUMN, pa.array(parts, pa.int32())))
        delivered[0] = batch
        time.sleep(0.05)

    def read() -> str | None:
        u = reads.choice(list(USERS))
        status, _, body = http_get(f"{url}/stores/replicated/get/{u}")
        return judged.judge(u, status, body)

    with Load() as load:
        load.every(write)
        load.every(read)
        wait_for(lambda: delivered[0] >= 10, what="batches flowing before the wipe")
        handle = ray.get_actor(victim, namespace=ns)
        # Wipe its partitions while it runs, then restart it: it comes back with nothing to reopen.
        shutil.rmtree(riqr_data(ns) / SPEC.name / victim)
        ray.kill(handle, no_restart=False)
        at_restart = delivered[0]

        def rebuilt() -> bool:
            positions = raycalls.get(handle.positions.remote(), "positions", timeout=30)
            return all(pos["state"] == "serving" for pos in positions.values())

        wait_for(lambda: delivered[0] > at_restart + 5 and rebuilt(), timeout=120, what="the wiped copy in sync")
        load.wait_more(100, "reads after the rebuild")
    assert load.errors == [], "ingest must never fail"
    assert load.wrong == [], load.wrong[:10]
    peer_handle = ray.get_actor(peer, namespace=ns)
    mine = raycalls.get(handle.positions.remote(), "positions")
    assert mine == raycalls.get(peer_handle.positions.remote(), "positions")
    assert {pos["batch_id"] for pos in mine.values()} == {delivered[0]}
    partitions = list(range(SPEC.partitions))
    copy, _ = raycalls.get(handle.scan.remote(partitions, Scan()), "scan")
    assert copy == raycalls.get(peer_handle.scan.remote(partitions, Scan()), "scan")[0]
    from runtime.codec import decode_value

    assert {k: decode_value(v) for k, v in copy} == latest


def _every_copy(runtime: Runtime, users: list[int]) -> dict[str, list[Any]]:
    """Each of the store's query actors' own answer for ``users`` (decoded values; None: it holds the key's
    partition but not the key; users in partitions it does not hold are left out)."""
    from runtime.codec import decode_value

    view = raycalls.get(runtime.registry().view.remote(), "view")
    table = view.tables[SPEC.name]
    out: dict[str, list[Any]] = {}
    for uuid in sorted(table.all_owners()):
        held = set(table.all_owners()[uuid])
        items = [(p, u) for u in users if (p := partition_of(SPEC.key.type, u, SPEC.partitions)) in held]
        values, _ = raycalls.get(ray.get_actor(uuid, namespace=runtime.namespace).get_many.remote(items), "get_many")
        out[uuid] = [None if v is None else decode_value(v) for v in values]
    return out


def _a_lost_object() -> Any:
    """A reference whose object is gone with its owner, as a lost node takes its objects."""

    @ray.remote
    class Owner:
        def hold(self) -> list[Any]:
            return [ray.put(b"an object that goes with its owner")]

    owner = Owner.remote()  # type: ignore[attr-defined]
    [gone] = ray.get(owner.hold.remote())
    ray.kill(owner, no_restart=True)
    return gone


def _observed(shared: list[dict[int, Any]], gone: Any) -> type[BatchDelivery]:
    """A sink that records what each batch's standbys shared, and with ``lose_shared`` loses it all
    (every reference replaced by ``gone``) before the actives are called."""

    class Observed(BatchDelivery):
        lose_shared = False

        def _apply_to(self, *args: Any, **kwargs: Any) -> list[Any]:
            results = super()._apply_to(*args, **kwargs)
            share = kwargs.get("share")
            if share is not None:
                shared.append(dict(share))
                if self.lose_shared:
                    share.update(dict.fromkeys(share, gone))
            return results

    return Observed


def test_active_copies_apply_their_standbys_encoded_slices_or_the_batchs_own_when_those_are_gone(
    runtime_ns: Runtime, store: BatchDelivery, caplog: pytest.LogCaptureFixture
) -> None:
    """A rocksdb store's standbys return their slices encoded, and the actives apply those instead of
    encoding the batch again. If those objects are gone when the actives are called (here: references
    whose owner was killed, as a lost node takes its objects), the actives are asked again with the
    batch's own slices: every copy ends the same."""

    gone = _a_lost_object()
    users = list(USERS)
    shared: list[dict[int, Any]] = []
    Observed = _observed(shared, gone)

    delivery = Observed(SPEC, runtime_ns.namespace, checkpoint="unused")
    assert delivery.share_encoded_rows > len(users)  # a small batch is not shared: this one is, on purpose
    delivery.share_encoded_rows = 1
    for batch_id, lose in ((1, False), (2, True)):
        delivery.lose_shared = lose
        caplog.clear()
        with caplog.at_level("WARNING", logger="topologies.delivery"):
            delivery.deliver("q", batch_id, _batch(batch_id, users, batch_id * 1000))
        assert sorted(shared[-1]) == list(range(SPEC.partitions))  # every partition encoded by its standby
        fell_back = [r.getMessage() for r in caplog.records if "encoded slices" in r.getMessage()]
        assert len(fell_back) == (SPEC.actors if lose else 0), fell_back
        copies = _every_copy(runtime_ns, users)
        assert len(copies) == SPEC.actors
        for answers in copies.values():  # each actor holds every partition here, as active or standby
            assert answers == [batch_id * 1000] * len(users)
    assert http_get(f"{runtime_ns.url}/stores/replicated/approximate-num-entries")[2] == {"result": len(USERS)}
    delivery.share_encoded_rows = len(users) + 1  # and a batch below the bound goes the plain way
    delivery.deliver("q", 3, _batch(3, users, 3000))
    assert len(shared) == 2
    assert all(answers == [3000] * len(users) for answers in _every_copy(runtime_ns, users).values())


def test_a_large_batch_reaches_each_active_as_the_file_its_standby_wrote(
    runtime_ns: Runtime, store: BatchDelivery, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch large enough for the rocksdb engine to write each partition's rows as an SST file: the
    standbys hand their files over with the encoded rows, the actives on the other node ingest them (into
    the state the files were made from), and every copy ends the same, counts included: first for new
    keys, then for updates with the files lost on the way (the actives then write the batch's own rows)."""
    from runtime.engines.rocks import INGEST_FILE_ROWS

    shared: list[dict[int, Any]] = []
    delivery = _observed(shared, _a_lost_object())(SPEC, runtime_ns.namespace, checkpoint="unused")
    users = list(range(SPEC.partitions * INGEST_FILE_ROWS * 23 // 20))  # every partition's slice is large
    sample = [*users[:: len(users) // 500], users[-1]]
    for batch_id, lose in ((1, False), (2, True)):
        delivery.lose_shared = lose
        caplog.clear()
        with caplog.at_level("WARNING", logger="topologies.delivery"):
            delivery.deliver("q", batch_id, _batch(batch_id, users, batch_id * 1000))
        slices = [raycalls.get(ref, "a shared slice") for ref in shared[-1].values()] if not lose else []
        for encoded in slices:
            assert encoded.written is not None and encoded.written.after == ("q", batch_id, encoded.num_rows)
        fell_back = [r.getMessage() for r in caplog.records if "encoded slices" in r.getMessage()]
        assert len(fell_back) == (SPEC.actors if lose else 0), fell_back
        copies = _every_copy(runtime_ns, sample)
        assert len(copies) == SPEC.actors
        for answers in copies.values():
            assert answers == [batch_id * 1000] * len(sample)
        count = http_get(f"{runtime_ns.url}/stores/replicated/approximate-num-entries")[2]
        assert count == {"result": len(users)}
        # Each active took its standby's file in batch 1; none could in batch 2.
        assert _ingested_from_copy(runtime_ns) == SPEC.partitions


def _ingested_from_copy(runtime: Runtime) -> float:
    """The store's batches its copies took as another copy's file, summed over its query actors."""
    view = raycalls.get(runtime.registry().view.remote(), "view")
    total = 0.0
    for uuid in view.tables[SPEC.name].all_owners():
        stats = raycalls.get(ray.get_actor(uuid, namespace=runtime.namespace).stats.remote(), "stats")
        for name, labels, value in stats["samples"]:
            if name == "riqr_batches_ingested_from_copy_total" and dict(labels).get("store") == SPEC.name:
                total += value
    return total


def _batch(batch_id: int, users: list[int], score: int) -> pa.Table:
    """Batch ``batch_id``: ``users`` get ``score``, as the sink would deliver it (partition column included)."""
    parts = [partition_of(SPEC.key.type, u, SPEC.partitions) for u in users]
    return pa.table(
        {
            "user": pa.array(users, pa.int64()),
            "score": pa.array([score] * len(users), pa.int64()),
            PARTITION_COLUMN: pa.array(parts, pa.int32()),
        }
    )


def test_owners_killed_again_and_again_under_reads_and_batches_never_give_an_older_answer(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    """Every batch raises some scores and adds one user, standbys first then actives, while both query
    actors are killed in turn (Ray restarts them). Reads fail over and come back; each reader checks that
    nothing it sees goes back: a score lower than one it saw, a user it saw turning 404, a count that drops.
    Wrong answers are counted, not only errors."""
    url = runtime_ns.url
    namespace = runtime_ns.namespace
    actors = sorted({i["actor"] for i in http_get(f"{url}/metadata/stores/replicated")[2]["result"]})
    delivered = [0]
    statuses: dict[int, int] = {}
    batches = itertools.count(1)

    def feed() -> None:
        batch = next(batches)
        raised = [u for u in USERS if u % 8 == batch % 8]
        store.deliver("q", batch, _batch(batch, [*raised, 1000 + batch], 100_000 + batch))
        delivered[0] = batch

    def reader(seed: int) -> Callable[[], str | None]:
        scores: dict[int, int] = {}
        count_seen = [0]
        steps = itertools.count(seed + 1)

        def read() -> str | None:
            i = next(steps)
            if i % 10 == 0:
                status, _, body = http_get(f"{url}/stores/replicated/approximate-num-entries")
                statuses[status] = statuses.get(status, 0) + 1
                if status != 200:
                    return None
                seen, count_seen[0] = count_seen[0], max(count_seen[0], body["result"])
                return f"count {body['result']} after {seen}" if body["result"] < seen else None
            user = USERS[(i * 37) % len(USERS)] if i % 3 else 1000 + max(1, delivered[0] - i % 5)
            status, _, body = http_get(f"{url}/stores/replicated/get/{user}")
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                before, scores[user] = scores.get(user, -1), max(scores.get(user, -1), body["response"])
                return f"user {user}: {body['response']} after {before}" if body["response"] < before else None
            if status == 404 and (user in scores or user < 1000):
                return f"user {user}: 404 after {scores.get(user, 'the first batch')}"
            return None if status in (404, 503) else f"user {user}: {status} {body}"

        return read

    with Load() as load:
        load.every(feed)
        load.every(reader(0))
        load.every(reader(5))
        wait_for(lambda: delivered[0] > 3 and sum(statuses.values()) > 50, what="batches and reads running")
        for kill in range(4):
            victim = actors[kill % len(actors)]
            ray.kill(ray.get_actor(victim, namespace=namespace), no_restart=False)
            seen, batches_then = sum(statuses.values()), delivered[0]
            wait_for(
                lambda seen=seen, b=batches_then: sum(statuses.values()) > seen + 100 and delivered[0] > b + 2,
                timeout=90,
                what=f"reads and batches after kill {kill + 1}",
            )
    assert load.errors == []
    assert load.wrong == [], f"{len(load.wrong)} wrong answers of {sum(statuses.values())}: {load.wrong[:10]}"
    answered = statuses.get(200, 0) + statuses.get(404, 0)
    assert answered >= 0.95 * sum(statuses.values()), statuses
    assert delivered[0] >= 10, delivered


def _solo_and_pair(runtime_ns: Runtime, prefix: str) -> dict[str, tuple[list[int], int]]:
    """Stores ``{prefix}-solo`` (no standby) and ``{prefix}-pair`` (a standby of each partition), 4 partitions
    on 2 actors, loaded with every user's score and visible over REST; for each, the users of its first
    actor's partitions and that actor's worker pid (the one to freeze)."""
    from bench.faults import user_scores, worker_pid

    registry = runtime_ns.registry()
    out = {}
    for name, standbys in ((f"{prefix}-solo", 0), (f"{prefix}-pair", 1)):
        spec = StoreSpec(name, KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=4, actors=2,
                         standbys=standbys)  # fmt: skip
        view = raycalls.get(registry.create_store.remote(spec), "create_store")
        table = view.tables[name]
        BatchDelivery(spec, runtime_ns.namespace, checkpoint="unused").deliver(
            "q", 0, user_scores(table, {u: u * 10 for u in USERS})
        )
        wait_for(
            lambda n=name: (
                http_get(f"{runtime_ns.url}/stores/{n}/approximate-num-entries")[2] == {"result": len(USERS)}
            ),
            what="the store loaded and visible",
        )
        victim = sorted(table.by_owner())[0]
        users = [u for u in USERS if table.partition_of(u) in table.by_owner()[victim]]
        out[name] = users, worker_pid(ray.get_actor(victim, namespace=runtime_ns.namespace))
    return out


def test_a_frozen_owner_is_asked_after_its_standby_and_as_the_only_copy_answers_503_not_after_the_deadline(
    runtime_ns: Runtime,
) -> None:
    """An owner that answers nothing (its worker stopped with SIGSTOP, as a host that hangs or a node gone
    until Ray declares it dead): lookups of its partitions are answered by their standby, and where it is
    the only copy they answer 503 `owner-unavailable` once it has been silent (docs/design.md, "Silent
    owners"), not 504 at the request deadline; every answer given is right, and all are 200 again once it
    runs. Lookups sent before the owner was found silent get the 503 too, once a ping of it goes
    unanswered, rather than waiting for it to run again."""
    import contextlib
    import os
    import signal
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    registry = runtime_ns.registry()
    url = runtime_ns.url
    loaded = _solo_and_pair(runtime_ns, "frozen")
    frozen = {name: users for name, (users, _) in loaded.items()}
    pids = [pid for _, pid in loaded.values()]
    answers: dict[str, list[tuple[int, int, Any]]] = {name: [] for name in frozen}
    took: dict[str, list[float]] = {name: [] for name in frozen}

    def get(name: str, user: int) -> None:
        started = time.monotonic()
        status, _, body = http_get(f"{url}/stores/{name}/get/{user}")
        answers[name].append((user, status, body))
        took[name].append(time.monotonic() - started)

    stop = threading.Event()
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(max_workers=300) as pool:  # open loop: GETs start on time, whatever waits
            for i in itertools.count():
                if i >= 250:  # 5 s at 50 GETs a second per store
                    break
                for name, users in frozen.items():
                    pool.submit(get, name, users[i % len(users)])
                stop.wait(0.02)
            # Scans and counts, now that the lookups found the owners silent: the standby's copy answers a
            # whole scan, and a count that needs the silent only copy is a 503, not a 504 at the deadline.
            status, _, everything = http_get(f"{url}/stores/frozen-pair/all")
            counted = http_get(f"{url}/stores/frozen-solo/approximate-num-entries")
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    for name, got in answers.items():
        statuses = [status for _, status, _ in got]
        wrong = [(u, s, b) for u, s, b in got if s == 200 and b != {"response": u * 10}]
        assert wrong == [], (name, wrong[:5])
        assert 504 not in statuses, (name, sorted(set(statuses)))
        print(f"\n{name}: {len(got)} GETs of the frozen owner's partitions: "
              f"{ {s: statuses.count(s) for s in sorted(set(statuses))} }")  # fmt: skip
    assert {s for _, s, _ in answers["frozen-pair"]} == {200}  # its standby answered every one
    assert status == 200 and [e["key"] for e in everything["result"]] == list(USERS), status
    assert counted[0] == 503 and counted[2]["error"]["code"] == "owner-unavailable", counted
    silent = [b for _, s, b in answers["frozen-solo"] if s == 503]
    assert silent and all(b["error"]["code"] == "owner-unavailable" for b in silent), silent[:3]
    assert {s for _, s, _ in answers["frozen-solo"]} <= {200, 503}
    # The owner stayed frozen over 6 s (the lookups, then a scan and a count): the first lookups, sent
    # before anything found it silent, waited for it that long until its ping was made on their behalf
    # (SILENT_AFTER, 2 s, then SILENT_BUDGET, 1 s).
    assert max(took["frozen-solo"]) < 4.5, sorted(took["frozen-solo"])[-5:]
    for user in frozen["frozen-solo"][:20]:  # running again: answered at once, not remembered as silent
        wait_for(lambda u=user: http_get(f"{url}/stores/frozen-solo/get/{u}")[2] == {"response": u * 10},
                 what="the thawed owner answering")  # fmt: skip
    for name in frozen:
        raycalls.get(registry.drop_store.remote(name), "drop_store")


def test_a_scan_whose_owner_is_frozen_fails_over_or_answers_503_once_a_ping_goes_unanswered(
    runtime_ns: Runtime,
) -> None:
    """Scans alone (no lookup found the owner silent first) of a store whose owner is frozen (SIGSTOP):
    the scan's call is long, so the facade pings the owner on the actor's own probe thread; no answer,
    and the scan continues on the standby (whole and right), or, where the frozen owner is the only copy,
    is a 503 `owner-unavailable`, both in a few seconds rather than a 504 at the request deadline."""
    import contextlib
    import os
    import signal
    import time

    from runtime.config import DEFAULT_REQUEST_TIMEOUT

    registry = runtime_ns.registry()
    url = runtime_ns.url
    pids = [pid for _, pid in _solo_and_pair(runtime_ns, "hung-scan").values()]
    want = [{"key": u, "value": u * 10} for u in USERS]
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        pair = http_get(f"{url}/stores/hung-scan-pair/all")
        pair_took = time.monotonic() - started
        started = time.monotonic()
        solo = http_get(f"{url}/stores/hung-scan-solo/all")
        solo_took = time.monotonic() - started
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    print(f"\nscan of the pair: {pair[0]} in {pair_took:.2f}s; of the solo store: {solo[0]} in {solo_took:.2f}s")
    assert pair[0] == 200 and pair[2]["result"] == want, pair[0]
    assert solo[0] == 503 and solo[2]["error"]["code"] == "owner-unavailable", solo
    assert max(pair_took, solo_took) < DEFAULT_REQUEST_TIMEOUT / 2, (pair_took, solo_took)
    wait_for(lambda: http_get(f"{url}/stores/hung-scan-solo/all")[2] == {"result": want}, what="the thawed owner")
    for name in ("hung-scan-solo", "hung-scan-pair"):
        raycalls.get(registry.drop_store.remote(name), "drop_store")
