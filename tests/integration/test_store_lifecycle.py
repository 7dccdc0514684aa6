"""A store fed directly through the sink's delivery path: typed keys, idempotent batches, owners dying.

These use ``BatchDelivery.deliver`` with Arrow tables whose partition column Spark computed, so they
exercise the real actors and HTTP verticles without waiting on micro-batch triggers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import ray

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.partitioner import spark_partition_sql
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import http_get, wait_for
from topologies.sink import BatchDelivery

pytestmark = pytest.mark.integration

SPEC = StoreSpec(
    "scores", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=4, actors=2, standbys=0
)  # no standby: these tests are about what a lone copy does


@pytest.fixture(scope="module")
def runtime_ns(ray_cluster: RayCluster) -> Iterator[Runtime]:
    from verticles import deploy

    runtime = deploy_runtime("riqr-life")
    yield runtime
    deploy.down(runtime.namespace)


def arrow_batch(spark: Any, rows: list[tuple[int, int | None]]) -> pa.Table:
    df = spark.createDataFrame(rows, "user bigint, score bigint")
    return df.selectExpr(
        "user", "score", f"{spark_partition_sql(SPEC.key.type, 'user', 4)} AS {PARTITION_COLUMN}"
    ).toArrow()


@pytest.fixture
def store(runtime_ns: Runtime, spark: Any) -> Iterator[BatchDelivery]:
    registry = runtime_ns.registry()
    view = ray.get(registry.create_store.remote(SPEC))
    delivery = BatchDelivery(SPEC, runtime_ns.namespace, checkpoint="unused")
    delivery.deliver("query-1", 0, arrow_batch(spark, [(i, i * 10) for i in [1, 2, 10, 20, 100, -5]]))
    # The store is recreated for every test: wait until each REST API's cached view knows its new actors
    # (facades poll the registry's epoch every second).
    actors = {u for u, info in view.actors.items() if info.store == SPEC.name}
    for url in runtime_ns.endpoints.values():
        wait_for(
            lambda url=url: {i["actor"] for i in http_get(f"{url}/metadata/stores/scores")[2]["result"]} == actors,
            what="the REST API seeing the new store",
        )
    yield delivery
    if ray.get(registry.view.remote()).table(SPEC.name) is not None:  # a test may have dropped it
        ray.get(registry.drop_store.remote(SPEC.name))


def test_integer_keys_parse_and_range_numerically(runtime_ns: Runtime, store: BatchDelivery) -> None:
    url = runtime_ns.url
    assert http_get(f"{url}/stores/scores/get/10")[2] == {"response": 100}
    body = http_get(f"{url}/stores/scores/range?from=2&to=20")[2]
    assert [e["key"] for e in body["result"]] == [2, 10, 20]
    assert [e["key"] for e in http_get(f"{url}/stores/scores/all")[2]["result"]] == [-5, 1, 2, 10, 20, 100]
    status, _, body = http_get(f"{url}/stores/scores/get/ten")
    assert status == 400 and body["error"]["code"] == "malformed-key"
    status, _, body = http_get(f"{url}/stores/scores/range?from=1&to=x")
    assert status == 400 and body["error"]["code"] == "malformed-range"
    status, _, body = http_get(f"{url}/stores/scores/get/99999999999999999999")
    assert status == 400


def test_a_replayed_batch_id_changes_nothing(runtime_ns: Runtime, store: BatchDelivery, spark: Any) -> None:
    url = runtime_ns.url
    store.deliver("query-1", 0, arrow_batch(spark, [(1, 999), (7, 7)]))  # batch 0 again, other content
    assert http_get(f"{url}/stores/scores/get/1")[2] == {"response": 10}
    assert http_get(f"{url}/stores/scores/get/7")[0] == 404
    store.deliver("query-1", 1, arrow_batch(spark, [(1, 11), (2, None)]))  # the next batch: upsert, delete
    assert http_get(f"{url}/stores/scores/get/1")[2] == {"response": 11}
    assert http_get(f"{url}/stores/scores/get/2")[0] == 404
    assert http_get(f"{url}/stores/scores/approximate-num-entries")[2] == {"result": 5}


def test_a_dead_owner_is_a_503_with_retry_after_never_a_wrong_answer_until_it_is_created_again(
    runtime_ns: Runtime, store: BatchDelivery, spark: Any
) -> None:
    url = runtime_ns.url
    owner = http_get(f"{url}/metadata/stores/scores/key/1")[2]["result"]
    before = http_get(f"{url}/stores/scores/all")[2]
    node = ray.get(runtime_ns.registry().view.remote()).actors[owner["actor"]].node_id
    handle = ray.get_actor(owner["actor"], namespace=runtime_ns.namespace)
    ray.kill(handle, no_restart=True)  # Ray will not restart it

    def dead() -> bool:
        """ray.kill returns before the actor is gone: a call that reaches it first is answered (and so was a
        GET, rightly: with the value it had)."""
        try:
            ray.get(handle.positions.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            pass
        return False

    wait_for(dead, timeout=30, what="the killed owner gone")
    for path in ["get/1", "all", "approximate-num-entries", "range?from=0&to=1000"]:
        status, headers, body = http_get(f"{url}/stores/scores/{path}")
        assert status == 503, (path, body)
        assert int(headers["Retry-After"]) >= 1
        assert body["error"]["code"] == "owner-unavailable"
    # The registry creates it again on its node once it has been gone for RIQR_RECREATE_AFTER (2 s), and it
    # reopens its partitions there: the next batch waits for it, and every answer is the one it had.
    store.deliver("query-1", 1, arrow_batch(spark, [(1, 11)]))
    assert http_get(f"{url}/stores/scores/get/1")[2] == {"response": 11}
    after = http_get(f"{url}/stores/scores/all")[2]
    assert after["result"] == [
        {"key": e["key"], "value": 11 if e["key"] == 1 else e["value"]} for e in before["result"]
    ]
    assert ray.get(runtime_ns.registry().view.remote()).actors[owner["actor"]].node_id == node  # where its data is


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_a_restarted_owner_serves_again_by_itself_with_exactly_its_state(
    runtime_ns: Runtime, store: BatchDelivery, spark: Any, how: str
) -> None:
    import os
    import signal

    from bench.faults import worker_pid

    url = runtime_ns.url
    owner = http_get(f"{url}/metadata/stores/scores/key/1")[2]["result"]
    before = http_get(f"{url}/stores/scores/all")[2]
    handle = ray.get_actor(owner["actor"], namespace=runtime_ns.namespace)
    if how == "ray.kill":
        ray.kill(handle, no_restart=False)
    else:
        os.kill(worker_pid(handle), signal.SIGKILL)
    # The sink's next batch waits out the restart (and so does a GET, within its deadline).
    store.deliver("query-1", 1, arrow_batch(spark, [(1, 11)]))
    assert http_get(f"{url}/stores/scores/get/1")[2] == {"response": 11}
    after = http_get(f"{url}/stores/scores/all")[2]
    assert after["result"] == [
        {"key": e["key"], "value": 11 if e["key"] == 1 else e["value"]} for e in before["result"]
    ]
    positions = http_get(f"{url}/metadata/stores/scores/key/1")[2]["result"]["positions"]
    assert {(p["batch_id"], p["state"]) for p in positions} == {(1, "serving")}
    # A replay of the batch the sink re-sent after the crash changes nothing.
    store.deliver("query-1", 1, arrow_batch(spark, [(1, 999)]))
    assert http_get(f"{url}/stores/scores/get/1")[2] == {"response": 11}


def test_a_store_dropped_and_declared_again_is_not_fed_by_the_topology_that_fed_the_old_one(
    runtime_ns: Runtime, store: BatchDelivery, spark: Any, tmp_path: Path
) -> None:
    """``riqr drop --force`` and a new declaration of the same store between two looks of the old feed:
    the old feed's next batch is refused before it reaches any copy, and the new store keeps exactly what
    its own feed gave it (fed, it would have been overwritten, or made 503 by a batch from a gap)."""
    from runtime.errors import NotConnected

    registry = runtime_ns.registry()
    store.declared(ray.get(registry.view.remote()))
    old_actors = set(store.owners or ())
    ray.get(registry.drop_store.remote(SPEC.name))  # as riqr drop --force
    view = ray.get(registry.create_store.remote(SPEC))
    new = BatchDelivery(SPEC, runtime_ns.namespace, checkpoint="unused")
    new.declared(view)
    assert new.owners and not (new.owners & old_actors)  # all new actors, under the same name
    assert new.begin("query-2") == [0, 1, 2, 3]
    new.deliver("query-2", 0, arrow_batch(spark, [(1, 1000), (3, 3000)]))

    with pytest.raises(NotConnected, match="'scores' was dropped and declared again"):
        store.deliver("query-1", 1, arrow_batch(spark, [(1, 11), (7, 7)]))
    assert store.begin("query-1") == []  # nor told a new source starts

    url = runtime_ns.url
    wait_for(lambda: http_get(f"{url}/stores/scores/get/1")[2] == {"response": 1000}, what="the new store served")
    assert http_get(f"{url}/stores/scores/get/3")[2] == {"response": 3000}
    assert http_get(f"{url}/stores/scores/get/7")[0] == 404
    assert http_get(f"{url}/stores/scores/approximate-num-entries")[2] == {"result": 2}
    positions = ray.get([new.handle(u).positions.remote() for u in sorted(new.owners)])
    assert {p["source"] for held in positions for p in held.values()} == {"query-2"}

    # The old topology's query started again in place (``start_again``) is refused too, before it starts,
    # and a store dropped meanwhile is not brought back by it.
    from topologies.sink import StoreUnregistered, materialize

    rate = spark.readStream.format("rate").load().selectExpr("value AS user", "value AS score")
    options: dict[str, Any] = {"store": "scores", "key": "user", "value": "score", "namespace": runtime_ns.namespace,
                               "partitions": 4, "actors": 2, "standbys": 0, "_rebuilding": True}  # fmt: skip
    with pytest.raises(StoreUnregistered, match="dropped and declared again.*not started again"):
        materialize(rate, checkpoint=str(tmp_path / "old"), _owners=frozenset(old_actors), **options)
    ray.get(registry.drop_store.remote(SPEC.name))
    with pytest.raises(StoreUnregistered, match="'scores' is no longer registered; not started again"):
        materialize(rate, checkpoint=str(tmp_path / "new"), _owners=new.owners, **options)
    assert ray.get(registry.view.remote()).table(SPEC.name) is None  # not created anew
    assert not [q for q in spark.streams.active if q.name.endswith("-scores")]


def test_redeclaring_with_another_layout_is_a_conflict(runtime_ns: Runtime, store: BatchDelivery) -> None:
    from runtime.errors import StoreConflict

    other = StoreSpec("scores", KeySchema("user", "string"), (ValueField("score", "bigint"),))
    said = r"already exists with another definition \(key \(user long\) -> \(user string\)\)"
    with pytest.raises(StoreConflict, match=said):
        raycalls.get(runtime_ns.registry().create_store.remote(other), "create_store")


def test_a_restarted_registry_rebuilds_its_tables_from_the_query_actors(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    registry = runtime_ns.registry()
    epoch_before = ray.get(registry.epoch.remote())
    ray.kill(registry, no_restart=False)

    def rebuilt() -> bool:
        view = ray.get(runtime_ns.registry().view.remote(), timeout=10)
        return view.epoch > epoch_before and "scores" in view.tables

    wait_for(rebuilt, what="the registry coming back with the store")
    view = ray.get(runtime_ns.registry().view.remote())
    assert sorted(p for info in view.actors.values() if info.store == "scores" for p in info.partitions) == [0, 1, 2, 3]
    assert {f"http://{ep.host}:{ep.port}" for ep in view.endpoints.values()} == set(runtime_ns.endpoints.values())
    # Facades follow the new epoch; queries keep working through it.
    wait_for(
        lambda: http_get(f"{runtime_ns.url}/stores/scores/get/10")[2] == {"response": 100},
        what="queries after the rebuild",
    )


def test_a_registry_restarted_while_an_owner_is_gone_for_good_remembers_it_and_creates_it_again(
    runtime_ns: Runtime, store: BatchDelivery, spark: Any
) -> None:
    """The restarted registry cannot ask the dead owner what it held; it knows from the members it saved.
    Before they were saved, the store (no standbys) was left out of the tables: 404 for every key, for good."""
    url = runtime_ns.url
    owner = http_get(f"{url}/metadata/stores/scores/key/1")[2]["result"]
    before = http_get(f"{url}/stores/scores/all")[2]["result"]
    expected = {e["key"]: e["value"] for e in before}
    node = ray.get(runtime_ns.registry().view.remote()).actors[owner["actor"]].node_id
    epoch_before = ray.get(runtime_ns.registry().epoch.remote())
    ray.kill(ray.get_actor(owner["actor"], namespace=runtime_ns.namespace), no_restart=True)
    ray.kill(runtime_ns.registry(), no_restart=False)

    answers: dict[int, int] = {}

    def back() -> bool:
        # Every answer meanwhile is the key's value or a 503 (its owner is down): never a 404 for the store
        # or the key, never another value.
        ok = True
        for key, value in expected.items():
            status, _, body = http_get(f"{url}/stores/scores/get/{key}")
            answers[status] = answers.get(status, 0) + 1
            assert status in (200, 503), (key, status, body)
            if status == 200:
                assert body == {"response": value}, key
            ok = ok and status == 200
        return ok and ray.get(runtime_ns.registry().epoch.remote(), timeout=10) > epoch_before

    wait_for(back, timeout=60, what="the owner created again by the restarted registry", fatal=(AssertionError,))
    assert answers.get(503, 0) > 0  # the owner was really gone for a while
    view = ray.get(runtime_ns.registry().view.remote())
    assert view.actors[owner["actor"]].node_id == node  # on its node, where its data is
    assert sorted(p for info in view.actors.values() if info.store == "scores" for p in info.partitions) == [0, 1, 2, 3]
    store.deliver("query-1", 1, arrow_batch(spark, [(1, 11)]))
    after = http_get(f"{url}/stores/scores/all")[2]["result"]
    assert after == [{"key": e["key"], "value": 11 if e["key"] == 1 else e["value"]} for e in before]


def test_a_registry_killed_in_the_middle_of_a_drop_finishes_it_when_it_restarts(
    runtime_ns: Runtime, store: BatchDelivery
) -> None:
    """``drop_store`` saves the drop (the store gone from the members, its actors marked as being dropped),
    then destroys the actors one by one. The first one's process is stopped (SIGSTOP), so the registry
    waits on it with nothing destroyed yet, and is killed right there: the restarted one finds the actors
    alive and answering, and must destroy them rather than take the store back. Before the marks, it took
    them back, and the store a user had dropped served again."""
    from bench.faults import worker_pid
    from verticles import deploy

    url, namespace = runtime_ns.url, runtime_ns.namespace
    registry = runtime_ns.registry()
    members = sorted(u for u, a in ray.get(registry.view.remote()).actors.items() if a.store == SPEC.name)
    kv = deploy.RayEnv(namespace)
    pid = worker_pid(ray.get_actor(members[0], namespace=namespace))  # destroyed first: uuid order
    os.kill(pid, signal.SIGSTOP)
    try:
        dropping = registry.drop_store.remote(SPEC.name)
        wait_for(lambda: (kv.load_membership() or {}).get("dropping") == members, what="the drop saved")
        ray.kill(registry, no_restart=False)
    finally:
        os.kill(pid, signal.SIGCONT)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(dropping, timeout=60)  # its caller sees an error, but the drop was made

    def destroyed() -> bool:
        # Until the drop is finished, an answer is the key's value (the drop was never acknowledged), a 503
        # or the store not found: never another value.
        status, _, body = http_get(f"{url}/stores/scores/get/10")
        assert (
            (status, body) == (200, {"response": 100})
            or status == 503
            or (status == 404 and body["error"]["code"] == "store-not-found")
        ), (status, body)
        alive = []
        for uuid in members:
            try:
                ray.get_actor(uuid, namespace=namespace)
                alive.append(uuid)
            except ValueError:
                pass
        return not alive and status == 404

    wait_for(destroyed, timeout=60, what="the saved drop finished by the restarted registry", fatal=(AssertionError,))
    view = ray.get(runtime_ns.registry().view.remote(), timeout=10)
    assert view.table(SPEC.name) is None and set(view.actors).isdisjoint(members)
    saved = kv.load_membership()
    assert saved is not None and SPEC.name not in saved["stores"] and "dropping" not in saved


def test_a_restarted_http_verticle_serves_again_on_the_same_url(runtime_ns: Runtime, store: BatchDelivery) -> None:
    from runtime.config import http_name

    node_id, url = next(iter(runtime_ns.endpoints.items()))
    ray.kill(ray.get_actor(http_name(node_id), namespace=runtime_ns.namespace), no_restart=False)
    wait_for(
        lambda: http_get(f"{url}/stores/scores/get/10")[2] == {"response": 100}, what="the REST API back on its URL"
    )
