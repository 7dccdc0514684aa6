"""Every curl of seed 000 over real HTTP, answered across all partitions, on every node."""

from __future__ import annotations

import zlib

import pytest

from tests.integration.conftest import SEED_CUSTOMERS, SEED_ORDER_COUNTS, Runtime
from tests.integration.helpers import http_get

pytestmark = pytest.mark.integration


def entries(mapping: dict[str, object]) -> list[dict[str, object]]:
    return [{"key": k, "value": v} for k, v in sorted(mapping.items())]


def test_all_is_every_entry_in_key_order_on_every_node(seeded: Runtime) -> None:
    for url in seeded.endpoints.values():
        status, _, body = http_get(f"{url}/stores/customer-v1-changelog/all")
        assert status == 200
        assert body == {"result": entries(SEED_CUSTOMERS)}
        assert http_get(f"{url}/stores/order-count/all")[2] == {"result": entries(SEED_ORDER_COUNTS)}


def test_get(seeded: Runtime) -> None:
    for url in seeded.endpoints.values():
        assert http_get(f"{url}/stores/customer-v1-changelog/get/2")[:3:2] == (200, {"response": "adam"})
        assert http_get(f"{url}/stores/order-count/get/1")[:3:2] == (200, {"response": 1})
        assert http_get(f"{url}/stores/order-count/get/")[:3:2] == (
            200,
            {"response": 1},
        )  # the order with the empty key


def test_range_both_ends_inclusive(seeded: Runtime) -> None:
    body = http_get(f"{seeded.url}/stores/customer-v1-changelog/range?from=1&to=5")[2]
    assert body == {"result": entries({k: SEED_CUSTOMERS[k] for k in "12345"})}
    assert http_get(f"{seeded.url}/stores/customer-v1-changelog/range?from=6")[2] == {
        "result": entries({"6": "mathew", "7": "will"})
    }


def test_approximate_num_entries(seeded: Runtime) -> None:
    assert http_get(f"{seeded.url}/stores/customer-v1-changelog/approximate-num-entries")[2] == {"result": 7}
    assert http_get(f"{seeded.url}/stores/order-count/approximate-num-entries")[2] == {"result": 3}


def test_metadata_lists_every_query_actor_with_its_node_endpoint(seeded: Runtime) -> None:
    status, _, body = http_get(f"{seeded.url}/metadata")
    assert status == 200
    instances = body["result"]
    assert sorted(i["state-store-names"][0] for i in instances) == ["customer-v1-changelog"] * 2 + ["order-count"] * 2
    for instance in instances:
        assert seeded.endpoints[instance["node"]] == f"http://{instance['host']}:{instance['port']}"
    store = http_get(f"{seeded.url}/metadata/stores/order-count")[2]["result"]
    assert [i for i in instances if i["state-store-names"] == ["order-count"]] == store
    assert sorted(p for i in store for p in i["partitions"]) == [0, 1, 2, 3]


def test_metadata_for_key_is_always_one_instance_present_or_not(seeded: Runtime) -> None:
    for key in ["1", "not-a-key"]:
        status, _, body = http_get(f"{seeded.url}/metadata/stores/order-count/key/{key}")
        assert status == 200
        result = body["result"]
        assert result["partition"] == zlib.crc32(key.encode()) % 4
        assert result["partition"] in result["partitions"]
        assert result["state-store-names"] == ["order-count"]
        # One standby by default on a multi-node cluster, on the other node.
        assert [s["node"] for s in result["standbys"]] != [result["node"]] and len(result["standbys"]) == 1


def test_catalog_names_kinds_and_schemas(seeded: Runtime) -> None:
    body = http_get(f"{seeded.url}/stores")[2]
    by_name = {s["name"]: s for s in body["result"]}
    assert by_name["order-count"]["value"] == [{"column": "count", "type": "bigint"}]
    assert by_name["customer-v1-changelog"]["key"] == {
        "column": "key",
        "type": "string",
        "columns": [{"column": "key", "type": "string"}],
    }
    assert {s["kind"] for s in body["result"]} == {"kv"}


def test_errors(seeded: Runtime) -> None:
    status, _, body = http_get(f"{seeded.url}/stores/order-count/get/99")
    assert status == 404 and body["error"]["code"] == "key-not-found"
    status, _, body = http_get(f"{seeded.url}/stores/no-such-store/get/1")
    assert status == 404 and body["error"]["code"] == "store-not-found"


def test_a_key_asked_at_a_node_that_does_not_own_it_is_still_answered(seeded: Runtime) -> None:
    instances = http_get(f"{seeded.url}/metadata/stores/customer-v1-changelog")[2]["result"]
    assert len({i["node"] for i in instances}) == 2, "the store's actors should sit on both nodes"
    remote_answers = 0
    for key, name in SEED_CUSTOMERS.items():
        owner = http_get(f"{seeded.url}/metadata/stores/customer-v1-changelog/key/{key}")[2]["result"]
        for node, url in seeded.endpoints.items():
            assert http_get(f"{url}/stores/customer-v1-changelog/get/{key}")[2] == {"response": name}
            remote_answers += node != owner["node"]
    assert remote_answers == len(SEED_CUSTOMERS)  # with two nodes, one of them is always remote
