"""The soak benchmark's pure parts (bench/soak_figures.py): roles, growth, the recount, and the judging of
answers and statuses. No Ray, no Spark, no sockets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.soak_figures import (
    Recount,
    Sample,
    after_warmup,
    classify,
    compare_store,
    descendants,
    growth_by_role,
    judge_count,
    judge_driver_call,
    judge_status,
    parse_landing_line,
    recount_home,
    recount_lines,
    sentinel_keys,
    slope_per_hour,
    summarise_statuses,
)


def _line(key: str | None, value: str | None, ts: int = 1, seq: int = 1) -> str:
    return json.dumps({"key": key, "value": value, "ts": ts, "seq": seq})


def test_processes_are_classified_by_the_role_their_command_line_says() -> None:
    venv = "/w/.venv/lib/python3.11/site-packages/ray"
    assert classify(["ray::QueryVerticle"]) == "query"
    assert classify(["ray::QueryVerticle.get_many()"]) == "query"  # Ray's title while a method runs
    assert classify(["ray::HttpVerticle"]) == "http"
    assert classify(["ray::FacadeVerticle.page"]) == "facade"
    assert classify(["ray::Registry"]) == "registry"
    assert classify(["ray::JobSupervisor"]) == "ray-other"
    assert classify(["ray::IDLE"]) == "ray-other"
    assert classify([f"{venv}/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/x"]) == "gcs_server"
    assert classify([f"{venv}/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/x"]) == "raylet"
    assert classify(["/usr/lib/jvm/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]) == (
        "spark-jvm"
    )
    assert classify(["/usr/lib/jvm/bin/java", "-jar", "other.jar"]) is None  # someone else's JVM
    assert classify(["/w/.venv/bin/python", "-m", "bench.soak_topology", "--home", "/tmp/h"]) == "topology"
    assert classify(["/w/.venv/bin/python", "-m", "bench.soak_driver", "--address", "x"]) == "driver-client"
    assert classify(["/w/.venv/bin/python", f"{venv}/dashboard/dashboard.py", "--host=127.0.0.1"]) == "ray-other"
    assert classify(["ray-dashboard-MetricsHead-0 (/w/.venv/bin/python -c ...)"]) == "ray-other"
    assert classify(["/w/.venv/bin/python", "-m", "bench.soak", "--minutes", "10"]) is None  # the bench itself
    assert classify(["/w/.venv/bin/riqr", "token"]) is None
    assert classify([]) is None


def test_descendants_are_the_whole_subtree_and_nothing_else() -> None:
    parents = {2: 1, 10: 2, 11: 10, 12: 11, 20: 1, 21: 20, 30: 10}
    assert descendants(parents, 10) == [11, 12, 30]
    assert descendants(parents, 2) == [10, 11, 12, 30]
    assert descendants(parents, 12) == []
    assert 1 not in descendants({1: 1, 5: 1}, 1)  # a pid listed as its own parent is not its own child


def test_the_slope_is_least_squares_per_hour() -> None:
    assert slope_per_hour([(0, 100.0), (1800, 110.0), (3600, 120.0)]) == pytest.approx(20.0)
    noisy = [(0, 100.0), (600, 104.0), (1200, 100.0), (1800, 104.0)]
    assert slope_per_hour(noisy) == pytest.approx(4.8)  # 2 MB per 25 min, fitted through the noise
    assert slope_per_hour([(0, 1.0), (60, 2.0)]) is None  # two points are no trend
    assert slope_per_hour([(5, 1.0), (5, 2.0), (5, 3.0)]) is None  # no spread in time
    assert slope_per_hour([(0, 5.0), (60, 5.0), (120, 5.0)]) == 0.0


def test_the_warm_up_is_a_fraction_of_the_run_from_its_first_look() -> None:
    points = [(float(t), float(t)) for t in range(100, 201, 10)]
    assert after_warmup(points, 0.2)[0] == (120.0, 120.0)
    assert len(after_warmup(points, 0.0)) == 11
    assert after_warmup(list(reversed(points)), 0.5)[0] == (150.0, 150.0)
    assert after_warmup([], 0.2) == []


def test_growth_sums_a_roles_processes_at_each_look_so_a_restarted_actor_stays_in_the_series() -> None:
    samples = []
    for i, t in enumerate(range(0, 3601, 600)):  # 7 looks over an hour
        samples.append(Sample(t, 100, "http", 200_000 + i * 10 * 1024, 40, 30 + i))
        # two query actors; the second one is killed after the third look and comes back as pid 300
        samples.append(Sample(t, 201, "query", 100 * 1024, 20, 10))
        samples.append(Sample(t, 202 if i < 3 else 300, "query", 100 * 1024, 20, 10))
        samples.append(Sample(t, 9, "gcs_server", 300 * 1024, 10, 50))
    growth = {g.role: g for g in growth_by_role(samples, warmup=0.2)}
    assert list(growth) == ["http", "query", "gcs_server"]  # ROLES order
    http = growth["http"]
    assert http.mb_per_hour == pytest.approx(60.0)  # 10 MB every 10 minutes
    assert http.first_mb == pytest.approx(200_000 / 1024)
    assert http.start_mb == pytest.approx((200_000 + 2 * 10 * 1024) / 1024)  # first look at or after 20% (720 s)
    assert http.ratio == pytest.approx(http.end_mb / http.start_mb)
    assert http.fds == (32, 36)
    query = growth["query"]
    assert query.processes == 2 and query.mb_per_hour == pytest.approx(0.0) and query.ratio == pytest.approx(1.0)
    assert query.threads == (40, 40)


def test_the_late_slope_tells_a_mark_that_levels_off_from_a_steady_leak() -> None:
    looks = range(0, 3601, 300)  # 13 looks over an hour
    samples = [Sample(t, 1, "http", int((100 + t / 60) * 1024), 1, 1) for t in looks]  # +60 MB/h throughout
    # rises 40 MB over the first 25 minutes, then flat
    samples += [Sample(t, 2, "facade", int((100 + min(t, 1500) / 1500 * 40) * 1024), 1, 1) for t in looks]
    growth = {g.role: g for g in growth_by_role(samples, warmup=0.2)}
    leak, mark = growth["http"], growth["facade"]
    assert leak.mb_per_hour == pytest.approx(60.0) and leak.late_mb_per_hour == pytest.approx(60.0)
    assert mark.mb_per_hour is not None and mark.mb_per_hour > 5  # the whole slope still sees the rise
    assert mark.late_mb_per_hour == pytest.approx(0.0)  # the last half of it does not


def test_the_producer_keeps_to_a_bounded_key_space_without_new_keys(tmp_path: Path) -> None:
    import threading

    from bench.soak_load import COLD_KEYS, Produced, Producer

    bounded = Produced()
    producer = Producer(tmp_path / "a", bounded, threading.Event(), orders_per_s=2000, customers_per_s=0,
                        malformed_every=0, new_keys=0.0)  # fmt: skip
    producer._orders()
    assert sum(bounded.orders.values()) == 2000
    assert all(1 <= int(key) <= COLD_KEYS for key in bounded.orders)  # never an ``n<i>`` key
    growing = Produced()
    Producer(tmp_path / "b", growing, threading.Event(), orders_per_s=2000, customers_per_s=0,
             malformed_every=0)._orders()  # fmt: skip
    new = [key for key in growing.orders if key.startswith("n")]
    assert 100 < len(new) < 220  # about 8% of 2,000, one order each
    with pytest.raises(ValueError, match="fraction"):
        Producer(tmp_path / "c", Produced(), threading.Event(), orders_per_s=1, customers_per_s=0,
                 malformed_every=0, new_keys=1.5)  # fmt: skip


def test_a_landing_line_is_a_record_only_with_every_field_of_its_type() -> None:
    assert parse_landing_line(_line("1", "pizza", 5, 7)) == {"key": "1", "value": "pizza", "ts": 5, "seq": 7}
    assert parse_landing_line(_line(None, None)) is not None  # nulls are records (a tombstone, a dropped key)
    assert parse_landing_line('{"key": "bad", "value": \n') is None  # what the soak writes as malformed
    assert parse_landing_line('["key", "value"]') is None
    assert parse_landing_line('{"key": "1", "value": "x", "ts": 1}') is None  # a field missing
    assert parse_landing_line('{"key": "1", "value": "x", "ts": "yesterday", "seq": 1}') is None
    assert parse_landing_line('{"key": 1, "value": "x", "ts": 1, "seq": 1}') is None


def test_the_recount_counts_orders_as_the_topology_does_and_keeps_each_customers_latest_name() -> None:
    recount = Recount()
    recount_lines(recount, "order", [_line("1", "pizza"), _line("1", "sushi"), _line("", "pasta"), "\n"])
    recount_lines(recount, "order", [_line(None, "x"), _line("2", None), '{"key": "bad", "value": \n'])
    assert recount.orders == Counter({"1": 2, "": 1})  # a null key or a null value is no order
    assert recount.order_records == 3
    assert recount.malformed == Counter({"order": 1})
    recount_lines(recount, "customer", [_line("1", "john", ts=5, seq=1), _line("1", "adam", ts=5, seq=2)])
    recount_lines(recount, "customer", [_line("1", "old", ts=4, seq=9), _line("2", "eve", ts=1, seq=1)])
    assert recount.customers == {"1": "adam", "2": "eve"}  # latest by (ts, seq), whatever the file order
    recount_lines(recount, "customer", [_line("2", None, ts=2, seq=1)])
    assert recount.customers == {"1": "adam"}  # a null latest value deletes the key
    recount_lines(recount, "customer", [_line("2", "zoe", ts=1, seq=5)])
    assert recount.customers == {"1": "adam"}  # older than the delete


def test_the_recount_reads_every_landing_file_but_hidden_ones(tmp_path: Path) -> None:
    orders = tmp_path / "data" / "order"
    orders.mkdir(parents=True)
    (orders / "000000000000001-a.json").write_text(_line("1", "pizza") + "\n" + _line("2", "pasta") + "\n")
    (orders / "000000000000002-b.json").write_text('{"key": "bad", "value": \n')
    (orders / ".000000000000003-c.json.tmp").write_text(_line("1", "half-written") + "\n")
    (orders / ".riqr-clock").write_text("123")
    recount = recount_home(tmp_path)
    assert recount.orders == Counter({"1": 1, "2": 1}) and recount.malformed == Counter({"order": 1})
    assert recount.customers == {}  # no customer topic yet


def test_a_store_compared_with_the_recount_tells_wrong_answers_from_lost_records() -> None:
    want = {"1": 3, "2": 5, "3": 1}
    assert compare_store(want, dict(want), counts=True).wrong == 0
    short = compare_store(want, {"1": 3, "2": 2}, counts=True)  # 3 orders of key 2 and key 3's one missing
    assert (short.keys, short.wrong, short.lost) == (2, 0, 4)
    assert short.examples == ("'2': want 5, got 2", "'3': want 1, got None")
    over = compare_store(want, {"1": 4, "2": 5, "3": 1, "9": 1}, counts=True)  # one counted twice, one unknown
    assert (over.wrong, over.lost) == (2, 0)
    names = compare_store({"1": "john", "2": "adam"}, {"1": "jack", "3": "eve"}, counts=False)
    assert (names.wrong, names.lost) == (2, 2)  # key 1 stale (wrong and lost), key 2 lost, key 3 never written


def test_the_sentinels_cover_every_partition_by_the_shared_partitioner() -> None:
    from runtime.keys import STRING
    from runtime.partitioner import partition_of

    keys = sentinel_keys(4)
    assert [partition_of(STRING, k, 4) for k in keys] == [0, 1, 2, 3]
    assert all(k.startswith("soak-end-") for k in keys)
    assert sentinel_keys(4) == keys  # the same every run


def test_statuses_are_judged_per_kind() -> None:
    assert judge_status("get", 200) == "ok" and judge_status("get", 404) == "ok"
    assert judge_status("get", 503) == "honest" and judge_status("count", 504) == "honest"
    assert judge_status("get", 500) == "unexpected"
    assert judge_status("get", "ClientConnectorError") == "unexpected"
    assert judge_status("no-token", 401) == "ok"
    assert judge_status("no-token", 200) == "wrong"  # a door left open
    assert judge_status("bad-token", 204) == "wrong"
    assert judge_status("bad-token", 403) == "unexpected"
    assert judge_status("ndjson-cut", "cut") == "ok" and judge_status("raw-cut", "cut") == "ok"
    assert judge_status("bad-param", 400) == "ok" and judge_status("bad-param", 200) == "unexpected"


def test_a_count_is_wrong_above_what_was_written_or_going_back_for_one_client() -> None:
    assert judge_count(3, produced=3, last_seen=2) is None
    assert judge_count(3, produced=5, last_seen=None) is None  # behind the producer: fine
    assert judge_count(4, produced=3, last_seen=None) == "4 with 3 written"
    assert judge_count(2, produced=3, last_seen=3) == "2 after 3"
    assert judge_count("3", produced=3, last_seen=None) == "not a count: '3'"
    assert judge_count(True, produced=3, last_seen=None) == "not a count: True"


def test_driver_calls_are_judged_by_their_exception() -> None:
    assert judge_driver_call("get", "ok") == "ok"
    assert judge_driver_call("get", "KeyNotFound") == "ok"
    assert judge_driver_call("page", "KeyNotFound") == "unexpected"
    assert judge_driver_call("get", "OwnerUnavailable") == "honest"
    assert judge_driver_call("iterate", "DeadlineExceeded") == "honest"
    assert judge_driver_call("unknown-store", "StoreNotFound") == "ok"
    assert judge_driver_call("unknown-store", "ok") == "unexpected"  # a store that does not exist answered
    assert judge_driver_call("stores", "RayActorError") == "unexpected"


def test_statuses_are_summed_per_kind_with_their_verdicts() -> None:
    outcomes: Counter[tuple[str, int | str]] = Counter(
        {("get", 200): 90, ("get", 404): 5, ("get", 503): 4, ("get", 500): 1, ("no-token", 401): 7,
         ("no-token", 200): 1, ("ndjson-cut", "cut"): 3}
    )  # fmt: skip
    summary = summarise_statuses(outcomes)
    assert list(summary) == ["get", "ndjson-cut", "no-token"]
    assert summary["get"] == {"total": 100, "by": {"200": 90, "404": 5, "500": 1, "503": 4}, "ok": 95, "honest": 4,
                              "unexpected": 1, "wrong": 0}  # fmt: skip
    assert summary["no-token"]["wrong"] == 1 and summary["no-token"]["ok"] == 7
    driver = summarise_statuses(Counter({("get", "ok"): 3, ("get", "OwnerUnavailable"): 1}), judge_driver_call)
    assert driver["get"]["ok"] == 3 and driver["get"]["honest"] == 1


def test_a_stream_that_ends_in_an_error_line_is_that_errors_outcome_not_its_200() -> None:
    """riqr sends a stream's 200 before its entries; a copy lost mid-scan ends it with an error line, which
    the load counted as the 200 it began with."""
    from bench.soak_figures import judge_status, stream_outcome

    unavailable = b'{"error": {"code": "partition-unavailable", "message": "m", "store": "s"}}\n'
    internal = b'{"error": {"code": "internal", "message": "m"}}\n'
    assert stream_outcome(200, b'{"key": "1", "value": 2}\n') == 200 and stream_outcome(200, None) == 200
    assert stream_outcome(200, unavailable) == "error:503" and judge_status("ndjson", "error:503") == "honest"
    assert stream_outcome(200, internal) == "error:500" and judge_status("ndjson", "error:500") == "unexpected"


def test_the_driver_loads_last_whole_result_line_counts() -> None:
    from bench.soak import _driver_counts

    out = 'x\nRESULT {"get:ok": 3}\nRESULT {"get:ok": 5}\nRESULT {"get:o'
    assert _driver_counts(out) == {"get:ok": 5} and _driver_counts("nothing") == {"process:died": 1}
