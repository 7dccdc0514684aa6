"""Read replicas on a real two-node Ray (``runtime.readreplica``): every HTTP verticle keeps a copy of a
store declared with ``read_replicas`` and answers key lookups from it without a Ray hop, fed by the sink
with the standbys; an HTTP verticle killed under reads and batches loses its replica, the sink drops it
without holding up ingest, and the restarted verticle makes, copies and serves a new one. Answers are
checked for freshness (after a batch is acknowledged, a lookup shows it) and monotonicity, not only status."""

from __future__ import annotations

import itertools
import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
import ray

from bench.faults import worker_pid
from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.config import http_name
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.partitioner import partition_of
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import Load, http_get, wait_for
from tests.promtext import value
from topologies.delivery import BatchDelivery

pytestmark = pytest.mark.integration

SPEC = StoreSpec(
    "mirrored",
    KeySchema("user", "long"),
    (ValueField("score", "bigint"),),
    partitions=4,
    actors=2,
    standbys=1,
    read_replicas=True,
)
USERS = list(range(50))


def _batch(score: int) -> pa.Table:
    """Every user's score is ``score`` (the batch id), as the sink would deliver it."""
    parts = [partition_of(SPEC.key.type, u, SPEC.partitions) for u in USERS]
    return pa.table(
        {
            "user": pa.array(USERS, pa.int64()),
            "score": pa.array([score] * len(USERS), pa.int64()),
            PARTITION_COLUMN: pa.array(parts, pa.int32()),
        }
    )


class IngestFailed(Exception):
    """A delivery that raised: ends a ``wait_for`` at once (``fatal``), instead of counting as "not yet"."""


class Feed:
    """The sink's delivery path with a batch counter: ``next()`` delivers the next batch and returns it."""

    def __init__(self, delivery: BatchDelivery) -> None:
        self.delivery = delivery
        self.last = -1

    def next(self) -> int:
        batch = self.last + 1
        try:
            self.delivery.deliver("q", batch, _batch(batch))
        except Exception as err:  # ingest must never fail here, whatever a replica does
            raise IngestFailed(f"batch {batch}: {type(err).__name__}: {err}") from err
        self.last = batch
        return batch


def _replicas(ray_cluster: RayCluster, namespace: str, node_id: str) -> list[dict[str, Any]]:
    actor = ray.get_actor(http_name(node_id), namespace=namespace)
    answer: list[dict[str, Any]] = raycalls.get(actor.read_replicas.remote(), "read replicas", timeout=10)
    return answer


def _answering(ray_cluster: RayCluster, namespace: str, node_id: str) -> bool:
    """Whether the node's HTTP verticle has a replica of the store that answers lookups."""
    return any(r["store"] == SPEC.name and r["answers"] for r in _replicas(ray_cluster, namespace, node_id))


def _local_reads(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        return value(answer.read().decode(), "riqr_local_reads_total", store=SPEC.name)


@pytest.fixture(scope="module")
def runtime_ns(ray_cluster: RayCluster) -> Iterator[Runtime]:
    from verticles import deploy

    runtime = deploy_runtime("riqr-readrep")
    yield runtime
    deploy.down(runtime.namespace)


@pytest.fixture
def feed(runtime_ns: Runtime, ray_cluster: RayCluster) -> Iterator[Feed]:
    registry = runtime_ns.registry()
    raycalls.get(registry.create_store.remote(SPEC), "create_store")
    feed = Feed(BatchDelivery(SPEC, runtime_ns.namespace, checkpoint="unused"))
    feed.next()

    def every_node_answers_locally() -> bool:
        feed.next()  # a replica answers once a batch reached it through the sink
        return all(_answering(ray_cluster, runtime_ns.namespace, n) for n in runtime_ns.endpoints)

    wait_for(every_node_answers_locally, what="a read replica answering on every node", interval=0.2,
             fatal=(IngestFailed,))  # fmt: skip
    yield feed
    raycalls.get(registry.drop_store.remote(SPEC.name), "drop_store")


def test_every_http_node_answers_lookups_from_its_replica_with_the_latest_acknowledged_batch(
    runtime_ns: Runtime, feed: Feed
) -> None:
    catalog = {s["name"]: s for s in http_get(f"{runtime_ns.url}/stores")[2]["result"]}
    assert catalog[SPEC.name]["read_replicas"] is True
    for url in runtime_ns.endpoints.values():
        before = _local_reads(url)
        batch = feed.next()
        for user in USERS:  # freshness: a batch acknowledged by the sink shows at once, and says so
            status, headers, body = http_get(f"{url}/stores/{SPEC.name}/get/{user}")
            assert (status, body["response"]) == (200, batch), f"user {user} on {url}"
            assert headers["X-Riqr-Position"].endswith(f"; source=q; batch={batch}")
        status, _, body = http_get(f"{url}/stores/{SPEC.name}/get/99999")
        assert status == 404 and body["error"]["code"] == "key-not-found"
        assert _local_reads(url) - before == len(USERS) + 1, "every lookup answered in the HTTP verticle's process"


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_an_http_verticle_killed_under_reads_and_batches_gets_a_new_replica_and_no_answer_is_wrong(
    runtime_ns: Runtime, ray_cluster: RayCluster, feed: Feed, how: str
) -> None:
    """Node A's REST API is read all along while batches flow and node B's HTTP verticle is killed (by
    Ray, or its worker process by SIGKILL, with no chance to say goodbye): the sink drops B's replica
    (ingest goes on), B restarts and answers from a new replica. Every answer from A is checked: never
    older than the batch acknowledged before the request, never going back."""
    node_a, node_b = sorted(runtime_ns.endpoints)
    url_a, url_b = runtime_ns.endpoints[node_a], runtime_ns.endpoints[node_b]
    acknowledged = [feed.last]
    answers: list[int] = []
    seen: dict[int, int] = {}
    picks = itertools.count()

    def read() -> str | None:
        user = USERS[next(picks) % len(USERS)]
        floor = acknowledged[0]
        status, _, body = http_get(f"{url_a}/stores/{SPEC.name}/get/{user}")
        if status != 200:
            return f"user {user}: {status} {body}"
        score, before = body["response"], seen.get(user, -1)
        seen[user] = max(score, before)
        answers.append(score)
        if score < floor or score < before:
            return f"user {user}: {score} after batch {floor} was acknowledged (seen {before})"
        return None

    with Load() as load:
        load.every(read)
        for _ in range(5):
            acknowledged[0] = feed.next()
        http_b = ray.get_actor(http_name(node_b), namespace=runtime_ns.namespace)
        old = [r["uuid"] for r in _replicas(ray_cluster, runtime_ns.namespace, node_b)]
        if how == "ray.kill":
            ray.kill(http_b, no_restart=False)  # its process dies; Ray restarts it
        else:
            os.kill(worker_pid(http_b), signal.SIGKILL)  # the process just dies; Ray restarts the actor

        def b_answers_from_a_new_replica() -> bool:
            acknowledged[0] = feed.next()  # batches go on meanwhile; the sink drops B's lost replica
            found = _replicas(ray_cluster, runtime_ns.namespace, node_b)
            return _answering(ray_cluster, runtime_ns.namespace, node_b) and [r["uuid"] for r in found] != old

        wait_for(b_answers_from_a_new_replica, what="node B's new read replica answering", interval=0.2,
                 fatal=(IngestFailed,))  # fmt: skip
        for _ in range(5):
            acknowledged[0] = feed.next()
    wrong = load.wrong
    assert load.errors == []
    assert not wrong, f"{len(wrong)} wrong answers of {len(answers)}: {wrong[:5]}"
    assert len(answers) > 50
    view = raycalls.get(runtime_ns.registry().view.remote(), "view")
    assert len(view.readers_of(SPEC.name)) == 2  # one per node, the killed verticle's old one dropped
    assert old[0] not in view.readers
    before = _local_reads(url_b)
    batch = feed.next()
    for user in USERS[:10]:
        assert http_get(f"{url_b}/stores/{SPEC.name}/get/{user}")[2]["response"] == batch
    assert _local_reads(url_b) - before == 10


def test_ingest_does_not_wait_for_a_replica_that_cannot_take_a_batch(runtime_ns: Runtime, feed: Feed) -> None:
    """A replica listed in the view whose verticle is gone (its node died between two batches) is dropped
    by the next batch's delivery, which still completes, and the live replicas keep answering."""
    from runtime.ownership import ReaderCopy

    node = sorted(runtime_ns.endpoints)[0]
    ghost = ReaderCopy("ghost-replica", SPEC.name, node, "riqr-http-gone")
    raycalls.get(runtime_ns.registry().add_reader.remote(ghost), "add_reader")
    batch = feed.next()
    view = raycalls.get(runtime_ns.registry().view.remote(), "view")
    assert "ghost-replica" not in view.readers and len(view.readers_of(SPEC.name)) >= 1
    status, _, body = http_get(f"{runtime_ns.url}/stores/{SPEC.name}/get/{USERS[0]}")
    assert (status, body["response"]) == (200, batch)
