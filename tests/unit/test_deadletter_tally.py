"""The dead-letter total a topology reports: its files read once at start, then kept by each batch's file
(a replay's file replaces its count), without reading every earlier file again at every batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from topologies import deadletter
from topologies.deadletter import _Tally, _write_batch


def write(directory: Path, name: str, lines: int) -> int:
    return _write_batch(directory, name, iter(f'{{"n": {i}}}' for i in range(lines)))


def test_the_total_counts_earlier_runs_files_and_follows_each_batch_replays_included(tmp_path: Path) -> None:
    write(tmp_path, "w1-run0-000000000000.jsonl", 3)  # an earlier run of this writer
    write(tmp_path, "w2-run0-000000000000.jsonl", 5)  # another consumer's: not this writer's
    tally = _Tally(tmp_path, "w1")
    assert tally.total == 3
    assert tally.wrote("w1-run1-000000000000.jsonl", write(tmp_path, "w1-run1-000000000000.jsonl", 2)) == 5
    assert tally.wrote("w1-run1-000000000001.jsonl", write(tmp_path, "w1-run1-000000000001.jsonl", 0)) == 5
    # Batch 0 replayed after a restart of the query: its file is written again, not counted twice.
    assert tally.wrote("w1-run1-000000000000.jsonl", write(tmp_path, "w1-run1-000000000000.jsonl", 2)) == 5
    assert sum(1 for p in tmp_path.glob("w1-*.jsonl") for line in p.read_text().splitlines() if line) == 5


def test_a_batch_reads_no_earlier_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(20):
        write(tmp_path, f"w1-run0-{n:012d}.jsonl", 1)
    tally = _Tally(tmp_path, "w1")
    opened: list[Path] = []
    real = deadletter._lines_in
    monkeypatch.setattr(deadletter, "_lines_in", lambda path: opened.append(path) or real(path))
    assert tally.wrote("w1-run0-000000000020.jsonl", write(tmp_path, "w1-run0-000000000020.jsonl", 4)) == 24
    assert opened == []
