"""The Python driver API gives the same answers as REST, sync and async, with riqr's exceptions."""

from __future__ import annotations

import asyncio

import pytest

import runtime
from tests.integration.conftest import SEED_CUSTOMERS, SEED_ORDER_COUNTS, RayCluster, Runtime
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(seeded: Runtime) -> runtime.Client:
    return runtime.connect(seeded.namespace)


def test_sync_queries(client: runtime.Client) -> None:
    customers = client.store("customer-v1-changelog")
    assert customers.get("2") == "adam"
    assert customers.all() == sorted(SEED_CUSTOMERS.items())
    assert customers.range("1", "5") == [(k, SEED_CUSTOMERS[k]) for k in "12345"]
    assert customers.range(None, "1") == [("1", "john")]
    assert customers.approximate_num_entries() == 7
    assert client.store("order-count").all() == sorted(SEED_ORDER_COUNTS.items())
    assert client.store("order-count").get("") == 1


def test_async_queries(client: runtime.Client) -> None:
    async def run() -> tuple:
        customers = client.store("customer-v1-changelog")
        return await asyncio.gather(
            customers.get_async("7"),
            customers.all_async(),
            customers.range_async("6", None),
            customers.approximate_num_entries_async(),
        )

    one, everything, tail, count = asyncio.run(run())
    assert one == "will" and everything == sorted(SEED_CUSTOMERS.items())
    assert tail == [("6", "mathew"), ("7", "will")] and count == 7


def test_a_lookup_says_what_it_reflects_as_rest_does(client: runtime.Client, seeded: Runtime) -> None:
    from tests.integration.helpers import http_get

    customers = client.store("customer-v1-changelog")
    found = customers.lookup("2")
    _, headers, body = http_get(f"{seeded.url}/stores/customer-v1-changelog/get/2")
    assert found == runtime.Lookup("adam", headers["X-Riqr-Position"]) and body == {"response": "adam"}
    assert asyncio.run(customers.lookup_async("2")) == found
    with pytest.raises(runtime.KeyNotFound) as missing:
        customers.lookup("99")
    assert missing.value.position is not None and missing.value.position.startswith("partition=")


def test_errors_are_riqrs_own(client: runtime.Client) -> None:
    with pytest.raises(runtime.KeyNotFound):
        client.store("order-count").get("99")
    with pytest.raises(runtime.StoreNotFound):
        client.store("nope").all()
    with pytest.raises(runtime.KeyNotFound):
        asyncio.run(client.store("order-count").get_async("99"))


def test_connecting_to_another_cluster_from_a_joined_process_is_an_error(seeded: Runtime) -> None:
    import ray

    here = ray.get_runtime_context().gcs_address
    with pytest.raises(ConnectionError, match="a process joins one cluster"):
        runtime.connect(seeded.namespace, address="127.0.0.1:1")  # another port: not this cluster
    assert runtime.connect(seeded.namespace, address=here).store("order-count").get("1") == 1  # this one


def test_catalog_and_owner(client: runtime.Client) -> None:
    assert [s["name"] for s in client.stores()] == ["customer-v1-changelog", "order-count"]
    owner = client.store("order-count").owner("1")
    # crc32("1") = 0x83DCEFB7, so partition 3 of 4; the actor holding 1 and 3 owns it, as REST says.
    assert (owner["partition"], owner["partitions"], owner["state-store-names"]) == (3, [1, 3], ["order-count"])
    assert len(client.metadata()) == 4
    assert owner["actor"] in {i["actor"] for i in client.metadata() if i["partitions"] == [1, 3]}
    store = client.store("order-count")
    assert {i["actor"] for i in store.instances()} == {
        i["actor"] for i in client.metadata() if i["state-store-names"] == ["order-count"]
    }

    async def the_async_forms() -> list[object]:
        return list(
            await asyncio.gather(
                client.stores_async(), client.metadata_async(), store.owner_async("1"), store.instances_async(),
                store.replicas_async(),
            )
        )  # fmt: skip

    stores, metadata, owner_async, instances, replicas = asyncio.run(the_async_forms())
    assert [s["name"] for s in stores] == [s["name"] for s in client.stores()]  # type: ignore[attr-defined]
    assert len(metadata) == 4 and owner_async["actor"] == owner["actor"]  # type: ignore[arg-type,index]
    assert {i["actor"] for i in instances} == {i["actor"] for i in store.instances()}  # type: ignore[attr-defined]
    assert sorted(replicas) == sorted(store.replicas()) == [0, 1, 2, 3]  # type: ignore[arg-type]


def test_failures_are_riqrs_errors_never_rays(client: runtime.Client) -> None:
    from ray.exceptions import RayTaskError

    store = client.store("order-count")
    calls = [
        (lambda: store.page(0), "limit"),
        (lambda: asyncio.run(store.page_async(0)), "limit"),
        (lambda: store.page(2, "garbage"), "cursor"),
    ]
    for call, about in calls:
        with pytest.raises(runtime.BadRequest, match=about) as refused:
            call()
        # The error itself, not Ray's wrapper of it (an instance of its class too, whose text is the actor's
        # whole traceback).
        assert not isinstance(refused.value, RayTaskError), type(refused.value).__mro__
        assert "Traceback" not in str(refused.value) and str(refused.value) == refused.value.message
    impatient = runtime.Client(client.facade, client.namespace, timeout=0.0)
    with pytest.raises(runtime.DeadlineExceeded):
        impatient.store("customer-v1-changelog").all()


def test_a_call_the_client_gives_up_on_is_cancelled_in_its_facade(ray_cluster: RayCluster) -> None:
    """What the client's cancel relies on, with a real Ray: a facade verticle is an async actor, and a call
    the client stops waiting for (its timeout, sync or async, or the caller's own cancel) ends in the
    facade rather than running on to the facade's deadline. The stand-in facade holds each call until
    cancelled and counts the cancels."""
    import ray

    @ray.remote(num_cpus=0)
    class Holding:
        def __init__(self) -> None:
            self.cancelled = 0

        async def entries(self, query: object) -> list[object]:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return []

        async def count(self) -> int:
            return self.cancelled

    facade = Holding.remote()  # type: ignore[attr-defined]
    assert ray.get(facade.count.remote(), timeout=60) == 0  # started: a call cancelled while queued never runs
    client = runtime.Client(facade, "riqr-cancel", timeout=0.3)

    def cancels_reach(n: int) -> None:
        wait_for(lambda: ray.get(facade.count.remote(), timeout=5) == n, timeout=30, what=f"{n} cancels")

    with pytest.raises(runtime.DeadlineExceeded):
        client.call("entries", None)
    cancels_reach(1)
    with pytest.raises(runtime.DeadlineExceeded):
        asyncio.run(client.call_async("entries", None))
    cancels_reach(2)

    async def caller_gives_up() -> None:
        patient = runtime.Client(facade, "riqr-cancel", timeout=30)
        async with asyncio.timeout(0.3):
            await patient.call_async("entries", None)

    with pytest.raises(TimeoutError):
        asyncio.run(caller_gives_up())
    cancels_reach(3)
    ray.kill(facade)
