"""The memory engine's own durability: snapshots rolling over, and restarts at each step of a roll."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from runtime.engines import Position
from runtime.engines.memory import MemoryEngine
from runtime.keys import KeySchema
from runtime.scan import Scan

LONG_KEY = KeySchema("k", "long")


def _fill(engine: MemoryEngine, batches: int) -> dict[int, bytes]:
    rng = random.Random(7)
    model: dict[int, bytes] = {}
    for batch_id in range(batches):
        rows: list[tuple[int, bytes | None]] = [
            (rng.randrange(100), None if rng.random() < 0.2 else bytes([batch_id])) for _ in range(20)
        ]
        for key, value in rows:
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        engine.apply(Position("q", batch_id), rows)
    return model


def test_snapshots_roll_and_keep_one_generation(tmp_path: Path) -> None:
    engine = MemoryEngine(LONG_KEY, tmp_path / "p", snapshot_records=4, snapshot_rows=10**9)
    model = _fill(engine, 22)
    engine.close()
    names = sorted(f.name for f in (tmp_path / "p").iterdir())
    assert names == ["changelog-000000000005.log", "riqr-engine.json", "snapshot-000000000005.bin"]
    reopened = MemoryEngine(LONG_KEY, tmp_path / "p")
    assert reopened.position() == Position("q", 21)
    assert list(reopened.scan(Scan())) == sorted(model.items())


def test_row_threshold_follows_the_store_size(tmp_path: Path) -> None:
    engine = MemoryEngine(LONG_KEY, tmp_path / "p", snapshot_records=10**9, snapshot_rows=50)
    engine.apply(Position("q", 0), [(k, b"v") for k in range(49)])
    assert not list((tmp_path / "p").glob("snapshot-*"))
    engine.apply(Position("q", 1), [(1000, b"v")])  # 50 rows logged, store 50 keys: max(50, 25) reached
    assert [f.name for f in (tmp_path / "p").glob("snapshot-*")] == ["snapshot-000000000001.bin"]
    engine.close()


def test_a_crash_between_snapshot_and_new_changelog_reopens_at_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "p"
    engine = MemoryEngine(LONG_KEY, path, snapshot_records=3)
    model = _fill(engine, 6)  # batches 2 and 5 rolled: generation 2, an empty changelog
    engine.close()
    # Rewind to the moment after snapshot 2 was renamed into place: the new changelog not yet created,
    # the previous generation's files not yet deleted, a temporary snapshot left over.
    (path / "changelog-000000000002.log").unlink()
    (path / "changelog-000000000001.log").write_bytes(b"")
    (path / ".snapshot-000000000003.bin.tmp").write_bytes(b"half a snapshot")
    reopened = MemoryEngine(LONG_KEY, path)
    assert reopened.position() == Position("q", 5) and list(reopened.scan(Scan())) == sorted(model.items())
    assert sorted(f.name for f in path.iterdir()) == [
        "changelog-000000000002.log",
        "riqr-engine.json",
        "snapshot-000000000002.bin",
    ]
    reopened.apply(Position("q", 6), [(5, b"x")])
    reopened.close()
    assert MemoryEngine(LONG_KEY, path).get(5) == b"x"


def test_without_a_directory_nothing_is_written_but_checkpoint_works(tmp_path: Path) -> None:
    engine = MemoryEngine(LONG_KEY)
    engine.apply(Position("q", 0), [(1, b"1")])
    engine.reset(Position("q2", -1))
    engine.apply(Position("q2", 0), [(2, b"2")])
    assert engine.checkpoint(tmp_path / "copy") == Position("q2", 0)
    assert list(MemoryEngine(LONG_KEY, tmp_path / "copy").scan(Scan())) == [(2, b"2")]


@pytest.mark.parametrize("fails", ["changelog", "snapshot", "directory"])
def test_a_failed_roll_leaves_no_snapshot_that_a_restart_would_take_over_later_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """A roll whose new changelog could not be made (EMFILE) left its snapshot in place while the batches
    after it went into the old changelog, acknowledged; a restart takes the newest snapshot and deletes the
    older changelog: those batches were gone (a write-path review). Whatever step fails, a restart now
    reopens at the last batch applied."""
    import errno
    import os

    import runtime.engines.memory as memory

    path = tmp_path / "p"
    engine = MemoryEngine(LONG_KEY, path, snapshot_records=3, snapshot_rows=10**9)
    engine.apply(Position("q", 0), [(0, b"a")])
    engine.apply(Position("q", 1), [(1, b"b")])
    real_open, real_fsync_directory = os.open, memory.fsync_directory

    def broken_open(where: object, flags: int, *args: object) -> int:
        if "changelog-000000000001" in str(where):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(where, flags, *args)  # type: ignore[arg-type]

    def broken_fsync(where: Path) -> None:
        if any(f.name.startswith("snapshot-000000000001") for f in where.iterdir()):
            raise OSError(errno.EIO, "I/O error")
        real_fsync_directory(where)

    if fails == "changelog":
        monkeypatch.setattr(os, "open", broken_open)
    elif fails == "snapshot":
        monkeypatch.setattr(
            memory, "_write_snapshot_lists", lambda *_: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
        )
    else:
        monkeypatch.setattr(memory, "fsync_directory", broken_fsync)
    engine.apply(Position("q", 2), [(2, b"c")])  # the roll fails: logged, the apply is in the changelog
    assert not (path / "snapshot-000000000001.bin").exists()
    engine.apply(Position("q", 3), [(3, b"d")])  # and a second time, still failing
    monkeypatch.undo()
    engine.apply(Position("q", 4), [(4, b"e")])
    reopened = MemoryEngine(LONG_KEY, path)  # the actor restarts
    assert reopened.position() == Position("q", 4)
    assert [k for k, _ in reopened.scan(Scan())] == [0, 1, 2, 3, 4]


def _written(tmp_path: Path, batches: int, value: bytes = b"v") -> Path:
    """A closed partition of ``batches`` applies, one row each; its changelog."""
    engine = MemoryEngine(LONG_KEY, tmp_path / "p", snapshot_records=100)
    for batch_id in range(batches):
        engine.apply(Position("q", batch_id), [(batch_id, value)])
    engine.close()
    (changelog,) = (tmp_path / "p").glob("changelog-*.log")
    return changelog


def _records(changelog: Path) -> list[int]:
    """Where each record of a changelog starts."""
    data, at, starts = changelog.read_bytes(), 0, []
    while at < len(data):
        starts.append(at)
        at += 8 + int.from_bytes(data[at : at + 4], "big")
    return starts


def test_a_damaged_record_with_records_after_it_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """A changelog whose bad record was followed by good ones was truncated like a torn tail: the
    partition reopened batches behind, with no word of it, and served as if it had never acknowledged
    them. Each apply syncs its one record before the next, so only the last can be torn."""
    from runtime.engines import EngineCorrupt

    changelog = _written(tmp_path, 3)
    good = changelog.read_bytes()
    second = _records(changelog)[1]
    damaged = bytearray(good)
    damaged[second + 9] ^= 0xFF  # a byte of the second record's payload
    changelog.write_bytes(bytes(damaged))
    with pytest.raises(EngineCorrupt, match="damaged"):
        MemoryEngine(LONG_KEY, tmp_path / "p")
    assert changelog.read_bytes() == bytes(damaged), "nothing truncated: the data is left for inspection"


@pytest.mark.parametrize("tail", ["zeros", "past-the-end", "cut-header"])
def test_what_a_crash_leaves_after_the_last_record_is_dropped(tmp_path: Path, tail: str) -> None:
    changelog = _written(tmp_path, 2)
    good = changelog.read_bytes()
    garbage = {
        "zeros": b"\0" * 64,  # a file extended and never written (power loss)
        "past-the-end": (1000).to_bytes(4, "big") + b"\1\2\3\4" + b"x" * 20,  # a record cut short
        "cut-header": b"\0\0\0",
    }[tail]
    changelog.write_bytes(good + garbage)
    reopened = MemoryEngine(LONG_KEY, tmp_path / "p")
    assert reopened.position() == Position("q", 1) and list(reopened.scan(Scan())) == [(0, b"v"), (1, b"v")]
    assert changelog.read_bytes() == good
    reopened.close()


@pytest.mark.parametrize("where", ["length", "checksum"])
def test_damage_to_a_middle_records_header_is_damage_too(tmp_path: Path, where: str) -> None:
    """The bad record's own length was trusted: damage that made it reach past the end of the file read as
    a torn tail, and the batches after it were truncated away (a review of the change)."""
    from runtime.engines import EngineCorrupt

    changelog = _written(tmp_path, 3)
    damaged = bytearray(changelog.read_bytes())
    second = _records(changelog)[1]
    damaged[second + (0 if where == "length" else 5)] ^= 0x80
    changelog.write_bytes(bytes(damaged))
    with pytest.raises(EngineCorrupt):
        MemoryEngine(LONG_KEY, tmp_path / "p")
    assert changelog.read_bytes() == bytes(damaged)


def test_a_last_record_whose_header_never_reached_the_disk_is_torn(tmp_path: Path) -> None:
    """A power loss during the last append's sync can leave its header's sector as zeros while a later
    sector of its payload made it: still the last append, never acknowledged, dropped."""
    changelog = _written(tmp_path, 3, b"v" * 50)
    data = bytearray(changelog.read_bytes())
    last = _records(changelog)[2]
    data[last : last + 8] = bytes(8)
    changelog.write_bytes(bytes(data))
    reopened = MemoryEngine(LONG_KEY, tmp_path / "p")
    assert reopened.position() == Position("q", 1) and changelog.stat().st_size == last
    reopened.close()


def test_a_torn_last_record_whose_value_holds_a_record_shaped_run_of_bytes_is_torn(tmp_path: Path) -> None:
    """A value holding bytes shaped like a record (length, checksum, payload) inside a torn last append
    read as a whole record after the bad one: damage, and a rebuild of a partition a crash left intact."""
    import zlib

    from runtime.engines.memory import _RECORD

    inner = b"\x93any value"
    lookalike = _RECORD.pack(len(inner), zlib.crc32(inner)) + inner
    engine = MemoryEngine(LONG_KEY, tmp_path / "p", snapshot_records=100)
    engine.apply(Position("q", 0), [(1, b"v")])
    engine.apply(Position("q", 1), [(2, lookalike + b"tail" * 10)])
    engine.close()
    (changelog,) = (tmp_path / "p").glob("changelog-*.log")
    changelog.write_bytes(changelog.read_bytes()[:-5])  # the last append cut short by a crash
    reopened = MemoryEngine(LONG_KEY, tmp_path / "p")
    assert reopened.position() == Position("q", 0)
    reopened.close()
