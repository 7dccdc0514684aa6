"""The other seeds' topologies on real Spark: windowed and session food orders, railway bookings (seed
004), events (seed 002). Each runs, gets records with controlled event times, and is queried over REST
and through the Python API, which must agree."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime
from runtime.errors import StoreInUse
from runtime.landing import Record, write_records
from tests import promtext
from tests.integration.conftest import RayCluster, Runtime, deploy_runtime
from tests.integration.helpers import T0, SessionReader, at, http_get, iso, session_triples, wait_for
from topologies.lateness import LATE_ROWS_FILE
from topologies.options import TopologyOptions, checkpoint_for

pytestmark = pytest.mark.integration


def z(seconds: float) -> str:
    """As a URL should carry it (no '+' to escape)."""
    return (T0 + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def rt(ray_cluster: RayCluster) -> Iterator[Runtime]:
    from verticles import deploy

    runtime_ns = deploy_runtime("riqr-topo")
    yield runtime_ns
    deploy.down(runtime_ns.namespace)


def fast(rt: Runtime) -> TopologyOptions:
    return TopologyOptions(namespace=rt.namespace, trigger="200 milliseconds")


def result(url: str) -> Any:
    status, _, body = http_get(url)
    return body.get("result") if status == 200 else None


def test_windowed_and_session_food_orders(rt: Runtime, spark: Any, tmp_path: Path) -> None:
    from topologies import food_orders_windowed as fw

    queries = fw.start(spark, tmp_path, fast(rt), watermark="5 seconds")
    try:
        orders = [
            Record("alice", "pizza", at(0)),
            Record("alice", "soup", at(10)),
            Record("bob", "pasta", at(20)),
            Record("alice", "salad", at(70)),
        ]
        write_records(tmp_path, "order", orders)
        write_records(tmp_path, "order", [Record("carol", "tea", at(600))])  # moves the watermark on
        url = rt.url
        windows = wait_for(
            lambda: (
                (w := result(f"{url}/stores/orders-per-minute/windows/alice?from={z(0)}&to={z(120)}"))
                and len(w) == 2
                and w
            ),
            what="alice's one-minute windows",
        )
        assert [(w["window"]["start"], w["window"]["end"], w["value"]) for w in windows] == [
            (iso(0), iso(60), 2),
            (iso(60), iso(120), 1),
        ]
        everyone = result(f"{url}/stores/orders-per-minute/windows?from={z(0)}&to={z(59)}")
        assert [(w["key"], w["value"]) for w in everyone] == [("alice", 2), ("bob", 1)]
        backwards = result(f"{url}/stores/orders-per-minute/windows/alice?from={z(0)}&to={z(120)}&reverse=true")
        assert [w["window"]["start"] for w in backwards] == [iso(60), iso(0)]

        sessions = wait_for(
            lambda: (s := result(f"{url}/stores/order-sessions/sessions/alice")) and len(s) == 2 and s,
            what="alice's two closed sessions",
        )
        assert [(s["window"]["start"], s["window"]["end"], s["value"]) for s in sessions] == [
            (iso(0), iso(40), 2),
            (iso(70), iso(100), 1),
        ]
        found = result(f"{url}/stores/order-sessions/sessions/alice?earliestEnd={z(50)}&latestStart={z(90)}")
        assert [s["window"]["start"] for s in found] == [iso(70)]
        assert [s["key"] for s in result(f"{url}/stores/order-sessions/sessions?keyFrom=b")] == ["bob"]
        assert result(f"{url}/stores/order-sessions/sessions/carol") == []  # still open: not emitted yet

        store = runtime.connect(rt.namespace).store("orders-per-minute")
        py = store.windows("alice", T0, T0 + dt.timedelta(seconds=120))
        assert [(w.start, w.end, w.value) for w in py] == [
            (T0, T0 + dt.timedelta(seconds=60), 2),
            (T0 + dt.timedelta(seconds=60), T0 + dt.timedelta(seconds=120), 1),
        ]
        assert asyncio.run(store.windows_async("alice", T0, T0 + dt.timedelta(seconds=120))) == py
        assert asyncio.run(store.windows_range_async(time_from=T0, time_to=T0 + dt.timedelta(seconds=59))) == [
            w for w in store.windows_range(time_from=T0, time_to=T0 + dt.timedelta(seconds=59))
        ]
        sessions_py = runtime.connect(rt.namespace).store("order-sessions")
        assert [s.value for s in sessions_py.sessions("alice")] == [2, 1]
        found_py = sessions_py.find_sessions("alice", T0 + dt.timedelta(seconds=50), T0 + dt.timedelta(seconds=90))
        assert [s.start for s in found_py] == [T0 + dt.timedelta(seconds=70)]
        assert asyncio.run(sessions_py.sessions_async("alice")) == sessions_py.sessions("alice")
        assert asyncio.run(sessions_py.sessions_range_async("b")) == sessions_py.sessions_range("b")
        found_async = sessions_py.find_sessions_async(
            "alice", T0 + dt.timedelta(seconds=50), T0 + dt.timedelta(seconds=90)
        )
        assert asyncio.run(found_async) == found_py
        # Paged and streamed as REST pages them: the same windows and sessions, a page at a time.
        every = store.windows_range()
        first = store.windows_page(1)
        assert first.entries == every[:1] and list(store.iterate_windows()) == every
        assert first.entries + store.windows_page(len(every), first.next).entries == every
        assert list(sessions_py.iterate_sessions(key="alice")) == sessions_py.sessions("alice")
        assert sessions_py.sessions_page(1, key="alice").entries == sessions_py.sessions("alice")[:1]
        assert asyncio.run(store.windows_page_async(1)).entries == every[:1]
        assert asyncio.run(sessions_py.sessions_page_async(9, key="alice")).entries == sessions_py.sessions("alice")

        # An order behind the watermark (at(600) - 5 s) is dropped by both stores, as Kafka Streams drops a
        # record past its grace period, and counted: in each store's feed, and at /metrics.
        write_records(tmp_path, "order", [Record("alice", "late soup", at(5))])
        late = wait_for(
            lambda: (f := _late_rows(url)).get("orders-per-minute") and f.get("order-sessions") and f,
            what="the late order counted by both stores",
        )
        assert late == {"orders-per-minute": 1, "order-sessions": 1}
        metrics = _metric_samples(url, "riqr_late_rows_dropped_total")
        assert metrics == {"orders-per-minute": 1.0, "order-sessions": 1.0}
        window = result(f"{url}/stores/orders-per-minute/windows/alice?from={z(0)}&to={z(0)}")
        assert [w["value"] for w in window] == [2]  # dropped: the closed window is as it was
        counted = {name: json.loads((checkpoint_for(tmp_path, rt.namespace, name) / LATE_ROWS_FILE).read_text())
                   for name in late}  # fmt: skip
        assert {name: c["total"] for name, c in counted.items()} == late  # kept in each query's checkpoint
    finally:
        for q in queries:
            q.stop()


def _late_rows(url: str) -> dict[str, int | None]:
    return {s["name"]: (s["ingest"] or {}).get("late_rows") for s in http_get(f"{url}/stores")[2]["result"]}


def _metric_samples(url: str, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        sample.labels["store"]: float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_a_session_store_rebuilt_from_a_fresh_checkpoint_never_shows_fewer_sessions(
    rt: Runtime, spark: Any, tmp_path: Path
) -> None:
    """Batch 0 of a fresh checkpoint runs with no watermark, so it holds no closed session: the partitions
    it resets answer 503 until a batch Spark runs with a watermark, never an emptier store. Twice: a new
    checkpoint given to the store, and a rebuild that sets the old checkpoint aside."""
    from topologies.checkpoint import batch_watermark, last_committed
    from topologies.food_orders_windowed import order_sessions
    from topologies.sink import materialize

    store = "sessions-rebuilt"
    write_records(tmp_path, "order", [Record("alice", "pizza", at(0)), Record("alice", "soup", at(10)),
                                      Record("bob", "pasta", at(20)), Record("alice", "salad", at(70))])  # fmt: skip
    write_records(tmp_path, "order", [Record("carol", "tea", at(600))])  # moves the watermark on
    expected = {"alice": [(iso(0), iso(40), 2), (iso(70), iso(100), 1)], "bob": [(iso(20), iso(50), 1)]}

    def start(checkpoint: Path, take_over: bool = False) -> Any:
        frame = order_sessions(fast(rt).read(spark, tmp_path, "order")[0], watermark="5 seconds")
        return materialize(frame, store=store, key="key", value="orders", kind="session",
                           checkpoint=str(checkpoint), namespace=rt.namespace, trigger="200 milliseconds",
                           take_over=take_over)  # fmt: skip

    def sessions(key: str) -> Any:
        status, _, body = http_get(f"{rt.url}/stores/{store}/sessions/{key}")
        return session_triples(body) if status == 200 else None

    first = tmp_path / "cp-1"
    query = start(first)
    wait_for(lambda: all(sessions(k) == v for k, v in expected.items()), what="the closed sessions")
    query.stop()
    second = tmp_path / "cp-2"

    def rebuilt() -> bool:  # the new checkpoint's batch 1, the first with a watermark, is in
        return (last_committed(str(second)) or 0) >= 1 and all(sessions(k) == v for k, v in expected.items())

    # The store holds what the first checkpoint fed it: another one takes it over only when told to.
    with pytest.raises(StoreInUse, match=f"store '{store}' holds what checkpoint .*cp-1 fed it"):
        start(second)
    assert not second.exists()
    with SessionReader(rt.url, store, expected) as reader:
        query = start(second, take_over=True)  # a new checkpoint: its batch 0 resets every partition
        try:
            wait_for(rebuilt, what="the sessions again after the new checkpoint's batch 1")
            reader.more(2 * len(expected), "reads after the rebuild")  # and they stay
        finally:
            query.stop()
    assert reader.wrong == []
    assert reader.answers[503] > 0 and reader.answers[200] > 0  # the reads overlapped the rebuild

    # Batch 1 ran with the watermark of all the input: every session the store had is closed by it.
    assert batch_watermark(str(second), 0) == 0 and batch_watermark(str(second), 1) == at(600) - 5_000
    # A checkpoint ahead of every partition (as when their data was restored from an older copy): the
    # query starts from a fresh one, and its partitions are rebuilt the same way.
    commits = sorted(int(n) for n in os.listdir(second / "commits") if n.isdigit())
    (second / "commits" / str(commits[-1] + 1)).write_text((second / "commits" / str(commits[-1])).read_text())
    with SessionReader(rt.url, store, expected) as reader:
        query = start(second)
        try:
            assert list(tmp_path.glob("cp-2.superseded-*"))
            wait_for(rebuilt, what="the sessions again after the rebuild's batch 1")
            reader.more(2 * len(expected), "reads after the rebuild")
        finally:
            query.stop()
    assert reader.wrong == []
    assert reader.answers[503] > 0 and reader.answers[200] > 0


def test_railway_bookings_of_a_customer_in_a_period(rt: Runtime, spark: Any, tmp_path: Path) -> None:
    from topologies import railway

    queries = railway.start(spark, tmp_path, fast(rt))
    try:
        bookings = [
            ("42", "2026-03-01T09:30:00Z Berlin-Hamburg"),
            ("42", "2026-03-15T18:00:00Z Hamburg-Berlin"),
            ("42", "2026-04-02T07:10:00Z Berlin-Munich"),
            ("420", "2026-03-10T12:00:00Z Cologne-Bonn"),
            ("7", "not-a-time Nowhere"),  # unparsable: dropped
        ]
        write_records(tmp_path, "booking", [Record(k, v) for k, v in bookings])
        url = rt.url
        wait_for(
            lambda: http_get(f"{url}/stores/latest-booking/get/42")[2] == {"response": "2026-04-02T07:10:00+00:00"},
            what="customer 42's latest booking",
        )
        # `bookings` is fed by a query of its own: wait for it too before reading it.
        every_42 = wait_for(
            lambda: (r := result(f"{url}/stores/bookings/range?from=42&to=42")) and len(r) == 3 and r,
            what="customer 42's three bookings",
        )
        march = result(f"{url}/stores/bookings/range?from=42/2026-03-01T00:00:00Z&to=42/2026-03-31T23:59:59Z")
        assert [(e["key"], e["value"]) for e in march] == [
            (["42", "2026-03-01T09:30:00+00:00"], "Berlin-Hamburg"),
            (["42", "2026-03-15T18:00:00+00:00"], "Hamburg-Berlin"),
        ]
        assert [e["value"] for e in every_42] == ["Berlin-Hamburg", "Hamburg-Berlin", "Berlin-Munich"]
        assert http_get(f"{url}/stores/latest-booking/get/7")[0] == 404
        assert http_get(f"{url}/stores/bookings/get/42/2026-03-15T18:00:00Z")[2] == {"response": "Hamburg-Berlin"}
        store = runtime.connect(rt.namespace).store("bookings")
        assert [v for _, v in store.range(("42",), ("42",))] == [e["value"] for e in every_42]

        # The unparsable booking went to the dead letters, and the catalog counts it for both stores.
        def dead_letters() -> Any:
            catalog = {s["name"]: s for s in runtime.connect(rt.namespace).stores()}
            stores = ["bookings", "latest-booking"]
            counts = [(catalog[s]["ingest"] or {}).get("dead_letters", {}).get("booking") for s in stores]
            return counts == [1, 1] and catalog

        catalog = wait_for(dead_letters, what="the dead letter counted in the catalog")
        assert catalog["bookings"]["key"]["columns"] == [
            {"column": "customer", "type": "string"},
            {"column": "booked_at", "type": "timestamp"},
        ]
    finally:
        for q in queries:
            q.stop()


def test_events_aggregated_per_key(rt: Runtime, spark: Any, tmp_path: Path) -> None:
    from topologies import events

    queries = events.start(spark, tmp_path, fast(rt))
    try:
        write_records(
            tmp_path,
            "event",
            [Record("sensor-1", "20.0", at(0)), Record("sensor-2", "5", at(1)), Record("sensor-1", "21.5", at(2))],
        )
        url = rt.url
        wait_for(
            lambda: (
                http_get(f"{url}/stores/event-aggregates/get/sensor-1")[2]
                == {"response": {"events": 2, "latest": "21.5"}}
            ),
            what="sensor-1's aggregate",
        )
        write_records(tmp_path, "event", [Record("sensor-1", "19.0", at(3))])
        wait_for(
            lambda: (
                http_get(f"{url}/stores/event-aggregates/get/sensor-1")[2]
                == {"response": {"events": 3, "latest": "19.0"}}
            ),
            what="sensor-1's aggregate after one more event",
        )
        assert runtime.connect(rt.namespace).store("event-aggregates").get("sensor-2") == {"events": 1, "latest": "5"}
    finally:
        for q in queries:
            q.stop()


def test_a_batch_of_null_keys_only_is_dropped_and_the_query_goes_on(rt: Runtime, spark: Any, tmp_path: Path) -> None:
    """A user's groupBy over a nullable key: a micro-batch whose only group is the null one failed the
    query (the sink's split blamed the partition count), and failed it again at every replay."""
    from pyspark.sql import functions as F

    from topologies.checkpoint import last_committed
    from topologies.sink import materialize

    store, landing, checkpoint = "null-keys", tmp_path / "in", tmp_path / "cp"
    landing.mkdir()
    (landing / "0.json").write_text('{"key": null, "value": "x"}\n{"key": null, "value": "y"}\n')
    counts = (
        spark.readStream.schema("key STRING, value STRING")
        .json(str(landing))
        .groupBy("key")
        .agg(F.count(F.lit(1)).alias("count"))
    )
    query = materialize(counts, store=store, key="key", value="count", checkpoint=str(checkpoint),
                        namespace=rt.namespace, trigger="200 milliseconds")  # fmt: skip
    try:
        wait_for(lambda: last_committed(str(checkpoint)) == 0, what="the batch of null keys only, committed")
        assert query.isActive and query.exception() is None
        (landing / "1.json").write_text('{"key": "a", "value": "z"}\n{"key": null, "value": "w"}\n')
        wait_for(lambda: http_get(f"{rt.url}/stores/{store}/get/a")[2] == {"response": 1}, what="key a counted")
        assert http_get(f"{rt.url}/stores/{store}/all")[2] == {"result": [{"key": "a", "value": 1}]}
        assert query.isActive and query.exception() is None

        # Not silently: the null group's row of each batch is counted into the store's feed.
        def dropped() -> Any:
            (entry,) = [s for s in http_get(f"{rt.url}/stores")[2]["result"] if s["name"] == store]
            return (entry.get("ingest") or {}).get("dropped_rows")

        wait_for(lambda: dropped() == {"null-key": 2}, what="the two null-key rows counted")
        metrics = urllib.request.urlopen(f"{rt.url}/metrics", timeout=30).read().decode()
        assert promtext.value(metrics, "riqr_rows_dropped_total", store=store, reason="null-key") == 2
    finally:
        query.stop()
