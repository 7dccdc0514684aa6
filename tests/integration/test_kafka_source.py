"""The food-orders topology reading Kafka topics through riqr's Python Kafka source, against the mock
Kafka cluster built into confluent-kafka (librdkafka's ``test.mock.num.brokers``).

The mock cluster cannot create topics with a chosen partition count (it has no controller for
CreateTopics); it auto-creates topics with 4 partitions on first use, so these topics have 4 where the
seed's have 3. The source reads whatever partitions a topic has.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import confluent_kafka
import pytest

from tests.integration.conftest import SEED_CUSTOMERS, SLOW_DEAD_LETTERS, RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import http_get, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    """A 3-broker mock Kafka cluster; yields its bootstrap servers. It lives as long as its owner client."""
    owner = confluent_kafka.Producer({"test.mock.num.brokers": 3, "log_level": 3})
    brokers = owner.list_topics(timeout=10).brokers.values()
    yield ",".join(f"{b.host}:{b.port}" for b in brokers)
    owner.flush(5)


def produce(bootstrap: str, topic: str, records: list[tuple[str, str]]) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value.encode())
    assert producer.flush(30) == 0, "messages left unsent"


@pytest.fixture(scope="module")
def rt(ray_cluster: RayCluster) -> Iterator[Runtime]:
    from verticles import deploy

    runtime_ns = deploy_runtime("riqr-kafka")
    yield runtime_ns
    deploy.down(runtime_ns.namespace)


def count(url: str, key: str) -> Any:
    status, _, body = http_get(f"{url}/stores/order-count/get/{key}")
    return body["response"] if status == 200 else None


def test_food_orders_from_kafka_topics_and_a_restart_that_counts_nothing_twice(
    kafka: str, rt: Runtime, spark: Any, tmp_path: Path
) -> None:
    from topologies import food_orders
    from topologies.options import TopologyOptions
    from topologies.sources import SourceConfig

    source = SourceConfig("kafka", kafka)
    produce(kafka, "customer", list(SEED_CUSTOMERS.items()))
    produce(kafka, "order", [("1", "spagety"), ("2", "pizza"), ("", "pasta")])
    partitions = confluent_kafka.Consumer({"bootstrap.servers": kafka, "group.id": "t", "log_level": 3})
    assert len(partitions.list_topics("order", timeout=10).topics["order"].partitions) > 1
    partitions.close()

    options = TopologyOptions(
        namespace=rt.namespace, trigger="200 milliseconds", source=source, dead_letter_trigger=SLOW_DEAD_LETTERS
    )
    queries = food_orders.start(spark, tmp_path, options)
    url = rt.url
    try:
        wait_for(
            lambda: (
                http_get(f"{url}/stores/customer-v1-changelog/all")[2]
                == {"result": [{"key": k, "value": v} for k, v in sorted(SEED_CUSTOMERS.items())]}
            ),
            what="the customers read from Kafka",
        )
        wait_for(
            lambda: (
                http_get(f"{url}/stores/order-count/all")[2]
                == {"result": [{"key": "", "value": 1}, {"key": "1", "value": 1}, {"key": "2", "value": 1}]}
            ),
            what="the order counts read from Kafka",
        )
        produce(kafka, "order", [("1", "soup")])
        wait_for(lambda: count(url, "1") == 2, what="a new order arriving through Kafka")
        # Bytes that are not UTF-8: once decoded with U+FFFD (two binary keys became one key, values were
        # changed), now a dead letter with its bad bytes escaped, never an order counted.
        raw = confluent_kafka.Producer({"bootstrap.servers": kafka, "log_level": 3})
        raw.produce("order", key=b"\xff\xfe", value=b"tea")
        raw.produce("order", key=b"2", value=b"caf\xe9")
        assert raw.flush(30) == 0
        from topologies.deadletter import read_dead_letters

        letters = wait_for(
            lambda: (found := read_dead_letters(tmp_path, "order")) and len(found) >= 2 and found,
            timeout=60,
            what="the two records that are not UTF-8 in the dead letters",
        )
        assert sorted(json.loads(letter["record"])["key"] for letter in letters) == ["2", "\\xff\\xfe"]
        assert all("not UTF-8" in letter["reason"] for letter in letters)
        assert count(url, "2") == 1 and count(url, quote("\ufffd\ufffd")) is None
    finally:
        for q in queries:
            q.stop()

    # Stopped: more orders arrive. The restarted query resumes from its checkpointed offsets.
    produce(kafka, "order", [("1", "tea"), ("2", "cake")])
    before = {q.id for q in spark.streams.active}
    food_orders.start_order_counts(spark, tmp_path, options)
    try:
        wait_for(lambda: count(url, "1") == 3 and count(url, "2") == 2, what="orders produced while stopped")
        assert count(url, "") == 1  # nothing was read twice
    finally:
        # The store's query and its dead-letter query, which start_order_counts starts and keeps running
        # (polling a mock cluster that goes with this module) until the session's Spark stops.
        for q in spark.streams.active:
            if q.id not in before:
                q.stop()


def _reader(bootstrap: str, topic: str, **options: str) -> Any:
    from topologies.kafka_source import KafkaStreamReader

    return KafkaStreamReader({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options})


def test_the_source_reads_transactions_to_their_end_and_skips_aborted_records(kafka: str) -> None:
    """A range that ends after a transaction's commit marker (an offset with no record) waited 30 s for a
    message that never comes, then failed the batch, at every replay."""
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka, "transactional.id": "riqr-test", "log_level": 3})
    producer.init_transactions(10)
    for values, commit in ((["1", "2", "3"], True), (["gone"], False), (["4", "5"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce("tx-orders", key=b"k", value=value.encode(), partition=0)
        producer.commit_transaction(10) if commit else producer.abort_transaction(10)
    reader = _reader(kafka, "tx-orders")
    start = reader.initialOffset()
    end = reader.latestOffset(start)
    assert end["tx-orders/0"] > 5  # five records, and the offsets of markers and the aborted one
    read = [row for part in reader.partitions(start, end) for row in reader.read(part)]
    assert [row[1] for row in read] == ["1", "2", "3", "4", "5"]


def test_offsets_kafka_no_longer_has_fail_the_batch_unless_told_to_skip_them(kafka: str) -> None:
    """librdkafka's default jumped to the end of the partition: the batch read nothing, silently."""
    from topologies.kafka_source import TopicRange

    produce(kafka, "gone-orders", [("k", "1"), ("k", "2")])
    beyond = TopicRange("gone-orders", 0, 100, 120)  # what a checkpoint holds after its topic was made again
    with pytest.raises(RuntimeError, match="records were lost before this query read them"):
        list(_reader(kafka, "gone-orders").read(beyond))
    assert list(_reader(kafka, "gone-orders", failOnDataLoss="false").read(beyond)) == []
    with pytest.raises(ValueError, match="failOnDataLoss"):
        _reader(kafka, "gone-orders", failOnDataLoss="maybe")


def test_a_batch_end_keeps_a_topic_whose_metadata_one_read_missed(kafka: str, monkeypatch: pytest.MonkeyPatch) -> None:
    produce(kafka, "flaky-orders", [("k", "1")])
    reader = _reader(kafka, "flaky-orders")
    start = reader.initialOffset()
    first = reader.latestOffset(start)
    monkeypatch.setattr(
        reader.kafka, "watermarks", lambda *, low, strict=False: {}
    )  # the topic's metadata had an error
    assert reader.latestOffset(first) == first and reader.latestOffset(None) == first
