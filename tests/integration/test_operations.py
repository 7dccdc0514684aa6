"""Operating riqr on a real Ray: /health and /ready flip as partitions and ingest fail and recover, every
documented metric is at /metrics and moves, and the metrics reach Ray's own metrics agent.

No Spark here: the store is created through the registry and fed by the sink's own ``BatchDelivery``,
called as Spark would call it (``delivery(frame, batch_id)``), which keeps these tests to seconds.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.ingest import PARTITION_COLUMN
from runtime.keys import KeySchema
from runtime.metrics import CATALOG
from runtime.partitioner import partition_of_bytes
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import http_get, wait_for
from tests.promtext import samples
from tests.promtext import value as _value

pytestmark = pytest.mark.integration

# No standby: a killed actor must leave its partitions with no serving copy.
SPEC = StoreSpec("ops", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=2, actors=2,
                 engine="memory", standbys=0)  # fmt: skip
GET_ROUTE = "/stores/{store}/get/{key}"


class _Frame:
    """What ``foreachBatch`` hands the sink, as far as the sink looks at it."""

    def __init__(self, rows: dict[str, str | None]) -> None:
        keys = list(rows)
        parts = [partition_of_bytes(SPEC.key.canonical_bytes(k), SPEC.partitions) for k in keys]
        self._table = pa.table({"key": keys, "value": [rows[k] for k in keys],
                                PARTITION_COLUMN: pa.array(parts, pa.int32())})  # fmt: skip

    def toArrow(self) -> pa.Table:  # noqa: N802 (Spark's name)
        return self._table


def _text(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(answer.read().decode())


def _ready(url: str) -> tuple[int, Any]:
    status, _, body = http_get(f"{url}/ready")
    return status, body


@pytest.fixture
def fed(ray_cluster: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Runtime, Any]]:
    """riqr in a fresh namespace with store ``ops`` (2 partitions on 2 actors), its sink started fresh.
    Query actors killed for good stay dead here (``RIQR_RECREATE_AFTER=off``): the probes' test needs a
    partition that stays missing."""
    from topologies.delivery import BatchDelivery
    from verticles import deploy

    monkeypatch.setenv("RIQR_RECREATE_AFTER", "off")  # read where `up` creates the registry
    runtime = deploy_runtime("riqr-ops")
    try:
        raycalls.get(runtime.registry().create_store.remote(SPEC), "creating the store")
        delivery = BatchDelivery(SPEC, runtime.namespace, str(tmp_path / "checkpoint"), delivery_timeout=2.0,
                                 query_name="riqr-ops-test")  # fmt: skip
        delivery.begin("source-a")
        delivery.report(state="running", plan="fresh")
        yield runtime, delivery
        delivery.feeder.finish()  # its heartbeat thread ends with the test
    finally:
        deploy.down(runtime.namespace)


def test_ready_flips_as_partitions_and_ingest_fail_and_recover(fed: tuple[Runtime, Any]) -> None:
    import ray

    runtime, delivery = fed
    url = runtime.url
    status, _, body = http_get(f"{url}/health")
    assert (status, body["status"]) == (200, "ok")
    wait_for(lambda: _ready(url)[0] == 200, timeout=30, what="/ready to answer 200")
    delivery(_Frame({"a": "1", "b": "2", "c": "3"}), 0)

    # A gap (batch 5 after batch 0) makes both partitions incomplete; a new source's batch 0 rebuilds them.
    delivery(_Frame({"a": "9"}), 5)
    status, body = wait_for(lambda: (r := _ready(url))[0] == 503 and r, timeout=30, what="/ready to answer 503")
    assert {(m["store"], m["partition"], m["state"]) for m in body["missing"]} == {("ops", 0, "incomplete"),
                                                                                  ("ops", 1, "incomplete")}  # fmt: skip
    delivery._source = "source-b"  # as after a restart on a fresh checkpoint
    delivery(_Frame({"a": "1", "b": "2", "c": "3"}), 0)
    wait_for(lambda: _ready(url)[0] == 200, timeout=30, what="/ready back to 200 after the rebuild")

    # An actor killed for good (and not created again: off here): its partition is missing, and the next
    # batch fails the ingest.
    table = ray.get(runtime.registry().view.remote()).tables["ops"]
    victim, held = next(iter(table.by_owner().items()))
    ray.kill(ray.get_actor(victim, namespace=runtime.namespace), no_restart=True)
    status, body = wait_for(lambda: (r := _ready(url))[0] == 503 and r, timeout=30, what="/ready 503 after a kill")
    assert [(m["partition"], m["state"]) for m in body["missing"]] == [(p, "unavailable") for p in held]
    with pytest.raises(Exception, match="did not acknowledge"):
        delivery(_Frame({"a": "2"}), 1)
    status, body = wait_for(
        lambda: any(m.get("ingest") == "failed" for m in _ready(url)[1].get("missing", [])) and _ready(url),
        timeout=30,
        what="/ready to list the failed ingest",
    )
    failed = next(m for m in body["missing"] if m.get("ingest"))
    # /ready needs no token: it says the feed failed, not its error's text; the catalog says that
    assert failed["store"] == "ops" and failed["reason"].startswith("its topology's query failed")
    ops = next(s for s in http_get(f"{url}/stores")[2]["result"] if s["name"] == "ops")
    assert "did not acknowledge" in ops["ingest"]["error"]
    assert http_get(f"{url}/health")[0] == 200  # liveness is about this node only

    # Dropping the broken store leaves nothing missing.
    raycalls.get(runtime.registry().drop_store.remote("ops"), "dropping the store")
    wait_for(lambda: _ready(url)[0] == 200, timeout=30, what="/ready 200 once the broken store is gone")


def test_every_documented_metric_is_exported_and_moves(fed: tuple[Runtime, Any]) -> None:
    runtime, delivery = fed
    url = runtime.url
    before = _text(url)
    assert {d.name for d in CATALOG} <= {f.name + ("_total" if f.type == "counter" else "")
                                         for f in text_string_to_metric_families(before)}  # fmt: skip
    delivery(_Frame({"a": "1", "b": "2", "c": "3"}), 0)
    wait_for(lambda: http_get(f"{url}/stores/ops/get/a")[0] == 200, timeout=30, what="key a")
    assert http_get(f"{url}/stores/ops/all")[2]["result"]
    delivery.report(state="running", batch_id=4, at=1.7e9)
    delivery.feeder.dead_letters("ops", "t", 2)

    def moved() -> str | None:
        text = _text(url)
        checks = [
            _value(text, "riqr_http_requests_total", route=GET_ROUTE, status="200") >= 1,
            _value(text, "riqr_http_request_duration_seconds_count", route=GET_ROUTE) >= 1,
            _value(text, "riqr_coalesced_batch_size_count", store="ops") >= 1,
            _value(text, "riqr_scan_entries_total", store="ops") >= 3,
            sum(_value(text, "riqr_batches_applied_total", store="ops", partition=p, role="active") for p in "01") == 2,
            sum(_value(text, "riqr_rows_applied_total", store="ops", partition=p, role="active") for p in "01") == 3,
            _value(text, "riqr_apply_duration_seconds_count", store="ops") == 2,
            _value(text, "riqr_partition_position", store="ops", partition="0") == 0,
            _value(text, "riqr_partition_lag_batches", store="ops", partition="1") == 4,
            _value(text, "riqr_partition_replicas", store="ops", partition="0", role="active", state="serving") == 1,
            _value(text, "riqr_partitions_unavailable", store="ops") == 0,
            _value(text, "riqr_ingest_state", store="ops", state="running") == 1,
            _value(text, "riqr_ingest_last_report_timestamp_seconds", store="ops") == 1.7e9,
            _value(text, "riqr_dead_letters_total", store="ops", topic="t") == 2,
            _value(text, "riqr_ready") == 1,
        ]
        return text if all(checks) else None

    wait_for(moved, timeout=30, what="every metric to move")
    delivery.report(state="failed", error="boom")
    wait_for(
        lambda: (
            _value(t := _text(url), "riqr_ready") == 0 and _value(t, "riqr_ingest_state", store="ops", state="failed")
        ),
        timeout=30,
        what="riqr_ready to drop to 0",
    )


def test_metrics_reach_rays_metrics_agent(seeded: Runtime) -> None:
    """Through Ray's metrics agent (the session's deployment: this needs no store of its own; its /health
    histogram holds these three requests and any other test's, which is as good a proof)."""
    import ray

    for _ in range(3):
        http_get(f"{seeded.url}/health")
    ports = [n["MetricsExportPort"] for n in ray.nodes() if n["Alive"] and n.get("MetricsExportPort")]
    assert ports

    duration = "ray_riqr_http_request_duration_seconds"

    def health_histogram(found: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> bool:
        """Whether a /health series arrived as Prometheus's own histogram series (cumulative buckets with
        ``le``, the count) holding at least this test's three requests: the +Inf bucket holds every observation and
        the buckets grow with their bound, so histogram_quantile reads it."""
        for name, labels in found:
            if name != f"{duration}_count" or ("route", "/health") not in labels:
                continue
            count = found[(name, labels)]
            by_bound = sorted(
                (float(dict(bucket_labels)["le"]), value)
                for (other, bucket_labels), value in found.items()
                if other == f"{duration}_bucket" and tuple(kv for kv in bucket_labels if kv[0] != "le") == labels
            )
            cumulative = [v for _, v in by_bound]
            if count >= 3 and by_bound[-1] == (float("inf"), count) and cumulative == sorted(cumulative):
                return True
        return False

    def exported() -> bool:
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                found = samples(answer.read().decode())
            if any(name == "ray_riqr_http_requests_total" for name, _ in found) and health_histogram(found):
                return True
        return False

    # The HTTP verticle copies every 5 s (the three requests may span two copies); Ray's agent reports
    # every few seconds after that.
    wait_for(exported, timeout=60, interval=1.0, what="riqr's metrics, its histograms whole, at a metrics agent")
