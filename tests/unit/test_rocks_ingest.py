"""The rocksdb engine's large batches: written as one SST file that RocksDB ingests, they give the state a
write batch gives (rows, deletes, count, position, after a reopen too), and a copy of the partition in the
same state ingests the file its peer wrote instead of writing the rows again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgpack
import pyarrow as pa
import pytest

from runtime.batchrows import BatchRows, EncodedSlice, WrittenFile
from runtime.catalog import StoreSpec, ValueField
from runtime.engines import Position, rocks
from runtime.engines.rocks import RocksEngine
from runtime.keys import KeySchema
from runtime.query import QueryCore
from runtime.scan import Scan

SPEC = StoreSpec("s", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=1, actors=1)
KEYS = [f"k{i:03}" for i in range(60)]

# Fresh puts; then updates, new keys, deletes of present and absent keys and a key written twice; then
# deletes only.
BATCHES = [
    pa.table({"key": KEYS[:40], "value": [f"a{i}" for i in range(40)]}),
    pa.table(
        {
            "key": [*KEYS[30:50], "k001", "k002", "zz-absent", "k045", None],
            "value": [*(f"b{i}" for i in range(20)), None, None, None, "last", "x"],
        }
    ),
    pa.table({"key": ["k003", "k004", "nope"], "value": [None, None, None]}),
]


def _state(engine: RocksEngine) -> tuple[list[tuple[object, bytes]], int, Position]:
    return list(engine.scan(Scan())), engine.count(), engine.position()


def _apply_all(engine: RocksEngine, monkeypatch: pytest.MonkeyPatch, threshold: int) -> None:
    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", threshold)
    for i, table in enumerate(BATCHES):
        engine.apply(Position("s", i), BatchRows(SPEC, table))


def test_a_batch_written_as_a_file_gives_the_state_a_write_batch_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_batch, by_file = RocksEngine(SPEC.key, tmp_path / "batch"), RocksEngine(SPEC.key, tmp_path / "file")
    _apply_all(by_batch, monkeypatch, 10**9)
    _apply_all(by_file, monkeypatch, 1)
    expected = _state(by_batch)
    rows, count, position = expected
    assert count == len(rows) == 46 and position == Position("s", 2)
    assert dict(rows)["k045"] == by_batch.get("k045") and by_batch.get("k001") is None
    assert _state(by_file) == expected
    assert by_file.get_many(["k045", "k001", "k039"]) == by_batch.get_many(["k045", "k001", "k039"])
    by_file.close()
    reopened = RocksEngine(SPEC.key, tmp_path / "file")  # durable: the files were ingested, not left aside
    try:
        assert _state(reopened) == expected
        assert not list((tmp_path / "file" / "ingest").glob("*"))
        # A new source's batch 0 after a reset, as a file: only that batch's rows.
        reopened.reset(Position("t", -1))
        reopened.apply(Position("t", 0), BatchRows(SPEC, BATCHES[0]))
        assert reopened.count() == 40 and reopened.position() == Position("t", 0)
        assert reopened.get("k045") is None and reopened.get("k000") is not None
    finally:
        reopened.close()
        by_batch.close()


def test_a_file_a_crash_left_before_its_ingestion_is_removed_at_open(tmp_path: Path) -> None:
    engine = RocksEngine(SPEC.key, tmp_path / "p")
    engine.close()
    leftover = tmp_path / "p" / "ingest" / "7-dead.sst"
    leftover.parent.mkdir()
    leftover.write_bytes(b"half a file")
    RocksEngine(SPEC.key, tmp_path / "p").close()
    assert not leftover.exists()


def _written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RocksEngine, EncodedSlice]:
    """A partition after batches 0 and 1, and batch 1 as its copies get it: encoded, with the file."""
    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", 1)
    peer = RocksEngine(SPEC.key, tmp_path / "peer")
    peer.apply(Position("s", 0), BatchRows(SPEC, BATCHES[0]))
    rows = BatchRows(SPEC, BATCHES[1])
    encoded = rows.shareable()
    rows.share_written = True
    peer.apply(Position("s", 1), rows)
    assert encoded is not None and rows.written is not None
    assert rows.written.before == ("s", 0, 40) and rows.written.after == ("s", 1, peer.count())
    return peer, dataclasses.replace(encoded, written=rows.written)


def test_a_copy_where_its_peer_was_ingests_the_file_the_peer_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peer, shared = _written(tmp_path, monkeypatch)
    copy = RocksEngine(SPEC.key, tmp_path / "copy")
    try:
        copy.apply(Position("s", 0), BatchRows(SPEC, BATCHES[0]))
        # No rows besides the file: what the copy ends with can only have come from the file.
        empty = pa.array([], pa.binary())
        assert shared.written is not None
        copy.apply(Position("s", 1), BatchRows(SPEC, EncodedSlice(empty, empty, 0, written=shared.written)))
        assert _state(copy) == _state(peer)
        # The same slice with its rows, for the next batch's position: not where the file was made, so the
        # rows are applied (and give the same state).
        later = RocksEngine(SPEC.key, tmp_path / "later")
        later.apply(Position("s", 0), BatchRows(SPEC, BATCHES[0]))
        later.apply(Position("s", 1), BatchRows(SPEC, shared))
        assert _state(later) == _state(peer)
        later.close()
    finally:
        copy.close()
        peer.close()


def test_a_copy_in_another_state_applies_the_rows_not_its_peers_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peer, shared = _written(tmp_path, monkeypatch)
    diverged = RocksEngine(SPEC.key, tmp_path / "diverged")
    try:
        extra = pa.table({"key": [*KEYS[:40], "extra"], "value": [*(f"a{i}" for i in range(40)), "e"]})
        diverged.apply(Position("s", 0), BatchRows(SPEC, extra))
        diverged.apply(Position("s", 1), BatchRows(SPEC, shared))
        assert diverged.count() == peer.count() + 1  # its own count, not the one the peer's file holds
        assert diverged.get("extra") is not None
        rows, _, _ = _state(peer)
        assert [(k, v) for k, v in _state(diverged)[0] if k != "extra"] == rows
    finally:
        diverged.close()
        peer.close()


def test_apply_sharing_hands_over_the_file_of_a_large_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", 30)
    spec = dataclasses.replace(SPEC, engine="rocksdb")
    core = QueryCore(spec, [0], directory=tmp_path)
    try:
        core.begin("s")
        _, shared = core.apply_sharing("s", 0, {0: BATCHES[0]})
        large = shared[0]
        assert isinstance(large, EncodedSlice) and isinstance(large.written, WrittenFile)
        assert large.written.after == ("s", 0, 40)
        other = QueryCore(spec, [0], directory=tmp_path / "other")  # the partition's other copy
        other.begin("s")
        [result] = other.apply("s", 0, {0: large})
        assert result.applied and result.rows == 40
        assert other.get_many([(0, "k039")])[0] == core.get_many([(0, "k039")])[0]
        assert other.metrics.value("riqr_batches_ingested_from_copy_total", store="s", partition="0") == 1
        assert core.metrics.value("riqr_batches_ingested_from_copy_total", store="s", partition="0") == 0
        other.close()
        _, shared = core.apply_sharing("s", 1, {0: BATCHES[2]})  # 3 rows: a write batch, no file
        assert isinstance(shared[0], EncodedSlice) and shared[0].written is None
    finally:
        core.close()


_CHILD = """
import sys
from pathlib import Path
import pyarrow as pa
from runtime.batchrows import BatchRows
from runtime.catalog import StoreSpec, ValueField
from runtime.engines import Position
from runtime.engines.rocks import RocksEngine
from runtime.keys import KeySchema

spec = StoreSpec("s", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=1, actors=1)
engine = RocksEngine(spec.key, Path(sys.argv[1]))
start = engine.position().batch_id + 1
print("ready", flush=True)
for i in range(start, start + 1000):
    n = 60_000 + 1_000 * i  # batch i: keys 0 .. n-1, every value i (so the count grows by 1,000)
    table = pa.table({"key": [f"k{j:07}" for j in range(n)], "value": [str(i)] * n})
    engine.apply(Position("s", i), BatchRows(spec, table))
    print("applied", i, flush=True)
"""


def test_a_process_killed_while_it_ingests_files_reopens_at_the_old_batch_or_the_new(tmp_path: Path) -> None:
    """SIGKILL at random instants of a process applying large batches (each an SST file ingested): the
    partition reopens at some batch k with exactly batch k's rows, count and position, never a mix, never
    behind a batch the process said it applied; and the next process goes on from there."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "p"
    env = {**os.environ, "PYTHONPATH": str(root)}
    rng = random.Random(11)
    last_said = -1
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.1, 1.0))
        os.kill(child.pid, signal.SIGKILL)
        said = [int(line.split()[1]) for line in child.stdout.read().splitlines() if line.startswith("applied")]
        child.wait(timeout=30)
        last_said = max([last_said, *said])
        engine = RocksEngine(SPEC.key, path)
        try:
            k = engine.position().batch_id
            assert k >= last_said  # an apply that returned is durable
            rows = list(engine.scan(Scan()))
            assert engine.count() == len(rows) == (60_000 + 1_000 * k if k >= 0 else 0)
            assert {v for _, v in rows} <= {msgpack.packb(str(k))}  # every value is batch k's
            assert not list((path / "ingest").glob("*"))
        finally:
            engine.close()
    assert last_said >= 0  # the kills did land after some batches
