"""Supervising a topology's queries: any failed query ends the topology at once with status 1; SIGTERM
stops every query and ends it with status 0 (fakes of Spark's StreamingQuery, no Spark)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from topologies.runner import supervise
from topologies.sink import _ensure_looker as ENSURE_LOOKER  # the real one: the ``running`` fixture replaces it

pytestmark = pytest.mark.usefixtures("no_feeders")


class FakeQuery:
    def __init__(self, name: str, *, fails_after: int | None = None) -> None:
        self.name = name
        self.polls = 0
        self.fails_after = fails_after
        self.stopped = False

    @property
    def isActive(self) -> bool:  # noqa: N802 (Spark's name)
        self.polls += 1
        return not self.stopped and (self.fails_after is None or self.polls <= self.fails_after)

    def stop(self) -> None:
        self.stopped = True

    def exception(self) -> Exception | None:
        return RuntimeError("ActorUnavailableError while delivering batch 7") if self.fails_after is not None else None


def test_any_failed_query_stops_the_others_and_exits_1(caplog: pytest.LogCaptureFixture) -> None:
    healthy, failing, other = FakeQuery("riqr-ns-a"), FakeQuery("riqr-ns-order-count", fails_after=2), FakeQuery("b")
    with caplog.at_level(logging.ERROR):
        assert supervise([healthy, failing, other], poll=0.001) == 1
    assert healthy.stopped and other.stopped
    assert "riqr-ns-order-count" in caplog.text and "ActorUnavailableError" in caplog.text


def test_sigterm_stops_every_query_and_exits_0() -> None:
    queries = [FakeQuery("riqr-ns-a"), FakeQuery("riqr-ns-b")]
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert supervise(queries, poll=0.01) == 0
    finally:
        timer.cancel()
    assert all(q.stopped for q in queries)
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are put back


class FakeFeeder:
    """Records what a delivery tells its feeder: queries attached, and reports; ``taken`` is what the
    registry said of stores another feed holds now."""

    def __init__(self) -> None:
        self.attached: list[tuple[str, object]] = []
        self.updates: list[dict[str, object]] = []
        self.taken: dict[str, str] = {}
        self.id = "host:1:fake"

    def superseded(self, store: str) -> str | None:
        return self.taken.get(store)

    def claimed(self, store: str) -> None:
        self.taken.pop(store, None)

    def attach(self, store: str, query: object) -> None:
        self.attached.append((store, query))

    def update(self, store: str, **info: object) -> None:
        self.updates.append(info)


def one_string_store() -> Any:
    """Store ``s``: string keys and values, two partitions on one actor."""
    from runtime.catalog import StoreSpec, ValueField
    from runtime.keys import KeySchema

    return StoreSpec("s", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=2, actors=1)


class FakeDelivery:
    """What ``topologies.sink.restart`` uses of a ``BatchDelivery``."""

    def __init__(self, store: str) -> None:
        self.spec = type("Spec", (), {"name": store})()
        self.unheld: list[int] = []
        self.feeder = FakeFeeder()
        self.reports: list[dict[str, object]] = []
        self.retired = False
        self.owners: frozenset[str] | None = None  # the actors it declared the store with (None: no check)
        self.replaced = False
        self._replaced_lock = threading.Lock()
        self.rebuild_from_input = True
        self.said_no_rebuild = False

    def report(self, **info: object) -> None:
        self.reports.append(info)

    def table(self, view: Any) -> Any:  # the real one: the same store, or another one of the same name
        from topologies.delivery import BatchDelivery

        return BatchDelivery.table(self, view)  # type: ignore[arg-type]

    def gone(self) -> str:
        from topologies.delivery import BatchDelivery

        return BatchDelivery.gone(self)  # type: ignore[arg-type]


def test_a_store_left_with_partitions_no_copy_serves_is_rebuilt_in_place_and_the_topology_runs_on(
    running: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    from topologies import sink

    old, other, delivery = FakeQuery("riqr-ns-order-count"), FakeQuery("riqr-ns-customers"), FakeDelivery("order-count")
    started: list[FakeQuery] = []
    stop = threading.Event()
    polled_new: list[bool] = []

    class NewQuery(FakeQuery):
        """The query started again: its first poll by ``supervise`` (the topology ran on) asks it to stop."""

        @property
        def isActive(self) -> bool:  # noqa: N802 (Spark's name)
            if not stop.is_set():
                polled_new.append(True)
                stop.set()
            return super().isActive

    def again(**extra: object) -> FakeQuery:  # materialize with the same arguments, as the sink registers it
        # ...told it rebuilds: an empty checkpoint then is one a failed start set aside, not a new store's
        assert extra == {"_rebuilding": True, "_owners": frozenset({"actor-1"})}  # the store it declared
        new = NewQuery("riqr-ns-order-count")
        started.append(new)
        delivery.unheld = []  # the new query's delivery (the same object here) has not seen a gap
        return new

    running["riqr-ns-order-count"] = (delivery, again)
    delivery.unheld = [1, 3]
    delivery.owners = frozenset({"actor-1"})
    # The stop waits for the batch in progress, which looked at ``retired`` just before it was set.
    old_stop = old.stop
    old.stop = lambda: (delivery.report(state="running", batch_id=8), old_stop())  # type: ignore[method-assign]
    queries = [old, other]
    hang_guard = threading.Timer(30, stop.set)  # only if the new query is never polled (the test then fails)
    hang_guard.start()
    try:
        with caplog.at_level(logging.WARNING):
            assert supervise(queries, poll=0.001, stop=stop) == 0  # the topology ran on, then was asked to stop
    finally:
        hang_guard.cancel()
    assert polled_new == [True]  # the stop came from a poll of the new query, not the hang guard
    assert len(started) == 1 and old.stopped and queries[0] is started[0]  # in the old one's place
    assert started[0].stopped and other.stopped  # the stop at the end reached the new query
    assert delivery.feeder.attached == [("order-count", None)]  # no "stopped" beat while it starts again
    assert delivery.retired  # a batch its stop cancels is not reported as the feed failing
    # The feed says rebuilding last (the feeder beats its last report until the new query's first batch).
    assert delivery.reports[-1] == {"state": "rebuilding", "incomplete": [1, 3]}
    assert [r["state"] for r in delivery.reports] == ["rebuilding", "running", "rebuilding"]
    assert "rebuilding the store in place" in caplog.text and "[1, 3]" in caplog.text
    assert sink.rebuild_due("riqr-ns-order-count") == []


def test_in_place_rebuilds_of_one_store_come_no_more_often_than_the_wait_allows(running: dict[str, object]) -> None:
    from topologies import sink

    delivery = FakeDelivery("s")
    running["q"] = (delivery, lambda **_: FakeQuery("q"))
    assert sink.rebuild_due("q") == [] and sink.rebuild_due("not-started-here") == []  # nothing unheld
    delivery.unheld = [2]
    assert sink.rebuild_due("q", now=0.0) == [2]  # the first: at once
    sink.stop_for_rebuild("q", FakeQuery("q"))
    assert len(sink._REBUILT["q"]) == 1
    sink._REBUILT["q"] = [1000.0]  # a round time, so the sums below are exact (a monotonic stamp is not)
    waits = []
    for _ in range(8):
        last = sink._REBUILT["q"][-1]
        wait = next(w for w in range(0, 4000) if sink.rebuild_due("q", now=last + w))
        assert sink.rebuild_due("q", now=last + wait - 1) == []
        waits.append(wait)
        sink._REBUILT["q"].append(last + wait)
    assert waits == [60, 120, 240, 480, 960, 1800, 1800, 1800]
    # A store that keeps losing its copies for weeks: the wait stays at its most (it raised OverflowError
    # at the 1,025th rebuild, which ended the topology), and only the last few times are kept.
    sink._REBUILT["q"] = [1000.0 + 1800.0 * n for n in range(2000)]
    last = sink._REBUILT["q"][-1]
    assert sink.rebuild_due("q", now=last + 1799) == [] and sink.rebuild_due("q", now=last + 1800) == [2]
    for _ in range(40):
        sink.stop_for_rebuild("q", FakeQuery("q"))
    assert len(sink._REBUILT["q"]) == sink._REBUILT_KEPT


def test_a_store_whose_source_cannot_read_its_input_again_is_never_rebuilt_in_place(
    running: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka from the latest offsets: a fresh checkpoint would reset the store to what comes from now on,
    so the unserved partitions stay 503 (the query goes on) and an error line says how to rebuild them."""
    from topologies import sink

    delivery = FakeDelivery("s")
    delivery.rebuild_from_input = False
    delivery.unheld = [2]
    running["q"] = (delivery, lambda **_: FakeQuery("q"))
    with caplog.at_level(logging.ERROR):
        assert sink.rebuild_due("q", now=0.0) == []
        assert sink.rebuild_due("q", now=5000.0) == []
    assert caplog.text.count("cannot be rebuilt from this source") == 1 and "--starting-offsets earliest" in caplog.text


def test_topology_options_say_which_sources_rebuild_from_their_input() -> None:
    from topologies.options import TopologyOptions
    from topologies.sources import SourceConfig

    def rebuilds(source: SourceConfig) -> bool:
        return bool(TopologyOptions(source=source).sink(Path("/tmp/h"), "s")["rebuild_from_input"])

    assert rebuilds(SourceConfig()) and rebuilds(SourceConfig("files", None, "latest"))  # files are read whole
    assert rebuilds(SourceConfig("kafka", "b:9092", "earliest"))
    assert not rebuilds(SourceConfig("kafka", "b:9092", "latest"))
    assert not rebuilds(SourceConfig("spark-kafka", "b:9092", "latest"))


def test_a_query_that_cannot_be_started_again_is_tried_again_then_fails_the_topology(
    running: dict[str, object], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from topologies import runner

    monkeypatch.setattr(runner, "START_AGAIN_WAIT", 0.001)
    delivery = FakeDelivery("s")
    delivery.unheld = [0]
    tries = []

    def again(**_: object) -> FakeQuery:
        tries.append(time.monotonic())
        raise RuntimeError("the registry is gone")

    running["riqr-ns-s"] = (delivery, again)
    old, healthy = FakeQuery("riqr-ns-s"), FakeQuery("riqr-ns-t")
    with caplog.at_level(logging.WARNING):
        assert supervise([old, healthy], poll=0.001) == 1
    assert len(tries) == runner.START_AGAIN_ATTEMPTS and old.stopped and healthy.stopped
    assert caplog.text.count("could not be started again") == runner.START_AGAIN_ATTEMPTS
    assert "riqr-ns-s" in caplog.text and "the registry is gone" in caplog.text


@pytest.mark.parametrize("verdict", ["unregistered", "in use"])
def test_a_store_gone_while_its_query_starts_again_fails_the_topology_at_once(
    running: dict[str, object], caplog: pytest.LogCaptureFixture, verdict: str
) -> None:
    """``materialize`` started again in place finds the store dropped (or declared again), or fed by
    another topology now: a verdict, not a moment's failure, so no tries after it."""
    from runtime.errors import StoreInUse
    from topologies import sink

    delivery = FakeDelivery("s")
    delivery.unheld = [0]
    delivery.owners = frozenset({"actor-1"})
    tries: list[dict[str, object]] = []

    def again(**extra: object) -> FakeQuery:
        tries.append(extra)
        if verdict == "in use":
            raise StoreInUse("store 's' is fed by another topology: x; not started again")
        raise sink.StoreUnregistered("store 's' is no longer registered; not started again")

    running["riqr-ns-s"] = (delivery, again)
    old, healthy = FakeQuery("riqr-ns-s"), FakeQuery("riqr-ns-t")
    with caplog.at_level(logging.WARNING):
        assert supervise([old, healthy], poll=0.001, stop=stopped_after(10)) == 1
    assert tries == [{"_rebuilding": True, "_owners": frozenset({"actor-1"})}]
    assert old.stopped and healthy.stopped
    assert "not started again" in caplog.text and "could not be started again" not in caplog.text


def test_a_start_that_fails_for_a_moment_is_tried_again_and_the_topology_runs_on(
    running: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    from topologies import runner

    monkeypatch.setattr(runner, "START_AGAIN_WAIT", 0.001)
    delivery = FakeDelivery("s")
    delivery.unheld = [0]
    started: list[FakeQuery] = []
    stop = threading.Event()

    def again(**_: object) -> FakeQuery:
        if len(started) < 2:
            started.append(FakeQuery("failed start"))
            raise RuntimeError("an owner is restarting")
        new = FakeQuery("riqr-ns-s")
        started.append(new)
        delivery.unheld = []
        stop.set()
        return new

    running["riqr-ns-s"] = (delivery, again)
    queries = [FakeQuery("riqr-ns-s"), FakeQuery("riqr-ns-t")]
    assert supervise(queries, poll=0.001, stop=stop) == 0  # the stopped query was not taken for a failed one
    assert len(started) == 3 and queries[0] is started[2] and started[2].stopped


def test_a_batch_that_fails_while_its_query_is_stopped_for_a_rebuild_is_not_the_feed_failing() -> None:
    from topologies.delivery import BatchDelivery

    class Cancelled:
        def toArrow(self) -> None:  # noqa: N802 (Spark's name)
            raise RuntimeError("Job cancelled because SparkContext was shut down")

    for retired, reported in ((False, ["failed"]), (True, [])):
        feeder = FakeFeeder()
        delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=feeder)  # type: ignore[arg-type]
        delivery._source, delivery.retired = "src", retired
        with pytest.raises(RuntimeError, match="cancelled"):
            delivery(Cancelled(), 4)
        assert [u["state"] for u in feeder.updates] == reported


def test_the_feed_says_rebuilding_while_a_partition_waits_for_a_watermark_and_a_retired_batch_says_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyarrow as pa

    from runtime.ingest import PARTITION_COLUMN
    from runtime.partition import INCOMPLETE, REBUILDING, SERVING, ApplyResult, Hold
    from topologies.delivery import BatchDelivery

    table = pa.table({"key": ["a", "b"], "value": ["1", "2"], PARTITION_COLUMN: pa.array([0, 1], pa.int32())})

    def delivered(states: tuple[str, str], *, retired: bool = False) -> tuple[list[dict[str, object]], list[int]]:
        feeder = FakeFeeder()
        delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=feeder)  # type: ignore[arg-type]
        delivery.retired = retired
        results = [ApplyResult(p, True, 1, state=state) for p, state in enumerate(states)]
        monkeypatch.setattr(delivery, "_apply_everywhere", lambda *args: results)  # no copies to call here
        assert delivery.deliver("src", 0, table, Hold(0)) == 2
        return feeder.updates, delivery.unheld

    updates, unheld = delivered((SERVING, SERVING))
    assert [u["state"] for u in updates] == ["running"] and unheld == []
    # Reset by a new source's batch 0 with no watermark: held (batches to come bring it up), not unheld.
    updates, unheld = delivered((REBUILDING, SERVING))
    assert [u["state"] for u in updates] == ["rebuilding"] and unheld == []
    updates, unheld = delivered((INCOMPLETE, REBUILDING))
    assert [(u["state"], u["incomplete"]) for u in updates] == [("rebuilding", [0])] and unheld == [0]
    # The last batch of a query stopped for a rebuild: ``stop_for_rebuild`` said rebuilding, and stays said.
    updates, _ = delivered((SERVING, SERVING), retired=True)
    assert updates == []


def test_a_store_that_gets_no_batch_is_rebuilt_when_two_looks_in_a_row_find_a_partition_unserved(
    running: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    from topologies import sink

    running["q"] = (FakeDelivery("s"), lambda **_: FakeQuery("q"))  # no batch: unheld stays empty
    assert sink.rebuild_due("q", now=0.0) == []
    sink.record_look("q", [2])
    assert sink.rebuild_due("q", now=0.0) == []  # one look
    sink.record_look("q", [2, 3])
    assert sink.rebuild_due("q", now=0.0) == [2]  # partition 2 in both looks
    sink.record_look("q", None)  # a look that could not tell: the count starts over
    sink.record_look("q", [3])
    assert sink.rebuild_due("q", now=0.0) == []
    with caplog.at_level(logging.WARNING):
        for _ in range(sink.PROBE_FAILURES_WARN):
            sink.record_look("q", None)
    assert caplog.text.count("could not be looked at") == 1


def test_riqr_entry_points_turn_off_rays_auto_connect_before_importing_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray call from a background thread after ``ray.shutdown()`` must fail, not start a new cluster."""
    import os

    from riqr.cli import main

    monkeypatch.delenv("RAY_ENABLE_AUTO_CONNECT", raising=False)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert os.environ["RAY_ENABLE_AUTO_CONNECT"] == "0"
    monkeypatch.setenv("RAY_ENABLE_AUTO_CONNECT", "1")  # a user's own choice is kept
    with pytest.raises(SystemExit):
        main(["--help"])
    assert os.environ["RAY_ENABLE_AUTO_CONNECT"] == "1"


def test_looks_go_only_to_the_stores_a_supervise_asks_about(
    running: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    from topologies import sink

    looked: list[str] = []

    def unserved(delivery: FakeDelivery, _ended: object = None) -> list[int]:
        looked.append(delivery.spec.name)
        if delivery.spec.name == "broken":
            raise TimeoutError("an owner restarts")
        return [1]

    monkeypatch.setattr(sink, "unserved", unserved)
    for name in ("asked", "broken", "forgotten", "retired"):
        delivery = FakeDelivery(name)
        delivery.retired = name == "retired"
        running[name] = (delivery, lambda **_: FakeQuery("q"))
    now = time.monotonic()
    sink._ASKED.update({"asked": now, "broken": now, "retired": now, "forgotten": now - 60})
    import ray

    # Ray not initialized (shut down, or never started; run after the integration tests, this process may
    # still be connected): no look at all.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    sink._look_at_all()
    assert looked == []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # the looks themselves are faked here
    sink._look_at_all()
    assert looked == ["asked", "broken"]  # not one no supervise asked about lately, nor one being restarted
    assert sink._LOOKS == {"asked": ([], [1])} and sink._FAILED_LOOKS == {"broken": 1}


def test_a_look_waiting_on_owners_that_do_not_answer_ends_as_soon_as_the_looks_are_stopped(
    running: dict[str, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A look asks every owner of a store for its copies' positions and waits up to 5 s. One still inside
    that Ray call when the topology process ends (Ray shuts down at exit) had Ray end the process with exit
    status 1 as the call returned: seen when a topology was stopped while its owners hung. ``supervise``
    ends the looks as it returns (``stop_looking``), within a slice of the wait, and that is not a failed
    look."""
    import ray

    from topologies import sink

    class Owner:
        class positions:  # noqa: N801 (the actor's method)
            @staticmethod
            def remote() -> str:
                return "ref"

    class View:
        def table(self, _name: str) -> Any:
            return type("Ownership", (), {"all_owners": lambda _self: {"actor-a", "actor-b"}})()

    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}")
    delivery = FakeDelivery("order-count")
    forgot: list[bool] = []
    delivery.checkpoint = str(tmp_path)  # type: ignore[attr-defined]
    delivery.current_view = lambda **_: View()  # type: ignore[attr-defined]
    delivery.handle = lambda _uuid: Owner()  # type: ignore[attr-defined]
    delivery.forget_handles = lambda: forgot.append(True)  # type: ignore[attr-defined]
    # Each wait on the owners: its slice, and whether the looks were stopped already as it began.
    waits: list[tuple[float, bool]] = []
    stop_flag: list[threading.Event] = []  # the flag the waits are told of (the looker's, then the getter's)
    second_wait = threading.Event()
    on_second_wait: list[Any] = []

    def never_ready(refs: list[Any], *, num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        waits.append((timeout, stop_flag[0].is_set()))
        if len(waits) > 40:  # a hang guard: ten seconds of slices, far past any stop
            raise AssertionError("still waiting on the owners long after the looks were stopped")
        time.sleep(timeout)
        if len(waits) == 2:
            second_wait.set()
            for hook in on_second_wait:
                hook()
        return [], list(refs)

    def no_get(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("waited on the owners without looking whether the looks were stopped")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "wait", never_ready)
    monkeypatch.setattr("topologies.sink.raycalls.get", no_get)
    monkeypatch.setattr(sink, "PROBE_EVERY", 0.01)
    monkeypatch.setattr(sink, "_LOOKER", [])
    running["riqr-ns-order-count"] = (delivery, lambda **_: FakeQuery("riqr-ns-order-count"))
    sink._ASKED["riqr-ns-order-count"] = time.monotonic()
    ended = threading.Event()
    stop_flag[:] = [ended]
    thread = threading.Thread(target=sink._looks, args=(ended,), daemon=True)
    sink._LOOKER[:] = [(thread, ended)]
    thread.start()
    assert second_wait.wait(10), "the look never waited on the owners"  # inside the look, waiting on them
    assert max(t for t, _ in waits) <= sink._LOOK_SLICE
    assert sink.stop_looking(timeout=5) and not thread.is_alive()  # 5 s: a hang guard, not the look's wait
    # Ended within the slice in progress, not the look's 5 s: no wait begun after the stop, or one at most
    # (begun between the look at the flag and the wait).
    assert sum(after for _, after in waits) <= 1, waits
    assert forgot == [] and sink._FAILED_LOOKS == {} and sink._LOOKS == {}  # no verdict, no failed look
    assert sink.stop_looking()  # again: nothing left to end

    # A later supervise in the same process looks again: a new thread, with a flag of its own.
    ENSURE_LOOKER()
    [(again, flag)] = sink._LOOKER
    assert again is not thread and again.is_alive() and not flag.is_set()
    ENSURE_LOOKER()  # running already: the same one
    assert len(sink._LOOKER) == 1 and sink._LOOKER[0][0] is again
    assert sink.stop_looking(timeout=5) and not again.is_alive()

    # The registry's answers (the view a look starts with) are waited for in the same slices: the looks
    # stopped during the second one, the getter ends as that one does, not at its 30 s timeout.
    waits.clear()
    second_wait.clear()
    flag = threading.Event()
    stop_flag[:] = [flag]
    on_second_wait.append(flag.set)
    with pytest.raises(sink._LooksEnded):
        sink._getter(flag)("ref", "registry epoch", timeout=30)
    assert [after for _, after in waits] == [False, False] and max(t for t, _ in waits) <= sink._LOOK_SLICE


def stopped_after(seconds: float) -> threading.Event:
    """A stop flag that sets itself after ``seconds`` (a ``supervise`` that ran on until asked to stop)."""
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    return stop


class ViewWithout:
    """A registry view that has no store at all (each of its stores dropped, or riqr down and up ran)."""

    def table(self, _name: str) -> None:
        return None


def test_a_look_that_finds_the_store_no_longer_registered_fails_the_topology_without_a_batch(
    running: dict[str, object], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``riqr drop --force`` of a store an idle topology feeds: no batch comes to fail on it, so the look
    at the copies says so, and ``supervise`` ends the topology as a failed query would."""
    import ray

    from runtime.errors import NotConnected
    from topologies import sink

    dropped, kept = FakeDelivery("order-count"), FakeDelivery("customers")
    dropped.namespace = "riqr-ns"  # type: ignore[attr-defined]
    dropped.current_view = lambda **_: ViewWithout()  # type: ignore[attr-defined]
    with pytest.raises(sink.StoreUnregistered, match="'order-count' is no longer registered in namespace 'riqr-ns'"):
        sink.unserved(dropped)  # type: ignore[arg-type]

    # No registry to ask (riqr down alone): the look cannot tell, which is no verdict.
    gone = FakeDelivery("customers")

    def no_registry(**_: object) -> None:
        raise NotConnected("no riqr runtime in Ray namespace 'riqr-ns'")  # as ``delivery.registry`` says it

    gone.current_view = no_registry  # type: ignore[attr-defined]
    running["riqr-ns-gone"] = (gone, lambda **_: FakeQuery("riqr-ns-gone"))
    real = sink.unserved

    def unserved(
        delivery: FakeDelivery, _ended: object = None
    ) -> list[int]:  # the real look, for the store whose copies all serve
        return real(delivery) if delivery in (dropped, gone) else []  # type: ignore[arg-type]

    monkeypatch.setattr(sink, "unserved", unserved)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    running["riqr-ns-order-count"] = (dropped, lambda **_: FakeQuery("riqr-ns-order-count"))
    running["riqr-ns-customers"] = (kept, lambda **_: FakeQuery("riqr-ns-customers"))
    queries = [FakeQuery("riqr-ns-customers"), FakeQuery("riqr-ns-order-count")]
    for name in ("riqr-ns-customers", "riqr-ns-order-count", "riqr-ns-gone"):
        assert sink.rebuild_due(name) == []  # what supervise asks first: the looks follow
    assert sink.unregistered("riqr-ns-order-count") is None  # nothing looked at yet
    sink._look_at_all()
    assert sink.unregistered("riqr-ns-customers") is None and sink.unregistered("riqr-ns-gone") is None
    assert sink._FAILED_LOOKS == {"riqr-ns-gone": 1}
    assert supervise([FakeQuery("riqr-ns-gone")], poll=0.001, stop=stopped_after(0.05)) == 0
    with caplog.at_level(logging.ERROR):  # no query ended, none got a batch
        assert supervise(queries, poll=0.001, stop=stopped_after(10)) == 1
    assert [q.polls for q in queries] == [2, 2]  # at its first poll (the second: whether to stop it)
    assert all(q.stopped for q in queries)
    assert "query riqr-ns-order-count stopped" in caplog.text
    assert "is no longer registered" in caplog.text and "riqr drop --force" in caplog.text


def test_a_query_started_again_forgets_that_a_look_found_its_store_unregistered(running: dict[str, object]) -> None:
    """``materialize`` declares the store before it registers the query: an earlier verdict is past."""
    from topologies import sink

    sink._UNREGISTERED["q"] = sink.StoreUnregistered("store 's' is no longer registered")
    assert sink.unregistered("q") is not None
    delivery = FakeDelivery("s")
    sink._register("q", delivery, lambda **_: FakeQuery("q"))  # type: ignore[arg-type]
    assert sink.unregistered("q") is None and running["q"][0] is delivery  # type: ignore[index]


def string_table(*owners: tuple[str, tuple[str, ...]]) -> Any:
    """Store ``s``'s ownership table: one (active, standbys) per partition."""
    from runtime.ownership import OwnershipTable, PartitionOwners

    return OwnershipTable(one_string_store(), tuple(PartitionOwners(a, sb) for a, sb in owners))


def test_a_store_dropped_and_declared_again_is_not_the_one_a_delivery_feeds(caplog: pytest.LogCaptureFixture) -> None:
    """A store's actors keep their uuids for its life; one declared again under its name has new ones. A
    delivery feeds the store it declared, whatever its table went through, and never the new one."""
    from runtime.ownership import ClusterView
    from topologies.delivery import BatchDelivery

    def view(table: Any) -> ClusterView:
        return ClusterView(7, {"s": table})

    declared = string_table(("a", ("b",)), ("b", ("a",)))
    feeder = FakeFeeder()
    delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=feeder)  # type: ignore[arg-type]
    assert delivery.table(view(string_table(("x", ()), ("x", ())))) is not None  # nothing declared yet: no verdict
    delivery.report(state="running")
    delivery.declared(view(declared))
    assert delivery.owners == {"a", "b"}
    # Its reports say which store they are about from then on (the registry ignores them once it is another).
    delivery.report(state="running", batch_id=0)
    assert [u.get("owners") for u in feeder.updates] == [None, ("a", "b")]
    promoted = string_table(("b", ("a",)), ("b", ("a",)))  # a down, b answers for both
    rebuilt = string_table(("b", ()), ("b", ()))  # a registry rebuilt while a was away
    for same in (declared, promoted, rebuilt):
        assert delivery.table(view(same)) is same
    assert not delivery.replaced and delivery.table(ClusterView(8)) is None and not delivery.replaced
    assert "is no longer registered" in delivery.gone()  # dropped, not declared again

    with caplog.at_level(logging.ERROR):
        assert delivery.table(view(string_table(("c", ("d",)), ("d", ("c",))))) is None
        assert delivery.table(view(string_table(("c", ("d",)), ("d", ("c",))))) is None
    assert delivery.replaced
    assert caplog.text.count("was dropped and declared again") == 1  # said once
    assert "dropped and declared again" in delivery.gone() and "no longer feeds it" in delivery.gone()


def test_a_store_declared_again_is_said_once_when_the_batch_and_a_look_find_it_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from runtime.ownership import ClusterView
    from topologies.delivery import BatchDelivery

    delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=FakeFeeder())  # type: ignore[arg-type]
    delivery.declared(ClusterView(1, {"s": string_table(("a", ()), ("a", ()))}))
    other = ClusterView(2, {"s": string_table(("c", ()), ("c", ()))})
    start = threading.Barrier(8)

    def look() -> None:
        start.wait()
        assert delivery.table(other) is None

    with caplog.at_level(logging.ERROR):
        threads = [threading.Thread(target=look) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert caplog.text.count("was dropped and declared again") == 1


def test_a_batch_for_a_store_declared_again_is_refused_before_any_copy_is_called() -> None:
    from runtime.errors import NotConnected
    from runtime.ownership import ClusterView
    from topologies.delivery import BatchDelivery

    delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=FakeFeeder())  # type: ignore[arg-type]
    delivery.declared(ClusterView(1, {"s": string_table(("a", ()), ("a", ()))}))
    delivery.current_view = lambda **_: ClusterView(3, {"s": string_table(("c", ()), ("c", ()))})  # type: ignore[method-assign]

    def no_call(uuid: str) -> Any:
        raise AssertionError(f"called {uuid}")

    delivery.handle = no_call  # type: ignore[method-assign]
    with pytest.raises(NotConnected, match="'s' was dropped and declared again"):
        delivery._apply_everywhere("src", 5, {}, 0)
    assert delivery.begin("src") == []  # nor told it starts empty


def test_a_look_at_a_store_declared_again_fails_the_topology(running: dict[str, object]) -> None:
    """The idle topology's look: a verdict (``StoreUnregistered``), which ``supervise`` ends the topology on."""
    from runtime.ownership import ClusterView
    from topologies import sink

    delivery = FakeDelivery("s")
    delivery.owners = frozenset({"actor-1"})
    delivery.namespace = "riqr-ns"  # type: ignore[attr-defined]
    delivery.current_view = lambda **_: ClusterView(3, {"s": string_table(("c", ()), ("c", ()))})  # type: ignore[attr-defined]
    with pytest.raises(sink.StoreUnregistered, match="'s' was dropped and declared again .*namespace 'riqr-ns'"):
        sink.unserved(delivery)  # type: ignore[arg-type]
    # The store it declared, promoted: no verdict, and no copy to ask before a first commit.
    delivery.replaced = False
    delivery.checkpoint = "/nonexistent"  # type: ignore[attr-defined]
    delivery.current_view = lambda **_: ClusterView(4, {"s": string_table(("actor-1", ()), ("actor-1", ()))})  # type: ignore[attr-defined]
    assert sink.unserved(delivery) == []  # type: ignore[arg-type]


class _Answer:
    """What a fake registry method's ``remote`` returns: the answer itself (``get`` below hands it back)."""

    def __init__(self, answer: Callable[..., Any]) -> None:
        self.answer = answer

    def remote(self, *args: Any) -> Any:
        return self.answer(*args)


def test_a_batch_is_not_delivered_once_another_feed_holds_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked in the call that fetches the epoch before each batch (``feed_epoch``), and known locally once
    a report's answer said so (``Feeder.superseded``): either way the batch fails before any copy."""
    from runtime.errors import NotConnected
    from runtime.ownership import ClusterView
    from topologies import delivery as delivery_module
    from topologies import sink
    from topologies.delivery import BatchDelivery

    taken = "store 's' is fed by another topology: riqr-ns-s (run host:2:bb from checkpoint /b/s)"
    asked: list[tuple[str, str, str]] = []

    class Registry:
        def __init__(self) -> None:
            self.feed_epoch = _Answer(lambda *a: asked.append(a) or (3, taken))
            self.epoch = _Answer(lambda: 3)
            self.view = _Answer(lambda: ClusterView(3, {"s": string_table(("a", ()), ("a", ()))}))

    monkeypatch.setattr(delivery_module, "registry", lambda _ns: Registry())
    feeder = FakeFeeder()
    delivery = BatchDelivery(one_string_store(), "ns", "relative/checkpoint", feeder=feeder)  # type: ignore[arg-type]
    with pytest.raises(NotConnected, match="fed by another topology.*this topology stops feeding it"):
        delivery.current_view(feeding=True, get=lambda ref, *_, **__: ref)
    assert asked == [("s", "host:1:fake", os.path.realpath("relative/checkpoint"), [])]  # its lineage, absolute
    with pytest.raises(NotConnected):  # a batch's check names its source (only its batch 0 may reset then)
        delivery.current_view(feeding=True, get=lambda ref, *_, **__: ref, source="q-1")
    assert asked[-1] == ("s", "host:1:fake", os.path.realpath("relative/checkpoint"), [], "q-1")
    assert delivery.current_view(get=lambda ref, *_, **__: ref).epoch == 3  # a look asks only the epoch

    feeder.taken["s"] = taken  # a report's answer said so
    with pytest.raises(NotConnected, match="this topology stops feeding it"):
        delivery._deliver_batch(object(), 7)
    # The failed batch is named in the error; batch_id stays the newest one delivered (a black-box run saw
    # ``batch_id: 4`` with every copy at batch 3, batch 4 having failed).
    assert [(u["state"], "batch_id" in u) for u in feeder.updates] == [("failed", False)]
    assert feeder.updates[0]["error"].startswith("batch 7: NotConnected: store 's' is fed by another topology")
    delivery.owners = frozenset({"a"})
    with pytest.raises(sink.StoreSuperseded, match="fed by another topology"):
        sink.unserved(delivery)  # the idle topology's look ends it too


def test_a_batch_waits_for_a_restarting_registry_rather_than_fail_its_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    """A black-box run SIGKILLed the registry (Ray restarts it) while orders landed: the next batch's
    ``feed_epoch`` met "the actor is restarting", the batch failed, and the topology with it. A batch's
    registry calls are asked again for up to the delivery timeout; a look's are not; a registry that is
    gone is not waited for."""
    from runtime.errors import NotConnected, OwnerUnavailable
    from runtime.ownership import ClusterView
    from topologies import delivery as delivery_module
    from topologies.delivery import BatchDelivery

    class Registry:
        def __init__(self) -> None:
            self.feed_epoch = _Answer(lambda *a: (3, None))
            self.epoch = _Answer(lambda: 3)
            self.view = _Answer(lambda: ClusterView(3, {"s": string_table(("a", ()), ("a", ()))}))

    monkeypatch.setattr(delivery_module, "registry", lambda _ns: Registry())
    delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=FakeFeeder())  # type: ignore[arg-type]
    monkeypatch.setattr(delivery, "_pause", lambda *_: None)
    failures = [2]

    def restarting(ref: Any, *_: Any, **__: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise OwnerUnavailable("registry epoch: the actor is restarting or unreachable")
        return ref

    assert delivery.current_view(feeding=True, get=restarting, source="q").epoch == 3 and failures == [0]
    failures[0] = 1
    with pytest.raises(OwnerUnavailable):  # a look at the copies is not a batch: it says so, and looks again later
        delivery.current_view(get=restarting)
    delivery.delivery_timeout = 0.0
    failures[0] = 1
    with pytest.raises(OwnerUnavailable):  # past the delivery timeout the batch fails, as before
        delivery.current_view(feeding=True, get=restarting, source="q")

    def gone(_ns: str) -> Any:
        raise NotConnected("no riqr runtime in Ray namespace 'ns'")

    monkeypatch.setattr(delivery_module, "registry", gone)
    delivery.delivery_timeout = 60.0
    with pytest.raises(NotConnected):
        delivery.current_view(feeding=True, get=restarting, source="q")


def test_a_read_replica_that_missed_a_batch_is_dropped_even_while_the_registry_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dropping a read replica that did not acknowledge a batch was one call: a registry restarting at that
    moment failed the batch and the topology (an ingest review), where every other registry call of a batch
    is asked again."""
    from runtime.deadline import Deadline
    from runtime.errors import OwnerUnavailable
    from topologies import delivery as delivery_module
    from topologies.delivery import BatchDelivery

    dropped: list[tuple[str, str]] = []
    failures = [1]

    class Registry:
        def __init__(self) -> None:
            self.drop_reader = _Answer(lambda uuid, reason: dropped.append((uuid, reason)) or 5)

    def get(ref: Any, *_: Any, **__: Any) -> Any:
        if isinstance(ref, RuntimeError):
            raise OwnerUnavailable(str(ref))  # the replica's own call: it did not acknowledge
        if failures[0]:
            failures[0] -= 1
            raise OwnerUnavailable("registry drop_reader: the actor is restarting")
        return ref

    monkeypatch.setattr(delivery_module, "registry", lambda _ns: Registry())
    monkeypatch.setattr(delivery_module.raycalls, "get", get)
    delivery = BatchDelivery(one_string_store(), "ns", "unused", feeder=FakeFeeder())  # type: ignore[arg-type]
    monkeypatch.setattr(delivery, "_pause", lambda seconds, what: None)
    delivery._settle_readers({"r1": RuntimeError("no answer")}, 7, Deadline.after(60))  # type: ignore[dict-item]
    assert failures == [0] and {uuid for uuid, _ in dropped} == {"r1"}  # asked again after the restart
    failures[0] = 1
    with pytest.raises(OwnerUnavailable):  # within the batch's own deadline, not a minute of its own
        delivery._settle_readers({"r1": RuntimeError("no answer")}, 7, Deadline.after(0))  # type: ignore[dict-item]


def _after_the_rounds(
    monkeypatch: pytest.MonkeyPatch, epoch: Callable[[], int], view: Callable[[], Any], spec: Any = None
) -> tuple[Any, list[dict[str, Any]]]:
    """A ``BatchDelivery`` whose registry answers ``epoch()`` and ``view()``, and the list its look after a
    batch's rounds (``_to_copies_changed_meanwhile``) puts what it sends in (its ``_apply_to`` faked)."""
    from topologies import delivery as delivery_module
    from topologies.delivery import BatchDelivery

    class Registry:
        def __init__(self) -> None:
            self.epoch = _Answer(epoch)
            self.view = _Answer(view)

    monkeypatch.setattr(delivery_module, "registry", lambda _ns: Registry())
    monkeypatch.setattr(delivery_module.raycalls, "get", lambda ref, *_, **__: ref)
    delivery = BatchDelivery(spec or one_string_store(), "ns", "unused", feeder=FakeFeeder())  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        delivery, "_apply_to", lambda source, batch_id, pending, *a, **k: sent.append(pending) or ["ok"]
    )
    return delivery, sent


def test_a_copy_admitted_while_a_batch_goes_out_gets_that_batch_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move's new actor (or a copy ``riqr standbys`` adds) admitted while batch N is delivered with a view
    from before: neither round reaches it, and having copied a peer from before N with nothing buffered,
    it called itself in sync and served N-1 after N was acknowledged. After the rounds one epoch call
    says whether the view moved; the copies listed since get the batch (and only those)."""
    from runtime.deadline import Deadline
    from runtime.ownership import ClusterView

    before = string_table(("a", ("b",)), ("b", ("a",)))
    after = string_table(("a", ("b", "new")), ("b", ("a",)))
    epoch = [3]
    fetched: list[int] = []
    delivery, sent = _after_the_rounds(
        monkeypatch, lambda: epoch[0], lambda: fetched.append(epoch[0]) or ClusterView(epoch[0], {"s": after})
    )
    split = {0: "rows of partition 0", 1: "rows of partition 1"}
    deadline = Deadline.after(5)
    assert delivery._to_copies_changed_meanwhile(ClusterView(3, {"s": before}), before, "q", 7, split, deadline,  # type: ignore[arg-type]
                                                  None) == []  # fmt: skip
    assert sent == [] and fetched == []  # the epoch did not move: no view fetched
    epoch[0] = 4
    assert delivery._to_copies_changed_meanwhile(ClusterView(3, {"s": before}), before, "q", 7, split, deadline,  # type: ignore[arg-type]
                                                  None) == ["ok"]  # fmt: skip
    assert sent == [{"new": {0: "rows of partition 0"}}]


def test_a_copy_restarted_while_a_batch_goes_out_gets_that_batch_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby that acknowledged batch N in the standby round, then lost its data and was re-created (same
    uuid) before the active round, copies the active from before N and, with nothing buffered, served N-1
    after N was acknowledged (a read-path review). Its restart is another incarnation in the registry's
    view: the copies whose incarnation changed get the batch again, for every partition they hold."""
    from runtime.deadline import Deadline
    from runtime.ownership import ActorInfo, ClusterView

    table = string_table(("a", ("b",)), ("b", ("a",)))

    def actors(b_incarnation: int) -> dict[str, ActorInfo]:
        return {
            "a": ActorInfo("a", "s", "n1", "10.0.0.1", (0, 1)),
            "b": ActorInfo("b", "s", "n2", "10.0.0.2", (0, 1), incarnation=b_incarnation),
        }

    before = ClusterView(3, {"s": table}, actors(0))
    latest = [ClusterView(4, {"s": table}, actors(0))]  # the epoch moved for another reason
    delivery, sent = _after_the_rounds(monkeypatch, lambda: latest[0].epoch, lambda: latest[0])
    split = {0: "rows of partition 0", 1: "rows of partition 1"}
    deadline = Deadline.after(5)
    assert delivery._to_copies_changed_meanwhile(before, table, "q", 7, split, deadline, None) == []  # type: ignore[arg-type]
    assert sent == []  # the same copies, the same incarnations: nothing sent again
    latest[0] = ClusterView(5, {"s": table}, actors(1))  # b restarted (its node died, re-created elsewhere)
    assert delivery._to_copies_changed_meanwhile(before, table, "q", 7, split, deadline, None) == ["ok"]  # type: ignore[arg-type]
    assert sent == [{"b": {0: "rows of partition 0", 1: "rows of partition 1"}}]


@pytest.mark.parametrize("registry_restarts", [False, True])
def test_a_copy_restarted_during_a_batch_gets_it_again_through_the_real_registry(
    monkeypatch: pytest.MonkeyPatch, registry_restarts: bool
) -> None:
    """The whole chain, with the registry's own code: the standby reports its restart (twice: the actor's
    start and its catch-up's announce), the registry may itself restart before the sink's look after the
    rounds (its incarnations were counts from 0 then, and a copy that restarted twice could read 0 again:
    a review of the fix), and the sink sends the batch again to the restarted copy."""
    from runtime.deadline import Deadline
    from tests.unit.fakes import kv_spec
    from tests.unit.test_verticles import Clock, FakeEnv, _infos, uuids
    from verticles.registry import Registry

    env, clock = FakeEnv(), Clock()
    registry = Registry("ns", env, new_uuid=uuids(), clock=clock)
    spec = kv_spec("s", partitions=2, actors=2, standbys=1)
    registry.create_store(spec)
    batch_view = registry.view()  # the view the batch goes out with
    table = batch_view.table("s")
    assert table is not None
    standby = table.partitions[0].standbys[0]
    info = batch_view.actors[standby]
    registry.actor_moved(standby, info.node_id, info.node_ip)  # its start, after it acknowledged round 1
    registry.actor_moved(standby, info.node_id, info.node_ip)  # its catch-up's announce
    latest = registry.view()
    if registry_restarts:  # Ray restarts the registry before the active round ends
        again = FakeEnv(restarted=True)
        again.membership, again.infos = env.membership, _infos(registry.view())
        clock.now += 5
        latest = Registry("ns", again, new_uuid=uuids(), clock=clock).view()
    delivery, sent = _after_the_rounds(monkeypatch, lambda: latest.epoch, lambda: latest, spec)
    split = {0: "rows 0", 1: "rows 1"}
    assert delivery._to_copies_changed_meanwhile(batch_view, table, "q", 7, split, Deadline.after(5), None) == ["ok"]  # type: ignore[arg-type]
    [pending] = sent
    assert pending[standby] == {p: split[p] for p in table.all_owners()[standby]}
    if not registry_restarts:
        assert set(pending) == {standby}  # only the copy that restarted
    else:
        assert set(pending) == set(table.all_owners())  # every copy: a replay each of them skips


def test_claiming_a_feed_waits_for_the_other_to_let_go_then_gives_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    from runtime.errors import StoreInUse
    from runtime.feeds import FeedReport
    from topologies import sink

    other = {"why": "store 's' is fed by another topology: x", "feeder": "elsewhere:1:aa", "same_checkpoint": False}
    answers: list[Any] = [other, other, None]
    claims: list[tuple[Any, Any]] = []
    taking_over: list[bool] = []

    class Registry:
        claim_feed = _Answer(
            lambda report, displace, take_over=False: (
                taking_over.append(take_over) or claims.append((report, displace)) or answers.pop(0)
            )
        )

    monkeypatch.setattr(sink, "registry", lambda _ns: Registry())
    monkeypatch.setattr(sink.raycalls, "get", lambda ref, *_, **__: ref)
    monkeypatch.setattr(sink, "_CLAIM_PAUSE", 0.01)
    feeder = Feeder()
    feeder.taken["s"] = "said before"
    report = FeedReport("s", feeder.id, "running", query="riqr-ns-s", checkpoint="/home/a/s", owners=("a", "b"))
    with caplog.at_level(logging.INFO):
        sink.claim_feed("ns", feeder, report, wait=5.0)  # type: ignore[arg-type]
    assert [c for c in claims] == [(report, None)] * 3 and feeder.superseded("s") is None  # taken at the third
    assert feeder.updates == [{"claimed": "s"}]  # the feed beats from the claim on
    assert caplog.text.count("waiting up to 5s for it to stop or fall silent") == 1
    assert "the other feed let it go" in caplog.text

    answers[:] = [other] * 100
    with pytest.raises(StoreInUse, match="fed by another topology: x"):
        sink.claim_feed("ns", feeder, report, wait=0.05)  # type: ignore[arg-type]

    # The store holds what another checkpoint fed it: refused at once (waiting changes nothing), and the
    # claim says whether it takes the store over on purpose.
    claims.clear()
    taking_over.clear()
    replaced = {"why": "store 's' holds what checkpoint /b/s fed it", "feeder": "elsewhere:1:aa",
                "same_checkpoint": False, "final": True}  # fmt: skip
    answers[:] = [replaced] * 100
    with pytest.raises(StoreInUse, match="holds what checkpoint /b/s fed it"):
        sink.claim_feed("ns", feeder, report, wait=5.0)  # type: ignore[arg-type]
    assert len(claims) == 1 and taking_over == [False]
    answers[:] = [None, None]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        sink.claim_feed("ns", feeder, report, wait=5.0, take_over=True)  # type: ignore[arg-type]
        sink.claim_feed("ns", feeder, report, wait=5.0, take_over=True)  # type: ignore[arg-type]
    assert taking_over == [False, True, True]
    assert caplog.text.count("store s: started with take-over") == 1  # the topology's log says it, once

    # Held by a run of this very checkpoint: displaced at once if its process is gone from this host, never
    # if it runs (this test's own process), nor if it ran on another host (the claim waits for the bound).
    from topologies.feeder import _pid_namespace

    claims.clear()
    here = f":{_pid_namespace()}" if _pid_namespace() else ""
    gone = f"{socket.gethostname()}:{_a_pid_that_is_gone()}:cc{here}"
    answers[:] = [{"why": "same", "feeder": gone, "same_checkpoint": True}, None]
    sink.claim_feed("ns", feeder, report, wait=0)  # type: ignore[arg-type]
    assert [d for _, d in claims] == [None, gone]
    for alive in (
        f"{socket.gethostname()}:{os.getpid()}:dd{here}",  # this very process
        "another-host:1:ee",
        f"{socket.gethostname()}:{_a_pid_that_is_gone()}:ff:1",  # another container of this host's name
        f"{socket.gethostname()}:cc:{os.getpid()}",  # not an id this riqr writes
    ):
        answers[:] = [{"why": "same checkpoint, alive", "feeder": alive, "same_checkpoint": True}] * 100
        with pytest.raises(StoreInUse, match="same checkpoint, alive"):
            sink.claim_feed("ns", feeder, report, wait=0)  # type: ignore[arg-type]


def _a_pid_that_is_gone() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_materialize_all_claims_every_store_at_once_and_holds_none_when_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused on its second store, a topology starts none and holds none: its stores are claimed in one
    call, all or none, each with the take-over its options ask for. One that fails to start after the
    claims lets go of those not started."""
    from runtime.errors import StoreInUse
    from runtime.feeds import FeedReport
    from runtime.ownership import ClusterView
    from topologies import sink

    feeder = Feeder()
    monkeypatch.setattr(sink, "_declare", lambda df, store, *_: (df, [], store))
    monkeypatch.setattr(sink, "create_stores", lambda ns, specs: ClusterView(1, {}))
    monkeypatch.setattr(sink, "feeder_for", lambda ns: feeder)
    monkeypatch.setattr(
        sink, "_claim_report", lambda ns, who, store, checkpoint, owners: FeedReport(store, who.id, "running")
    )
    started: list[str] = []

    def materialize(df: Any, **options: Any) -> str:
        if options["store"] == "third":
            raise RuntimeError("the third store's query could not start")
        started.append(options["store"])
        return options["store"]

    monkeypatch.setattr(sink, "materialize", materialize)
    asked: list[tuple[list[str], set[str]]] = []

    def claim_feeds(namespace: str, who: Any, reports: Any, wait: float | None = None, take_over: Any = ()) -> None:
        asked.append(([r.store for r in reports], set(take_over)))
        if any(r.store == "second" for r in reports):
            raise StoreInUse("store 'second' is fed by another topology: x", store="second")
        for report in reports:
            who.claimed(report)

    monkeypatch.setattr(sink, "claim_feeds", claim_feeds)
    pairs = [(None, {"store": s, "key": "k", "checkpoint": f"/h/{s}", "namespace": "ns", "take_over": s == "first"})
             for s in ("first", "second")]  # fmt: skip
    with pytest.raises(StoreInUse):
        sink.materialize_all(pairs)
    assert started == [] and feeder.updates == [] and asked == [(["first", "second"], {"first"})]

    pairs = [(None, {"store": s, "key": "k", "checkpoint": f"/h/{s}", "namespace": "ns"}) for s in ("first", "third")]
    with pytest.raises(RuntimeError, match="could not start"):
        sink.materialize_all(pairs)
    assert started == ["first"]  # the third's claim let go; the first, started, keeps feeding
    assert feeder.updates == [{"claimed": "first"}, {"claimed": "third"}, {"store": "third", "state": "stopped"}]


def test_claiming_several_stores_names_every_refusal_and_waits_for_them_together(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``claim_feeds``: one call for all of a topology's stores; a final refusal of any ends the start at
    once naming every store refused; live feeds are waited for together, each said once; a registry of the
    riqr before, with no ``claim_feeds``, is asked store by store."""
    from runtime.errors import StoreInUse
    from runtime.feeds import FeedReport
    from topologies import sink

    live = {"why": "store 'b' is fed by another topology: x", "feeder": "elsewhere:1:aa", "same_checkpoint": False,
            "final": False}  # fmt: skip
    final = {"why": "store 'c' holds what checkpoint /x/c fed it", "feeder": "elsewhere:1:aa",
             "same_checkpoint": False, "final": True}  # fmt: skip
    answers: list[Any] = []
    calls: list[Any] = []

    class Registry:
        claim_feeds = _Answer(lambda claims: calls.append(claims) or answers.pop(0))

    monkeypatch.setattr(sink, "registry", lambda _ns: Registry())
    monkeypatch.setattr(sink.raycalls, "get", lambda ref, *_, **__: ref)
    monkeypatch.setattr(sink, "_CLAIM_PAUSE", 0.01)
    feeder = Feeder()
    reports = [FeedReport(s, feeder.id, "running", checkpoint=f"/h/{s}") for s in "abc"]

    answers[:] = [[None, live, final]]
    with pytest.raises(StoreInUse) as refused:
        sink.claim_feeds("ns", feeder, reports, wait=5.0, take_over={"a"})  # type: ignore[arg-type]
    assert len(calls) == 1 and [(r.store, d, t) for r, d, t in calls[0]] == [("a", None, True), ("b", None, False),
                                                                             ("c", None, False)]  # fmt: skip
    message = str(refused.value)
    assert message.startswith("2 of this topology's 3 stores are refused, so it feeds none: (1) store 'b'")
    assert "(2) store 'c' holds what checkpoint /x/c fed it." in message
    assert refused.value.details == {"store": "b", "stores": ["b", "c"]} and feeder.updates == []

    calls.clear()
    answers[:] = [[None, live, dict(live, why="store 'c' is fed by another topology: y")]] * 3 + [[None] * 3]
    with caplog.at_level(logging.INFO):
        sink.claim_feeds("ns", feeder, reports, wait=5.0)  # type: ignore[arg-type]
    assert len(calls) == 4 and feeder.updates == [{"claimed": s} for s in "abc"]
    assert caplog.text.count("waiting up to 5s for it to stop or fall silent") == 2  # b's and c's, once each
    assert caplog.text.count("the other feed let it go") == 2  # b and c; a was never waited for

    answers[:] = [[None, live, None]] * 100
    with pytest.raises(StoreInUse, match="^store 'b' is fed by another topology: x$"):  # one refused: its words
        sink.claim_feeds("ns", feeder, reports, wait=0.05)  # type: ignore[arg-type]

    class OlderRegistry:  # the riqr before: one store a call, and take_over only when asked
        claim_feed = _Answer(lambda report, displace, *take_over: calls.append((report.store, take_over)) or
                             (live if report.store == "b" else None))  # fmt: skip

    calls.clear()
    feeder = Feeder()
    monkeypatch.setattr(sink, "registry", lambda _ns: OlderRegistry())
    with pytest.raises(StoreInUse, match="store 'b' is fed"):
        sink.claim_feeds("ns", feeder, reports, wait=0.05, take_over={"a"})  # type: ignore[arg-type]
    assert calls[0] == ("a", (True,)) and set(calls[1:]) == {("b", ())}
    assert feeder.updates == [{"claimed": "a"}]  # materialize_all lets it go


class Feeder(FakeFeeder):
    """A ``FakeFeeder`` that keeps what it claimed as live feeds, as ``topologies.feeder.Feeder`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.live: set[str] = set()

    def claimed(self, report: Any) -> None:  # type: ignore[override]
        self.taken.pop(report.store, None)
        self.live.add(report.store)
        self.updates.append({"claimed": report.store})

    def live_stores(self) -> list[str]:
        return sorted(self.live)

    def update(self, store: str, **info: object) -> None:
        self.live.discard(store)
        self.updates.append({"store": store, **info})


def test_a_topology_that_cannot_reach_ray_says_so_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import argparse

    import ray

    from topologies.runner import run_topology

    def no_cluster(**_: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "init", no_cluster)
    # An address where nothing listens: "auto" would find a cluster this machine runs meanwhile (another
    # session's, or the suite's own integration tests), which answers, and that is "cannot join".
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    started: list[object] = []
    with caplog.at_level(logging.ERROR):
        assert run_topology(argparse.ArgumentParser(prog="t"), ["--log-format", "kv"], lambda *a: started) == 1
    assert not started and "not started: cannot reach the Ray cluster" in caplog.text
    assert "`ray start --head`, then `riqr up`" in caplog.text  # what starts a cluster: `riqr up` does not


@pytest.mark.parametrize("given", ["--home", "$RIQR_HOME", "the default"])
def test_a_topology_says_at_start_which_home_it_reads(
    given: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A Ray job runs in the environment Ray started with, not the submitting shell's: the home it reads
    (and where from) is logged before anything else can fail, so a RIQR_HOME that never reached it shows."""
    import argparse

    import ray

    from topologies.runner import run_topology

    def no_cluster(**_: object) -> None:
        raise ConnectionError("no cluster in a unit test")

    monkeypatch.setattr(ray, "init", no_cluster)
    monkeypatch.delenv("RIQR_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["--log-level", "info", "--log-format", "kv"]
    home = tmp_path / ".riqr"
    if given == "--home":
        home = tmp_path / "given"
        argv += ["--home", str(home)]
    elif given == "$RIQR_HOME":
        home = tmp_path / "from-env"
        monkeypatch.setenv("RIQR_HOME", str(home))
    with caplog.at_level(logging.INFO):
        assert run_topology(argparse.ArgumentParser(prog="t"), argv, lambda *a: []) == 1
    home = home.resolve() if given != "the default" else home
    assert f"home {home} (from {given}): landing directories under {home / 'data'}, " in caplog.text
    assert f"checkpoints under {home / 'checkpoints'}" in caplog.text


def test_a_checkpoints_lineage_is_one_for_a_path_and_its_file_uri(tmp_path: Path) -> None:
    """A store's contents belong to a lineage, and another one is refused without --take-over: the same
    directory given as ``file:///x``, ``file://localhost/x``, through a symbolic link or as ``/x`` must be one."""
    from topologies.delivery import lineage_of

    real = tmp_path / "home" / "checkpoints" / "s"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "home")
    one = lineage_of(str(real))
    assert one == os.path.realpath(real)
    assert lineage_of(f"file://{real}") == lineage_of(f"file://localhost{real}") == one
    assert lineage_of(str(tmp_path / "link" / "checkpoints" / "s")) == one
    assert lineage_of("hdfs://nn:8020/riqr/s") == "hdfs://nn:8020/riqr/s"  # another URI as given


def test_a_failed_querys_line_leads_with_the_python_exception_not_the_py4j_wrapper() -> None:
    """A black-box run: a topology's failing cast logged 4.4 KB opening "An exception was raised by the
    Python Proxy. Return Message: Traceback ...", with the cause buried in it."""
    from topologies.runner import error_cause

    text = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "/x/py4j/clientserver.py", line 644, in _call_proxy\n'
        "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
        "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] The value '12345678901' "
        'of the type "STRING" cannot be cast to "INT" because it is malformed.\n'
        "== DataFrame ==\n"
        '"cast" was called from\n'
        "/home/me/badcast.py:7\n"
        "\n\n=== Streaming Query ===\nIdentifier: riqr-ns-bad [id = 1]\nLogical Plan:\n~WriteToMicroBatch ...\n"
    )

    class StreamingQueryException(Exception):
        pass

    assert error_cause(StreamingQueryException(text)) == (
        "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] The value '12345678901' "
        'of the type "STRING" cannot be cast to "INT" because it is malformed. == DataFrame == "cast" was called '
        "from /home/me/badcast.py:7"
    )
    assert (
        error_cause(RuntimeError("the sink's owner is gone\nmore detail")) == "RuntimeError: the sink's owner is gone"
    )
    assert error_cause(RuntimeError("")) == "RuntimeError"


def test_the_stores_last_words_give_a_failed_querys_cause_not_sparks_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every store of a topology whose query failed reports the failure (``GET /stores``, ``riqr status``),
    clipped to 500 characters: it was the whole StreamingQueryException, so what showed was Spark's ids
    and py4j's frames, and the cause was cut off (an ingest review). It is the log line's cause now."""
    from topologies import feeder
    from topologies.runner import error_cause

    class StreamingQueryException(Exception):
        pass

    wrapped = StreamingQueryException(
        "[STREAM_FAILED] Query [id = 3f1c, runId = 8e7d] terminated with exception: An exception was raised by "
        "the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "/x/py4j/clientserver.py", line 644, in _call_proxy\n'
        "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
        "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] The value 'x' cannot be "
        "cast\n"
    )
    failing = FakeQuery("riqr-ns-a", fails_after=1)
    failing.exception = lambda: wrapped  # type: ignore[method-assign]
    words: list[tuple[str | None, str | None]] = []
    monkeypatch.setattr(feeder, "finish_all", lambda query=None, error=None, timeout=0.0: words.append((query, error)))
    assert supervise([failing, FakeQuery("riqr-ns-b")], poll=0.001) == 1
    assert words == [("riqr-ns-a", error_cause(wrapped))]
    assert words[0][1] is not None and words[0][1].startswith(
        "pyspark.errors.exceptions.captured.NumberFormatException"
    )


def test_a_query_spark_refuses_at_start_is_one_line_naming_the_topologys_own_line() -> None:
    """A black-box run: the README's sensors topology started before its input directory existed printed a
    37-line traceback through riqr's and py4j's frames."""
    from topologies.runner import _analysis_error, _topology_frame, error_cause

    class AnalysisException(Exception):  # PySpark's captured class, by name
        pass

    scope: dict[str, Any] = {"AnalysisException": AnalysisException}
    message = "[PATH_NOT_FOUND] Path does not exist: /srv/readings. SQLSTATE: 42K03"
    code = f"def start():\n    raise AnalysisException({message!r})\n"
    exec(compile(code, "/home/me/sensors.py", "exec"), scope)  # noqa: S102 - a frame in the user's file
    try:
        scope["start"]()
    except AnalysisException as err:
        assert _analysis_error(err) and not _analysis_error(ValueError("x"))
        assert _topology_frame(err) == " (at /home/me/sensors.py:2)"
        assert error_cause(err) == (
            "AnalysisException: [PATH_NOT_FOUND] Path does not exist: /srv/readings. SQLSTATE: 42K03"
        )


@pytest.mark.parametrize(
    ("flags", "words"),
    [(["--partitions", "0"], "at least 1, got 0"), (["--actors", "-1"], "at least 1, got -1"),
     (["--standbys", "-3"], "at least 0, got -3"), (["--partitions", "two"], "invalid whole number value")],
)  # fmt: skip
def test_store_sizes_a_topology_cannot_have_are_refused_before_ray_and_spark_start(
    flags: list[str], words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store's spec refused them, 10 to 20 s later, with Ray joined and Spark's JVM started."""
    import argparse

    import ray

    from topologies.runner import run_topology

    def no_ray(**_: object) -> None:
        raise AssertionError("Ray joined for flags argparse refuses")

    monkeypatch.setattr(ray, "init", no_ray)
    with pytest.raises(SystemExit) as exit_:
        run_topology(argparse.ArgumentParser(prog="t"), flags, lambda *a: [])
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_a_topology_whose_spark_cannot_start_says_why_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import argparse

    import topologies.spark
    from topologies.runner import run_topology

    monkeypatch.setattr("runtime.client.join_ray", lambda *a, **k: None)

    def no_java(*_: object, **__: object) -> None:
        raise topologies.spark.SparkNotStarted("Spark's driver JVM did not start (JAVA_HOME is not set)")

    monkeypatch.setattr(topologies.spark, "spark_session", no_java)
    with caplog.at_level(logging.ERROR):
        assert run_topology(argparse.ArgumentParser(prog="t"), ["--log-format", "kv"], lambda *a: []) == 1
    assert "not started: Spark's driver JVM did not start" in caplog.text
