"""Late rows (``topologies.lateness``): the total kept in a checkpoint, counted once a batch, and the
listener's handling of Spark's progress events, with fakes of the py4j objects Spark hands it. The
listener on a real Spark query, fed a late order, is in tests/integration/test_topologies.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from topologies.lateness import LATE_ROWS_FILE, LateCount, _Listener, _Watched


def test_the_total_outlives_a_restart_and_counts_each_batch_once(tmp_path: Path) -> None:
    path = tmp_path / LATE_ROWS_FILE
    count = LateCount(path, "q1")
    assert (count.total, count.batch) == (0, -1) and not path.exists()
    assert not count.add(0, 0) and not path.exists()  # nothing dropped: nothing written
    assert count.add(1, 3) and count.add(2, 2)
    assert not count.add(2, 2) and not count.add(1, 5)  # a batch seen before is not counted again
    assert json.loads(path.read_text()) == {"query": "q1", "batch": 2, "total": 5}
    again = LateCount(path, "q1")  # the topology started again on its checkpoint
    assert (again.total, again.batch) == (5, 2)
    assert not again.add(2, 2) and again.add(3, 1) and again.total == 6
    assert [p.name for p in tmp_path.iterdir()] == [LATE_ROWS_FILE]  # no temporary file left


def test_a_file_of_another_query_or_unreadable_counts_as_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / LATE_ROWS_FILE
    path.write_text(json.dumps({"query": "old", "batch": 57, "total": 9}))  # an old run's, set aside since
    count = LateCount(path, "new")
    assert (count.total, count.batch) == (0, -1)
    assert count.add(0, 1)  # the new query's batch 0 is not mistaken for one counted
    assert json.loads(path.read_text()) == {"query": "new", "batch": 0, "total": 1}
    path.write_text("{torn")
    with caplog.at_level(logging.WARNING):
        assert LateCount(path, "new").total == 0
    assert "cannot read" in caplog.text


class FakeOp:
    def __init__(self, dropped: int) -> None:
        self.dropped = dropped

    def numRowsDroppedByWatermark(self) -> int:  # noqa: N802 (Spark's name)
        return self.dropped


class FakeProgress:
    def __init__(self, query: str, batch: int, *dropped: int) -> None:
        self.query, self.batch, self.ops = query, batch, [FakeOp(d) for d in dropped]

    def id(self) -> str:
        return self.query

    def batchId(self) -> int:  # noqa: N802
        return self.batch

    def stateOperators(self) -> list[FakeOp]:  # noqa: N802
        return self.ops


class FakeEvent:
    def __init__(self, progress: Any) -> None:
        self._progress = progress

    def progress(self) -> Any:
        return self._progress


class Told:
    def __init__(self) -> None:
        self.said: list[tuple[str, int]] = []

    def late_rows(self, store: str, total: int) -> None:
        self.said.append((store, total))


def test_the_listener_counts_its_stores_queries_only(tmp_path: Path) -> None:
    listener, told = _Listener(), Told()
    listener.watch("q1", _Watched("s", LateCount(tmp_path / "s.json", "q1"), told))
    listener.onQueryProgress(FakeEvent(FakeProgress("q1", 0, 2, 1)))  # two stateful operators: summed
    listener.onQueryProgress(FakeEvent(FakeProgress("q1", 1)))  # a stateless batch: nothing to add
    listener.onQueryProgress(FakeEvent(FakeProgress("other", 2, 5)))  # a dead-letter query, say: not ours
    listener.onQueryProgress(FakeEvent(FakeProgress("q1", 2, 0)))
    assert told.said == [("s", 3)]
    # The store's query set aside (a rebuild) and started anew: the old query's late events are ignored.
    listener.watch("q2", _Watched("s", LateCount(tmp_path / "s.json", "q2"), told))
    listener.onQueryProgress(FakeEvent(FakeProgress("q1", 3, 4)))
    listener.onQueryProgress(FakeEvent(FakeProgress("q2", 0, 1)))
    assert told.said == [("s", 3), ("s", 1)]


def test_the_listener_never_raises_into_spark(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    listener, told = _Listener(), Told()
    listener.watch("q1", _Watched("s", LateCount(tmp_path / "s.json", "q1"), told))

    class Broken:
        def progress(self) -> Any:
            raise RuntimeError("py4j: the JVM is gone")

    with caplog.at_level(logging.WARNING):
        listener.onQueryProgress(Broken())
    assert "could not count a progress event" in caplog.text and told.said == []


def test_a_stream_of_late_rows_is_logged_once_a_minute(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    listener, told = _Listener(), Told()
    listener.watch("q1", _Watched("s", LateCount(tmp_path / "s.json", "q1"), told))
    with caplog.at_level(logging.WARNING, logger="topologies.lateness"):
        for batch in range(5):
            listener.onQueryProgress(FakeEvent(FakeProgress("q1", batch, 1)))
    assert told.said == [("s", n) for n in range(1, 6)]  # every change is reported
    assert [r.getMessage() for r in caplog.records] == [
        "store s: input rows later than the event-time watermark were dropped, 1 in this batch, 1 in all "
        "(riqr_late_rows_dropped_total)"
    ]
