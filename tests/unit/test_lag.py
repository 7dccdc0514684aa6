"""Lag in batches and seconds, and replica states (runtime.lag), and the registry's acknowledgement log
(runtime.feeds.AckLog): plain numbers, no Ray."""

import pytest

from runtime.feeds import AckLog, FeedBook, FeedReport
from runtime.lag import Newest, lag, replica_state, with_lag


@pytest.mark.parametrize(
    ("role", "state", "expected"),
    [
        ("active", "serving", "active"),
        ("standby", "serving", "in-sync"),
        ("active", "catching-up", "catching-up"),
        ("standby", "catching-up", "catching-up"),
        ("active", "rebuilding", "catching-up"),  # from its source, until the watermark catches up
        ("standby", "incomplete", "incomplete"),
        ("active", "lost", "incomplete"),
        ("standby", "loading", "incomplete"),
        ("active", "unavailable", "unavailable"),
        ("standby", "unknown", "unavailable"),
        ("active", "unassigned", "unavailable"),
        ("active", None, "unavailable"),
    ],
)
def test_replica_state(role: str, state: str | None, expected: str) -> None:
    assert replica_state(role, state) == expected


NEWEST = Newest(7, "q", [(4, 30.0), (5, 20.0), (6, 12.5), (7, 2.0)])


def test_a_copy_at_or_past_the_newest_acknowledged_batch_has_no_lag() -> None:
    assert lag({"source": "q", "batch_id": 7}, NEWEST) == (0, 0.0)
    # Positions are read after the status: a copy may already hold a batch not yet acknowledged.
    assert lag({"source": "q", "batch_id": 8}, NEWEST) == (0, 0.0)


def test_lag_in_seconds_is_the_age_of_the_first_batch_the_copy_lacks() -> None:
    assert lag({"source": "q", "batch_id": 6}, NEWEST) == (1, 2.0)  # lacks 7, acknowledged 2 s ago
    assert lag({"source": "q", "batch_id": 4}, NEWEST) == (3, 20.0)  # lacks 5, 6, 7; 5 is 20 s old
    assert lag({"source": "q", "batch_id": 3}, NEWEST) == (4, 30.0)


def test_behind_every_kept_time_it_is_the_oldest_kept_age_a_lower_bound() -> None:
    assert lag({"source": "q", "batch_id": 0}, NEWEST) == (7, 30.0)


def test_a_copy_at_another_source_lacks_every_batch_of_the_newest() -> None:
    assert lag({"source": "old", "batch_id": 90}, NEWEST) == (8, 30.0)
    assert lag({"source": None, "batch_id": -1}, NEWEST) == (8, 30.0)


def test_unknown_when_nothing_was_acknowledged_or_the_copy_did_not_answer() -> None:
    assert lag({"source": "q", "batch_id": 3}, None) == (None, None)
    assert lag({"state": "unavailable", "reason": "down"}, NEWEST) == (None, None)


def test_without_kept_times_the_batches_are_known_and_the_seconds_are_not() -> None:
    newest = Newest.from_ingest({"state": "running", "batch_id": 5, "source": "q"})
    assert lag({"source": "q", "batch_id": 5}, newest) == (0, 0.0)
    assert lag({"source": "q", "batch_id": 2}, newest) == (3, None)


def test_a_sink_that_did_not_name_its_source_compares_batch_ids_only() -> None:
    newest = Newest.from_ingest({"state": "running", "batch_id": 5, "acked": [[5, 1.0]]})
    assert newest is not None and newest.source is None
    assert lag({"source": "anything", "batch_id": 4}, newest) == (1, 1.0)


def test_newest_from_ingest() -> None:
    assert Newest.from_ingest(None) is None
    assert Newest.from_ingest({"state": "running"}) is None
    # A failed report names the batch that failed, not one acknowledged.
    assert Newest.from_ingest({"state": "failed", "batch_id": 3}) is None
    kept = Newest.from_ingest({"state": "failed", "batch_id": 3, "source": "q", "acked": [[1, 5.0], [2, 4.0]]})
    assert kept == Newest(2, "q", [(1, 5.0), (2, 4.0)])


def test_with_lag_keeps_the_position_and_adds_the_fields() -> None:
    position = {"source": "q", "batch_id": 6, "state": "serving"}
    assert with_lag(position, "standby", NEWEST) == {
        **position,
        "role": "standby",
        "replica_state": "in-sync",
        "lag_batches": 1,
        "lag_seconds": 2.0,
    }


def test_ack_log_keeps_the_last_batches_of_the_current_source() -> None:
    log = AckLog(length=3)
    for b, t in [(0, 100.0), (1, 101.0), (1, 101.5), (2, 103.0), (3, 104.0)]:
        log.record("q", b, t)
    assert log.ages(110.0) == [[1, 9.0], [2, 7.0], [3, 6.0]]  # bounded; a repeat keeps the first time
    log.record("r", 0, 111.0)  # a new source starts over
    assert (log.source, log.ages(112.0)) == ("r", [[0, 1.0]])
    log.record("r", 5, 113.0)
    log.record("r", 2, 114.0)  # going back (a replay after a restart) starts over too
    assert log.ages(115.0) == [[2, 1.0]]


def test_the_book_reports_ack_ages_by_its_own_clock() -> None:
    book = FeedBook()
    book.report(FeedReport("s", "f1", "running", batch_id=0, source="q", at=1e9), now=10.0)
    book.report(FeedReport("s", "f1", "running", batch_id=1, source="q", at=1e9), now=12.0)
    book.report(FeedReport("s", "f1", "running", batch_id=1, source="q", at=1e9), now=13.0)  # a heartbeat
    entry = book.status(15.0)["s"]
    assert entry["acked"] == [[0, 5.0], [1, 3.0]] and entry["source"] == "q"
    # Not saved: a restored book has no times until the next batch.
    restored = FeedBook.from_json(book.to_json(), now=20.0)
    assert "acked" not in restored.status(21.0)["s"]
    book.forget("s")
    book.report(FeedReport("s", "f2", "running", plan="resume"), now=30.0)
    assert "acked" not in book.status(31.0)["s"]
