"""The partition engine contract. Every engine in ENGINES runs every test here, in a temporary directory."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.engines import ENGINES, NONE, EngineMismatch, PartitionEngine, Position, open_engine
from runtime.keys import TOP, KeySchema
from runtime.scan import JUMP_AFTER, Bound, Scan, TimeFilter, TimeWalk

STRING_KEY = KeySchema("k", "string")
LONG_KEY = KeySchema("k", "long")
WINDOWED = KeySchema("user", "string", (("window_start", "timestamp"),))
P1, P2 = Position("q1", 0), Position("q1", 1)


class Opener:
    """Opens engines of one kind on directories under the test's tmp_path, and closes them afterwards."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind, self.root, self.opened = kind, root, []  # type: ignore[var-annotated]

    def __call__(self, schema: KeySchema = STRING_KEY, name: str = "p0") -> PartitionEngine:
        engine = open_engine(self.kind, schema, self.root / name)
        self.opened.append(engine)
        return engine

    def reopen(self, engine: PartitionEngine, schema: KeySchema = STRING_KEY, name: str = "p0") -> PartitionEngine:
        engine.close()
        return self(schema, name)


@pytest.fixture(params=ENGINES)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    o = Opener(request.param, tmp_path)
    yield o
    for engine in o.opened:
        engine.close()


def keys(entries: Iterator[tuple[Any, bytes]]) -> list[Any]:
    return [k for k, _ in entries]


def test_get_and_get_many(opener: Opener) -> None:
    engine = opener()
    engine.apply(P1, [("b", b"2"), ("a", b"1"), ("", b"empty")])
    assert engine.get("a") == b"1" and engine.get("") == b"empty" and engine.get("c") is None
    assert engine.get_many(["b", "c", "a"]) == [b"2", None, b"1"]
    assert engine.get_many([]) == []


def test_deletes_and_last_write_wins_within_one_apply(opener: Opener) -> None:
    engine = opener()
    engine.apply(P1, [("k", b"1"), ("gone", b"x")])
    engine.apply(P2, [("k", b"2"), ("k", b"3"), ("j", b"x"), ("j", None), ("i", None), ("i", b"4"), ("gone", None)])
    assert list(engine.scan(Scan())) == [("i", b"4"), ("k", b"3")]
    assert engine.count() == 2
    engine.apply(Position("q1", 2), [("absent", None)])  # deleting a missing key changes nothing
    assert engine.count() == 2


def test_empty_values_are_values(opener: Opener) -> None:
    engine = opener()
    engine.apply(P1, [("a", b"")])
    assert engine.get("a") == b"" and engine.count() == 1


@pytest.mark.parametrize("reverse", [False, True])
def test_scans_honour_open_inclusive_and_exclusive_bounds(opener: Opener, reverse: bool) -> None:
    engine = opener()
    engine.apply(P1, [(k, k.encode()) for k in "1234567"])

    def scan(lo: Bound | None, hi: Bound | None) -> list[str]:
        found = keys(engine.scan(Scan(lo, hi, reverse)))
        return found[::-1] if reverse else found

    assert scan(None, None) == list("1234567")
    assert scan(Bound("2"), Bound("4")) == ["2", "3", "4"]
    assert scan(Bound("2", False), Bound("4", False)) == ["3"]
    assert scan(None, Bound("2")) == ["1", "2"]
    assert scan(Bound("6", False), None) == ["7"]
    assert scan(Bound("0"), Bound("15")) == ["1"]  # bounds need not be keys
    assert scan(Bound("8"), None) == []
    assert scan(Bound("4"), Bound("2")) == []
    assert scan(Bound("3", False), Bound("3")) == []


def test_integer_keys_scan_numerically_including_negatives(opener: Opener) -> None:
    engine = opener(LONG_KEY)
    values = [10, 2, 33, -1, -(2**63), 2**63 - 1, 0]
    engine.apply(P1, [(k, b"v") for k in values])
    assert keys(engine.scan(Scan())) == sorted(values)
    assert keys(engine.scan(Scan.closed(-1, 10))) == [-1, 0, 2, 10]
    assert keys(engine.scan(Scan.closed(None, 0, reverse=True))) == [0, -1, -(2**63)]
    assert engine.get(-(2**63)) == b"v"


def test_composite_keys_with_partial_and_top_bounds(opener: Opener) -> None:
    engine = opener(WINDOWED)
    rows = [(u, t) for u in ["al", "alice", "bob", "al\x00"] for t in [-5, 0, 100]]
    engine.apply(P1, [(k, repr(k).encode()) for k in rows])
    everything = sorted(rows)
    assert keys(engine.scan(Scan())) == everything
    # from=alice&to=alice: a partial lower bound and a TOP-padded upper bound cover every window of alice.
    alice = Scan(Bound(("alice",)), Bound(("alice", TOP)))
    assert keys(engine.scan(alice)) == [("alice", -5), ("alice", 0), ("alice", 100)]
    assert keys(engine.scan(Scan(alice.lo, alice.hi, reverse=True))) == [("alice", 100), ("alice", 0), ("alice", -5)]
    # "al\x00" sorts after "al" and every ("al", t), and before "alice".
    assert keys(engine.scan(Scan(Bound(("al", TOP), False), Bound(("alice",), False)))) == [
        ("al\x00", -5),
        ("al\x00", 0),
        ("al\x00", 100),
    ]
    assert keys(engine.scan(Scan(Bound(("bob", 0), False), None))) == [("bob", 100)]
    assert keys(engine.scan(Scan(None, Bound(("al", 0)), reverse=True))) == [("al", 0), ("al", -5)]
    assert engine.get(("bob", 100)) == repr(("bob", 100)).encode()


def test_scan_paging_resumes_after_the_last_key(opener: Opener) -> None:
    engine = opener(LONG_KEY)
    engine.apply(P1, [(k, b"v") for k in range(25)])
    for reverse in (False, True):
        scan, seen = Scan(reverse=reverse), []
        while page := keys(_take(engine.scan(scan), 7)):
            seen += page
            scan = scan.after(page[-1])
        assert seen == sorted(range(25), reverse=reverse)


def _take(entries: Iterator[tuple[Any, bytes]], n: int) -> Iterator[tuple[Any, bytes]]:
    for i, entry in enumerate(entries):
        if i == n:
            return
        yield entry


@pytest.mark.parametrize("batch_size", [1, 7, 300])
def test_matches_a_dict_model_under_random_writes(opener: Opener, batch_size: int) -> None:
    engine = opener(LONG_KEY)
    rng = random.Random(batch_size)
    model: dict[int, bytes] = {}
    for batch_id in range(30):
        batch = []
        for _ in range(batch_size):
            key = rng.randrange(-150, 150)
            value = None if rng.random() < 0.3 else str(rng.random()).encode()
            batch.append((key, value))
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        engine.apply(Position("q", batch_id), batch)
        assert engine.count() == len(model)
    assert list(engine.scan(Scan())) == sorted(model.items())
    assert list(engine.scan(Scan.closed(-20, 70, reverse=True))) == sorted(
        ((k, v) for k, v in model.items() if -20 <= k <= 70), reverse=True
    )


def test_position_and_reset(opener: Opener) -> None:
    engine = opener()
    assert engine.position() == NONE and engine.count() == 0
    engine.apply(P1, [("a", b"1"), ("b", b"2")])
    assert engine.position() == P1
    engine.reset(Position("q2", -1))
    assert engine.position() == Position("q2", -1) and engine.count() == 0 and list(engine.scan(Scan())) == []
    engine.apply(Position("q2", 0), [("b", b"3")])
    engine = opener.reopen(engine)
    assert engine.position() == Position("q2", 0) and list(engine.scan(Scan())) == [("b", b"3")]


def test_close_and_reopen_keeps_rows_position_and_count(opener: Opener) -> None:
    engine = opener(WINDOWED)
    engine.apply(P1, [(("a", 1), b"1"), (("b", 2), b"2")])
    engine.apply(P2, [(("a", 1), None), (("c", 3), b"3")])
    engine = opener.reopen(engine, WINDOWED)
    assert engine.position() == P2 and engine.count() == 2
    assert list(engine.scan(Scan())) == [(("b", 2), b"2"), (("c", 3), b"3")]


def test_close_ends_a_scan_left_open(opener: Opener) -> None:
    engine = opener()
    engine.apply(P1, [("a", b"1"), ("b", b"2")])
    started, unstarted = engine.scan(Scan()), engine.scan(Scan())
    next(started)
    engine = opener.reopen(engine)  # the rocksdb engine would fail to reopen a database an iterator pins
    assert engine.count() == 2 and unstarted is not None


def test_checkpoint_opens_as_a_point_in_time_copy(opener: Opener, tmp_path: Path) -> None:
    engine = opener(LONG_KEY)
    engine.apply(P1, [(k, b"old") for k in range(100)])
    assert engine.checkpoint(tmp_path / "copy") == P1
    engine.apply(P2, [(k, b"new") for k in range(50, 150)])
    copy = opener(LONG_KEY, "copy")
    assert copy.position() == P1 and copy.count() == 100
    assert list(copy.scan(Scan())) == [(k, b"old") for k in range(100)]
    copy.apply(P2, [(0, None)])  # the copy is an engine of its own
    assert engine.get(0) == b"old" and engine.count() == 150
    with pytest.raises(FileExistsError):
        engine.checkpoint(tmp_path / "copy")


def test_start_checkpoint_captures_at_the_call_and_finishes_after_later_writes(opener: Opener, tmp_path: Path) -> None:
    engine = opener(LONG_KEY)
    engine.apply(P1, [(k, b"old") for k in range(100)])
    pending = engine.start_checkpoint(tmp_path / "copy")  # under the caller's write lock: brief
    assert pending.position == P1
    engine.apply(P2, [(k, b"new") for k in range(50, 150)] + [(0, None)])  # writes go on before the write-out
    engine.reset(Position("q2", -1))
    assert pending.finish() == P1
    copy = opener(LONG_KEY, "copy")
    assert copy.position() == P1 and copy.count() == 100
    assert list(copy.scan(Scan())) == [(k, b"old") for k in range(100)]


def test_reopening_with_another_kind_or_key_schema_fails_clearly(opener: Opener) -> None:
    engine = opener(STRING_KEY)
    engine.apply(P1, [("a", b"1")])
    engine.close()
    other = next(k for k in ENGINES if k != opener.kind)
    with pytest.raises(EngineMismatch, match="engine"):
        open_engine(other, STRING_KEY, opener.root / "p0")
    with pytest.raises(EngineMismatch, match="key schema"):
        open_engine(opener.kind, LONG_KEY, opener.root / "p0")
    assert opener().get("a") == b"1"  # refusing did not damage it


def test_a_row_that_cannot_be_stored_leaves_the_old_state(opener: Opener) -> None:
    # What this proves: a batch with a bad row is rejected as a whole, before anything is written (both
    # engines validate every row first), and the durable state is untouched. What it cannot prove: that
    # a process killed *during* the write leaves no mix. For rocksdb that rests on WriteBatch atomicity
    # (one WAL record); for memory, test_a_torn_changelog_tail_is_dropped below simulates the torn write.
    engine = opener(LONG_KEY)
    engine.apply(P1, [(1, b"1")])
    with pytest.raises((TypeError, ValueError)):
        engine.apply(P2, [(2, b"2"), (3, "not bytes")])  # type: ignore[list-item]
    with pytest.raises((TypeError, ValueError)):
        engine.apply(P2, [(4, b"4"), ("5", b"5")])
    with pytest.raises((TypeError, ValueError)):
        engine.apply(P2, [(6, b"6"), (2**63, b"7")])
    assert engine.position() == P1 and list(engine.scan(Scan())) == [(1, b"1")] and engine.count() == 1
    engine = opener.reopen(engine, LONG_KEY)
    assert engine.position() == P1 and list(engine.scan(Scan())) == [(1, b"1")] and engine.count() == 1


def test_a_closed_engine_refuses_writes(opener: Opener) -> None:
    engine = opener()
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.apply(P1, [("a", b"1")])


def test_destroy_deletes_the_directory(opener: Opener) -> None:
    engine = opener()
    engine.apply(P1, [("a", b"1")])
    engine.destroy()
    assert not (opener.root / "p0").exists()
    assert opener().count() == 0


class _FailingWrites:
    """Stands in for the RocksDB handle: reads pass through, the write raises as a failing disk would."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def write(self, *_args: Any) -> None:
        raise OSError("simulated I/O error")


def _tear_last_apply(kind: str, engine: Any, how: str) -> PartitionEngine:
    """Make the last apply fail the way a crash (memory) or an I/O error (rocksdb) would, then reopen."""
    if kind == "memory":
        engine.close()
        (changelog,) = engine.path.glob("changelog-*.log")
        data = changelog.read_bytes()
        if how == "truncate":
            changelog.write_bytes(data[:-3])  # killed mid-write: the record's tail never reached the file
        else:
            changelog.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # a torn sector: the CRC catches it
        return open_engine(kind, STRING_KEY, engine.path)
    real = engine._db
    engine._db = _FailingWrites(real)
    with pytest.raises(OSError):
        engine.apply(Position("q1", 2), [("a", None), ("z", b"z")])
    engine._db = real
    return engine


@pytest.mark.parametrize("how", ["truncate", "corrupt"])
def test_a_torn_apply_leaves_the_previous_position_and_rows(opener: Opener, how: str) -> None:
    # Memory: a process killed while appending leaves a torn record; reopening must drop exactly that
    # record. RocksDB: a unit test cannot kill a process inside WriteBatch; atomicity there is RocksDB's
    # (one WAL record per batch). What the test shows is that a failed write changes neither the rows nor
    # the position and count the engine keeps alongside them.
    engine = opener()
    engine.apply(P1, [("a", b"1")])
    engine.apply(P2, [("a", b"2"), ("b", b"2")])
    if opener.kind == "memory":
        engine = _tear_last_apply(opener.kind, engine, how)
        opener.opened.append(engine)
        assert engine.position() == P1 and list(engine.scan(Scan())) == [("a", b"1")] and engine.count() == 1
        engine.apply(P2, [("c", b"3")])  # appends after the cut, not behind the garbage
        engine = opener.reopen(engine)
        assert engine.position() == P2 and list(engine.scan(Scan())) == [("a", b"1"), ("c", b"3")]
    else:
        engine = _tear_last_apply(opener.kind, engine, how)
        engine = opener.reopen(engine)
        assert engine.position() == P2 and engine.count() == 2
        assert list(engine.scan(Scan())) == [("a", b"2"), ("b", b"2")]


def test_memory_accounting_names_what_holds_bytes_outside_python(opener: Opener) -> None:
    engine = opener()
    engine.apply(P1, [(f"k{i:04d}", b"v" * 100) for i in range(2000)])
    usage = engine.memory()
    assert all(isinstance(v, int) and v >= 0 for v in usage.values())
    if opener.kind == "rocksdb":
        # Rows sit in the memtable until flushed; the cache and table readers are named even when empty.
        assert set(usage) == {"block_cache", "block_cache_pinned", "memtables", "table_readers"}
        assert usage["memtables"] >= 2000 * 100
    else:
        assert usage == {}


def test_the_count_stays_exact_from_an_empty_partition_on(opener: Opener) -> None:
    # The first apply to an empty partition reads no old presence (rocksdb); the count must not care.
    engine = opener()
    engine.apply(P1, [("a", b"1"), ("b", b"2"), ("a", b"3"), ("c", None)])
    assert engine.count() == 2
    engine.apply(P2, [("a", b"4"), ("d", b"5"), ("b", None)])
    assert engine.count() == 2 and engine.get("a") == b"4" and engine.get("b") is None
    engine.reset(Position("q2", -1))
    engine.apply(Position("q2", 0), [("a", b"1"), ("a", None), ("e", b"6")])
    assert engine.count() == 1 and engine.get("a") is None


class CountingWalk(TimeWalk):
    """A ``TimeWalk`` that counts the entries the engine looked at."""

    def __init__(self, times: TimeFilter, reverse: bool, end_of: Any = None) -> None:
        super().__init__(times, 1, reverse, end_of)
        self.looked: list[Any] = []
        admits = self.admits

        def counted(key: Any, raw: bytes) -> bool:
            self.looked.append(key)
            return admits(key, raw)

        self.admits = counted


def _counting(times: TimeFilter, reverse: bool, end_of: Any = None) -> CountingWalk:
    return CountingWalk(times, reverse, end_of)


@pytest.mark.parametrize("seed", range(12))
def test_a_time_filtered_walk_returns_what_filtering_every_window_does(opener: Opener, seed: int) -> None:
    """Random window stores (some keys with long runs of windows, some with one), random key bounds and
    time filters, both directions: the walk's seeks never skip a window the filter keeps or add one."""
    rng = random.Random(seed)
    engine = opener(WINDOWED)
    users = sorted({f"u{rng.randrange(40):02d}" for _ in range(12)})
    rows = []
    for user in users:
        for start in sorted(rng.sample(range(-50, 200), rng.choice([1, 3, 30, 120]))):
            rows.append(((user, start), (start + rng.randrange(1, 40)).to_bytes(4, "big", signed=True)))
    engine.apply(P1, rows)

    def end_of(raw: bytes) -> int:
        return int.from_bytes(raw, "big", signed=True)

    for _ in range(25):
        a, b = sorted(rng.sample(range(-60, 210), 2))
        times = rng.choice(
            [TimeFilter(a, b), TimeFilter(a, None), TimeFilter(None, b), TimeFilter(None, b, a), TimeFilter(b, a)]
        )
        lo = rng.choice([None, Bound((rng.choice(users),), rng.random() < 0.5), Bound((rng.choice(users), a))])
        hi = rng.choice([None, Bound((rng.choice(users), TOP)), Bound((rng.choice(users), b), rng.random() < 0.5)])
        for reverse in (False, True):
            scan = Scan(lo, hi, reverse, times)
            expected = [(k, v) for k, v in engine.scan(scan) if times.admits(k[-1], end_of(v))]
            walk = _counting(times, reverse, end_of)
            assert list(engine.scan(scan, walk)) == expected, (times, lo, hi, reverse)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_time_filtered_walk_seeks_past_a_keys_windows_outside_the_range(opener: Opener, reverse: bool) -> None:
    """A day of one-minute windows for each of 50 keys, an hour asked of all keys: the walk looks at the
    hour's windows and a few on either side per key, not at every window."""
    engine = opener(WINDOWED)
    engine.apply(P1, [((f"user-{u:02d}", m), b"1") for u in range(50) for m in range(1440)])
    walk = _counting(TimeFilter(600, 659), reverse)
    found = list(engine.scan(Scan(reverse=reverse), walk))
    assert len(found) == 50 * 60 and {k[1] for k, _ in found} == set(range(600, 660))
    assert len(walk.looked) <= 50 * (60 + 2 * JUMP_AFTER)  # against 72,000 windows in the store
