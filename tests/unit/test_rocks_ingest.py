"""The rocksdb engine's large batches: written as one SST file that RocksDB ingests, they give the state a
write batch gives (rows, deletes, count, position, after a reopen too), and a copy of the partition in the
same state ingests the file its peer wrote instead of writing the rows again."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

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


def _ingestions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """From now on, the rows' file of every ingestion (of any engine), in order."""
    ingest = rocks.RocksEngine._ingest_files
    files: list[Path] = []

    def counted(self: RocksEngine, rows_path: Path, *rest: Any) -> None:
        files.append(rows_path)
        ingest(self, rows_path, *rest)

    monkeypatch.setattr(rocks.RocksEngine, "_ingest_files", counted)
    return files


def _files_per_level(engine: RocksEngine) -> list[int]:
    """RocksDB's table files at each level, 0 to 6 (its ``rocksdb.levelstats``)."""
    lines = (engine.db.property_value("rocksdb.levelstats") or "").splitlines()[2:]
    return [int(line.split()[1]) for line in lines]


def test_the_rows_files_of_new_keys_go_to_the_bottom_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The metadata key is in every batch, so it has a file of its own: a rows' file of keys new to the
    partition overlaps nothing and goes straight to the bottom level, never through level 0 and the
    compactions that would rewrite the partition there."""
    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", 1)
    engine = RocksEngine(SPEC.key, tmp_path / "p")
    try:
        for i in range(6):
            keys = [f"k{i:02}-{j:03}" for j in range(50)]
            engine.apply(Position("s", i), BatchRows(SPEC, pa.table({"key": keys, "value": ["v"] * 50})))
        levels = _files_per_level(engine)
        assert len(levels) == 7 and levels[6] >= 6, levels  # every rows' file (and the first metadata one)
        assert engine.count() == 300 and engine.position() == Position("s", 5)
    finally:
        engine.close()


def test_a_batch_written_as_a_file_gives_the_state_a_write_batch_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_batch, by_file = RocksEngine(SPEC.key, tmp_path / "batch"), RocksEngine(SPEC.key, tmp_path / "file")
    files = _ingestions(monkeypatch)
    _apply_all(by_batch, monkeypatch, 10**9)
    assert files == []
    _apply_all(by_file, monkeypatch, 1)
    assert len(files) == len(BATCHES)
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
        # The same slice with its rows, for another batch than the file's: the rows are applied.
        later = RocksEngine(SPEC.key, tmp_path / "later")
        later.apply(Position("s", 0), BatchRows(SPEC, BATCHES[0]))
        took = rocks.RocksEngine._ingest_copy
        taken: list[bool] = []

        def spied(self: RocksEngine, position: Position, rows: BatchRows) -> bool:
            taken.append(took(self, position, rows))
            return taken[-1]

        monkeypatch.setattr(rocks.RocksEngine, "_ingest_copy", spied)
        later.apply(Position("s", 2), BatchRows(SPEC, shared))
        assert taken == [False]
        assert _state(later)[:2] == _state(peer)[:2] and later.position() == Position("s", 2)
        later.close()
    finally:
        copy.close()
        peer.close()


def test_a_peers_file_deletes_every_key_the_batch_deletes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' file holds a tombstone for every delete of the batch, not only for the keys its writer
    held: the rows a file gives do not depend on the writer's rows (the count does, hence the check of
    position and count before a copy takes a peer's file)."""
    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", 1)
    writer, taker = RocksEngine(SPEC.key, tmp_path / "writer"), RocksEngine(SPEC.key, tmp_path / "taker")
    try:
        writer.apply(Position("s", 0), BatchRows(SPEC, pa.table({"key": ["a"], "value": ["1"]})))
        taker.apply(Position("s", 0), BatchRows(SPEC, pa.table({"key": ["y"], "value": ["1"]})))
        rows = BatchRows(SPEC, pa.table({"key": ["b", "y"], "value": ["2", None]}))
        encoded = rows.shareable()
        rows.share_written = True
        writer.apply(Position("s", 1), rows)
        assert encoded is not None and rows.written is not None and writer.get("y") is None
        empty = pa.array([], pa.binary())
        taker.apply(Position("s", 1), BatchRows(SPEC, EncodedSlice(empty, empty, 0, written=rows.written)))
        assert taker.get("y") is None and taker.get("b") == writer.get("b")
    finally:
        writer.close()
        taker.close()


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


# Applies batches until killed (``run``), or dies at a fixed point of its first one: just after the rows'
# file is written (``written``) or just after RocksDB ingested it, before the engine moves its own count
# and position (``ingested``).
_CHILD = """
import os, sys
from pathlib import Path
import pyarrow as pa
from runtime.batchrows import BatchRows
from runtime.catalog import StoreSpec, ValueField
from runtime.engines import Position, rocks
from runtime.engines.rocks import RocksEngine
from runtime.keys import KeySchema

mode = sys.argv[2]
if mode == "written":
    real_writer = rocks.SstFileWriter

    class DyingWriter:
        def __init__(self, options):
            self.inner, self.path = real_writer(options), ""
        def open(self, path):
            self.path = path
            self.inner.open(path)
        def __setitem__(self, key, value):
            self.inner[key] = value
        def __delitem__(self, key):
            del self.inner[key]
        def finish(self):
            self.inner.finish()
            if self.path.endswith("-rows.sst"):
                os._exit(9)

    rocks.SstFileWriter = DyingWriter
elif mode == "ingested":
    real_ingest = rocks.RocksEngine._ingest_files

    def dying_ingest(self, *args):
        real_ingest(self, *args)
        os._exit(9)

    rocks.RocksEngine._ingest_files = dying_ingest
spec = StoreSpec("s", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=1, actors=1)
engine = RocksEngine(spec.key, Path(sys.argv[1]))
start = engine.position().batch_id + 1
print("ready", flush=True)
for i in range(start, start + (1000 if mode == "run" else 1)):
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
    for attempt in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), "run"], stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        # The first process is let apply a batch before its kill, however slow the machine is: the kills are
        # then sure to land after some batches, not only before the first.
        first = child.stdout.readline() if attempt == 0 else ""
        time.sleep(rng.uniform(0.1, 1.0))
        os.kill(child.pid, signal.SIGKILL)
        # Only whole lines were said: the kill can land between "applied" and its number.
        out = first + child.stdout.read()
        said = [int(m[1]) for m in re.finditer(r"^applied (\d+)\n", out, re.MULTILINE)]
        child.wait(timeout=30)
        last_said = max([last_said, *said])
        engine = RocksEngine(SPEC.key, path)
        try:
            k = engine.position().batch_id
            assert k >= last_said  # an apply that returned is durable
            rows = list(engine.scan(Scan()))
            assert engine.count() == len(rows) == (60_000 + 1_000 * k if k >= 0 else 0)
            assert {v for _, v in rows} <= {msgpack.packb(str(k))}  # every value is batch k's
        finally:
            engine.close()
    assert last_said >= 0  # the kills did land after some batches


def _reopened(path: Path) -> tuple[int, int, int]:
    """(position's batch id, count, rows) of the partition at ``path``, opened again."""
    engine = RocksEngine(SPEC.key, path)
    try:
        return engine.position().batch_id, engine.count(), len(list(engine.scan(Scan())))
    finally:
        engine.close()


def test_a_process_killed_at_each_step_of_an_ingestion_reopens_consistent(tmp_path: Path) -> None:
    """The two instants a random kill rarely hits: the rows' file written but not ingested (the partition
    reopens at the old batch, and the file is deleted), and the files ingested before the engine moved
    its own count and position (it reopens at the new batch: the metadata came in with the rows)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    path = tmp_path / "p"

    def child(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path), mode], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.stdout.startswith("ready"), done.stderr
        return done.returncode

    assert child("once") == 0  # batch 0, cleanly
    assert _reopened(path) == (0, 60_000, 60_000)
    assert child("written") == 9  # dies in batch 1, its rows' file written
    assert [f.name.endswith("-rows.sst") for f in (path / "ingest").iterdir()] == [True]
    assert _reopened(path) == (0, 60_000, 60_000)  # the old batch, whole
    assert not (path / "ingest").exists()  # removed as the engine opened
    assert child("ingested") == 9  # dies in batch 1, just after the ingestion
    assert _reopened(path) == (1, 61_000, 61_000)  # the new batch, whole


def test_a_batch_a_catching_up_copy_buffers_is_applied_later_sharing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby catching up from its peer buffers the batch the sink shares with it: what it hands back
    carries no file (it wrote none), and when the catch-up applies the buffered batch, the file it writes
    is not read back to share with anyone (its bytes are not kept)."""
    from runtime.partition import CATCHING_UP, SERVING
    from tests.unit.test_rebuild import Setup, batch

    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", 1)
    s = Setup("rocksdb", tmp_path)
    [result], shared = s.me.apply_sharing("q", 57, batch(57))
    assert result.state == CATCHING_UP and not result.applied
    assert isinstance(shared[0], EncodedSlice) and shared[0].written is None
    [(_, _, buffered)] = list(s.me.partitions[0]._buffer)
    assert isinstance(buffered, BatchRows) and not buffered.share_written

    def during_the_copy() -> None:  # the snapshot is at 56: the buffered 57 is applied after it
        s.peer_core.apply("q", 57, batch(57))
        s.both(58)

    s.peer.during_copy = during_the_copy
    files = _ingestions(monkeypatch)
    assert s.run() == "in-sync"
    assert s.me.positions()[0] == {"source": "q", "batch_id": 58, "state": SERVING}
    mine = [f for f in files if f.is_relative_to(tmp_path / "me")]
    assert len(mine) == 2  # the buffered 57 and 58 went into the copy as files
    assert buffered.written is None  # and 57's bytes were not read back to share
    assert s.contents(s.me) == s.contents(s.peer_core)


@pytest.mark.parametrize("walk_share", [0.0, 10.0**9], ids=["walked", "multi-got"])
@pytest.mark.parametrize("threshold", [1, 10**9], ids=["files", "write-batches"])
def test_the_count_is_exact_whether_presence_is_walked_or_multi_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walk_share: float, threshold: int
) -> None:
    """Random batches of puts and deletes (of present and absent keys) over a small key space, each
    batch's presence read by walking the partition or by one multi-get: the count and the rows match a
    plain dict's after every batch, and after a reopen."""
    import random

    monkeypatch.setattr(rocks, "WALK_SHARE", walk_share)
    monkeypatch.setattr(rocks, "INGEST_FILE_ROWS", threshold)
    walked: list[int] = []
    present = rocks.RocksEngine._present
    monkeypatch.setattr(
        rocks.RocksEngine, "_present", lambda self, keys: walked.append(len(keys)) or present(self, keys)
    )
    rng = random.Random(11)
    space = [f"k{i:03}" for i in range(200)]
    model: dict[str, str] = {}
    engine = RocksEngine(SPEC.key, tmp_path / "p")
    try:
        for batch_id in range(25):
            keys = rng.sample(space, rng.choice([1, 5, 40, 150, 200]))
            values = [None if rng.random() < 0.3 else f"v{batch_id}-{k}" for k in keys]
            engine.apply(Position("s", batch_id), BatchRows(SPEC, pa.table({"key": keys, "value": values})))
            for k, v in zip(keys, values):
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
            assert engine.count() == len(model), batch_id
        assert {k: msgpack.unpackb(v) for k, v in engine.scan(Scan())} == model
        assert len(walked) >= 20  # the presence was read for every batch after the partition had rows
    finally:
        engine.close()
    reopened = RocksEngine(SPEC.key, tmp_path / "p")
    try:
        assert reopened.count() == len(model) and reopened.position() == Position("s", 24)
    finally:
        reopened.close()


def test_presence_is_walked_for_a_batch_of_many_keys_and_multi_got_for_a_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = RocksEngine(SPEC.key, tmp_path / "p")
    multi_gets: list[int] = []
    multi_get = rocks.RocksEngine._multi_get
    monkeypatch.setattr(
        rocks.RocksEngine, "_multi_get", lambda self, keys: multi_gets.append(len(keys)) or multi_get(self, keys)
    )
    try:
        engine.apply(Position("s", 0), BatchRows(SPEC, pa.table({"key": KEYS, "value": ["a"] * 60})))
        assert multi_gets == []  # an empty partition: nothing to read
        engine.apply(Position("s", 1), BatchRows(SPEC, pa.table({"key": KEYS[:5], "value": ["b"] * 5})))
        assert multi_gets == [5]  # 5 of 60 keys: below WALK_SHARE, one multi-get
        engine.apply(Position("s", 2), BatchRows(SPEC, pa.table({"key": [*KEYS[10:40], "new"], "value": ["c"] * 31})))
        assert multi_gets == [5]  # 31 of 60: walked
        assert engine.count() == 61
    finally:
        engine.close()
