"""The Python driver API's key lookups go straight to the owners (runtime.facade.inprocess) and fail over
like the facade's: on a real two-node Ray, killing a partition's active owner under sync, threaded and
async lookups costs no error and no wrong answer, and the registry's promotion reaches the client's own
cached view through its long poll."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
import ray

import runtime
from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.partitioner import partition_of
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import Load, wait_for
from topologies.delivery import BatchDelivery

pytestmark = pytest.mark.integration

SPEC = StoreSpec(
    "direct", KeySchema("user", "long"), (ValueField("score", "bigint"),), partitions=4, actors=2, standbys=1
)
USERS = range(0, 400)


@pytest.fixture(scope="module")
def runtime_ns(ray_cluster: RayCluster) -> Iterator[Runtime]:
    from verticles import deploy

    rt = deploy_runtime("riqr-driver-failover")
    raycalls.get(rt.registry().create_store.remote(SPEC), "create_store")
    users = list(USERS)
    batch = pa.table(
        {
            "user": pa.array(users, pa.int64()),
            "score": pa.array([u * 10 for u in users], pa.int64()),
            PARTITION_COLUMN: pa.array([partition_of(SPEC.key.type, u, 4) for u in users], pa.int32()),
        }
    )
    BatchDelivery(SPEC, rt.namespace, checkpoint="unused").deliver("q", 0, batch)
    yield rt
    deploy.down(rt.namespace)


def _route(rt: Runtime, user: int) -> tuple[int, str, str]:
    table = raycalls.get(rt.registry().view.remote(), "view").tables[SPEC.name]
    partition = table.partition_of(user)
    owners = table.partitions[partition]
    assert owners.active is not None and len(owners.standbys) == 1
    return partition, owners.active, owners.standbys[0]


def test_a_get_fails_over_when_the_active_owner_is_killed(runtime_ns: Runtime) -> None:
    client = runtime.connect(runtime_ns.namespace)
    store = client.store(SPEC.name)
    wait_for(lambda: store.get(7) == 70, what="the store answering through the driver API")
    partition, active, standby = _route(runtime_ns, 7)
    # The client answers from its own process: its view knows the owners, and a lookup reached the owner.
    table = client.keys.core.view.table(SPEC.name)
    assert table is not None and table.partitions[partition].active == active

    def sync_reader(start: int) -> Callable[[], str | None]:
        picks = itertools.count(start, 7)

        def read() -> str | None:
            user = USERS[next(picks) % len(USERS)]
            try:
                value = store.get(user)
            except Exception as exc:  # any error is a wrong answer here
                return f"{user}: {exc!r}"
            return None if value == user * 10 else f"{user}: {value!r}"

        return read

    starts = itertools.count(3, 11)

    async def async_read() -> str | None:
        i = next(starts)
        users = [USERS[(i + j) % len(USERS)] for j in range(8)]
        values = await asyncio.gather(*(store.get_async(u) for u in users), return_exceptions=True)
        wrong = [f"{u}: {v!r}" for u, v in zip(users, values) if v != u * 10]
        return "; ".join(wrong) if wrong else None

    with Load() as load:
        for start in range(3):
            load.every(sync_reader(start))
        load.every_async(async_read)
        load.wait_more(100, "lookups before the kill")
        ray.kill(ray.get_actor(active, namespace=runtime_ns.namespace), no_restart=True)
        # A lookup of the dead owner's partition right after the kill is answered (by the standby).
        assert store.get(7) == 70
        # The registry promoted the standby, and the client's own view heard of it (long poll). (Seconds
        # later the registry creates the killed actor again and gives it its partitions back.)
        wait_for(
            lambda: client.keys.core.view.table(SPEC.name).partitions[partition].active == standby,  # type: ignore[union-attr]
            interval=0.02,
            what="the promotion reaching the client's view",
        )
        load.wait_more(300, "lookups after the kill")
        wait_for(
            lambda: client.keys.core.view.table(SPEC.name).partitions[partition].active == active,  # type: ignore[union-attr]
            timeout=60,
            what="the actor created again and given its partition back, in the client's view",
        )
        load.wait_more(100, "lookups after it came back")
    assert (load.wrong, load.errors) == ([], [])
    assert [store.get(u) for u in (0, 7, 399)] == [0, 70, 3990]
    with pytest.raises(runtime.KeyNotFound):
        store.get(100_000)


def test_scans_go_on_through_another_nodes_facade_when_the_clients_dies(runtime_ns: Runtime) -> None:
    """Scans, pages and the catalog go through a facade verticle, chosen at ``connect`` (this node's). Killed
    for good, as with its node, the client's next scan failed and every later one too, while key lookups
    went on; it now takes another node's facade. Last in this module: the facade stays dead."""
    client = runtime.connect(runtime_ns.namespace)
    store = client.store(SPEC.name)
    expected = [(u, u * 10) for u in USERS]
    assert store.all() == expected
    dead = client.facade
    ray.kill(dead, no_restart=True)
    wait_for(lambda: _dead(dead), timeout=30, what="the killed facade gone")
    assert store.all() == expected  # through the other node's facade
    assert client.facade != dead
    assert store.page(10).entries == expected[:10]
    assert asyncio.run(store.range_async(5, 7)) == expected[5:8]
    assert {s["name"] for s in client.stores()} == {SPEC.name}


def _dead(handle: object) -> bool:
    try:
        ray.get(handle.__ray_ready__.remote(), timeout=5)  # type: ignore[attr-defined]
    except ray.exceptions.RayActorError:
        return True
    return False
