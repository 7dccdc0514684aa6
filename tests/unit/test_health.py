"""Readiness and the cluster probe: what /ready answers as partitions and ingest fail and recover."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runtime.auth import AuthConfig, mint_token
from runtime.facade import Facade
from runtime.feeds import FeedBook, FeedReport
from runtime.health import ClusterProbe, ClusterSnapshot, cluster_families, readiness
from runtime.metrics import Metrics, exposition
from runtime.ownership import ClusterView
from runtime.rest import build_app
from runtime.rest.openapi import openapi_document
from runtime.rest.routes import ROUTES
from tests.unit.fakes import FakeBus, kv_spec

SECRET = "s" * 40


def _bus(standbys: int = 0) -> FakeBus:
    bus = FakeBus()
    bus.create_store(kv_spec("s", partitions=4, actors=2, standbys=standbys))
    bus.load("s", {"a": "1", "b": "2"})
    return bus


async def _snapshot(bus: FakeBus) -> ClusterSnapshot:
    return await ClusterProbe(bus, bus.state.view, max_age=0.0, deadline=0.2).snapshot()


def _owners(bus: FakeBus) -> list[str]:
    return sorted(bus.owners)


async def test_every_partition_serving_and_no_failed_ingest_is_ready() -> None:
    verdict = readiness(await _snapshot(_bus()))
    assert verdict.ready and verdict.to_json() == {"status": "ready", "stores": 1, "partitions": 4}


async def test_a_dead_actor_makes_its_partitions_missing_with_the_reason() -> None:
    bus = _bus()
    dead = _owners(bus)[0]
    bus.owners[dead].down = True
    verdict = readiness(await _snapshot(bus))
    held = sorted(bus.state.view().tables["s"].by_owner()[dead])
    assert not verdict.ready
    assert [m["partition"] for m in verdict.missing] == held
    assert all(m["store"] == "s" and m["state"] == "unavailable" for m in verdict.missing)
    assert all(m["reason"] == "its actor is dead or did not answer in time" for m in verdict.missing)
    bus.owners[dead].down = False  # Ray restarted it: ready again
    assert readiness(await _snapshot(bus)).ready


async def test_a_serving_standby_keeps_the_partition_ready() -> None:
    bus = _bus(standbys=1)
    bus.owners[_owners(bus)[0]].down = True
    assert readiness(await _snapshot(bus)).ready


async def test_an_incomplete_partition_is_missing_until_rebuilt() -> None:
    bus = _bus()
    bus.load("s", {"a": "3"}, batch_id=5)  # a gap: every partition turns incomplete
    verdict = readiness(await _snapshot(bus))
    assert {m["state"] for m in verdict.missing} == {"incomplete"} and len(verdict.missing) == 4
    bus.load("s", {"a": "1"}, batch_id=0, source="new")  # a new source's batch 0 rebuilds them
    assert readiness(await _snapshot(bus)).ready


async def test_a_failed_ingest_is_missing_without_its_error_and_a_later_batch_clears_it() -> None:
    """``/ready`` needs no token: a failed feed's error (exception text, which may quote a path or a value)
    is not in it; GET /stores, with a token, has it."""
    bus = _bus()
    bus.ingest["s"] = {"state": "failed", "error": "ValueError: cannot cast 'secret-value' to BIGINT in /srv/x"}
    verdict = readiness(await _snapshot(bus))
    reason = "its topology's query failed; GET /stores with a token, or riqr status, says why"
    assert verdict.missing == ({"store": "s", "ingest": "failed", "reason": reason},)
    assert "secret-value" not in json.dumps(verdict.to_json())
    bus.ingest["s"] = {"state": "running", "batch_id": 1}
    assert readiness(await _snapshot(bus)).ready


async def test_a_feed_gone_silent_is_missing_and_stopped_or_never_fed_stores_are_ready() -> None:
    bus = _bus()
    bus.create_store(kv_spec("idle", partitions=2, actors=1))  # nothing ever fed it
    bus.load("idle", {"x": "1"})
    book = FeedBook(stale_after=6.0)
    book.report(FeedReport("s", "run-1", "running", query="riqr-ns-s", batch_id=3), now=100.0)
    bus.ingest = book.status(105.0)
    assert readiness(await _snapshot(bus)).ready
    bus.ingest = book.status(107.0)  # the topology was SIGKILLed at 100: three heartbeats missed
    verdict = readiness(await _snapshot(bus))
    assert [(m["store"], m["ingest"]) for m in verdict.missing] == [("s", "stale")]
    assert "no heartbeat from riqr-ns-s" in verdict.missing[0]["reason"]
    snapshot = await _snapshot(bus)
    text = exposition(Metrics(()), cluster_families(snapshot)).decode()
    assert 'riqr_ingest_state{state="stale",store="s"} 1.0' in text and "riqr_ready 0.0" in text
    book.report(FeedReport("s", "run-1", "stopped"), now=108.0)  # stopped on purpose: not a fault
    bus.ingest = book.status(1000.0)
    assert readiness(await _snapshot(bus)).ready


def test_a_registry_never_reached_is_not_ready_but_one_reached_before_is() -> None:
    never = ClusterSnapshot(ClusterView(), registry_error="no riqr registry")
    assert readiness(never).missing == ({"registry": "unreachable", "reason": "the registry did not answer"},)
    assert readiness(ClusterSnapshot(ClusterView(epoch=3), registry_error="restarting")).ready


class _SlowBus(FakeBus):
    def __init__(self) -> None:
        super().__init__()
        self.status_calls = 0

    async def fetch_status(self) -> dict[str, Any]:
        self.status_calls += 1
        await asyncio.sleep(0.01)
        return await super().fetch_status()


async def test_concurrent_probes_share_one_look_and_reuse_it_for_max_age() -> None:
    bus = _SlowBus()
    bus.create_store(kv_spec("s"))
    now = [100.0]
    probe = ClusterProbe(bus, bus.state.view, max_age=1.0, clock=lambda: now[0])
    first = await asyncio.gather(*(probe.snapshot() for _ in range(20)))
    assert probe.taken == 1 and bus.status_calls == 1 and all(s is first[0] for s in first)
    assert sum(o.calls.count("stats") for o in bus.owners.values()) == len(bus.owners)
    now[0] += 0.5
    assert await probe.snapshot() is first[0]
    now[0] += 0.6
    assert await probe.snapshot() is not first[0] and probe.taken == 2


async def test_an_actor_slower_than_the_deadline_is_reported_unavailable() -> None:
    bus = _bus()
    stalled = _owners(bus)[1]
    bus.owners[stalled].stall = 5.0
    snapshot = await ClusterProbe(bus, bus.state.view, deadline=0.05).snapshot()
    assert snapshot.failures == {stalled: "it did not answer within 0.05s"}
    assert not readiness(snapshot).ready


@pytest.fixture
async def app_client(aiohttp_client):  # type: ignore[no-untyped-def]
    bus = _bus()
    facade = Facade(bus, timeout=1.0)
    facade.probe.max_age = 0.0
    await facade.start()
    client = await aiohttp_client(build_app(facade, auth=AuthConfig(enabled=True, secret=SECRET)))
    yield bus, client
    await facade.stop()


async def test_ready_flips_to_503_with_what_is_missing_and_back(app_client) -> None:  # type: ignore[no-untyped-def]
    bus, client = app_client
    assert (await client.get("/ready")).status == 200
    dead = _owners(bus)[0]
    bus.owners[dead].down = True
    answer = await client.get("/ready")
    body = await answer.json()
    assert answer.status == 503 and body["status"] == "not-ready"
    assert {m["partition"] for m in body["missing"]} == set(bus.state.view().tables["s"].by_owner()[dead])
    assert (await client.get("/health")).status == 200  # liveness does not depend on the cluster
    bus.owners[dead].down = False
    assert (await client.get("/ready")).status == 200


async def test_probes_are_public_and_metrics_need_a_token_for_every_store(app_client) -> None:  # type: ignore[no-untyped-def]
    _, client = app_client
    for path in ("/health", "/ready"):
        assert (await client.get(path)).status == 200, path
    assert (await client.get("/metrics")).status == 401
    one = {"Authorization": "Bearer " + mint_token(SECRET, stores=["other"])}
    assert (await client.get("/metrics", headers=one)).status == 403
    every = {"Authorization": "Bearer " + mint_token(SECRET)}
    answer = await client.get("/metrics", headers=every)
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")


async def test_metrics_forget_a_dropped_store_so_no_token_sees_its_name(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """The HTTP verticle's own series (coalesced lookups, scanned entries) kept a dropped store's label, shown
    to a token allowed to read every store that exists: one that never could read the dropped one."""
    bus = _bus()
    bus.create_store(kv_spec("secret-store"))
    bus.load("secret-store", {"k": "v"})
    facade = Facade(bus, timeout=1.0)
    facade.probe.max_age = 0.0
    await facade.start()
    try:
        client = await aiohttp_client(build_app(facade, auth=AuthConfig(enabled=True, secret=SECRET)))
        every = {"Authorization": "Bearer " + mint_token(SECRET)}
        assert (await client.get("/stores/secret-store/get/k", headers=every)).status == 200
        assert (await client.get("/stores/secret-store/all", headers=every)).status == 200
        assert (await client.get("/stores/s/get/a", headers=every)).status == 200
        assert 'store="secret-store"' in await (await client.get("/metrics", headers=every)).text()
        bus.state.drop("secret-store")
        await facade.views.refresh()  # the node's view moves on (its long poll does it, in its own time)
        only_s = {"Authorization": "Bearer " + mint_token(SECRET, stores=["s"])}
        shown = await client.get("/metrics", headers=only_s)
        text = await shown.text()
        assert shown.status == 200 and "secret-store" not in text
        assert 'riqr_coalesced_batch_size_count{store="s"}' in text  # the stores that exist keep theirs
    finally:
        await facade.stop()


async def test_metrics_keep_a_new_stores_series_when_the_probes_view_is_older(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """The probe's snapshot is cached for up to a second or two: a store made since, and already read
    through this node, is in the facade's own view, and keeps its series."""
    bus = _bus()
    facade = Facade(bus, timeout=1.0)
    facade.probe.max_age = 3600.0  # the first scrape's snapshot, from before the store existed, is kept
    await facade.start()
    try:
        client = await aiohttp_client(build_app(facade, auth=AuthConfig(enabled=True, secret=SECRET)))
        every = {"Authorization": "Bearer " + mint_token(SECRET)}
        assert (await client.get("/metrics", headers=every)).status == 200
        bus.create_store(kv_spec("fresh"))
        bus.load("fresh", {"k": "v"})
        assert (await client.get("/stores/fresh/get/k", headers=every)).status == 200
        shown = await (await client.get("/metrics", headers=every)).text()
        assert 'riqr_coalesced_batch_size_count{store="fresh"}' in shown
        only_s = {"Authorization": "Bearer " + mint_token(SECRET, stores=["s"])}
        assert (await client.get("/metrics", headers=only_s)).status == 403  # "fresh" exists: not for this token
    finally:
        await facade.stop()


def test_the_openapi_document_describes_ready_and_metrics() -> None:
    doc = openapi_document(ROUTES)
    ready = doc["paths"]["/ready"]["get"]
    assert ready["security"] == [] and "401" not in ready["responses"]
    assert ready["responses"]["503"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Ready"}
    metrics = doc["paths"]["/metrics"]["get"]
    assert "text/plain; version=0.0.4; charset=utf-8" in metrics["responses"]["200"]["content"]
    assert "401" in metrics["responses"]
