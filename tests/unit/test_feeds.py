"""The registry's ingest records (``runtime.feeds``): when a feed is stale, whose reports count, what a
restart keeps, and the file that keeps it (written atomically, read back tolerantly)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from runtime.feeds import FeedBook, FeedReport, load_book, save_book


def test_a_live_feed_turns_stale_after_the_bound_and_a_heartbeat_brings_it_back() -> None:
    book = FeedBook(stale_after=6.0)
    assert book.report(FeedReport("s", "run-1", "running", query="riqr-ns-s", batch_id=3), now=100.0)
    assert book.verdict("s", 106.0) == ("running", None)  # at the bound: still alive
    state, reason = book.verdict("s", 106.5) or ("", "")
    assert state == "stale" and reason is not None and "riqr-ns-s" in reason and "6s" in reason
    entry = book.status(106.5)["s"]
    assert (entry["state"], entry["reported"], entry["batch_id"], entry["heard_at"]) == ("stale", "running", 3, 100.0)
    assert not book.report(FeedReport("s", "run-1", "running", query="riqr-ns-s", batch_id=3), now=107.0)
    assert book.status(107.0)["s"]["state"] == "running" and "reason" not in book.status(107.0)["s"]


def test_ended_feeds_never_go_stale_and_a_store_never_fed_has_no_verdict() -> None:
    book = FeedBook(stale_after=6.0)
    book.report(FeedReport("a", "run-1", "stopped"), now=0.0)
    book.report(FeedReport("b", "run-1", "failed", error="OwnerUnavailable: gone"), now=0.0)
    assert book.verdict("a", 1e6) == ("stopped", None)
    assert book.verdict("b", 1e6) == ("failed", "OwnerUnavailable: gone")
    assert book.verdict("never", 0.0) is None and "never" not in book.status(0.0)


def test_a_new_run_takes_over_and_the_old_runs_last_words_are_ignored() -> None:
    book = FeedBook(stale_after=6.0)
    book.report(FeedReport("s", "old", "running", dead_letters={"order": 2, "customer": 1}), now=0.0)
    assert book.report(FeedReport("s", "new", "rebuilding", dead_letters={"order": 3}), now=10.0)
    # The old run's SIGTERM handler reports late: the new run feeds the store, so it does not count.
    assert not book.report(FeedReport("s", "old", "stopped"), now=11.0)
    entry = book.status(11.0)["s"]
    assert (entry["feeder"], entry["state"]) == ("new", "rebuilding")
    assert entry["dead_letters"] == {"order": 3, "customer": 1}  # totals per topic; unmentioned ones kept
    # The run that feeds it may stop it.
    assert book.report(FeedReport("s", "new", "stopped"), now=12.0)
    assert book.verdict("s", 1e6) == ("stopped", None)


def test_a_last_word_made_before_the_runs_claim_since_does_not_end_the_feed() -> None:
    """A run's query fails while the registry restarts, so its ``failed`` is held and re-sent with each
    beat (``topologies.feeder``); the same process starts the query again and claims the store. The held
    word, taken after the claim, recorded the just-claimed feed as failed (a review of the change)."""
    book = FeedBook(stale_after=10)
    book.report(FeedReport("s", "run-1", "running", query="q", at=100.0), now=100)
    assert book.claim(FeedReport("s", "run-1", "running", query="q", at=120.0), now=120) is None
    assert not book.report(FeedReport("s", "run-1", "failed", query="q", at=110.0, error="boom"), now=121)
    holder = book.holder("s")
    assert holder is not None and holder.live
    # One made after the claim is its last word, as ever, even when a batch's report is dated later (a
    # clock stepped back after it): only the claim's time is compared.
    book.report(FeedReport("s", "run-1", "running", query="q", at=140.0, batch_id=3), now=140)
    assert book.report(FeedReport("s", "run-1", "failed", query="q", at=130.0, error="again"), now=141)
    holder = book.holder("s")
    assert holder is not None and (holder.state, holder.error) == ("failed", "again")


def test_a_late_row_total_is_kept_until_a_report_tells_another() -> None:
    book = FeedBook(stale_after=6.0)
    book.report(FeedReport("s", "run", "running", late_rows=5), now=0.0)
    book.report(FeedReport("s", "run", "running", batch_id=3), now=1.0)  # a report that does not say
    assert book.status(1.0)["s"]["late_rows"] == 5
    book.report(FeedReport("s", "new", "running", late_rows=0), now=2.0)  # a rebuilt checkpoint counts anew
    assert book.status(2.0)["s"]["late_rows"] == 0
    assert "late_rows" not in book.status(2.0).get("never", {})
    book.report(FeedReport("t", "run", "running"), now=2.0)
    assert "late_rows" not in book.status(2.0)["t"]  # no watermark, nothing said: no total shown


def test_reports_about_a_store_dropped_and_declared_again_since_are_ignored() -> None:
    """The old store's feeder beats and says its last words until it sees the drop; the store of that name
    now has other actors and another feeder, whose record they must neither take over nor fail."""
    book = FeedBook(stale_after=6.0)
    now_owners = {"new-1": [0], "new-2": [1]}
    assert book.report(FeedReport("s", "new", "running", batch_id=0, owners=("new-1", "new-2")), 10.0, now_owners)
    assert not book.report(FeedReport("s", "old", "running", batch_id=41, owners=("old-1", "old-2")), 11.0, now_owners)
    assert not book.report(FeedReport("s", "old", "failed", error="gone", owners=("old-1",)), 12.0, now_owners)
    entry = book.status(12.0)["s"]
    assert (entry["feeder"], entry["state"], entry["batch_id"]) == ("new", "running", 0)
    assert entry["owners"] == ["new-1", "new-2"]
    # One actor in common is the same store (an actor re-created keeps its uuid, a moved copy too); a report
    # that names no owners (an older feeder) is taken as before.
    assert not book.report(FeedReport("s", "new", "running", batch_id=1, owners=("new-2", "new-3")), 13.0, now_owners)
    assert book.status(13.0)["s"]["batch_id"] == 1
    assert book.report(FeedReport("s", "older", "running", batch_id=5), 14.0, now_owners)
    assert book.status(14.0)["s"]["feeder"] == "older"


def test_one_store_has_one_feed_and_only_a_feed_that_let_it_go_gives_it_to_another_checkpoint() -> None:
    """``refusal`` and ``claim``: a live feed heard within the bound holds its store against a run from
    another checkpoint; the same run, or a run on the same checkpoint (started again after a kill), takes
    it at once; a feed that stopped, failed or fell silent past the bound lets it go."""
    book = FeedBook(stale_after=6.0)
    first = FeedReport("s", "host:1:aa", "running", query="riqr-ns-s", checkpoint="/home/a/checkpoints/ns/s")
    assert book.claim(first, 100.0) is None and book.status(100.0)["s"]["checkpoint"] == "/home/a/checkpoints/ns/s"
    other = FeedReport("s", "host:2:bb", "running", query="riqr-ns-s", checkpoint="/home/b/checkpoints/ns/s")
    why = book.claim(other, 103.0)
    assert why is not None and "fed by another topology: riqr-ns-s (run host:1:aa from checkpoint /home/a/" in why
    assert "heard from 3.0s ago" in why and "stop that topology first" in why
    assert book.status(103.0)["s"]["feeder"] == "host:1:aa"  # a refused claim changes nothing
    assert book.refusal(replace(first, state="rebuilding"), 104.0) is None  # the same run
    # Another run on its checkpoint: two runs of one topology on one home, unless the first one's process is
    # gone (seen by the claimant, which then names the run it displaces).
    again = replace(first, feeder="host:1:cc")
    assert "(run host:1:aa from this same checkpoint)" in (book.refusal(again, 104.0) or "")
    assert book.refusal(again, 104.0, displace="host:1:zz") is not None  # another run than the holder
    assert book.claim(again, 104.0, displace="host:1:aa") is None and book.status(104.0)["s"]["feeder"] == "host:1:cc"
    assert book.claim(first, 104.5, displace="host:1:cc") is None  # and back (as if cc had been killed)
    # Claimed again by the run that holds it (a rebuild in place): heard, its record's progress kept.
    book.report(replace(first, batch_id=9, delivered=first.checkpoint), 104.6)  # a batch delivered
    assert book.claim(first, 104.7) is None
    assert (book.status(104.7)["s"]["batch_id"], book.status(104.7)["s"]["heard_at"]) == (9, 104.7)
    assert book.refusal(replace(other, checkpoint=None), 105.0) is not None  # no checkpoint: never the same feed
    # Silent past the bound: the other checkpoint may take it, but only on purpose (``replacing``): the store
    # holds what the first checkpoint fed it, and the other's first batch would replace that.
    assert book.refusal(other, 110.5) is not None and book.refusal(other, 111.0) is None
    why = book.claim(other, 111.0)
    assert why is not None and "holds what checkpoint /home/a/checkpoints/ns/s fed it" in why and "--take-over" in why
    assert book.status(111.0)["s"]["feeder"] == "host:1:aa"  # refused: nothing changed
    assert book.claim(other, 111.0, take_over=True) is None
    assert book.status(111.0)["s"]["feeder"] == "host:2:bb"
    # A feed that ended lets it go at once; the store still holds the first checkpoint's batches (the other
    # delivered none), so the first takes it back without taking over.
    book.report(replace(other, state="stopped"), 112.0)
    assert book.claim(first, 112.5) is None
    book.report(replace(first, state="failed", error="boom"), 113.0)
    assert book.refusal(other, 113.5) is None
    # Its own failed record, claimed again by the same run: recorded, live, so it holds the store again.
    assert book.claim(first, 114.0) is None and book.status(114.0)["s"]["state"] == "running"
    assert book.refusal(other, 114.5) is not None


def test_a_stores_contents_go_to_another_checkpoint_only_when_it_takes_the_store_over(tmp_path: Path) -> None:
    """``replacing``: a store holds what the checkpoint of the last batch delivered fed it. Another
    checkpoint's first batch would replace that, and so would one from that checkpoint's location emptied
    (deleted, or another host's disk): both only with ``take_over``. A claim, a start (a resumed one says
    its checkpoint's batch) or a heartbeat does not change the contents, so a take-over that never
    delivered leaves them where they were. They are saved at once, and survive a save and load."""
    book = FeedBook(stale_after=6.0)
    a = FeedReport("s", "h:1:aa", "running", query="riqr-ns-s", checkpoint="/a/s")
    b = FeedReport("s", "h:2:bb", "running", query="riqr-ns-s", checkpoint="/b/s")
    assert book.claim(a, 0.0) is None
    book.report(replace(a, state="stopped"), 1.0)
    assert book.replacing(b, 2.0) is None and book.claim(b, 2.0) is None  # a delivered nothing: nothing to replace
    # b's start, resumed at its checkpoint's batch 6: not a delivery. Its batch 7 is, and is saved at once.
    book.report(replace(b, batch_id=6, source="q1", plan="resume"), 2.5)
    assert book.contents("s") is None
    assert book.report(replace(b, batch_id=7, source="q1", plan="resume", delivered="/b/s"), 3.0)
    assert book.contents("s") == "/b/s" and book.status(3.0)["s"]["contents"] == "/b/s"
    assert "delivered" not in book.status(3.0)["s"]
    book.report(replace(b, state="stopped", batch_id=7, delivered="/b/s"), 4.0)
    why = book.claim(a, 64.0)
    assert why is not None
    assert why.startswith("store 's' holds what checkpoint /b/s fed it (its feed last: riqr-ns-s (run h:2:bb), stoppe")
    assert "heard from 60s ago)" in why
    assert "this topology's checkpoint /a/s is another" in why and "riqr drop" in why and "--take-over" in why
    assert book.holder("s") == replace(b, state="stopped", batch_id=7, delivered="/b/s")  # refused: nothing changed
    # Its own checkpoint again, as it stands: a restart; emptied: refused, saying so.
    assert book.replacing(replace(b, feeder="h:2:cc"), 65.0) is None
    emptied = book.replacing(replace(b, feeder="h:2:cc", plan="fresh"), 65.0)
    assert emptied is not None and "holds batches of checkpoint /b/s" in emptied and "which is empty here" in emptied
    assert book.claim(replace(b, feeder="h:2:cc", plan="fresh"), 65.0) == emptied
    # A take-over is granted; its start (resumed: a's home has batches of its own) and heartbeats leave the
    # store b's until it delivers, so b may come back without the flag, and so may a (the operator gave it
    # the store: a topology whose other store it took over and fed must not be stuck between two homes),
    # while a third checkpoint is told it is b's, naming the feed that took it over but did not deliver.
    assert book.claim(a, 66.0, take_over=True) is None
    book.report(replace(a, batch_id=3, source="qa", plan="resume"), 66.2)
    assert book.contents("s") == "/b/s"
    assert book.replacing(replace(a, feeder="h:1:zz"), 66.5) is None  # a's checkpoint was given the store
    assert book.refusal(replace(a, feeder="h:1:zz"), 66.5) is not None  # but a's run holds the live feed
    assert book.replacing(a, 66.5) is None  # a's own run, its own checkpoint (a rebuild in place)
    # The same run (one process is one feeder) on another checkpoint: held to the rule like any other.
    assert "holds what checkpoint /b/s fed it" in (book.replacing(replace(a, checkpoint="/a2/s"), 66.5) or "")
    book.report(replace(a, state="failed", error="boom"), 67.0)
    c = FeedReport("s", "h:3:cc", "running", checkpoint="/c/s")
    said = book.replacing(c, 68.0) or ""
    assert "/b/s fed it (its feed last: riqr-ns-s (run h:1:aa from checkpoint /a/s), failed" in said
    assert book.replacing(replace(a, feeder="h:1:yy"), 68.0) is None  # a again, without the flag
    assert book.claim(replace(b, feeder="h:2:dd"), 68.0) is None  # and b, whose batches the store holds
    # Once a checkpoint delivers, the store is its alone: the take-over's grant ends with it.
    book.report(replace(b, feeder="h:2:dd", batch_id=8, delivered="/b/s"), 68.5)
    assert "holds what checkpoint /b/s fed it" in (book.replacing(replace(a, feeder="h:1:xx"), 69.0) or "")
    # The contents are saved with the book; a book saved before them takes the record's own checkpoint if
    # it had delivered a batch (a failed record's batch is the one that failed).
    path = tmp_path / "ingest.json"
    save_book(book, path)
    again = load_book(path, now=100.0, stale_after=6.0)
    assert "holds what checkpoint /b/s fed it" in (again.replacing(c, 200.0) or "")
    saved = json.loads(path.read_text())
    del saved["feeds"]["s"]["contents"]
    del saved["feeds"]["s"]["report"]["batch_id"]
    older = FeedBook.from_json(saved, now=100.0)
    assert older.replacing(c, 200.0) is None  # a record that had delivered nothing: not known
    saved["feeds"]["s"]["report"]["batch_id"] = 3
    assert "holds what checkpoint /b/s fed it" in (FeedBook.from_json(saved, now=100.0).replacing(c, 200.0) or "")
    saved["feeds"]["s"]["report"].update(state="failed", error="boom")
    assert FeedBook.from_json(saved, now=100.0).replacing(c, 200.0) is None
    # A feeder too old to say its checkpoint is never refused for it.
    assert again.replacing(replace(c, checkpoint=None), 200.0) is None
    # A take-over's grant is saved too.
    granted = FeedBook(stale_after=6.0)
    granted.report(replace(a, batch_id=1, delivered="/a/s"), 299.0)
    granted.report(replace(a, batch_id=1, delivered="/a/s", state="stopped"), 300.0)
    assert granted.claim(b, 301.0, take_over=True) is None
    save_book(granted, path)
    restored = load_book(path, now=400.0, stale_after=6.0)
    assert restored.replacing(replace(b, feeder="h:2:ee"), 401.0) is None and restored.replacing(c, 401.0) is not None


def test_a_feeder_that_lost_its_store_while_silent_takes_it_back_only_by_a_claim() -> None:
    """``unclaimed``: a topology paused past the bound while another took its store over, delivered and
    stopped. Its heartbeats, once it resumes, must not take the store back: its next batch would be a gap
    and its rebuild in place would replace the taker's contents, with no take-over asked for. Had the
    taker delivered nothing, the store is still the paused one's, and its reports go on."""
    book = FeedBook(stale_after=6.0)
    a = FeedReport("s", "h:1:aa", "running", query="riqr-ns-s", checkpoint="/a/s", batch_id=4, delivered="/a/s")
    b = FeedReport("s", "h:2:bb", "running", query="riqr-ns-s", checkpoint="/b/s")
    book.report(a, 0.0)
    assert book.claim(b, 10.0, take_over=True) is None  # a silent past the bound
    assert "fed by another topology" in (book.unclaimed(a, 11.0) or "")  # b is live: as before
    book.report(replace(b, state="stopped"), 12.0)  # b delivered nothing
    assert book.unclaimed(a, 13.0) is None  # the store is still a's: its reports go on
    book.report(a, 13.0)
    assert book.holder("s") == a
    assert book.claim(b, 20.0, take_over=True) is None
    book.report(replace(b, batch_id=0, delivered="/b/s"), 21.0)
    book.report(replace(b, state="stopped", batch_id=0, delivered="/b/s"), 22.0)
    why = book.unclaimed(a, 23.0)
    assert why is not None and "holds what checkpoint /b/s fed it" in why
    assert book.unclaimed(replace(a, plan="fresh"), 23.0) == why  # a report says nothing of an empty checkpoint
    assert book.unclaimed(replace(b, feeder="h:2:cc"), 23.0) is None  # b's checkpoint, another run: not another's


def test_only_state_changes_are_significant_enough_to_save_at_once() -> None:
    book = FeedBook()
    assert book.report(FeedReport("s", "r", "running", batch_id=1, at=1.0), now=0.0)  # a new feed
    assert not book.report(FeedReport("s", "r", "running", batch_id=2, at=2.0, rows=5), now=1.0)  # progress
    assert book.report(FeedReport("s", "r", "running", batch_id=2, dead_letters={"t": 1}), now=2.0)
    assert book.report(FeedReport("s", "r", "failed", error="boom"), now=3.0)
    assert book.dirty


def test_reports_are_typed() -> None:
    with pytest.raises(ValueError, match="not one of"):
        FeedReport("s", "r", "stale")  # the registry's verdict, never a feeder's report


def test_the_book_survives_a_save_and_load_and_restored_feeds_get_one_bound(tmp_path: Path) -> None:
    path = tmp_path / "_registry" / "ingest.json"
    book = FeedBook(stale_after=6.0)
    book.report(FeedReport("s", "r", "running", query="q", batch_id=4, at=50.0, incomplete=(1,),
                           dead_letters={"order": 2}, late_rows=4, owners=("a1", "a2"), checkpoint="/h/s"),
                now=50.0)  # fmt: skip
    book.report(FeedReport("t", "r", "failed", error="boom"), now=50.0)
    save_book(book, path)
    assert not book.dirty and [p.name for p in path.parent.iterdir()] == ["ingest.json"]  # no temporary left
    restored = load_book(path, now=1000.0, stale_after=6.0)
    assert restored.status(1000.0) == {
        "s": {"state": "running", "feeder": "r", "query": "q", "checkpoint": "/h/s", "at": 50.0, "batch_id": 4,
              "incomplete": [1], "dead_letters": {"order": 2}, "late_rows": 4, "owners": ["a1", "a2"],
              "heard_at": 1000.0},
        "t": {"state": "failed", "feeder": "r", "error": "boom", "heard_at": 1000.0},
    }  # fmt: skip
    assert restored.verdict("s", 1006.0) == ("running", None)
    assert (restored.verdict("s", 1007.0) or ("", ""))[0] == "stale"
    restored.keep_only({"t"})
    assert "s" not in restored and "t" in restored


def test_a_missing_or_unreadable_file_starts_an_empty_book(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert load_book(tmp_path / "none.json", now=0.0).status(0.0) == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert load_book(bad, now=0.0).status(0.0) == {}
    bad.write_text(json.dumps({"format": 99, "feeds": {}}))
    assert load_book(bad, now=0.0).status(0.0) == {}
    assert "unreadable" in caplog.text


def test_dropped_rows_add_up_within_a_run_and_start_again_with_a_new_one() -> None:
    book = FeedBook(stale_after=6.0)
    book.report(FeedReport("s", "run", "running", dropped_rows={"null-key": 2}), now=0.0)
    book.report(FeedReport("s", "run", "running", batch_id=3), now=1.0)  # a heartbeat that does not say
    assert book.status(1.0)["s"]["dropped_rows"] == {"null-key": 2}
    book.report(FeedReport("s", "run", "running", dropped_rows={"time-out-of-range": 1}), now=2.0)
    assert book.status(2.0)["s"]["dropped_rows"] == {"null-key": 2, "time-out-of-range": 1}
    book.report(FeedReport("s", "next", "running"), now=3.0)  # a new run counts from nothing
    assert "dropped_rows" not in book.status(3.0)["s"]
    again = FeedReport.from_json("s", FeedReport("s", "r", "running", dropped_rows={"null-key": 5}).to_json())
    assert again.dropped_rows == {"null-key": 5}
