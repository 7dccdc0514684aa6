"""A running topology: records produced after start become visible; a batch Spark replays is a no-op."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray

from tests.integration.conftest import RayCluster, Topology, produce, seeded_food_orders
from tests.integration.helpers import http_get, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live(ray_cluster: RayCluster, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    with seeded_food_orders(spark, "riqr-live", tmp_path_factory.mktemp("live-home"), keep_running=True) as topology:
        yield topology


def value(url: str) -> Any:
    status, _, body = http_get(url)
    return body.get("response") if status == 200 else None


def test_records_produced_after_start_become_visible(live: Topology) -> None:
    url = live.runtime.url
    produce(live.home, "order", "1--soup\n5--salad\n5--bread")
    produce(live.home, "customer", "8--zoe\n1--jon")
    wait_for(lambda: value(f"{url}/stores/order-count/get/1") == 2, what="order count of 1 reaching 2")
    wait_for(lambda: value(f"{url}/stores/order-count/get/5") == 2, what="order count of 5 reaching 2")
    wait_for(lambda: value(f"{url}/stores/customer-v1-changelog/get/8") == "zoe", what="new customer 8")
    wait_for(lambda: value(f"{url}/stores/customer-v1-changelog/get/1") == "jon", what="customer 1 renamed")
    assert http_get(f"{url}/stores/customer-v1-changelog/approximate-num-entries")[2] == {"result": 8}


def test_a_batch_replayed_by_spark_changes_nothing(live: Topology, spark: Any) -> None:
    from topologies import food_orders
    from topologies.options import TopologyOptions, checkpoint_for

    url = live.runtime.url
    before = http_get(f"{url}/stores/order-count/all")[2]
    query = live.queries[1]
    query.stop()
    checkpoint = checkpoint_for(live.home, live.runtime.namespace, food_orders.ORDER_COUNT_STORE)
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    # Hadoop's raw local file system (topologies/spark.py): no .crc beside the logs and state files.
    assert not list(checkpoint.rglob("*.crc"))
    last = commits[-1]
    (checkpoint / "commits" / str(last)).unlink()  # Spark will run batch `last` again on restart

    owners = [i["actor"] for i in http_get(f"{url}/metadata/stores/order-count")[2]["result"]]
    handles = [ray.get_actor(uuid, namespace=live.runtime.namespace) for uuid in owners]
    positions_before = [ray.get(h.positions.remote()) for h in handles]
    assert all(p["batch_id"] == last for pos in positions_before for p in pos.values())

    options = TopologyOptions(namespace=live.runtime.namespace, trigger="200 milliseconds")
    live.queries[1] = food_orders.start_order_counts(spark, live.home, options)
    wait_for(lambda: (checkpoint / "commits" / str(last)).exists(), what=f"Spark replaying batch {last}")
    assert http_get(f"{url}/stores/order-count/all")[2] == before
    positions_after = [ray.get(h.positions.remote()) for h in handles]
    assert positions_after == positions_before  # the replay was recognised and skipped, not re-applied
