"""Ingest liveness on a real Ray: a feeding process killed with SIGKILL makes /ready 503 naming its store
once its heartbeats stop, a new feeder brings it back, SIGTERM reports ``stopped``; and a registry that
Ray restarts keeps ingest states and dead-letter totals.

The feeding process is ``tests/integration/feeder_process.py``: a real separate Ray driver with the real
feeder and ``supervise``, standing in for Spark's query, so a kill is a real kill and the test stays at
seconds (the staleness bound is three 2-second heartbeats).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.config import FEED_STALE_AFTER
from runtime.keys import KeySchema
from tests.integration.conftest import REPO, RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import http_get, wait_for

pytestmark = pytest.mark.integration

SPEC = StoreSpec("live", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=2, actors=2,
                 engine="memory")  # fmt: skip
QUERY = "riqr-liveness-live"


@pytest.fixture
def served(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[Runtime]:
    """riqr in a fresh namespace with store ``live``, its partitions serving (empty), nothing feeding it."""
    from topologies.delivery import BatchDelivery
    from verticles import deploy

    runtime = deploy_runtime("riqr-live")
    try:
        raycalls.get(runtime.registry().create_store.remote(SPEC), "creating the store")
        BatchDelivery(SPEC, runtime.namespace, str(tmp_path / "checkpoint")).begin("source-a")
        yield runtime
    finally:
        deploy.down(runtime.namespace)


def _ready(url: str) -> tuple[int, Any]:
    status, _, body = http_get(f"{url}/ready")
    return status, body


def _ingest(url: str) -> dict[str, Any]:
    stores = {s["name"]: s for s in http_get(f"{url}/stores")[2]["result"]}
    return dict(stores[SPEC.name]["ingest"] or {})


def _metric(url: str, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


class Feeding:
    """A feeder process, started and waited for until its first report was acknowledged."""

    def __init__(self, cluster: RayCluster, runtime: Runtime, log: Path) -> None:
        self.log = log
        self.out = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.feeder_process", cluster.address, runtime.namespace,
             SPEC.name, QUERY],
            cwd=REPO, stdout=self.out, stderr=subprocess.STDOUT, env=os.environ.copy(),
        )  # fmt: skip
        self.id = wait_for(self._started, timeout=60, what="the feeder process to report", fatal=(AssertionError,))

    def _started(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the feeder process exited {self.proc.returncode}:\n{self.log.read_text()}")
        words = self.log.read_text().split()
        return words[words.index("feeding") + 1] if "feeding" in words else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.out.close()


def test_a_killed_feeder_turns_stale_and_a_new_one_brings_the_store_back(
    ray_cluster: RayCluster, served: Runtime, tmp_path: Path
) -> None:
    url = served.url
    # A store nothing ever fed is ready (docs/operations.md, "Probes").
    wait_for(lambda: _ready(url)[0] == 200, timeout=30, what="/ready 200 before any feeder")
    assert _ingest(url) == {}

    first = Feeding(ray_cluster, served, tmp_path / "first.log")
    try:
        wait_for(lambda: _ingest(url).get("feeder") == first.id, timeout=30, what="the first feeder in the catalog")
        assert _ingest(url)["state"] == "running" and _ready(url)[0] == 200
        os.kill(first.proc.pid, signal.SIGKILL)  # no last word: only the heartbeats stop
        assert first.proc.wait(timeout=30) == -signal.SIGKILL
        status, body = wait_for(
            lambda: (r := _ready(url))[0] == 503 and r, timeout=FEED_STALE_AFTER + 20, what="/ready 503 once stale"
        )
        assert [(m["store"], m["ingest"]) for m in body["missing"]] == [(SPEC.name, "stale")]
        assert f"no heartbeat from {QUERY}" in body["missing"][0]["reason"]
        stale = _ingest(url)
        assert (stale["state"], stale["reported"], stale["feeder"]) == ("stale", "running", first.id)
        assert _metric(url, "riqr_ingest_state", store=SPEC.name, state="stale") == 1
        assert _metric(url, "riqr_ready") == 0
    finally:
        first.stop()

    second = Feeding(ray_cluster, served, tmp_path / "second.log")
    try:
        wait_for(lambda: _ready(url)[0] == 200, timeout=30, what="/ready 200 with a new feeder")
        assert (_ingest(url)["state"], _ingest(url)["feeder"]) == ("running", second.id)
        second.proc.send_signal(signal.SIGTERM)  # ray job stop: supervise says "stopped" before exiting
        assert second.proc.wait(timeout=30) == 0
        assert _ingest(url)["state"] == "stopped"
        assert _ready(url)[0] == 200  # stopped on purpose is not a fault
    finally:
        second.stop()


def test_a_restarted_registry_keeps_ingest_states_and_dead_letter_totals(served: Runtime) -> None:
    import ray

    from topologies.feeder import Feeder, RayFeedLink

    url, registry = served.url, served.registry()
    feeder = Feeder(RayFeedLink(served.namespace), interval=0.5)
    feeder.update(SPEC.name, state="running", query=QUERY, batch_id=3, rows=10)
    feeder.dead_letters(SPEC.name, "order", 2)
    feeder.update(SPEC.name, state="failed", batch_id=4, error="OwnerUnavailable: delivering batch 4 ...")
    before = wait_for(lambda: (i := _ingest(url)).get("state") == "failed" and i, timeout=30, what="the failure")
    assert before["dead_letters"] == {"order": 2}

    epoch = raycalls.get(registry.epoch.remote(), "epoch")
    ray.kill(registry, no_restart=False)  # Ray restarts it: tables from the query actors, ingest from disk
    wait_for(lambda: raycalls.get(registry.epoch.remote(), "epoch", timeout=10) > max(epoch, 10**12), timeout=60,
             what="the registry restarted and rebuilt")  # fmt: skip
    after = _ingest(url)
    assert {k: after.get(k) for k in ("state", "error", "batch_id", "dead_letters", "feeder", "query")} == {
        k: before.get(k) for k in ("state", "error", "batch_id", "dead_letters", "feeder", "query")
    }
    status, body = _ready(url)
    assert status == 503 and [(m["store"], m["ingest"]) for m in body["missing"]] == [(SPEC.name, "failed")]

    # A live feeder's heartbeat carries the whole state, so batch progress not yet on disk comes back too.
    feeder.update(SPEC.name, state="running", batch_id=0, rows=1)
    wait_for(lambda: _ready(url)[0] == 200, timeout=30, what="/ready 200 once fed again")
    ray.kill(registry, no_restart=False)
    wait_for(lambda: (i := _ingest(url)).get("state") == "running" and i.get("dead_letters") == {"order": 2}
             and i.get("batch_id") == 0, timeout=60, what="the live feed after a second restart")  # fmt: skip
    feeder.finish()
    assert _ingest(url)["state"] == "stopped"
