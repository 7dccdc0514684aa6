"""``riqr status``, ``riqr query`` and the progress of ``riqr demo``/``up``: pure logic on fake data."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from rich.console import Console

from riqr import cli
from riqr.progress import Steps
from riqr.status import endpoint_rows, lag, render_status, replicas_per_node, store_rows
from runtime.errors import BadRequest, DeadlineExceeded, KeyNotFound, OwnerUnavailable, StoreNotFound
from runtime.queries import UrlKey
from runtime.windows import Windowed

NODE_A, NODE_B = "a" * 56, "b" * 56
NOW = 1_000_000.0


def _catalog() -> list[dict[str, Any]]:
    spec = {"key": {"column": "key", "type": "string"}, "value": [{"column": "count", "type": "bigint"}]}
    ingest = {"state": "running", "batch_id": 7, "at": NOW - 3, "query": "q", "dead_letters": {"order": 2}}
    return [
        {**spec, "name": "order-count", "kind": "kv", "partitions": 4, "standbys": 1, "ingest": ingest,
         "positions": [{"partition": p, "actor": "u1", "source": "s", "batch_id": 7 - (p == 3) * 2,
                        "state": "serving"} for p in range(4)]},
        {**spec, "name": "clicks", "kind": "window", "partitions": 2, "standbys": 0, "ingest": None,
         "positions": [{"partition": 0, "actor": None, "state": "unassigned"},
                       {"partition": 1, "actor": "u3", "state": "loading", "source": None, "batch_id": -1}]},
    ]  # fmt: skip


def _instances() -> list[dict[str, Any]]:
    return [
        {"state-store-names": ["order-count"], "node": NODE_A, "partitions": [0, 2], "standby-partitions": [1, 3]},
        {"state-store-names": ["order-count"], "node": NODE_B, "partitions": [1, 3], "standby-partitions": [0, 2]},
        {"state-store-names": ["clicks"], "node": NODE_B, "partitions": [1], "standby-partitions": []},
    ]


def test_lag_counts_batches_behind_the_last_delivered_and_needs_both_ends() -> None:
    assert lag({"batch_id": 5}, {"batch_id": 7}) == 2
    assert lag({"batch_id": 8}, {"batch_id": 7}) == 0  # reported before the sink's report arrived
    assert lag({"batch_id": 5}, None) is None and lag({}, {"batch_id": 7}) is None


def test_replicas_are_counted_per_node() -> None:
    assert replicas_per_node(_instances(), "order-count") == {NODE_A: (2, 2, 0), NODE_B: (2, 2, 0)}
    assert replicas_per_node(_instances(), "clicks") == {NODE_B: (1, 0, 0)}
    assert replicas_per_node(_instances(), "other") == {}


def test_copies_whose_actor_does_not_answer_are_counted_apart_not_as_standbys() -> None:
    """After a failover the registry lists a dead actor's copies as standbys until they are replaced: the
    column read "2 active, 2 standby" for a node whose actor was gone (an operations run)."""
    instances = _instances()
    dead = {"partition": -1, "state": "unavailable", "reason": "the actor died"}
    instances[0] = {**instances[0], "partitions": [], "standby-partitions": [0, 1, 2, 3],
                    "positions": [{**dead, "partition": p, "role": "standby"} for p in range(4)]}  # fmt: skip
    instances[1] = {**instances[1], "partitions": [0, 1, 2, 3], "standby-partitions": [],
                    "positions": [{"partition": p, "state": "serving"} for p in range(4)]}  # fmt: skip
    assert replicas_per_node(instances, "order-count") == {NODE_A: (0, 0, 4), NODE_B: (4, 0, 0)}
    # An actor that answered without a partition (a copy being added to it) is no silence.
    instances[1]["standby-partitions"], instances[1]["positions"][0] = [5], {"partition": 5, "state": "unknown"}
    assert replicas_per_node(instances, "order-count")[NODE_B] == (4, 1, 0)
    instances[1]["standby-partitions"] = []
    row = {r[0]: r for r in store_rows(_catalog(), instances, now=NOW)}["order-count"]
    assert row[3] == "aaaaaaaaaaaa: 0 active, 4 not answering\nbbbbbbbbbbbb: 4 active"


def test_a_row_per_store_says_what_serves_how_far_behind_and_how_ingest_goes() -> None:
    rows = {row[0]: row for row in store_rows(_catalog(), _instances(), now=NOW)}
    assert list(rows) == ["clicks", "order-count"]  # by name
    orders = rows["order-count"]
    assert orders[1:3] == ("kv", "4 (+1 standby)")
    assert orders[3] == "aaaaaaaaaaaa: 2 active, 2 standby\nbbbbbbbbbbbb: 2 active, 2 standby"
    assert orders[4] == "4 serving, batch 5-7"
    assert orders[5] == "2 batches"
    assert orders[6] == "running, batch 7, 3 s ago"
    assert orders[7] == "order: 2"
    clicks = rows["clicks"]
    assert clicks[4] == "1 loading, 1 unassigned, batch -1"
    assert clicks[5] == "-" and clicks[6] == "no sink reported" and clicks[7] == "-"


def test_the_ingest_column_says_how_many_late_rows_a_windowed_store_dropped() -> None:
    catalog = _catalog()[1:]
    catalog[0]["ingest"] = {"state": "running", "batch_id": 2, "at": NOW - 1, "late_rows": 0}
    assert store_rows(catalog, _instances(), NOW)[0][6] == "running, batch 2, 1 s ago"  # none: not said
    catalog[0]["ingest"]["late_rows"] = 12
    assert store_rows(catalog, _instances(), NOW)[0][6] == "running, batch 2, 1 s ago, 12 late rows dropped"


def test_the_lag_column_shows_the_copy_furthest_behind_standbys_included() -> None:
    catalog = _catalog()[:1]
    for p in catalog[0]["positions"]:
        p.update(lag_batches=0, lag_seconds=0.0, batch_id=7)
        p["replicas"] = [
            {"role": "active", "batch_id": 7, "lag_batches": 0, "lag_seconds": 0.0},
            {"role": "standby", "batch_id": 7 - (p["partition"] == 2) * 3, "lag_batches": (p["partition"] == 2) * 3,
             "lag_seconds": (p["partition"] == 2) * 4.25},
        ]  # fmt: skip
    [row] = store_rows(catalog, _instances(), NOW)
    assert row[5] == "3 batches, 4.2 s"
    for p in catalog[0]["positions"]:
        p["replicas"][1].update(lag_batches=0, lag_seconds=0.0)
    assert store_rows(catalog, _instances(), NOW)[0][5] == "0 batches"


def test_the_lag_column_counts_copies_whose_actor_did_not_answer_rather_than_reading_as_caught_up() -> None:
    catalog = _catalog()[:1]
    for p in catalog[0]["positions"]:
        p.update(lag_batches=0, lag_seconds=0.0, batch_id=7)
        lost = {"role": "standby", "state": "unavailable", "reason": "no answer", "lag_batches": None}
        p["replicas"] = [{"role": "active", "batch_id": 7, "lag_batches": 0, "lag_seconds": 0.0}, lost]
    assert store_rows(catalog, _instances(), NOW)[0][5] == "0 batches; 4 of 8 copies unknown"
    for p in catalog[0]["positions"]:
        p["replicas"][0] = dict(p["replicas"][1], role="active")
    assert store_rows(catalog, _instances(), NOW)[0][5] == "8 of 8 copies unknown"
    catalog[0]["ingest"] = {"state": "running", "at": NOW - 1}  # a feed that reported no batch yet
    assert store_rows(catalog, _instances(), NOW)[0][5] == "-"


def test_a_failed_ingest_shows_its_error() -> None:
    catalog = _catalog()
    catalog[0]["ingest"] = {"state": "failed", "batch_id": 8, "error": "OwnerUnavailable: gone"}
    row = store_rows(catalog, _instances(), now=NOW)[1]
    assert row[6] == "failed, batch 8: OwnerUnavailable: gone"
    # A query's failure carries Spark's whole traceback: one line of it in the table, the rest in --json.
    trace = 'StreamingQueryException: [STREAM_FAILED] query failed\n  File "x.py", line 1\n    raise\nError: boom'
    catalog[0]["ingest"] = {"state": "failed", "batch_id": 8, "error": trace}
    row = store_rows(catalog, _instances(), now=NOW)[1]
    assert (
        row[6]
        == "failed, batch 8: StreamingQueryException: [STREAM_FAILED] query failed ... (riqr status --json has it all)"
    )


def test_the_rendered_tables_hold_every_store_and_endpoint() -> None:
    out = io.StringIO()
    endpoints = {NODE_B: ("10.0.0.2", 7400), NODE_A: ("10.0.0.1", 7400)}
    assert endpoint_rows(endpoints) == [
        ("aaaaaaaaaaaa", "http://10.0.0.1:7400/"),
        ("bbbbbbbbbbbb", "http://10.0.0.2:7400/"),
    ]
    render_status(Console(file=out, width=200, color_system=None), _catalog(), _instances(), endpoints, now=NOW)
    text = out.getvalue()
    expected = ["order-count", "clicks", "4 serving, batch 5-7", "running, batch 7, 3 s ago", "order: 2"]
    expected += ["http://10.0.0.1:7400/", "http://10.0.0.2:7400/", "replicas per node", "dead letters"]
    for part in expected:
        assert part in text, part
    empty = io.StringIO()
    render_status(Console(file=empty, width=120, color_system=None), [], [], endpoints, now=NOW)
    assert "no stores yet" in empty.getvalue()


def test_an_error_with_brackets_is_printed_as_written_not_read_as_markup() -> None:
    """rich read table cells as markup: "[/data/x]" raised MarkupError (on the failed feed one looks at),
    and "[red]" vanished from the message."""
    catalog = _catalog()
    catalog[0]["ingest"] = {"state": "failed", "batch_id": 8, "error": "OSError: [/data/x] is gone [red]"}
    out = io.StringIO()
    render_status(Console(file=out, width=300, color_system=None), catalog, _instances(), {}, now=NOW)
    assert "OSError: [/data/x] is gone [red]" in out.getvalue()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["query", "s", "get", "1"], {"store": "s", "op": "get", "key": "1"}),
        (["query", "s", "range", "2", "5"], {"op": "range", "lo": "2", "hi": "5", "limit": None, "reverse": False}),
        (["query", "s", "range"], {"op": "range", "lo": None, "hi": None}),
        (["query", "s", "prefix", "ab", "--reverse"], {"op": "prefix", "prefix": "ab", "reverse": True}),
        (["query", "s", "all", "--limit", "3"], {"op": "all", "limit": 3}),
        (["query", "s", "--namespace", "ns", "all"], {"namespace": "ns", "address": None}),
        (["status", "--address", "10.0.0.1:6379", "--namespace", "ns"], {"address": "10.0.0.1:6379", "json": False}),
        (["status", "--json"], {"namespace": "riqr", "json": True}),
    ],
)
def test_arguments(argv: list[str], expected: dict[str, Any]) -> None:
    args = vars(cli.build_parser().parse_args(argv))
    assert {k: args[k] for k in expected} == expected


@pytest.mark.parametrize("argv", [["query", "s"], ["query", "s", "get"], ["query", "s", "all", "--limit", "0"],
                                  ["query", "s", "range", "1", "2", "3"]])  # fmt: skip
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv)


class FakeStore:
    """The part of ``runtime.client.Store`` that ``riqr query`` uses, over a sorted dict."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self.data = dict(sorted(data.items()))
        self.asked: list[dict[str, Any]] = []

    def get(self, key: UrlKey) -> Any:
        return self.data[key.text()]

    def iterate(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        items = list(self.data.items())[:: -1 if kwargs["reverse"] else 1]
        lo, hi, prefix = kwargs.get("lo"), kwargs.get("hi"), kwargs.get("prefix")
        for k, v in items:
            if (lo is None or k >= lo.text()) and (hi is None or k <= hi.text()) and k.startswith(prefix or ""):
                yield (k, v)


def _lines(store: Any, *argv: str) -> list[str]:
    return list(cli.query_lines(store, cli.build_parser().parse_args(["query", "s", *argv])))


def test_query_prints_json_lines() -> None:
    store = FakeStore({"1": "john", "2": {"n": 2}, "3": None, "a/b": [1.5], "ab": "x"})
    assert _lines(store, "get", "2") == ['{"n":2}']
    assert _lines(store, "range", "1", "2") == ['{"key":"1","value":"john"}', '{"key":"2","value":{"n":2}}']
    assert _lines(store, "prefix", "a") == ['{"key":"a/b","value":[1.5]}', '{"key":"ab","value":"x"}']
    assert _lines(store, "all", "--limit", "2", "--reverse") == [
        '{"key":"ab","value":"x"}',
        '{"key":"a/b","value":[1.5]}',
    ]
    assert store.asked[-1]["page_size"] == 2  # never fetches more than it prints
    assert _lines(store, "prefix", "a%2F") == ['{"key":"a/b","value":[1.5]}']  # written as in a REST path


def test_query_spells_nan_and_infinities_as_the_rest_api_does_and_finishes_the_scan() -> None:
    store = FakeStore({"1": 21.0, "2": float("nan"), "3": [float("inf"), -float("inf")], "4": 4.5})
    assert _lines(store, "get", "2") == ['"NaN"']
    assert _lines(store, "all") == [
        '{"key":"1","value":21.0}',
        '{"key":"2","value":"NaN"}',
        '{"key":"3","value":["Infinity","-Infinity"]}',
        '{"key":"4","value":4.5}',
    ]


def test_query_takes_either_bound_alone_and_its_options_after_the_query() -> None:
    store = FakeStore({"1": "a", "2": "b", "3": "c"})
    assert _lines(store, "range", "--to", "2") == ['{"key":"1","value":"a"}', '{"key":"2","value":"b"}']
    assert _lines(store, "range", "--from", "3") == ['{"key":"3","value":"c"}']
    assert _lines(store, "range", "2") == ['{"key":"2","value":"b"}', '{"key":"3","value":"c"}']
    with pytest.raises(BadRequest, match="given twice"):
        _lines(store, "range", "1", "--from", "2")
    parser = cli.build_parser()
    after = parser.parse_args(["query", "s", "all", "--namespace", "x", "--address", "auto"])
    assert (after.namespace, after.address) == ("x", "auto")
    before = parser.parse_args(["query", "--namespace", "x", "s", "get", "1"])
    assert (before.namespace, before.address) == ("x", None)
    assert parser.parse_args(["query", "s", "get", "1"]).namespace == "riqr"


def test_query_exit_status_tells_an_absent_key_and_a_retry_from_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Flaky(FakeStore):
        def iterate(self, **kwargs: Any) -> Any:
            yield ("1", "a")
            raise OwnerUnavailable("partition 1's owner is restarting", retry_after=1)

        def get(self, key: UrlKey) -> Any:
            if key.text() == "slow":
                raise DeadlineExceeded("no answer within 10s")
            return super().get(key)

    def run(store: Any, *argv: str) -> int:
        return cli.print_query(store, cli.build_parser().parse_args(["query", "s", *argv]))

    store = Flaky({"1": "a"})
    assert run(store, "get", "1") == 0 and capsys.readouterr().out == '"a"\n'

    class Missing(FakeStore):
        def get(self, key: UrlKey) -> Any:
            raise KeyNotFound(f"key {key.text()!r} not found in store 's'")

    assert run(Missing({}), "get", "9") == cli.EXIT_ABSENT == 1
    assert "not found" in capsys.readouterr().err
    assert run(store, "get", "slow") == cli.EXIT_TRY_AGAIN == 75
    assert run(store, "all") == 75  # a scan cut short: what was printed is not the whole store
    out, err = capsys.readouterr()
    assert out == '{"key":"1","value":"a"}\n' and "restarting" in err and "try again" in err

    class Unknown(FakeStore):
        def get(self, key: UrlKey) -> Any:
            raise StoreNotFound("store 'x' not found")

    with pytest.raises(StoreNotFound):  # an error of the command: main says it and exits 2
        run(Unknown({}), "get", "1")


def test_query_prints_windows_with_their_bounds() -> None:
    start = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    window = Windowed("alice", start, start + dt.timedelta(minutes=1), 3)

    class Windows(FakeStore):
        def iterate(self, **kwargs: Any) -> Any:
            yield window

    [line] = _lines(Windows({}), "all")
    assert line.startswith('{"key":"alice","window":{"start":"2026-01-01T12:00:00') and line.endswith('"value":3}')


def test_progress_off_a_terminal_is_plain_lines_with_durations() -> None:
    out = io.StringIO()  # not a TTY
    with Steps("[riqr demo]", out) as steps:
        with steps.step("starting Ray"):
            pass
        steps.say("REST API at http://localhost:7400/")
        with pytest.raises(RuntimeError), steps.step("starting Spark"):
            raise RuntimeError("no Java")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[riqr demo] starting Ray ..."
    assert lines[1].startswith("[riqr demo] starting Ray: done in ") and lines[1].endswith("s")
    assert lines[2] == "[riqr demo] REST API at http://localhost:7400/"
    assert lines[3] == "[riqr demo] starting Spark ..."
    assert lines[4].startswith("[riqr demo] starting Spark: failed after ")
    assert "\x1b" not in out.getvalue()  # no terminal control codes in logs


class _Writes(io.StringIO):
    """A stream that keeps each ``write`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_progress_lines_from_two_threads_are_whole_lines() -> None:
    """``riqr demo`` runs the Spark step in a thread beside Ray's: each line must be one write, its newline
    included, or two threads' lines run together in the log."""
    import threading

    out = _Writes()
    with Steps("[riqr demo]", out) as steps:

        def beside() -> None:
            for _ in range(50):
                with steps.step("starting Spark (beside Ray)"):
                    pass

        thread = threading.Thread(target=beside)
        thread.start()
        for _ in range(50):
            with steps.step("starting a local Ray cluster"):
                steps.say("a message")
        thread.join()
    assert out.calls and all(
        c.startswith("[riqr demo] ") and c.endswith("\n") and c.count("\n") == 1 for c in out.calls
    )
    assert len(out.getvalue().splitlines()) == 50 * 2 + 50 * 3


def test_progress_on_a_terminal_is_live_and_leaves_each_step_with_its_time() -> None:
    out = io.StringIO()
    with Steps("[riqr up]", out, live=True) as steps, steps.step("deploying the verticles"):
        pass
    assert "deploying the verticles" in out.getvalue() and "0.0s" in out.getvalue()
    assert [t.what for t in steps.timings] == ["deploying the verticles"]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_records_each_step_with_when_it_started_and_ended() -> None:
    clock, out = _Clock(), io.StringIO()
    with Steps("[riqr demo]", out, clock=clock) as steps:
        clock.now += 0.5
        with steps.step("starting Ray"):
            clock.now += 3.0
        with pytest.raises(RuntimeError), steps.step("starting Spark"):
            clock.now += 1.25
            raise RuntimeError("no Java")
    [ray, spark] = steps.timings
    assert (ray.what, ray.started, ray.ended, ray.seconds, ray.ok) == ("starting Ray", 0.5, 3.5, 3.0, True)
    assert (spark.started, spark.ended, spark.ok) == (3.5, 4.75, False)
    assert steps.summary() == "starting Ray 3.0s (at 3.5s); starting Spark 1.2s (at 4.8s) failed"
    assert "starting Ray: done in 3.0s" in out.getvalue()
