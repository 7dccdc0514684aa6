"""What a checkpoint says, and how a store's query starts from it when nothing was committed yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies.checkpoint import last_committed, last_planned, query_id, supersede
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
