"""Scans beyond the seed on real actors and real HTTP: reverse, prefix, pages with cursors, NDJSON, and
paging through 10,000 keys while batches keep arriving. REST and the Python API must agree."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator

import pyarrow as pa
import pytest
import ray

import runtime
from runtime.catalog import StoreSpec, ValueField
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.partitioner import partition_of
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import http_get
from topologies.sink import BatchDelivery

pytestmark = pytest.mark.integration

SPEC = StoreSpec("users", KeySchema("key", "string"), (ValueField("value", "bigint"),), partitions=4, actors=2)
N = 10_000


def key(i: int) -> str:
    return f"user-{i:06d}"


def batch(rows: dict[str, int | None]) -> pa.Table:
    keys = list(rows)
    return pa.table(
        {
            "key": keys,
            "value": pa.array([rows[k] for k in keys], pa.int64()),
            PARTITION_COLUMN: pa.array([partition_of(SPEC.key.type, k, 4) for k in keys], pa.int32()),
        }
    )


@pytest.fixture(scope="module")
def users(ray_cluster: RayCluster) -> Iterator[tuple[Runtime, BatchDelivery]]:
    from verticles import deploy

    rt = deploy_runtime("riqr-scans")
    ray.get(rt.registry().create_store.remote(SPEC))
    delivery = BatchDelivery(SPEC, rt.namespace, checkpoint="unused")
    delivery.deliver("q", 0, batch({key(i): i for i in range(0, 2 * N, 2)}))  # even keys: present throughout
    yield rt, delivery
    deploy.down(rt.namespace)


def test_reverse_prefix_and_ranges_over_rest_match_python(users: tuple[Runtime, BatchDelivery]) -> None:
    rt, _ = users
    store = runtime.connect(rt.namespace).store("users")
    rest = http_get(f"{rt.url}/stores/users/range?from={key(10)}&to={key(20)}&reverse=true")[2]["result"]
    assert [e["key"] for e in rest] == [key(i) for i in (20, 18, 16, 14, 12, 10)]
    assert [(e["key"], e["value"]) for e in rest] == store.range(key(10), key(20), reverse=True)
    rest = http_get(f"{rt.url}/stores/users/prefix/user-00001")[2]["result"]
    assert [e["key"] for e in rest] == [key(i) for i in range(10, 20, 2)]
    assert [(e["key"], e["value"]) for e in rest] == store.prefix("user-00001")
    first = http_get(f"{rt.url}/stores/users/all?reverse=true&limit=2")[2]
    assert [e["key"] for e in first["result"]] == [key(2 * N - 2), key(2 * N - 4)]
    assert asyncio.run(store.prefix_async("user-00001", reverse=True)) == store.prefix("user-00001")[::-1]


def test_ndjson_streams_the_whole_store_in_key_order(users: tuple[Runtime, BatchDelivery]) -> None:
    rt, _ = users
    request = urllib.request.Request(f"{rt.url}/stores/users/all", headers={"Accept": "application/x-ndjson"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        keys = [json.loads(line)["key"] for line in resp]
    assert {key(i) for i in range(0, 2 * N, 2)} <= set(keys)
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    # A limit goes down to the owners; the stream still ends after exactly that many lines.
    request = urllib.request.Request(
        f"{rt.url}/stores/users/all?limit=3&reverse=true", headers={"Accept": "application/x-ndjson"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert [json.loads(line)["key"] for line in resp] == sorted(keys, reverse=True)[:3]
    store = runtime.connect(rt.namespace).store("users")

    async def walk() -> list[str]:
        return [k async for k, _ in store.iterate_async(prefix="user-0001")]

    assert asyncio.run(walk()) == [k for k, _ in store.iterate(prefix="user-0001")] != []


def test_paging_through_10k_keys_while_batches_keep_arriving(users: tuple[Runtime, BatchDelivery]) -> None:
    rt, delivery = users
    stable = {key(i) for i in range(0, 2 * N, 2)}
    stop = threading.Event()
    delivered = []

    def keep_writing() -> None:  # odd keys come and go, even keys get new values, all the while
        batch_id = 1
        while not stop.is_set():
            rows: dict[str, int | None] = {key(i): batch_id for i in range(batch_id % 97, 2 * N, 97)}
            rows.update({key(i): None for i in range((batch_id * 31) % 89 | 1, 2 * N, 178)})
            delivery.deliver("q", batch_id, batch(rows))
            delivered.append(batch_id)
            batch_id += 1

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        seen_rest: list[str] = []
        body = http_get(f"{rt.url}/stores/users/all?limit=500")[2]
        while True:
            seen_rest += [e["key"] for e in body["result"]]
            if body["next"] is None:
                break
            body = http_get(f"{rt.url}/stores/users/all?limit=500&cursor={body['next']}")[2]
        store = runtime.connect(rt.namespace).store("users")
        seen_python = [k for k, _ in store.iterate(page_size=700, reverse=True)]
    finally:
        stop.set()
        writer.join(timeout=60)
    assert len(delivered) >= 3, "batches should have landed while paging"
    for seen in (seen_rest, seen_python[::-1]):
        assert len(seen) == len(set(seen)), "a key came back twice"
        assert stable <= set(seen), "a key present throughout was skipped"
        assert seen == sorted(seen)


def test_bad_parameters_are_400s_over_real_http(users: tuple[Runtime, BatchDelivery]) -> None:
    rt, _ = users
    for query, code in [("all?limit=20000", "invalid-parameter"), ("all?cursor=xyz", "malformed-cursor")]:
        status, _, body = http_get(f"{rt.url}/stores/users/{query}")
        assert (status, body["error"]["code"]) == (400, code)
    with pytest.raises(runtime.BadRequest):
        runtime.connect(rt.namespace).store("users").page(0)
