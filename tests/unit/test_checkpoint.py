"""What a checkpoint says, and how a store's query starts from it when nothing was committed yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.partition import Hold
from topologies.checkpoint import (
    batch_watermark,
    last_committed,
    last_planned,
    mark_rebuild_pending,
    query_id,
    rebuild_delivered,
    rebuild_pending,
    supersede,
)
from topologies.sink import partitions_without_a_current_copy, plan_start


def make(tmp_path: Path, *, offsets: list[int], commits: list[int]) -> str:
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "metadata").write_text(json.dumps({"id": "query-1"}) + "\n")
    for i in offsets:
        (cp / "offsets" / str(i)).write_text("v1")
    for i in commits:
        (cp / "commits" / str(i)).write_text("v1")
    (cp / "offsets" / ".0.crc").write_text("")  # Spark's checksum files are not batches
    return str(cp)


def test_what_a_checkpoint_says(tmp_path: Path) -> None:
    cp = make(tmp_path, offsets=[0, 1, 2], commits=[0, 1])
    assert (query_id(cp), last_planned(cp), last_committed(cp)) == ("query-1", 2, 1)
    assert (query_id(str(tmp_path / "none")), last_planned(str(tmp_path / "none"))) == (None, None)


class NoRay:
    """A delivery that fails the test if the plan asks the cluster anything."""

    def current_view(self, **_: object) -> None:
        raise AssertionError("the plan should not need the owners' positions here")


@pytest.mark.parametrize(
    ("offsets", "plan"),
    [
        ([], "fresh"),  # never ran a batch: the partitions may start serving empty
        ([0], "resume"),  # batch 0 planned, stopped before its commit: it comes again; no "start empty"
    ],
)
def test_nothing_committed_is_fresh_only_if_nothing_was_planned(tmp_path: Path, offsets: list[int], plan: str) -> None:
    assert plan_start(NoRay(), make(tmp_path, offsets=offsets, commits=[])) == plan  # type: ignore[arg-type]


def test_a_superseded_checkpoint_is_kept_aside(tmp_path: Path) -> None:
    cp = make(tmp_path, offsets=[0], commits=[0])
    moved = supersede(cp)
    assert not Path(cp).exists() and moved.name.startswith("cp.superseded-") and (moved / "metadata").exists()


def test_only_the_newest_superseded_checkpoints_of_one_are_kept(tmp_path: Path) -> None:
    """Each rebuild set the whole checkpoint aside, Spark's state with it, and none was ever deleted."""
    from topologies.checkpoint import SUPERSEDED_KEPT

    other = make(tmp_path / "other", offsets=[0], commits=[0])
    supersede(other)
    moved = []
    for _ in range(SUPERSEDED_KEPT + 3):
        cp = make(tmp_path, offsets=[0], commits=[0])
        moved.append(supersede(cp))
    left = sorted(tmp_path.glob("cp.superseded-*"))
    assert left == moved[-SUPERSEDED_KEPT:] and all((p / "metadata").exists() for p in left)
    assert len(list((tmp_path / "other").glob("cp.superseded-*"))) == 1  # another checkpoint's are its own
    # A clock stepped back: the one just made sorts first, and is kept all the same.
    for day in range(1, SUPERSEDED_KEPT + 1):
        (tmp_path / f"cp.superseded-299901{day:02d}T000000000000Z").mkdir()
    newest = supersede(make(tmp_path, offsets=[0], commits=[0]))
    assert newest.exists() and len(list(tmp_path.glob("cp.superseded-*"))) == SUPERSEDED_KEPT


def _pos(source: str, batch: int, state: str = "serving") -> dict[str, object]:
    return {"source": source, "batch_id": batch, "state": state}


def test_a_partition_needs_a_rebuild_only_when_none_of_its_copies_is_current() -> None:
    positions = {
        # partition 0: the active catches up from its peer, the standby is current: resume (it copies)
        # partition 1: both copies current; partition 2: only copies at another source or behind
        "a": {0: _pos("q", 3, "catching-up"), 1: _pos("q", 7), 2: _pos("old", 9)},
        "b": {0: _pos("q", 7), 1: _pos("q", 8), 2: _pos("q", 6)},
    }
    assert partitions_without_a_current_copy(positions, "q", 7) == [2]
    positions["a"][2] = _pos("q", 7, "incomplete")
    assert partitions_without_a_current_copy(positions, "q", 7) == [2]  # incomplete proves nothing
    positions["b"][2] = _pos("q", 7)
    assert partitions_without_a_current_copy(positions, "q", 7) == []
    positions["b"][2] = _pos("q", 7, "rebuilding")  # held for the watermark: the batch Spark runs next serves it
    assert partitions_without_a_current_copy(positions, "q", 7) == []
    # ...in a running query. A query started again runs no batch until new input: at a start it is behind.
    assert partitions_without_a_current_copy(positions, "q", 7, rebuilding_current=False) == [2]


def test_a_start_rebuilds_again_a_store_whose_only_current_copy_waits_for_the_watermark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from topologies import sink

    cp = make(tmp_path, offsets=[0, 1], commits=[0, 1])
    copies = {"a": {0: _pos("query-1", 1, "rebuilding")}, "b": {0: _pos("query-1", 0, "incomplete")}}
    monkeypatch.setattr(sink, "_copies_positions", lambda *_, **__: copies)
    delivery = type("Delivery", (), {"spec": type("Spec", (), {"name": "sessions"})()})()
    assert plan_start(delivery, cp) == "rebuild"  # nothing pending: Spark would run no batch to release it
    pending = make(tmp_path / "pending", offsets=[0, 1, 2], commits=[0, 1])
    assert plan_start(delivery, pending) == "resume"  # batch 2 runs again at the start, with a watermark
    copies["a"][0] = _pos("query-1", 1)
    assert plan_start(delivery, cp) == "resume"


def test_a_store_ahead_of_its_checkpoint_is_rebuilt_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's checkpoint files are not fsynced: after a machine crash its last offsets and commits may be
    gone while the partitions (synced) hold those batches. Resumed, Spark plans those batch ids again with
    other records and the copies skip them as replays: lost. A copy past the last planned batch of the
    checkpoint's source means exactly that: rebuild."""
    from topologies import sink

    cp = make(tmp_path, offsets=[0, 1, 2], commits=[0, 1])
    copies = {"a": {0: _pos("query-1", 2), 1: _pos("query-1", 4)}, "b": {0: _pos("query-1", 2), 1: _pos("old", 9)}}
    monkeypatch.setattr(sink, "_copies_positions", lambda *_, **__: copies)
    delivery = type("Delivery", (), {"spec": type("Spec", (), {"name": "s"})()})()
    assert plan_start(delivery, cp) == "rebuild"  # partition 1 is at batch 4; the checkpoint planned up to 2
    copies["a"][1] = _pos(
        "query-1", 2
    )  # batch 2 planned, not committed: a copy may have it; another source's 9 is no matter
    assert plan_start(delivery, cp) == "resume"


def _offsets(cp: str, batch_id: int, watermark: object) -> None:
    entry = json.dumps({"batchWatermarkMs": watermark, "batchTimestampMs": 1, "conf": {}})
    (Path(cp) / "offsets" / str(batch_id)).write_text(f'v1\n{entry}\n{{"logOffset":{batch_id}}}')


def test_the_watermark_each_batch_runs_with_is_read_from_the_offset_log(tmp_path: Path) -> None:
    cp = make(tmp_path, offsets=[0, 1, 2], commits=[0, 1])
    _offsets(cp, 0, 0)
    _offsets(cp, 1, 1_700_000_595_000)
    assert (batch_watermark(cp, 0), batch_watermark(cp, 1)) == (0, 1_700_000_595_000)
    assert batch_watermark(cp, 2) is None and batch_watermark(cp, 9) is None  # unreadable, missing: unknown
    _offsets(cp, 2, "soon")
    assert batch_watermark(cp, 2) is None


def test_a_rebuild_is_pending_from_before_its_checkpoint_is_set_aside_until_its_first_batch(tmp_path: Path) -> None:
    cp = make(tmp_path, offsets=[0], commits=[0])
    assert not rebuild_pending(cp)
    mark_rebuild_pending(cp)
    supersede(cp)  # ...and the start dies here: the next one finds an empty checkpoint, and knows
    assert rebuild_pending(cp) and last_planned(cp) is None
    rebuild_delivered(cp)
    rebuild_delivered(cp)  # idempotent
    assert not rebuild_pending(cp)


def test_a_delivery_sends_each_batch_of_a_held_store_with_its_watermark(tmp_path: Path) -> None:
    from runtime.catalog import StoreSpec, ValueField
    from runtime.keys import KeySchema
    from topologies.delivery import BatchDelivery

    cp = make(tmp_path, offsets=[0, 1], commits=[0])
    _offsets(cp, 0, 0)
    _offsets(cp, 1, 7_000)
    spec = StoreSpec("s", KeySchema("key", "string"), (ValueField("n", "long"),))
    delivery = BatchDelivery(spec, "ns", cp, feeder=object())  # type: ignore[arg-type]
    assert delivery.hold(1) is None  # an update-mode store: nothing held
    delivery.holds = True
    assert (delivery.hold(0), delivery.hold(1)) == (Hold(0), Hold(7_000))
    assert delivery.hold(5) == Hold(0)  # no entry to read: no evidence of a watermark


def test_a_resumed_feed_starts_from_the_batch_its_checkpoint_last_committed(tmp_path: Path) -> None:
    from topologies.sink import _resumed_at

    cp = make(tmp_path, offsets=[0, 1, 2], commits=[0, 1])
    # What GET /stores says before this run's first batch (none comes on an idle input): batch 1 of query-1.
    assert _resumed_at("resume", cp) == {"batch_id": 1, "source": "query-1"}
    assert _resumed_at("rebuild", cp) == {} and _resumed_at("fresh", cp) == {}
    assert _resumed_at("resume", make(tmp_path / "none", offsets=[0], commits=[])) == {}
