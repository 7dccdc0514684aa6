"""Metrics: names follow Prometheus conventions, every metric moves when its thing happens, the docs list
exactly the catalog, and the copy into Ray sends differences."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime.facade import Facade
from runtime.health import ClusterSnapshot, cluster_families
from runtime.metrics import (
    CATALOG,
    FOLD_EVERY,
    QUERY_METRICS,
    HistogramState,
    MetricDef,
    Metrics,
    Mirror,
    exposition,
)
from runtime.query import QueryCore
from runtime.rest import build_app
from tests.promtext import value as _value
from tests.unit.fakes import FakeBus, kv_spec

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("d", CATALOG, ids=lambda d: d.name)
def test_names_and_labels_follow_prometheus_conventions(d: MetricDef) -> None:
    assert re.fullmatch(r"riqr_[a-z_]+", d.name)
    assert d.name.endswith("_total") == (d.kind == "counter")
    if d.kind == "histogram":
        assert d.name.endswith(("_seconds", "_size")) and d.buckets == tuple(sorted(d.buckets))
    assert not {"key", "value", "path", "actor", "token"} & set(d.labels)  # unbounded or secret


def test_the_operations_doc_lists_exactly_the_catalog() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    table = set(re.findall(r"^\| `(riqr_[a-z_]+)` \|", text, re.M))
    assert table == {d.name for d in CATALOG}


def test_records_folded_in_later_read_as_if_incremented_and_observed_at_once() -> None:
    direct, folded = Metrics(), Metrics()
    durations = [0.0001, 0.0005, 0.0005000001, 0.001, 0.07, 3.0, 10.0, 99.0]  # on, around and past the bounds
    for i, seconds in enumerate(durations * 200):
        route, status = f"/r{i % 3}", str(200 + i % 2)
        direct.child("riqr_http_requests_total", route, status).inc()
        direct.child("riqr_http_request_duration_seconds", route).observe(seconds)
        folded.record("riqr_http_requests_total", (route, status))
        folded.record("riqr_http_request_duration_seconds", (route,), seconds)
    folded.record("riqr_scan_entries_total", ("s",), 7.0)
    direct.inc("riqr_scan_entries_total", "s", amount=7.0)
    got, want = folded.samples(), direct.samples()  # every collect folds what is pending first
    assert [(s.name, s.labels) for s in got] == [(s.name, s.labels) for s in want]
    for g, w in zip(got, want):  # counts exact; a sum may differ in its last bits (added in another order)
        assert g.value == (pytest.approx(w.value, rel=1e-12) if g.name.endswith("_sum") else w.value), g
    assert folded.value("riqr_scan_entries_total", store="s") == 7.0


def test_records_made_while_other_threads_collect_are_never_lost() -> None:
    metrics, done = Metrics(), threading.Event()

    def scrape() -> None:
        while not done.is_set():
            metrics.samples()

    scrapers = [threading.Thread(target=scrape) for _ in range(2)]
    for t in scrapers:
        t.start()
    try:
        for _ in range(20 * FOLD_EVERY + 3):  # folds on the recording thread and on the scrapers, interleaved
            metrics.record("riqr_local_reads_total", ("s",))
    finally:
        done.set()
        for t in scrapers:
            t.join()
    assert metrics.value("riqr_local_reads_total", store="s") == 20 * FOLD_EVERY + 3


@pytest.fixture
async def served(aiohttp_client):  # type: ignore[no-untyped-def]
    bus = FakeBus()
    bus.create_store(kv_spec("s"))
    bus.load("s", {f"k{i}": str(i) for i in range(20)})
    facade = Facade(bus, timeout=1.0)
    facade.probe.max_age = 0.0
    await facade.start()
    yield bus, facade, await aiohttp_client(build_app(facade))
    await facade.stop()


async def _metrics(client: Any) -> str:
    answer = await client.get("/metrics")
    assert answer.status == 200
    return str(await answer.text())


async def test_requests_are_counted_by_route_pattern_and_status_and_timed(served) -> None:  # type: ignore[no-untyped-def]
    _, _, client = served
    route = "/stores/{store}/get/{key}"
    before = await _metrics(client)
    assert (await client.get("/stores/s/get/k1")).status == 200
    assert (await client.get("/stores/s/get/nope")).status == 404
    assert (await client.get("/no/such/path/k1")).status == 404
    after = await _metrics(client)
    for status in ("200", "404"):
        grown = _value(after, "riqr_http_requests_total", route=route, status=status)
        assert grown == _value(before, "riqr_http_requests_total", route=route, status=status) + 1
    assert _value(after, "riqr_http_requests_total", route="unmatched", status="404") == 1
    assert _value(after, "riqr_http_request_duration_seconds_count", route=route) == 2
    assert "k1" not in after and "nope" not in after  # keys never become labels


async def test_concurrent_gets_are_coalesced_and_the_batch_sizes_recorded(served) -> None:  # type: ignore[no-untyped-def]
    bus, facade, client = served
    await asyncio.gather(*(client.get(f"/stores/s/get/k{i}") for i in range(20)))
    text = await _metrics(client)
    calls = _value(text, "riqr_coalesced_batch_size_count", store="s")
    assert _value(text, "riqr_coalesced_batch_size_sum", store="s") == 20
    assert 1 <= calls == sum(o.calls.count("get_many") for o in bus.owners.values())


async def test_scanned_entries_are_counted_for_lists_pages_and_streams(served) -> None:  # type: ignore[no-untyped-def]
    _, _, client = served
    await client.get("/stores/s/all")
    await client.get("/stores/s/all?limit=5")
    stream = await client.get("/stores/s/all", headers={"Accept": "application/x-ndjson"})
    assert len((await stream.text()).splitlines()) == 20
    assert _value(await _metrics(client), "riqr_scan_entries_total", store="s") == 20 + 5 + 20


def test_applies_are_counted_per_partition_but_replays_are_not() -> None:
    core = QueryCore(kv_spec("s", partitions=1, actors=1), [0])
    core.begin("q")
    bus = FakeBus()
    bus.create_store(kv_spec("s", partitions=1, actors=1))
    uuid = next(iter(bus.owners))
    bus.owners[uuid].core = core
    bus.load("s", {"a": "1", "b": "2"}, batch_id=0)
    bus.load("s", {"a": "1", "b": "2"}, batch_id=0)  # a replay
    bus.load("s", {"a": None}, batch_id=1)  # a delete is a row too
    m = core.metrics
    assert m.value("riqr_batches_applied_total", store="s", partition="0") == 2
    assert m.value("riqr_rows_applied_total", store="s", partition="0") == 3
    assert m.value("riqr_apply_duration_seconds_count", store="s") == 3
    assert {name for name, _, _ in core.stats()["samples"]} >= {"riqr_rows_applied_total"}


def _snapshot(standbys: int = 0, **ingest: Any) -> tuple[FakeBus, ClusterSnapshot]:
    bus = FakeBus()
    bus.create_store(kv_spec("s", partitions=2, actors=2, standbys=standbys))
    bus.load("s", {"a": "1", "b": "2", "c": "3"})
    view = bus.state.view()
    stats = {u: o.core.stats() for u, o in bus.owners.items()}
    return bus, ClusterSnapshot(view, {"s": ingest} if ingest else {}, stats)


def _cluster_text(snapshot: ClusterSnapshot) -> str:
    return exposition(Metrics(()), cluster_families(snapshot)).decode()


def test_cluster_metrics_show_positions_lag_ingest_dead_letters_and_late_rows() -> None:
    _, snapshot = _snapshot(state="running", batch_id=3, at=1700000000.5, dead_letters={"order": 2}, late_rows=7,
                            dropped_rows={"null-key": 4, "time-out-of-range": 1})  # fmt: skip
    text = _cluster_text(snapshot)
    assert _value(text, "riqr_partition_position", store="s", partition="0") == 0
    assert _value(text, "riqr_partition_lag_batches", store="s", partition="1") == 3
    assert _value(text, "riqr_ingest_state", store="s", state="running") == 1
    assert _value(text, "riqr_ingest_last_report_timestamp_seconds", store="s") == 1700000000.5
    assert _value(text, "riqr_dead_letters_total", store="s", topic="order") == 2
    assert _value(text, "riqr_late_rows_dropped_total", store="s") == 7
    assert _value(text, "riqr_rows_dropped_total", store="s", reason="null-key") == 4
    assert _value(text, "riqr_rows_dropped_total", store="s", reason="time-out-of-range") == 1
    assert _value(text, "riqr_partitions_unavailable", store="s") == 0
    assert _value(text, "riqr_ready") == 1


def test_cluster_metrics_count_copies_by_role_and_state_and_label_applies_by_role() -> None:
    bus, snapshot = _snapshot(standbys=1)
    dead = sorted(bus.owners)[0]
    alive = {u: s for u, s in snapshot.stats.items() if u != dead}
    snapshot = ClusterSnapshot(snapshot.view, {}, alive, {dead: "gone"})
    text = _cluster_text(snapshot)
    table = snapshot.view.tables["s"]
    p = table.by_owner()[dead][0]
    assert _value(text, "riqr_partition_replicas", store="s", partition=str(p), role="active", state="unavailable") == 1
    assert _value(text, "riqr_partition_replicas", store="s", partition=str(p), role="standby", state="serving") == 1
    assert _value(text, "riqr_partitions_unavailable", store="s") == 0  # the standby serves
    assert _value(text, "riqr_batches_applied_total", store="s", partition=str(p), role="standby") == 1
    assert _value(text, "riqr_batches_applied_total", store="s", partition=str(p), role="active") == 0
    assert _value(text, "riqr_apply_duration_seconds_count", store="s") == 1  # the live actor's one apply


def test_the_query_actors_histogram_buckets_come_in_increasing_le() -> None:
    """The text format wants a histogram's buckets by increasing ``le``; sorted as text, ``+Inf`` came
    first and ``10.0`` before ``2.5``."""
    _, snapshot = _snapshot()
    text = _cluster_text(snapshot)
    bounds = re.findall(r'^riqr_apply_duration_seconds_bucket\{le="([^"]+)",store="s"\}', text, re.M)
    assert len(bounds) > 2 and bounds[-1] == "+Inf"
    assert [float(b) for b in bounds] == sorted(float(b) for b in bounds)


class _Target:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str], float, int]] = []

    def counter_inc(self, d: MetricDef, tags: dict[str, str], amount: float) -> None:
        self.calls.append(("inc", d.base, tags, amount, 1))

    def gauge_set(self, d: MetricDef, tags: dict[str, str], value: float) -> None:
        self.calls.append(("set", d.base, tags, value, 1))

    def histogram_set(self, d: MetricDef, tags: dict[str, str], value: HistogramState) -> None:
        self.calls.append(("histogram", d.base, tags, value, 1))


def test_the_copy_into_ray_sends_counter_differences_and_histogram_states_once() -> None:
    metrics = Metrics(QUERY_METRICS)
    target = _Target()
    mirror = Mirror(metrics, target)
    metrics.inc("riqr_rows_applied_total", "s", "0", amount=5)
    metrics.observe("riqr_apply_duration_seconds", 0.003, "s")
    metrics.observe("riqr_apply_duration_seconds", 0.003, "s")
    metrics.observe("riqr_apply_duration_seconds", 99.0, "s")
    mirror.flush()
    assert ("inc", "riqr_rows_applied", {"store": "s", "partition": "0"}, 5.0, 1) in target.calls
    [(_, _, tags, state, _)] = [c for c in target.calls if c[0] == "histogram"]
    assert tags == {"store": "s"}
    cumulative = dict(state.buckets)
    assert cumulative[0.0025] == 0 and cumulative[0.005] == 2 and cumulative[30.0] == 2
    assert cumulative[float("inf")] == 3 and list(cumulative)[-1] == float("inf")  # bounds in order
    assert state.count == 3 and state.sum == 0.003 + 0.003 + 99.0  # the exact sum, not a bucket's bound
    target.calls.clear()
    mirror.flush()
    assert target.calls == []  # nothing new, nothing sent
    metrics.inc("riqr_rows_applied_total", "s", "0", amount=2)
    mirror.flush()
    assert target.calls == [("inc", "riqr_rows_applied", {"store": "s", "partition": "0"}, 2.0, 1)]
    metrics.observe("riqr_apply_duration_seconds", 0.2, "s")
    mirror.flush()
    [(_, _, _, state, _)] = target.calls[1:]
    assert state.count == 4 and dict(state.buckets)[0.25] == 3  # the whole state again, cumulative


def test_a_store_made_again_after_its_series_were_forgotten_counts_in_ray_from_its_first_request() -> None:
    """``retain_stores`` forgets a dropped store's series; made again under its name, its counter starts at
    0 below the mirror's last value, and Ray's counter stayed frozen until it passed that value."""
    from runtime.metrics import HTTP_METRICS

    metrics = Metrics(HTTP_METRICS)
    target = _Target()
    mirror = Mirror(metrics, target)
    metrics.inc("riqr_local_reads_total", "s", amount=100)
    mirror.flush()
    metrics.retain_stores(set())  # dropped
    metrics.inc("riqr_local_reads_total", "s", amount=60)  # made again, read 60 times
    target.calls.clear()
    mirror.flush()
    assert target.calls == [("inc", "riqr_local_reads", {"store": "s"}, 60.0, 1)]
    metrics.retain_stores(set())  # dropped again, made again, and read past its old count before a flush
    metrics.inc("riqr_local_reads_total", "s", amount=150)
    target.calls.clear()
    mirror.flush()
    assert target.calls == [("inc", "riqr_local_reads", {"store": "s"}, 150.0, 1)]
    for i in range(50):  # nor does the mirror remember every dropped store's series
        metrics.inc("riqr_local_reads_total", f"gone-{i}")
        mirror.flush()
        metrics.retain_stores({"s"})
    mirror.flush()
    assert len(mirror._last) <= 2  # noqa: SLF001


def test_query_actors_totals_never_go_back_when_an_actor_misses_a_look_or_restarts() -> None:
    """An actor slower than the probe's deadline dropped out of the sums, and one restarted counted from
    zero: the sum fell, and Prometheus' rate() read a reset, a spike of the whole total."""
    from runtime.health import Totals

    def stats(rows: float) -> dict[str, Any]:
        labels = (("store", "s"), ("partition", "0"))
        return {"partitions": {}, "samples": [("riqr_rows_applied_total", labels, rows)]}

    def rows(looked: dict[str, Any], uuid: str) -> float:
        return float(looked[uuid]["samples"][0][2])

    totals = Totals()
    assert rows(totals.look({"a": stats(10), "b": stats(5)}, [], ["a", "b"]), "a") == 10
    missed = totals.look({"b": stats(7)}, ["a"], ["a", "b"])  # a did not answer in time
    assert rows(missed, "a") == 10 and rows(missed, "b") == 7
    restarted = totals.look({"a": stats(3), "b": stats(8)}, [], ["a", "b"])  # a restarted: 3 since
    assert rows(restarted, "a") == 13
    assert rows(totals.look({"a": stats(4)}, [], ["a"]), "a") == 14  # b left the view: forgotten
    assert rows(totals.look({"b": stats(1)}, [], ["a", "b"]), "b") == 1  # back as a new actor: from its own


def test_a_restart_carries_every_series_of_the_actor_so_histogram_buckets_stay_in_order() -> None:
    from runtime.health import Totals

    def stats(incarnation: str, fast: float, every: float) -> dict[str, Any]:
        bucket = "riqr_apply_duration_seconds_bucket"
        series = [((("store", "s"), ("le", "0.1")), fast), ((("store", "s"), ("le", "+Inf")), every)]
        return {"incarnation": incarnation, "samples": [(bucket, labels, value) for labels, value in series]}

    totals = Totals()
    totals.look({"a": stats("one", 9, 9)}, [], ["a"])
    # Restarted, and already past its old count in one series by the next look: only the incarnation tells.
    after = totals.look({"a": stats("two", 1, 10)}, [], ["a"])["a"]["samples"]
    assert [value for _, _, value in after] == [10, 19]  # le=0.1 <= +Inf, both carried
    # Restarted again, and nothing recorded yet (its series come back at its next apply): still there.
    quiet = totals.look({"a": {"incarnation": "three", "samples": []}}, [], ["a"])["a"]["samples"]
    assert sorted(value for _, _, value in quiet) == [10, 19]


def test_the_cluster_metrics_sum_the_carried_totals() -> None:
    bus, snapshot = _snapshot()
    dead = sorted(bus.owners)[0]
    kept = {u: s for u, s in snapshot.stats.items()}  # what the probe carried for every actor
    alive = {u: s for u, s in snapshot.stats.items() if u != dead}
    missing = ClusterSnapshot(snapshot.view, {}, alive, {dead: "slow"}, totals=kept)
    text = _cluster_text(missing)
    assert _value(text, "riqr_apply_duration_seconds_count", store="s") == 2  # both actors' applies, still
