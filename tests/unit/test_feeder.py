"""The topology process's side of ingest liveness (``topologies.feeder``), with a fake registry link and
fakes of Spark's StreamingQuery: what a heartbeat carries, how an ended query is reported once, what the
supervisor's last words are, and that a registry that is down never breaks or blocks the feeder."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from runtime.feeds import FeedReport
from topologies import feeder as feeder_module
from topologies.feeder import Feeder
from topologies.runner import supervise


class FakeLink:
    def __init__(self) -> None:
        self.sent: list[list[FeedReport]] = []
        self.down = False
        self.waited = 0
        self.lost = 0  # calls the registry fails after they were sent
        self.dead = False  # calls are sent, then fail (a handle of a registry that is gone)
        self.watched: list[Any] = []
        self.refused: dict[str, str] = {}  # what the registry answers: the stores another feed holds

    def submit(self, reports: Sequence[FeedReport]) -> Any:
        if self.down:
            raise ValueError("Failed to look up actor with name 'riqr-registry'")
        self.sent.append(list(reports))
        return len(self.sent)

    def wait(self, pending: Any, timeout: float) -> dict[str, str]:
        self.waited += 1
        if self.lost > 0:
            self.lost -= 1
            raise RuntimeError("ActorUnavailableError: the registry is restarting")
        return dict(self.refused)

    def watch(self, pending: Any, failed: Any, answered: Any) -> None:
        self.watched.append(pending)
        if self.dead:
            self.dead = False  # the link forgets the dead handle and looks the registry up again
            failed()
        else:
            answered(dict(self.refused))  # at once, as Ray calls back a call answered already

    def last(self) -> dict[str, FeedReport]:
        return {r.store: r for r in self.sent[-1]}


class FakeQuery:
    def __init__(self, name: str) -> None:
        self.name = name
        self.active = True
        self.error: Exception | None = None
        self.broken = False

    @property
    def isActive(self) -> bool:  # noqa: N802 (Spark's name)
        if self.broken:
            raise RuntimeError("py4j: the JVM is gone")
        return self.active

    def stop(self) -> None:
        self.active = False

    def exception(self) -> Exception | None:
        return self.error


def _feeder(link: FakeLink) -> Feeder:
    return Feeder(link, interval=60.0, clock=lambda: 42.0)  # the thread never beats by itself in these tests


def _fed_s_and_t(link: FakeLink) -> tuple[Feeder, FakeQuery]:
    """A feeder of two running stores: ``s`` with its query attached (returned), ``t`` without one."""
    feeder = _feeder(link)
    query = FakeQuery("riqr-ns-s")
    feeder.update("s", state="running", query=query.name)
    feeder.update("t", state="running")
    feeder.attach("s", query)
    return feeder, query


def test_every_change_is_sent_at_once_and_every_beat_carries_the_whole_state() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.dead_letters("s", "order", 2)  # before the store's query starts (railway's order): held
    assert link.sent == []
    feeder.update("s", state="rebuilding", plan="rebuild", query="riqr-ns-s")
    feeder.update("s", state="running", batch_id=0, rows=3, incomplete=[1])
    sent = link.last()["s"]
    assert (sent.state, sent.batch_id, sent.plan, sent.incomplete, sent.feeder) == (
        "running",
        0,
        "rebuild",
        (1,),
        feeder.id,
    )
    assert sent.dead_letters == {"order": 2} and sent.at == 42.0
    feeder.dead_letters("s", "order", 3)
    assert link.last()["s"].dead_letters == {"order": 3}
    waited = link.waited
    feeder.beat()
    assert link.last() == {"s": link.sent[-2][0]} and link.waited == waited + 1  # a beat waits; updates do not


def test_late_rows_are_carried_by_every_later_report_of_the_store() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.late_rows("s", 4)  # told as the query starts, before the feed's first report: held
    assert link.sent == []
    feeder.update("s", state="running", query="riqr-ns-s")
    assert link.last()["s"].late_rows == 4
    feeder.dead_letters("s", "order", 1)
    feeder.late_rows("s", 6)
    assert (link.last()["s"].late_rows, link.last()["s"].dead_letters) == (6, {"order": 1})
    feeder.update("s", state="running", batch_id=9)  # a state change keeps both totals
    assert (link.last()["s"].late_rows, link.last()["s"].dead_letters) == (6, {"order": 1})
    feeder.claimed(FeedReport("t", feeder.id, "running"))
    feeder.beat()
    assert link.last()["t"].late_rows is None  # another store: nothing said about it


def test_a_query_that_ends_is_reported_once_then_never_again() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    stopped, failing = FakeQuery("riqr-ns-a"), FakeQuery("riqr-ns-b")
    for store, query in (("a", stopped), ("b", failing)):
        feeder.update(store, state="running", query=query.name)
        feeder.attach(store, query)
    stopped.stop()
    failing.active, failing.error = False, RuntimeError("StreamingQueryException: " + "x" * 2000)
    feeder.beat()
    last = link.last()
    assert last["a"].state == "stopped" and last["a"].error is None
    assert last["b"].state == "failed" and last["b"].error is not None and len(last["b"].error) <= 500
    assert feeder.live_stores() == []
    sends = len(link.sent)
    feeder.beat()
    assert len(link.sent) == sends  # nothing live: nothing to say


def test_an_ended_querys_report_rides_every_beat_until_the_registry_takes_it() -> None:
    """A query that fails while the registry restarts: its ``failed`` report is not taken, and dropping
    it (as the feeder did) left the registry to call the feed ``stale`` after silence, not ``failed``."""
    link = FakeLink()
    feeder, query = _fed_s_and_t(link)
    query.active, query.error = False, RuntimeError("StreamingQueryException: boom")
    link.lost = 1  # sent, then the call fails: the registry restarting
    feeder.beat()
    assert link.last()["s"].state == "failed" and feeder.live_stores() == ["t"]
    link.down = True  # and then not there at all for a beat
    feeder.beat()
    link.down = False
    feeder.beat()
    assert link.last()["s"].state == "failed" and "boom" in (link.last()["s"].error or "")
    feeder.beat()
    assert set(link.last()) == {"t"}  # taken: said no more


def test_a_failed_batchs_report_lost_on_its_way_is_sent_again_by_the_next_beat() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("s", state="running", batch_id=4)
    feeder.update("t", state="running")
    link.dead = True  # the report sent at once fails when its answer comes
    feeder.update("s", state="failed", batch_id=5, error="OwnerUnavailable: gone")
    feeder.beat()
    assert link.last()["s"].state == "failed" and link.last()["s"].batch_id == 5
    feeder.beat()
    assert set(link.last()) == {"t"}
    link.down = True  # lost before it was sent: the same
    feeder.update("t", state="stopped")
    link.down = False
    feeder.beat()
    assert link.last()["t"].state == "stopped"
    sends = len(link.sent)
    feeder.beat()
    assert len(link.sent) == sends, "taken once, and nothing is live: nothing more to say"


def test_a_claim_or_a_new_run_replaces_last_words_not_yet_taken() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("s", state="running", batch_id=1)
    link.down = True
    feeder.update("s", state="failed", error="boom")
    link.down = False
    feeder.claimed(FeedReport("s", feeder.id, "running", query="riqr-ns-s"))  # the topology starts it again
    feeder.beat()
    assert [r.state for r in link.sent[-1]] == ["running"]
    link.down = True
    feeder.update("s", state="stopped")
    link.down = False
    feeder.finish()  # the process ends: the untaken last word is its last word
    assert [r.state for r in link.sent[-1]] == ["stopped"]


def test_a_query_that_cannot_be_asked_is_left_out_of_the_beat() -> None:
    link = FakeLink()
    feeder, query = _fed_s_and_t(link)
    query.broken = True
    feeder.beat()
    assert set(link.last()) == {"t"}  # s is not vouched for: the registry turns it stale if this lasts
    query.broken = False
    feeder.beat()
    assert set(link.last()) == {"s", "t"}


def test_a_failed_batch_is_the_feeds_last_word() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("s", state="running", batch_id=4)
    feeder.update("s", state="failed", batch_id=5, error="OwnerUnavailable: gone")
    assert (link.last()["s"].state, link.last()["s"].error) == ("failed", "OwnerUnavailable: gone")
    assert feeder.live_stores() == []
    feeder.update("s", state="running", batch_id=0)  # a new query in this process feeds it again
    assert link.last()["s"].error is None and feeder.live_stores() == ["s"]


def test_a_store_another_feed_holds_now_is_no_longer_fed_from_here_until_claimed_again() -> None:
    """The registry answers a beat, or a report, with the stores another topology took while this one was
    silent: each is flagged once (its next batch fails, ``topologies.delivery``) and beats no more, and
    live reports about it are not sent; a claim of this process's own makes it fed from here again (and
    beating from the claim on, before its query reports), and an earlier answer does not undo that."""
    link = FakeLink()
    feeder = _feeder(link)
    feeder.claimed(FeedReport("s", feeder.id, "running", query="riqr-ns-s", checkpoint="/a/s"))
    assert feeder.live_stores() == ["s"]  # beats from the claim on
    feeder.update("s", state="running", batch_id=4)
    feeder.update("t", state="running", batch_id=1)
    assert feeder.superseded("s") is None
    link.refused = {"s": "store 's' is fed by another topology"}
    feeder.beat()
    assert feeder.superseded("s") == "store 's' is fed by another topology" and feeder.superseded("t") is None
    assert feeder.live_stores() == ["t"]  # no more heartbeats for it
    sent = len(link.sent)
    feeder.update("s", state="running", batch_id=5)  # e.g. a stop for a rebuild reporting: not sent
    assert len(link.sent) == sent and feeder.live_stores() == ["t"]
    feeder.update("s", state="failed", error="NotConnected: fed by another topology")  # its last word is
    assert len(link.sent) == sent + 1
    feeder.claimed(FeedReport("s", feeder.id, "running", checkpoint="/a/s"))  # started again, taken back
    assert feeder.superseded("s") is None
    link.refused = {}
    feeder.update("s", state="running", batch_id=0)
    assert feeder.live_stores() == ["s", "t"]
    # An answer to a report sent before the claim (here: the claims as they stood then) changes nothing.
    feeder._answered({"s": 1}, {"s": "an old answer"})
    assert feeder.superseded("s") is None


def test_an_answer_to_a_report_sent_without_waiting_is_taken_on_the_heartbeats_thread() -> None:
    """Ray calls back on its own thread, or at once under the feeder's lock: the callback only queues the
    answer and wakes the heartbeat, whose thread flags the store."""
    link = FakeLink()
    feeder = Feeder(link, interval=60.0)
    feeder.update("t", state="running", batch_id=1)  # starts the heartbeat's thread
    link.refused = {"t": "store 't' is fed by another topology"}
    feeder.update("t", state="running", batch_id=2)  # answered at once, under the lock: queued
    deadline = time.monotonic() + 5
    while feeder.superseded("t") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert feeder.superseded("t") == "store 't' is fed by another topology" and feeder.live_stores() == []
    feeder.finish()


def test_a_registry_that_is_down_breaks_nothing_and_the_next_beat_catches_up() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    link.down = True
    feeder.update("s", state="running", batch_id=1)  # does not raise into the batch
    feeder.dead_letters("s", "order", 1)
    feeder.beat()
    assert link.sent == []
    link.down = False
    feeder.beat()
    assert (link.last()["s"].batch_id, link.last()["s"].dead_letters) == (1, {"order": 1})


def test_a_report_the_registry_did_not_take_wakes_the_heartbeat_at_once() -> None:
    """A registry replaced while this process held the old one's handle (``riqr down``, ``riqr up``): the
    report sent without waiting fails only when its answer comes. The heartbeat then beats at once with
    the whole state instead of one, or two, intervals later (which left the catalog without the new
    run's ``plan`` while the store already answered)."""
    link = FakeLink()
    feeder = Feeder(link, interval=60.0, clock=lambda: 42.0)  # no beat of its own within the test
    feeder.update("s", state="running", query="riqr-ns-s")  # starts the heartbeat thread
    link.dead = True
    feeder.update("s", state="rebuilding", plan="rebuild")
    assert link.watched == [1, 2]
    deadline = time.monotonic() + 10
    while len(link.sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(link.sent) == 3, "a beat right after the failed report"
    assert (link.last()["s"].plan, link.last()["s"].state) == ("rebuild", "rebuilding")
    feeder.finish()
    assert link.last()["s"].state == "stopped"


def test_finish_says_stopped_or_names_the_failed_query_then_nothing_more() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("a", state="running", query="riqr-ns-a")
    feeder.update("b", state="running", query="riqr-ns-b")
    feeder.finish("riqr-ns-b", "ActorDiedError: boom")
    last = link.last()
    assert (last["b"].state, last["b"].error) == ("failed", "ActorDiedError: boom")
    assert last["a"].state == "failed" and "riqr-ns-b" in (last["a"].error or "")
    sends = len(link.sent)
    feeder.update("a", state="running", batch_id=9)  # a batch that completes while the queries stop
    feeder.beat()
    assert len(link.sent) == sends and feeder.closed
    other = _feeder(link)
    other.update("c", state="running")
    other.finish()
    assert link.last()["c"].state == "stopped"


def test_last_words_are_sent_again_until_the_registry_takes_them() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("s", state="running")
    link.lost = 2  # a registry restarting, or one this process has not yet seen come back
    feeder.finish(timeout=5.0)
    assert [[r.state for r in sent] for sent in link.sent[-3:]] == [["stopped"]] * 3 and link.lost == 0


def test_the_heartbeat_thread_beats_until_finished() -> None:
    link = FakeLink()
    feeder = Feeder(link, interval=0.01)
    feeder.update("s", state="running")
    done = threading.Event()

    def beats() -> None:
        while len(link.sent) < 4:
            threading.Event().wait(0.005)
        done.set()

    threading.Thread(target=beats, daemon=True).start()
    assert done.wait(5.0), "the heartbeat thread did not beat"
    feeder.finish()
    assert feeder._thread is not None
    feeder._thread.join(5.0)
    assert not feeder._thread.is_alive()


def test_finish_returns_once_a_beat_waiting_on_the_registry_has_ended(caplog: pytest.LogCaptureFixture) -> None:
    """A beat waits on the registry for up to a heartbeat interval. One still inside that Ray call when the
    topology process ends, and Ray shuts down at exit, had Ray end the process with exit status 1; so
    ``finish`` waits for the heartbeat's thread, within its own timeout."""

    class SlowLink(FakeLink):
        """The first beat's call is answered only when ``answer`` is set (or after ``hold`` seconds, a hang
        guard far past anything waited here); ``events`` says what happened in which order."""

        def __init__(self, hold: float = 30.0) -> None:
            super().__init__()
            self.hold = hold
            self.inside = threading.Event()
            self.answer = threading.Event()
            self.last_words = threading.Event()
            self.events: list[str] = []

        def wait(self, pending: Any, timeout: float) -> dict[str, str]:
            if len(self.sent) == 2:  # the first beat: the registry answers only when told to
                self.inside.set()
                self.answer.wait(self.hold)
                self.events.append("beat answered")
            elif len(self.sent) == 3:  # finish's last words, sent while that beat waits
                self.last_words.set()
            return super().wait(pending, timeout)

    link = SlowLink()
    feeder = Feeder(link, interval=1.0)
    feeder.update("s", state="running")  # sent at once (1); the heartbeat thread starts
    assert link.inside.wait(5.0), "no beat waited on the registry"

    def finish() -> None:
        feeder.finish(timeout=60.0)  # far longer than the test waits: returning means the beat ended
        link.events.append("finish returned")

    finishing = threading.Thread(target=finish, daemon=True)
    finishing.start()
    assert link.last_words.wait(5.0), "finish did not send its last words"
    finishing.join(0.2)  # not a sync: a finish that does not wait returns within it, a working one never
    assert finishing.is_alive() and link.events == [], "finish returned while a beat still waited on the registry"
    link.answer.set()
    finishing.join(10.0)  # a hang guard: well short of finish's own 60 s
    assert not finishing.is_alive(), "finish waited on after the beat's call returned"
    assert feeder._thread is not None and not feeder._thread.is_alive()
    assert link.events == ["beat answered", "finish returned"]  # until the beat's call returned, no longer

    # A beat that outlasts the timeout: finish still returns within it (the beat still waiting), and says so.
    link = SlowLink()
    feeder = Feeder(link, interval=1.0)
    feeder.update("s", state="running")
    assert link.inside.wait(5.0)
    with caplog.at_level(logging.WARNING):
        feeder.finish(timeout=0.3)
    assert feeder._thread is not None and feeder._thread.is_alive() and link.events == []  # not answered yet
    assert "heartbeat" in caplog.text and "still waiting on the registry" in caplog.text
    link.answer.set()
    feeder._thread.join(5.0)
    assert link.events == ["beat answered"]


def _one_supervised_feed(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeLink, FakeQuery]:
    """The process's only feeder, feeding store ``s`` from one running query."""
    link = FakeLink()
    feeder = _feeder(link)
    monkeypatch.setattr(feeder_module, "_FEEDERS", {"ns": feeder})
    query = FakeQuery("riqr-ns-s")
    feeder.update("s", state="running", query=query.name)
    feeder.attach("s", query)
    return link, query


def test_supervise_reports_stopped_on_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    link, query = _one_supervised_feed(monkeypatch)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert supervise([query], poll=0.01) == 0
    finally:
        timer.cancel()
    assert link.last()["s"].state == "stopped" and not query.active


def test_supervise_stops_at_once_when_the_stop_was_asked_before_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """``riqr demo``'s own handler sets the flag for a Ctrl-C that comes before serving: supervising then
    stops at once (a Ctrl-C that came as the demo became ready was once lost, and the demo served on)."""
    link, query = _one_supervised_feed(monkeypatch)
    asked = threading.Event()
    asked.set()
    before = signal.getsignal(signal.SIGINT)
    assert supervise([query], poll=60.0, stop=asked) == 0  # no poll interval waited: the flag is seen first
    assert link.last()["s"].state == "stopped" and not query.active
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back


def test_supervise_reports_the_failed_query_and_fails_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    link = FakeLink()
    feeder = _feeder(link)
    monkeypatch.setattr(feeder_module, "_FEEDERS", {"ns": feeder})
    healthy, failing = FakeQuery("riqr-ns-a"), FakeQuery("riqr-ns-b")
    for store, query in (("a", healthy), ("b", failing)):
        feeder.update(store, state="running", query=query.name)
        feeder.attach(store, query)
    failing.active, failing.error = False, RuntimeError("delivering batch 7: gone")
    assert supervise([healthy, failing], poll=0.01) == 1
    last = link.last()
    assert (last["b"].state, last["b"].error) == ("failed", "RuntimeError: delivering batch 7: gone")
    assert last["a"].state == "failed" and "riqr-ns-b" in (last["a"].error or "") and not healthy.active


def test_partitions_catching_up_from_a_peer_are_reported_and_survive_the_registry_file() -> None:
    from runtime.feeds import FeedReport

    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("s", state="running", batch_id=5, rows=0, incomplete=[], catching_up=[2, 3])
    sent = link.last()["s"]
    assert sent.catching_up == (2, 3) and sent.incomplete == ()
    assert sent.to_json()["catching_up"] == [2, 3]
    assert FeedReport.from_json("s", sent.to_json()) == sent


def test_dropped_rows_add_up_across_deliveries_of_a_run_and_ride_every_report() -> None:
    link = FakeLink()
    feeder = _feeder(link)
    feeder.update("s", state="running")
    feeder.dropped_rows("s", {"null-key": 2})
    feeder.dropped_rows("s", {"null-key": 1, "time-out-of-range": 4})  # a rebuild's new delivery, same run
    feeder.update("s", batch_id=7)
    assert link.last()["s"].dropped_rows == {"null-key": 3, "time-out-of-range": 4}
