"""Rebuilding a copy that lost its state from a live peer, without Ray: the copy buffers batches while it
copies, installs the peer's snapshot at p, applies the batches after p, and only then serves. The peer
is another ``QueryCore`` in-process; the catch-up runs when the test says (``spawn`` collects it)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from runtime.codec import decode_value
from runtime.errors import OwnerUnavailable, PartitionCatchingUp, PartitionIncomplete, PartitionUnavailable
from runtime.partition import CATCHING_UP, INCOMPLETE, MARKER, REBUILDING, SERVING, Hold
from runtime.query import QueryCore
from runtime.rebuild import RebuildSettings
from runtime.scan import Scan
from tests.unit.fakes import Peer, kv_spec


def batch(n: int, tag: str = "") -> dict[int, pa.Table]:
    """Batch ``n``: sets key k<n> to n and bumps the shared key ``last`` (so order and gaps show)."""
    return {0: pa.table({"key": [f"k{n}", "last"], "value": [f"{n}{tag}", f"{n}{tag}"]})}


class Peers:
    def __init__(self, peers: dict[str, Peer]) -> None:
        self.peers = peers

    def holders(self, partition: int) -> list[str]:
        return ["me", *self.peers]

    def peer(self, uuid: str) -> Peer:
        return self.peers[uuid]


class Setup:
    """A serving peer at batch ``at`` and a copy (``me``) that has nothing, on one engine kind."""

    def __init__(self, kind: str, root: Path, *, at: int = 56, volatile_copy: bool = False) -> None:
        self.spec = dataclasses.replace(kv_spec("s", partitions=2, actors=2, standbys=1), engine=kind)
        self.peer_core = QueryCore(self.spec, [0], directory=root / "peer")
        for n in range(at + 1):
            self.peer_core.apply("q", n, batch(n))
        self.peer = Peer(self.peer_core)
        self.jobs: list[Callable[[], object]] = []
        self.now = [0.0]
        self.sleeps: list[Callable[[], None]] = []
        self.me = self.open_copy(None if volatile_copy else root / "me")

    def open_copy(
        self, directory: Path | None, recovered: bool = False, announce: Callable[[], None] | None = None
    ) -> QueryCore:
        """A copy whose catch-ups run on the fake clock: each backoff sleep runs a queued action."""
        core = QueryCore(
            self.spec, [0], directory=directory, recovered=recovered, peers=Peers({"peer": self.peer}), me="me",
            spawn=self.jobs.append, rebuild=RebuildSettings(chunk=512, first_backoff=1, max_backoff=1, give_up_after=5),
            announce=announce,
        )  # fmt: skip

        def sleep(seconds: float) -> None:
            self.now[0] += seconds
            if self.sleeps:
                self.sleeps.pop(0)()

        rebuilder = core._rebuilder
        assert rebuilder is not None
        rebuilder._clock, rebuilder._sleep = (lambda: self.now[0]), sleep
        return core

    def both(self, n: int, tag: str = "") -> list[Any]:
        """Deliver batch ``n`` like the sink: the copy (a standby here) first, then the peer."""
        results = self.me.apply("q", n, batch(n, tag))
        self.peer_core.apply("q", n, batch(n, tag))
        return results

    def run(self) -> object:
        """Run the catch-up a copy started last (on the fake clock of ``open_copy``)."""
        return self.jobs.pop()()

    def contents(self, core: QueryCore) -> list[tuple[str, Any]]:
        entries, _ = core.scan([0], Scan())
        return [(k, decode_value(v)) for k, v in entries]


@pytest.fixture(params=["rocksdb", "memory"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("snapshot_at", [57, 56])
def test_an_empty_copy_receiving_batch_57_catches_up_from_its_peer_and_only_then_serves(
    kind: str, tmp_path: Path, snapshot_at: int
) -> None:
    s = Setup(kind, tmp_path)
    [result] = s.me.apply("q", 57, batch(57))  # the gap: it has nothing, and is sent batch 57 (standby first)
    assert result.state == CATCHING_UP and not result.applied  # the sink's apply returned at once
    assert len(s.jobs) == 1
    with pytest.raises(PartitionCatchingUp, match="catching-up"):
        s.me.get_many([(0, "last")])

    def ingest_during_the_copy() -> None:
        assert s.me.positions()[0]["state"] == CATCHING_UP
        if snapshot_at == 56:
            s.peer_core.apply("q", 57, batch(57))  # the sink reaches the active after the standby
        s.both(58)
        s.both(59)

    if snapshot_at == 57:
        s.peer_core.apply("q", 57, batch(57))  # the snapshot has 57: the buffered 57 is a no-op
    s.peer.during_copy = ingest_during_the_copy
    assert s.run() == "in-sync" and s.peer.opens == 1
    assert s.me.positions()[0] == {"source": "q", "batch_id": 59, "state": SERVING}
    assert s.contents(s.me) == s.contents(s.peer_core) and ("last", "59") in s.contents(s.me)
    assert not (tmp_path / "me" / "p0" / MARKER).exists()
    assert s.me.apply("q", 60, batch(60))[0].applied  # in sync: batches apply directly again


def test_a_buffer_that_does_not_continue_from_the_snapshot_makes_it_copy_again(kind: str, tmp_path: Path) -> None:
    s = Setup(kind, tmp_path, at=54)  # the peer is behind the first batch the copy buffers
    s.me.apply("q", 56, batch(56))

    def peer_moves_on() -> None:  # while the copy backs off: the marker is in place, the peer catches up
        assert (tmp_path / "me" / "p0" / MARKER).exists()
        assert s.me.positions()[0]["batch_id"] == 54  # the first copy was installed, then the gap showed
        s.peer_core.apply("q", 55, batch(55))
        s.peer_core.apply("q", 56, batch(56))

    s.sleeps.append(peer_moves_on)
    assert s.run() == "in-sync" and s.peer.opens == 2
    assert s.contents(s.me) == s.contents(s.peer_core)
    assert s.me.positions()[0]["batch_id"] == 56


def test_replays_during_a_catch_up_change_nothing(kind: str, tmp_path: Path) -> None:
    s = Setup(kind, tmp_path)
    s.me.apply("q", 57, batch(57))
    s.peer_core.apply("q", 57, batch(57))

    def spark_replays() -> None:
        s.both(58)
        s.me.apply("q", 57, batch(57, "-replayed"))  # Spark re-runs a batch after a crash: a no-op
        s.me.apply("q", 58, batch(58, "-replayed"))
        s.both(59)

    s.peer.during_copy = spark_replays
    assert s.run() == "in-sync"
    assert s.contents(s.me) == s.contents(s.peer_core) and ("k58", "58") in s.contents(s.me)


def test_a_new_sources_batch_0_ends_a_catch_up_before_or_during_the_copy(kind: str, tmp_path: Path) -> None:
    s = Setup(kind, tmp_path)
    s.me.apply("q", 57, batch(57))
    [result] = s.me.apply("q2", 0, {0: pa.table({"key": ["fresh"], "value": ["new"]})})
    assert result.applied and result.reset and result.state == SERVING
    assert s.run() == "aborted" and s.peer.opens == 0
    assert s.contents(s.me) == [("fresh", "new")]

    s.me.apply("q2", 5, batch(5))  # a gap again: catching up, and this time batch 0 comes mid-copy
    s.peer.during_copy = lambda: s.me.apply("q3", 0, {0: pa.table({"key": ["newer"], "value": ["x"]})})
    assert s.run() == "aborted" and s.peer.opens == 1
    assert s.contents(s.me) == [("newer", "x")]  # the peer's copy was not installed over it
    assert s.me.positions()[0] == {"source": "q3", "batch_id": 0, "state": SERVING}
    assert not list((tmp_path / "me").glob(".p0.*"))  # nothing left from the cancelled copy


def test_without_a_serving_peer_it_gives_up_as_incomplete_and_the_next_batch_tries_again(
    kind: str, tmp_path: Path
) -> None:
    s = Setup(kind, tmp_path)
    s.peer_core.apply("q", 60, batch(60))  # the peer has a gap too: it cannot give a snapshot
    s.me.apply("q", 57, batch(57))
    assert s.run() == "gave-up" and s.peer.opens >= 2  # retried with backoff until give_up_after
    state = s.me.positions()[0]
    assert state["state"] == INCOMPLETE and "could not take a peer's copy (no other copy is serving)" in state["reason"]
    with pytest.raises(PartitionUnavailable):
        s.me.get_many([(0, "last")])
    assert s.me.apply("q", 58, batch(58))[0].state == CATCHING_UP and len(s.jobs) == 1


def test_a_catch_up_that_fails_with_any_error_is_retried_then_given_up_never_left_catching_up(
    kind: str, tmp_path: Path
) -> None:
    """RocksDB raises plain ``Exception`` (a lock, a full disk): such an error ended the catch-up's thread
    and left its partition catching-up for good, buffering batches nothing would apply."""
    s = Setup(kind, tmp_path)

    def broken(partition: int, at_least: Any = None) -> Any:
        s.peer.opens += 1
        raise RuntimeError("IO error: No space left on device")

    s.peer.open_snapshot = broken  # type: ignore[method-assign]
    s.me.apply("q", 57, batch(57))
    assert s.run() == "gave-up" and s.peer.opens >= 2  # retried with backoff, then given up
    state = s.me.positions()[0]
    assert state["state"] == INCOMPLETE and "No space left" in state["reason"]
    assert s.me.apply("q", 58, batch(58))[0].state == CATCHING_UP and len(s.jobs) == 1  # the next batch tries again


def test_a_holder_ray_no_longer_names_is_skipped_for_the_next_one(kind: str, tmp_path: Path) -> None:
    s = Setup(kind, tmp_path)

    class WithAGoneHolder(Peers):
        def holders(self, partition: int) -> list[str]:
            return ["me", "gone", *self.peers]

        def peer(self, uuid: str) -> Any:
            if uuid == "gone":
                raise OwnerUnavailable("no actor named gone", actor="gone")
            return super().peer(uuid)

    rebuilder = s.me._rebuilder
    assert rebuilder is not None
    rebuilder.peers = WithAGoneHolder({"peer": s.peer})
    s.peer_core.apply("q", 57, batch(57))
    s.me.apply("q", 57, batch(57))
    assert s.run() == "in-sync" and s.peer.opens == 1
    assert s.contents(s.me) == s.contents(s.peer_core)


def test_a_restarted_actor_whose_data_was_wiped_rebuilds_without_waiting_for_a_batch(kind: str, tmp_path: Path) -> None:
    s = Setup(kind, tmp_path)
    s.me.close()
    shutil.rmtree(tmp_path / "me")  # wiped: nothing to reopen
    again = s.me = s.open_copy(tmp_path / "me", recovered=True)
    assert again.positions()[0]["state"] == INCOMPLETE and "nothing on disk" in again.positions()[0]["reason"]
    assert again.rebuild_unserved() == [0]
    assert s.run() == "in-sync"
    assert s.contents(again) == s.contents(s.peer_core) and again.positions()[0]["batch_id"] == 56


def test_a_crash_before_catching_up_reopens_incomplete_never_serving_an_old_state(tmp_path: Path) -> None:
    s = Setup("rocksdb", tmp_path)
    s.me.apply("q", 57, batch(57))
    s.me.close()  # dies before its catch-up ran
    again = s.open_copy(tmp_path / "me", recovered=True)
    assert again.positions()[0]["state"] == INCOMPLETE
    assert again.rebuild_unserved() == [0]


def test_a_copy_kept_in_memory_only_is_rebuilt_from_a_durable_peer(tmp_path: Path) -> None:
    s = Setup("rocksdb", tmp_path, volatile_copy=True)
    s.me.apply("q", 57, batch(57))
    s.peer.during_copy = lambda: s.peer_core.apply("q", 57, batch(57))
    assert s.run() == "in-sync"
    assert s.contents(s.me) == s.contents(s.peer_core)


def test_copies_kept_in_memory_only_leave_no_temporary_directory_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a data directory the receiving copy and the peer's exports go to temporary directories; a
    # catch-up and the peer's close delete them, not only what is inside (3,570 empty ones were found in
    # a test machine's /tmp).
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    s = Setup("memory", tmp_path, volatile_copy=True)
    s.peer_core.close()
    s.peer_core = QueryCore(s.spec, [0], directory=None)
    for n in range(57):
        s.peer_core.apply("q", n, batch(n))
    s.peer.core = s.peer_core
    s.me.apply("q", 57, batch(57))
    s.peer.during_copy = lambda: s.peer_core.apply("q", 57, batch(57))
    assert s.run() == "in-sync" and s.peer.opens == 1
    assert s.contents(s.me) == s.contents(s.peer_core)
    s.peer_core.close()
    s.me.close()
    assert list(scratch.iterdir()) == []


def test_an_overflowing_buffer_is_dropped_and_the_copy_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runtime.partition

    monkeypatch.setattr(runtime.partition, "BUFFER_ROWS", 3)
    s = Setup("memory", tmp_path)
    s.me.apply("q", 57, batch(57))
    s.peer.during_copy = lambda: [s.both(57 + n) if n else s.peer_core.apply("q", 57, batch(57)) for n in range(4)]
    assert s.run() == "in-sync" and s.peer.opens == 2  # batches were dropped: the first copy was not enough
    assert s.contents(s.me) == s.contents(s.peer_core) and s.me.positions()[0]["batch_id"] == 60


def _serving_copy(kind: str, tmp_path: Path) -> Setup:
    """A copy that caught up from its peer, serves batch 57, and is closed as its process ends."""
    s = Setup(kind, tmp_path)
    s.me.apply("q", 57, batch(57))
    s.peer.during_copy = lambda: s.peer_core.apply("q", 57, batch(57))
    assert s.run() == "in-sync" and s.me.positions()[0]["state"] == SERVING
    s.me.close()
    return s


def _damage(kind: str, partition: Path) -> None:
    """Make the partition's files unreadable to its engine, as a disk fault would."""
    victims = [partition / "rocksdb" / "CURRENT"] if kind == "rocksdb" else sorted(partition.glob("snapshot-*.bin"))
    assert victims and all(v.is_file() for v in victims)
    for victim in victims:
        victim.write_bytes(b"\x00garbage" * 64)


def test_a_partition_whose_data_cannot_be_opened_is_set_aside_and_rebuilt_from_its_peer(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the engine's error ended the actor's constructor, which Ray does not retry: every partition
    of the actor went dark for good. Now only the damaged one is unavailable, and only until rebuilt."""
    import runtime.query

    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0, 0.0))
    s = _serving_copy(kind, tmp_path)
    _damage(kind, tmp_path / "me" / "p0")
    again = s.me = s.open_copy(tmp_path / "me", recovered=True)
    position = again.positions()[0]
    assert position["state"] == INCOMPLETE and "is damaged" in position["reason"]
    [aside] = (tmp_path / "me").glob("p0.unreadable-*")
    assert aside.name in position["reason"] and any(aside.iterdir())  # the damaged data is kept
    with pytest.raises(PartitionUnavailable):
        again.get_many([(0, "last")])  # a 503, never the empty store it starts again as
    assert again.rebuild_unserved() == [0]
    assert s.run() == "in-sync"
    assert again.positions()[0] == {"source": "q", "batch_id": 57, "state": SERVING}
    assert s.contents(again) == s.contents(s.peer_core)
    again.destroy()
    assert not (tmp_path / "me").exists()  # the set-aside copy went with the actor's data


def test_a_partition_whose_current_names_a_missing_manifest_is_set_aside_not_the_actor_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocksDB says "IO error: No such file or directory" for a MANIFEST its CURRENT names and that is gone:
    that was raised as no damage, the actor's constructor failed at every attempt, and its other partitions
    went down with it (a black-box run). It is damage: set aside and rebuilt, as a corrupt file is."""
    import runtime.query

    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0,))
    s = _serving_copy("rocksdb", tmp_path)
    (tmp_path / "me" / "p0" / "rocksdb" / "CURRENT").write_text("MANIFEST-000999\n")
    again = s.me = s.open_copy(tmp_path / "me", recovered=True)
    position = again.positions()[0]
    assert (
        position["state"] == INCOMPLETE
        and "is damaged" in position["reason"]
        and "MANIFEST-000999" in position["reason"]
    )
    assert len(list((tmp_path / "me").glob("p0.unreadable-*"))) == 1
    assert again.rebuild_unserved() == [0] and s.run() == "in-sync"
    assert s.contents(again) == s.contents(s.peer_core)
    again.close()


def test_a_partition_that_fails_to_open_once_is_opened_again_not_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runtime.query

    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0, 0.0))
    s = _serving_copy("rocksdb", tmp_path)
    real_open = runtime.query.open_engine
    failures: list[Exception] = [Exception("Corruption: a read that failed once"), OSError(11, "Resource busy")]

    def open_after_failures(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_open(*args, **kwargs)

    monkeypatch.setattr(runtime.query, "open_engine", open_after_failures)
    again = s.open_copy(tmp_path / "me", recovered=True)
    assert again.positions()[0] == {"source": "q", "batch_id": 57, "state": SERVING}
    assert not list((tmp_path / "me").glob("p0.unreadable-*"))
    again.close()


@pytest.mark.parametrize(
    "error",
    [OSError(11, "IO error: lock hold by another process"), OSError(24, "Too many open files"), MemoryError()],
)
def test_an_error_that_is_not_damage_is_raised_and_the_data_left_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """Only the engine's word that files are damaged sets data aside: a busy lock, too many open files or
    a lack of memory are no reason to throw a good copy out."""
    import runtime.query

    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0,))
    s = _serving_copy("rocksdb", tmp_path)

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(runtime.query, "open_engine", failing)
    with pytest.raises(type(error)):
        s.open_copy(tmp_path / "me", recovered=True)
    assert not list((tmp_path / "me").glob("p0.unreadable-*")) and (tmp_path / "me" / "p0" / "rocksdb").is_dir()


def test_damaged_data_is_left_in_place_while_another_process_holds_the_actors_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A previous process of the actor that has not exited may still write into the partition: moving
    the directory then would let it write into the fresh one."""
    import runtime.query
    from runtime.orphans import OwnerLock

    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0,))
    monkeypatch.setattr(runtime.query, "_OWNER_WAIT", 0.1)
    s = _serving_copy("rocksdb", tmp_path)
    _damage("rocksdb", tmp_path / "me" / "p0")
    previous = OwnerLock.take(tmp_path / "me")  # another open file description: as another process's
    try:
        with pytest.raises(Exception, match="Corruption"):
            s.open_copy(tmp_path / "me", recovered=True)
        assert not list((tmp_path / "me").glob("p0.unreadable-*"))
    finally:
        previous.release()


def test_a_crash_between_setting_data_aside_and_marking_the_fresh_partition_never_serves_empty(
    kind: str, tmp_path: Path
) -> None:
    s = _serving_copy(kind, tmp_path)
    (tmp_path / "me" / "p0").rename(tmp_path / "me" / "p0.unreadable-20261126T000000-abcdef")  # then SIGKILL
    again = s.open_copy(tmp_path / "me", recovered=True)
    assert again.positions()[0]["state"] == INCOMPLETE and "set aside" in again.positions()[0]["reason"]
    assert again.begin("q2") == []  # a fresh start does not make it serve empty
    with pytest.raises(PartitionUnavailable):
        again.get_many([(0, "last")])
    assert again.rebuild_unserved() == [0]
    assert s.run() == "in-sync" and s.contents(again) == s.contents(s.peer_core)
    again.close()


def test_when_a_fresh_partition_cannot_be_opened_either_the_data_is_put_back_and_the_error_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk after the damage fails the fresh partition too: the data goes back where it was."""
    import runtime.query

    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0,))
    s = _serving_copy("rocksdb", tmp_path)
    _damage("rocksdb", tmp_path / "me" / "p0")

    def files() -> list[str]:  # but RocksDB's info logs, which each attempt to open rotates
        return sorted(p.name for p in (tmp_path / "me" / "p0").rglob("*") if not p.name.startswith("LOG"))

    before = files()
    real_open, opens = runtime.query.open_engine, []

    def full_disk_for_a_fresh_one(*args: Any, **kwargs: Any) -> Any:
        opens.append(1)
        if len(opens) > 2:  # the two attempts on the damaged data go through to the engine
            raise OSError(28, "No space left on device")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(runtime.query, "open_engine", full_disk_for_a_fresh_one)
    with pytest.raises(Exception, match="Corruption"):
        s.open_copy(tmp_path / "me", recovered=True)
    assert files() == before and "CURRENT" in before
    assert not list((tmp_path / "me").glob("p0.unreadable-*"))


def test_a_copy_held_for_its_watermark_is_no_peer_to_copy_and_is_not_copied_over(kind: str, tmp_path: Path) -> None:
    # A new source's batch 0 reset both copies of an append-mode store; they wait for the watermark.
    s = Setup(kind, tmp_path)
    for n in range(57):
        s.me.apply("q", n, batch(n))
    for core in (s.me, s.peer_core):
        assert core.apply("q2", 0, {0: None}, Hold(0))[0].state == REBUILDING
        with pytest.raises(PartitionIncomplete, match="watermark") as raised:
            core.get_many([(0, "last")])
        assert raised.value.details["retry_after"] == 1
    assert s.me.rebuild_unserved() == [] and not s.jobs  # complete up to batch 0: the batches to come bring it up
    s.me.close()
    other = s.open_copy(tmp_path / "other")  # a third copy with nothing, seeing a gap
    assert other.apply("q2", 1, batch(1), Hold(500))[0].state == CATCHING_UP
    assert s.run() == "gave-up" and s.peer.opens >= 1  # the held peer gave no snapshot of its partial state


def test_a_read_begun_while_serving_is_no_answer_once_a_catch_up_replaces_its_engine(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads take no lock. A read begun while the copy served, then overlapped by a catch-up's install
    (a move's ``catch_up`` of a serving copy), read the engine the install closed: a memory engine answered
    None for a key that exists, a RocksDB scan ended early, each with a span that looked whole (a
    review's scripts showed both). Such a read is now unavailable (a 503, or failover), whether it ends
    between the old engine's close and the new one's opening or after."""
    import runtime.rebuild as rebuild

    s = Setup(kind, tmp_path)
    s.peer_core.apply("q", 57, batch(57))
    s.me.apply("q", 57, batch(57))
    assert s.run() == "in-sync"
    s.both(58)
    assert s.me.get_one(0, "last") == (b"\xa258", ("q", 58, 58))

    begun = [s.me._start_read((0,)) for _ in range(2)]  # each read's start while the copy serves

    def finish(read: Any) -> object:
        """The rest of a scan as ``QueryCore.scan`` does it, on the engine the read started with."""
        try:
            entries = list(read.engines[0].scan(Scan()))  # closed: [] (memory), or it raises (rocksdb)
        except Exception as err:
            s.me._raise_if_gone(err, read)
            raise
        return entries, s.me._spans(read)

    windows: list[bool] = []
    real_install = rebuild.install_directory

    def read_in_the_window(incoming: Path, target: Path) -> None:
        with pytest.raises(PartitionUnavailable, match="caught up from a peer during the read"):
            finish(begun[0])  # the old engine closed, the new one not in place yet
        windows.append(True)
        real_install(incoming, target)

    monkeypatch.setattr(rebuild, "install_directory", read_in_the_window)
    assert s.me.catch_up([0]) == [0]
    assert s.run() == "in-sync" and windows == [True]
    with pytest.raises(PartitionUnavailable, match="caught up from a peer during the read") as after:
        finish(begun[1])  # one that ends after the new engine is in place
    assert after.value.details["partitions"] == [0]
    assert s.me.get_one(0, "last") == (b"\xa258", ("q", 58, 58))  # reads begun since answer as before


@pytest.mark.parametrize("put_back", [True, False])
def test_a_copy_that_cannot_be_renamed_in_leaves_the_partition_incomplete_on_disk(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, put_back: bool
) -> None:
    """The install set the old directory (and its INCOMPLETE marker) aside, then could not rename the copy
    in (a full disk): an empty engine was opened in its place, with no marker, so a crash before the retry
    reopened it as never loaded, and a fresh checkpoint's ``begin`` made it serve empty (a review's script).
    The old directory is put back; if even that fails, the new empty one carries a marker."""
    import errno
    import os

    import runtime.snapshots as snapshots

    s = Setup(kind, tmp_path)
    s.peer_core.apply("q", 57, batch(57))
    s.me.apply("q", 57, batch(57))  # a gap: catching up, marked incomplete on disk
    real_rename = os.rename

    def full_disk(src: Any, dst: Any) -> None:
        if ".incoming-" in str(src) or (not put_back and ".old-" in str(src)):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(snapshots.os, "rename", full_disk)
    state = s.me.partitions[0]
    rebuilder = s.me._rebuilder
    assert rebuilder is not None
    with pytest.raises(OSError, match="No space left"):
        rebuilder._attempt(state, state.generation)  # one attempt, then the process dies
    monkeypatch.setattr(snapshots.os, "rename", real_rename)
    assert (tmp_path / "me" / "p0" / MARKER).exists()
    s.me.close()
    again = s.open_copy(tmp_path / "me", recovered=True)
    assert again.positions()[0]["state"] == INCOMPLETE
    assert again.begin("r") == []  # a fresh checkpoint does not make it serve empty
    with pytest.raises(PartitionIncomplete):
        again.get_one(0, "last")


def test_a_marker_that_cannot_be_cleared_once_is_cleared_at_the_next_try(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catch-up ended before the marker was removed: one I/O error there made it stale to its own
    thread, and the partition stayed catching up, buffering every batch, until its actor restarted."""
    import os

    import runtime.partition as partition

    s = Setup(kind, tmp_path)
    s.peer_core.apply("q", 57, batch(57))
    s.me.apply("q", 57, batch(57))
    real_unlink, failures = os.unlink, [1]

    def flaky(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith(f"p0/{MARKER}") and failures:  # the partition's own, not an rmtree's
            failures.pop()
            raise OSError(5, "Input/output error")
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(partition.os, "unlink", flaky)
    assert s.run() == "in-sync" and not failures
    assert not (tmp_path / "me" / "p0" / MARKER).exists()
    s.both(58)
    assert s.me.positions()[0]["state"] == SERVING and s.me.get_one(0, "last") == (b"\xa258", ("q", 58, 58))


def test_a_buffered_batch_of_the_source_the_sink_left_does_not_stall_the_catch_up(kind: str, tmp_path: Path) -> None:
    """The copy buffered q/57 (its gap); the topology was rebuilt on source r, whose batch 0 reached the
    peer first: the copy installed the peer's r/0 and received r/0 itself, yet q/57 at the head of its
    buffer read as a gap, and it copied again until it gave up (31 copies in 30 s in a review's script)."""
    s = Setup(kind, tmp_path)
    s.me.apply("q", 57, batch(57))
    s.peer_core.apply("r", 0, batch(0, "-r"))
    s.sleeps.append(lambda: s.me.apply("r", 0, batch(0, "-r")))  # after the first copy: r/0 buffered too
    assert s.run() == "in-sync"
    assert s.peer.opens <= 2
    assert s.me.get_one(0, "last") == (b"\xa30-r", ("r", 0, 0))


def test_a_copy_ahead_of_its_peer_does_not_take_the_peers_older_copy(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A standby is fed before its active: a catch-up of the standby (a move's) took the active's copy at
    batch 58 while it held 59, and served 58 again (and lacked 59, acknowledged applied). The peer now
    refuses before it exports anything, and the copy, ahead of every peer, catches up in place from its
    own engine; with a batch missing from its buffer too, it waits for a peer that has it."""
    s = Setup(kind, tmp_path)
    for n in (57, 58):
        s.peer_core.apply("q", n, batch(n))
        s.me.apply("q", n, batch(n))
        if n == 57:
            assert s.run() == "in-sync"
    s.me.apply("q", 59, batch(59))  # the standby first; its active is still at 58
    opens = s.peer.opens
    begun = s.me._start_read((0,))  # a lock-free read begun while it served
    assert s.me.catch_up([0]) == [0]
    s.me.apply("q", 60, batch(60))  # buffered, then applied in place to the engine that read sees
    with caplog.at_level(logging.INFO, logger="runtime.rebuild"):
        assert s.run() == "in-sync" and s.peer.opens == opens + 1  # asked once, refused: nothing exported
    # Said in a line of its own (a black-box run could only count it as an in-sync without an install).
    assert "partition 0: every peer that answered is behind this copy (batch 59): it catches up in place" in (
        caplog.text
    )
    with pytest.raises(PartitionUnavailable, match="caught up from a peer during the read"):
        s.me._spans(begun)  # its rows may be half of batch 60's: no answer, as for an install
    s.peer_core.apply("q", 59, batch(59))
    s.peer_core.apply("q", 60, batch(60))
    assert s.me.get_one(0, "last") == (b"\xa260", ("q", 60, 60))
    assert s.me.positions()[0]["state"] == SERVING

    # Ahead of the peer (61 against 60) and missing a batch (63 received, 62 not): it waits for a peer that
    # has them, then takes that peer's copy.
    s.me.apply("q", 61, batch(61))
    s.me.apply("q", 63, batch(63))  # 62 never reached this copy: a gap, so it catches up
    assert s.me.positions()[0]["state"] == CATCHING_UP

    def the_sink_reaches_the_active() -> None:
        for n in (61, 62, 63):
            s.peer_core.apply("q", n, batch(n))

    s.sleeps.append(the_sink_reaches_the_active)  # during the first backoff: the peer was behind until then
    assert s.run() == "in-sync"
    assert s.me.get_one(0, "k62")[0] is not None and s.me.get_one(0, "last") == (b"\xa263", ("q", 63, 63))


def test_a_new_copy_with_nothing_yet_is_not_warned_about_as_lost_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every copy a move or `riqr standbys` made logged 'its actor restarted with nothing on disk (a new
    node, or its data was lost)' as a warning (105 in a black-box run), which alerts on warnings took for
    data loss. A new copy says what it is, at info; a restarted actor that finds nothing still warns."""
    spec = kv_spec("s", partitions=2, actors=2, standbys=1)
    with caplog.at_level("INFO", logger="runtime.partition"):
        new = QueryCore(spec, [0], directory=tmp_path / "new", recovered=True, new_copy=True)
        lost = QueryCore(spec, [0], directory=tmp_path / "lost", recovered=True)
    assert new.positions()[0]["state"] == lost.positions()[0]["state"] == INCOMPLETE
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("INFO", "partition 0 is incomplete: it is a new copy and has nothing yet: it copies from a peer"),
        (
            "WARNING",
            "partition 0 is incomplete: its actor restarted with nothing on disk (a new node, or its data was lost)",
        ),
    ]
    new.close()
    lost.close()


def test_only_a_copy_that_served_catches_up_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-place catch-up (every peer behind) trusts the copy's own engine: only one that served when the
    catch-up began, untouched by an install since. A review of it found three that it trusted wrongly,
    each ending ``in-sync`` and serving: a copy held for a watermark (it would serve before any batch with
    one), an incomplete copy restarted (it forgot which batches it missed), and one whose reopen after an
    install failed (it served from a closed engine: 500s, and every batch to it failing)."""
    import runtime.rebuild as rebuild

    def copy_of(directory: Path, peers: dict[str, Any], *, recovered: bool = False) -> tuple[QueryCore, list[Any]]:
        jobs: list[Any] = []
        core = QueryCore(
            spec, [0], directory=directory, recovered=recovered, peers=Peers(peers), me="me", spawn=jobs.append,
            rebuild=RebuildSettings(chunk=512, first_backoff=1, max_backoff=1, give_up_after=3),
        )  # fmt: skip
        rebuilder = core._rebuilder
        assert rebuilder is not None
        now = [0.0]
        rebuilder._clock, rebuilder._sleep = (lambda: now[0]), (lambda seconds: now.__setitem__(0, now[0] + seconds))
        return core, jobs

    spec = dataclasses.replace(kv_spec("s", partitions=2, actors=2, standbys=1), engine="rocksdb")

    # Held for a watermark after a new source's batch 0, with a serving peer of that source behind it.
    peer = QueryCore(spec, [0], directory=tmp_path / "empty-peer")
    assert peer.begin("s") == [0]  # serves (empty) at batch -1 of s
    held, jobs = copy_of(tmp_path / "held", {"peer": Peer(peer)})
    for n in range(3):
        held.apply("old", n, batch(n))
    held.apply("s", 0, batch(0, "-new"), hold=Hold(0))
    assert held.positions()[0]["state"] == REBUILDING
    assert held.catch_up([0]) == [0] and jobs.pop()() == "gave-up"
    assert held.positions()[0]["state"] != SERVING

    # Incomplete (it missed batch 11), restarted: the peer at 9 is behind it, yet it must not serve.
    behind = QueryCore(spec, [0], directory=tmp_path / "behind")
    for n in range(10):
        behind.apply("q", n, batch(n))
    gap, _ = copy_of(tmp_path / "gap", {"peer": Peer(behind)})
    for n in range(11):
        gap.apply("q", n, batch(n))
    gap.catch_up_on_gap = False
    gap.apply("q", 12, batch(12))
    gap.close()
    gap, jobs = copy_of(tmp_path / "gap", {"peer": Peer(behind)}, recovered=True)
    assert gap.positions()[0]["state"] == INCOMPLETE
    assert gap.rebuild_unserved() == [0] and jobs.pop()() == "gave-up"
    assert gap.positions()[0]["state"] == INCOMPLETE

    # An install whose reopen failed, then only a peer behind left: the closed engine is not trusted.
    ahead = QueryCore(spec, [0], directory=tmp_path / "ahead")
    for n in range(12):
        ahead.apply("q", n, batch(n))
    peers: dict[str, Any] = {"ahead": Peer(ahead), "behind": Peer(behind)}
    me, jobs = copy_of(tmp_path / "me", peers)
    for n in range(11):
        me.apply("q", n, batch(n))
    real_open, opens = rebuild.open_engine, [0]

    def too_many_files(*args: Any, **kwargs: Any) -> Any:
        opens[0] += 1
        if opens[0] == 1:
            peers.pop("ahead")  # and the peer ahead goes away
            raise OSError(24, "Too many open files")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(rebuild, "open_engine", too_many_files)
    assert me.catch_up([0]) == [0] and jobs.pop()() == "gave-up"
    assert me.positions()[0]["state"] == INCOMPLETE


def test_a_moves_new_copy_asked_again_copies_from_the_copy_it_replaces_first(kind: str, tmp_path: Path) -> None:
    """A black-box run: the active at 58 and the moved copy, a standby, at 59 (fed first; the topology then
    killed). The new copy took the active's 58 at every ask of the mover and never reached 59: the drain
    spun until its timeout. Asked with ``prefer``, it copies the copy it replaces first."""
    s = Setup(kind, tmp_path, at=58)  # "peer": the active, at 58
    old_core = QueryCore(s.spec, [0], directory=tmp_path / "old")
    for n in range(60):
        old_core.apply("q", n, batch(n))  # the moved standby, at 59
    old = Peer(old_core)
    rebuilder = s.me._rebuilder
    assert rebuilder is not None
    rebuilder.peers = Peers({"peer": s.peer, "old": old})  # the registry's order: the active first
    s.me.apply("q", 58, batch(58))  # a gap for a copy with nothing: it copies
    assert s.run() == "in-sync" and s.me.positions()[0]["batch_id"] == 58  # the active's copy
    assert s.me.catch_up([0]) == [0]  # the mover's ask, as before: the active's 58 again
    assert s.run() == "in-sync" and s.me.positions()[0]["batch_id"] == 58 and old.opens == 0
    assert s.me.catch_up([0], prefer="old") == [0]
    assert s.run() == "in-sync" and old.opens == 1
    assert s.me.positions()[0] == {"source": "q", "batch_id": 59, "state": SERVING}
    assert s.contents(s.me) == s.contents(old_core)
    assert s.me.partitions[0].prefer_peer is None  # for that catch-up only
    old_core.close()


def test_a_restarted_copy_tells_the_registry_before_it_copies_a_peer_and_takes_the_batch_sent_again(
    kind: str, tmp_path: Path
) -> None:
    """A standby acknowledges batch 57 (the standby round), loses its data and is re-created before the
    active applies 57; it copied the active at 56 and, with nothing buffered, served 56 after 57 was
    acknowledged (a read-path review). Now it tells the registry of its restart before asking any peer,
    waiting for the answer (so the delivery of 57, which asks the registry's epoch after its rounds, sees
    another incarnation of it and sends 57 again), and takes 57 as the next batch."""
    s = Setup(kind, tmp_path)
    s.me.apply("q", 57, batch(57))  # the standby round: acknowledged
    s.me.close()
    shutil.rmtree(tmp_path / "me")  # its node died: re-created elsewhere, nothing on disk
    told: list[int] = []

    def announce() -> None:
        assert s.peer.opens == 0  # before any peer is asked for a copy
        told.append(1)
        if len(told) == 1:
            raise OwnerUnavailable("registry actor_moved: the actor is restarting")  # tried again, as a copy is

    again = s.open_copy(tmp_path / "me", recovered=True, announce=announce)
    assert again.rebuild_unserved() == [0]
    assert s.run() == "in-sync" and told == [1, 1]  # the first try failed; the second was answered
    assert again.positions()[0]["batch_id"] == 56  # the active's copy: 57 had not reached it
    s.peer_core.apply("q", 57, batch(57))  # the active round: 57 acknowledged
    [sent_again] = again.apply("q", 57, batch(57))  # the delivery saw the new incarnation
    assert sent_again.applied and again.positions()[0] == {"source": "q", "batch_id": 57, "state": SERVING}
    values, _ = again.get_many([(0, "last")])
    assert decode_value(values[0]) == "57"
    for n in (58, 59, 60):
        s.peer_core.apply("q", n, batch(n))
    [gap] = again.apply("q", 60, batch(60))  # 58 and 59 missed: a catch-up of its own
    assert gap.state == CATCHING_UP
    assert s.run() == "in-sync" and again.positions()[0]["batch_id"] == 60
    assert told == [1, 1]  # once per process: the registry has this incarnation already
