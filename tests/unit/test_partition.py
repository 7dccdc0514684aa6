"""The gap rule on both engines: a partition serves only a state it can prove complete."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.engines import Position, open_engine
from runtime.keys import KeySchema
from runtime.partition import HELD, INCOMPLETE, LOADING, LOST, REBUILDING, SERVING, Hold, PartitionState

SCHEMA = KeySchema("key", "string")


def rows(**values: str | None) -> list[tuple[str, bytes | None]]:
    return [(k, None if v is None else v.encode()) for k, v in values.items()]


@pytest.fixture(params=["memory", "rocksdb"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def open_partition(kind: str, path: Path, *, lost: bool = False) -> PartitionState:
    return PartitionState(0, open_engine(kind, SCHEMA, path), directory=path, lost=lost)


def test_a_new_partition_loads_until_its_first_batch(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    assert part.state == LOADING and not part.serving
    result = part.apply("q", 0, rows(a="1"))
    assert result.applied and part.serving and part.engine.get("a") == b"1"


def test_contiguous_batches_apply_and_replays_are_no_ops(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1"))
    part.apply("q", 1, rows(a="2", b="x"))
    replay = part.apply("q", 1, rows(a="999"))  # Spark re-runs batch 1 after a crash
    assert not replay.applied and part.engine.get("a") == b"2"
    assert part.apply("q", 2, rows(b=None)).applied and part.engine.get("b") is None
    assert part.describe() == {"source": "q", "batch_id": 2, "state": SERVING}


def test_a_new_actor_receiving_batch_57_is_incomplete_never_serving_partial_state(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    result = part.apply("q", 57, rows(a="1"))
    assert not result.applied and result.state == INCOMPLETE
    assert part.engine.get("a") is None and "missed batches" in part.reason
    assert not part.apply("q", 58, rows(b="2")).applied  # contiguous with 57, but 0..56 are still missing


def test_a_gap_in_a_serving_partition_makes_it_incomplete_and_a_restart_remembers(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1"))
    assert part.apply("q", 2, rows(a="3")).state == INCOMPLETE
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == INCOMPLETE and reopened.engine.get("a") == b"1"


def test_batch_0_of_a_new_source_rebuilds_whatever_the_partition_was(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1", stale="x"))
    part.apply("q", 5, rows(a="2"))  # a gap
    assert part.state == INCOMPLETE
    rebuilt = part.apply("q2", 0, rows(a="new"))
    assert rebuilt.reset and part.serving and part.engine.get("stale") is None and part.engine.get("a") == b"new"
    part.engine.close()
    assert open_partition(kind, tmp_path / "p0").serving  # the marker went with the rebuild


def test_a_later_batch_of_a_new_source_is_a_gap(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1"))
    assert part.apply("q2", 3, rows(a="2")).state == INCOMPLETE
    assert part.engine.get("a") == b"1"


def test_reopening_resumes_at_the_last_position(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    for batch in range(4):
        part.apply("q", batch, rows(**{f"k{batch}": str(batch)}))
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0", lost=True)
    assert reopened.serving and reopened.position().batch_id == 3 and reopened.engine.count() == 4
    assert reopened.apply("q", 4, rows(k4="4")).applied


def test_begin_makes_only_a_never_loaded_partition_serve_empty(kind: str, tmp_path: Path) -> None:
    fresh = open_partition(kind, tmp_path / "fresh")
    assert fresh.begin("q") and fresh.serving and fresh.engine.count() == 0
    assert fresh.apply("q", 0, rows(a="1")).applied
    old = open_partition(kind, tmp_path / "old")
    old.apply("q", 0, rows(a="1"))
    assert not old.begin("q2") and old.engine.get("a") == b"1"  # keeps serving until q2's batch 0


def test_a_read_that_may_have_seen_a_reset_partition_empty_reflects_no_state(kind: str, tmp_path: Path) -> None:
    """A new source's batch 0 resets the partition, then applies the batch: a read that started in
    between may have found a key missing that was there before and is there after. It must not be
    answered (found with reads under load during a rebuild: a 404 for a key counted 9 times)."""
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1"))
    engine_reset, engine_apply = part.engine.reset, part.engine.apply
    started: list[Position] = []
    seen: list[tuple[str | None, int, int] | None] = []

    def reset(position: Position) -> None:
        engine_reset(position)
        assert part.engine.get("a") is None  # emptied: what a read now would find
        started.append(part.position())  # a read starts here...

    def apply(position: Position, batch: list[tuple[str, bytes | None]]) -> None:
        seen.append(part.span(started[0]))  # ...and ends before the batch is in,
        engine_apply(position, batch)
        seen.append(part.span(started[0]))  # or after it

    part.engine.reset = reset  # type: ignore[method-assign]
    part.engine.apply = apply  # type: ignore[method-assign]
    part.apply("r", 0, rows(a="2"))
    assert started == [Position("r", -1)]
    assert seen == [None, None]
    assert part.span(started[0]) is None  # and after the apply returned
    assert part.span(part.position()) == ("r", 0, 0) and part.engine.get("a") is not None


def test_a_reset_whose_batch_fails_to_apply_serves_nothing_until_the_batch_comes_again(
    kind: str, tmp_path: Path
) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1", b="2"))
    engine_apply = part.engine.apply

    def full_disk(position: Position, batch: list[tuple[str, bytes | None]]) -> None:
        raise OSError("No space left on device")

    part.engine.apply = full_disk  # type: ignore[method-assign]
    with pytest.raises(OSError):
        part.apply("r", 0, rows(a="3"))
    assert part.state == LOADING and not part.serving  # emptied by the reset: never served so
    assert "batch 0 of source r" in part.reason
    part.engine.apply = engine_apply  # type: ignore[method-assign]
    result = part.apply("r", 0, rows(a="3"))  # Spark runs the failed batch again
    assert result.applied and part.serving and part.position() == Position("r", 0)
    assert part.engine.get("a") == b"3" and part.engine.get("b") is None


def test_a_partition_reopened_between_a_reset_and_its_batch_takes_the_batch_when_it_comes_again(
    kind: str, tmp_path: Path
) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1"))
    part.engine.reset(Position("r", -1))  # the actor died right after the reset of r's batch 0
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == LOADING
    result = reopened.apply("r", 0, rows(a="2"))
    assert result.applied and reopened.serving and reopened.engine.get("a") == b"2"
    # Likewise a partition that began empty and restarted before its first batch.
    fresh = open_partition(kind, tmp_path / "p1")
    assert fresh.begin("s") and fresh.serving
    fresh.engine.close()
    again = open_partition(kind, tmp_path / "p1")
    assert again.apply("s", 0, rows(a="9")).applied and again.serving


def test_reads_of_a_partition_begun_empty_are_answered_while_its_first_batch_applies(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    assert part.begin("s")
    before = part.position()
    part.moving_to = Position("s", 0)  # its batch 0 is being applied: empty or the batch, both true states
    assert part.span(before) == ("s", -1, 0)


def test_a_volatile_partition_of_a_restarted_actor_is_lost() -> None:
    part = PartitionState(0, open_engine("memory", SCHEMA, None), directory=None, lost=True)
    assert part.state == LOST and "not durable" in part.reason
    assert part.apply("q", 9, rows(a="1")).state == INCOMPLETE
    assert part.apply("q2", 0, rows(a="1")).applied and part.serving


def test_an_apply_or_reset_names_where_it_moves_while_its_rows_may_show(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")
    part.apply("q", 0, rows(a="1"))
    seen: list[tuple[Position | None, tuple[str | None, int, int] | None]] = []
    engine_apply = part.engine.apply
    started = [part.position()]

    def watched(position: Position, batch: list[tuple[str, bytes | None]]) -> None:
        engine_apply(position, batch)
        # A read that started before this apply and ends now, with the new rows already visible:
        seen.append((part.moving_to, part.span(started[0])))

    part.engine.apply = watched  # type: ignore[method-assign]
    part.apply("q", 1, rows(a="2"))
    started[0] = part.position()
    part.apply("r", 0, rows(a="3"))  # a new source: reset, then its batch 0
    assert [m for m, _ in seen] == [Position("q", 1), Position("r", 0)]
    assert seen[0][1] == ("q", 0, 1)  # the read may hold batch 1's rows: its span says so
    assert seen[1][1] is None  # a read across a reset reflects no one state
    assert part.moving_to is None and part.span(part.position()) == ("r", 0, 0)


# -- an append-mode aggregation's rebuild: held until a batch with a watermark -------------------------


def serving_old_state(kind: str, path: Path) -> PartitionState:
    part = open_partition(kind, path)
    part.apply("old", 0, rows(s1="3", s2="1"))  # two closed sessions
    part.apply("old", 1, rows(s3="2"), Hold(900))  # a serving partition takes the hold as news only
    assert part.serving
    return part


def test_a_reset_whose_batch_closed_no_session_serves_only_from_a_batch_with_a_watermark(
    kind: str, tmp_path: Path
) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    reset = part.apply("new", 0, [], Hold(0))  # a fresh checkpoint's batch 0: no watermark, nothing closed
    assert reset.reset and reset.applied and reset.state == REBUILDING and not part.serving
    assert "first batch with" in part.reason and part.describe()["state"] == REBUILDING
    unread = part.apply("new", 1, [], Hold(0))  # its watermark could not be read: no evidence
    assert unread.applied and unread.state == REBUILDING
    caught_up = part.apply("new", 2, rows(s1="3", s2="1", s3="2"), Hold(1_000))
    assert caught_up.applied and caught_up.state == SERVING and part.serving
    assert [part.engine.get(k) for k in ("s1", "s2", "s3")] == [b"3", b"1", b"2"]
    assert not (tmp_path / "p0" / HELD).exists() and part.describe() == {
        "source": "new",
        "batch_id": 2,
        "state": SERVING,
    }


def test_a_partition_held_for_a_watermark_stays_held_across_a_restart(kind: str, tmp_path: Path) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")  # its actor restarted before batch 1
    assert reopened.state == REBUILDING
    assert not reopened.apply("new", 0, [], Hold(0)).applied  # Spark's replay of batch 0
    assert reopened.state == REBUILDING
    assert reopened.apply("new", 1, rows(s1="3"), Hold(5_000)).state == SERVING


def test_the_batch_with_a_watermark_again_releases_a_partition_that_missed_its_release(
    kind: str, tmp_path: Path
) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    part.apply("new", 1, rows(s1="3"), Hold(1_000))
    # The release is made durable after the batch's rows: a crash in between reopens the partition held at
    # the batch with the watermark, and Spark runs that batch again.
    held = tmp_path / "p0" / HELD
    held.write_text("held")
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == REBUILDING
    assert not reopened.apply("new", 0, [], Hold(0)).applied and reopened.state == REBUILDING  # an older replay
    again = reopened.apply("new", 1, rows(s1="3"), Hold(1_000))
    assert not again.applied and again.state == SERVING and not held.exists()


def test_a_reset_of_an_update_mode_store_or_with_a_watermark_serves_at_once(kind: str, tmp_path: Path) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    assert part.apply("new", 0, rows(s1="3")).state == SERVING  # no hold: batch 0 re-emits the whole state
    assert part.apply("newer", 0, rows(s1="3"), Hold(2_000)).state == SERVING
    assert not (tmp_path / "p0" / HELD).exists()


def test_a_gap_while_held_makes_the_partition_incomplete(kind: str, tmp_path: Path) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    assert part.apply("new", 3, rows(s1="3"), Hold(1_000)).state == INCOMPLETE
    part.engine.close()
    assert open_partition(kind, tmp_path / "p0").state == INCOMPLETE  # the marker that says so wins


def test_a_held_partition_fed_without_a_hold_stays_held_until_a_new_source_resets_it(kind: str, tmp_path: Path) -> None:
    # A batch without a hold (a sink that could not tell the query has a watermark) proves nothing.
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    assert part.apply("new", 1, rows(s1="3")).state == REBUILDING
    assert part.apply("newer", 0, [], Hold(0)).state == REBUILDING  # rebuilt again, before it caught up
    assert part.apply("newest", 0, rows(s1="3", s2="1", s3="2")).state == SERVING  # an update-mode batch 0
    assert not (tmp_path / "p0" / HELD).exists()


def fail(*_: object) -> None:
    raise OSError("disk full")


def dying_after(apply: Callable[..., None]) -> Callable[..., None]:
    """``apply``, then the process dies: its batch is in, nothing after it ran."""

    def apply_then_die(*args: object) -> None:
        apply(*args)
        raise OSError("the process dies here")

    return apply_then_die


def test_a_reset_that_fails_leaves_a_held_partition_held(kind: str, tmp_path: Path) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    part.apply("new", 1, rows(s1="3"), Hold(0))  # partial: one session of three
    part.engine.reset = fail  # type: ignore[method-assign]
    with pytest.raises(OSError):
        part.apply("newer", 0, rows(s1="3"))  # a new source's batch 0, whose reset fails (or a crash there)
    assert (tmp_path / "p0" / HELD).exists() and not part.serving
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == REBUILDING and reopened.engine.get("s2") is None  # its partial state: not served


def test_a_reset_without_a_hold_whose_batch_fails_is_taken_again(kind: str, tmp_path: Path) -> None:
    # Held, then reset by an update-mode batch 0 that fails after the reset (a crash there): the partition
    # reopens at batch -1, loading, and takes the batch when Spark runs it again, serving.
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    apply = part.engine.apply
    part.engine.apply = fail  # type: ignore[method-assign]
    with pytest.raises(OSError):
        part.apply("newer", 0, rows(s1="3", s2="1", s3="2"))
    part.engine.apply = apply  # type: ignore[method-assign]
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == LOADING
    assert reopened.apply("newer", 0, rows(s1="3", s2="1", s3="2")).state == SERVING


def test_a_reset_without_a_hold_that_dies_right_after_its_batch_serves_on_reopening(kind: str, tmp_path: Path) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    part.apply("new", 0, [], Hold(0))
    part.engine.apply = dying_after(part.engine.apply)  # type: ignore[method-assign]
    with pytest.raises(OSError):
        part.apply("newer", 0, rows(s1="3", s2="1", s3="2"))  # an update-mode batch 0: its rows are whole
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == SERVING  # not held for a watermark no batch of this store will bring
    assert not reopened.apply("newer", 0, rows(s1="3", s2="1", s3="2")).applied  # Spark's replay: a no-op


def test_a_held_reset_that_dies_after_its_batch_reopens_held(kind: str, tmp_path: Path) -> None:
    part = serving_old_state(kind, tmp_path / "p0")
    part.engine.apply = dying_after(part.engine.apply)  # type: ignore[method-assign]
    with pytest.raises(OSError):
        part.apply("new", 0, [], Hold(0))
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == REBUILDING  # its empty batch 0 is in: not served
    assert reopened.apply("new", 1, rows(s1="3", s2="1", s3="2"), Hold(1_000)).state == SERVING


def test_begin_forgets_a_hold_left_by_a_reset_that_died_before_its_batch(kind: str, tmp_path: Path) -> None:
    part = open_partition(kind, tmp_path / "p0")  # never loaded
    part.engine.reset = fail  # type: ignore[method-assign]
    with pytest.raises(OSError):
        part.apply("new", 0, [], Hold(0))  # HELD written, then the reset dies
    part.engine.close()
    reopened = open_partition(kind, tmp_path / "p0")
    assert reopened.state == LOADING and reopened.begin("fresh")  # a new store's start after all
    assert not (tmp_path / "p0" / HELD).exists()
    assert reopened.apply("fresh", 0, rows(a="1")).state == SERVING  # an update-mode store's first batch
    reopened.engine.close()
    assert open_partition(kind, tmp_path / "p0").serving  # not held for a watermark that never comes
