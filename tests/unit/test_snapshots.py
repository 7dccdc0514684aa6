"""Copying a partition's engine directory from a peer: export, chunked transfer with checks, atomic
install, on both engines; nothing is installed from a damaged or refused copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.engines import ENGINES, Position, open_engine
from runtime.keys import KeySchema
from runtime.scan import Scan
from runtime.snapshots import (
    SnapshotCorrupt,
    SnapshotExports,
    SnapshotOffer,
    describe_files,
    download,
    install_directory,
    remove_leftovers,
)

SCHEMA = KeySchema("k", "long")


class ExportingPeer:
    """A peer in-process: exports one engine's checkpoint, serves it in chunks, counts the reads."""

    def __init__(self, kind: str, root: Path, rows: int = 500) -> None:
        self.engine = open_engine(kind, SCHEMA, root / "peer" / "p0")
        self.engine.apply(Position("q", 7), [(k, f"v{k}".encode() * 20) for k in range(rows)])
        self.exports = SnapshotExports(root / "peer" / ".exports")
        self.reads = 0
        self.damage: str | None = None  # a file whose bytes get flipped in transit

    def open_snapshot(self, partition: int) -> SnapshotOffer:
        token, dest = self.exports.new_directory()
        position = self.engine.start_checkpoint(dest).finish()
        return SnapshotOffer(token, partition, position, describe_files(dest))

    def read_snapshot(self, token: str, path: str, offset: int, length: int) -> bytes:
        self.reads += 1
        data = self.exports.read(token, path, offset, length)
        if path == self.damage and offset == 0 and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def close_snapshot(self, token: str) -> None:
        self.exports.close(token)


@pytest.fixture(params=ENGINES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_copy_moves_in_chunks_and_installs_in_place_of_the_old_directory(kind: str, tmp_path: Path) -> None:
    peer = ExportingPeer(kind, tmp_path)
    target = tmp_path / "me" / "p0"
    old = open_engine(kind, SCHEMA, target)  # what the wiped or incomplete copy had
    old.apply(Position("q", 2), [(-1, b"stale")])
    old.close()
    offer = peer.open_snapshot(0)
    assert offer.position == Position("q", 7) and offer.size > 0
    incoming = tmp_path / "me" / ".p0.incoming-x"
    download(peer, offer, incoming, chunk=1024, cancelled=lambda: False)
    assert peer.reads >= offer.size // 1024  # one chunk per call: memory holds a chunk, not the copy
    peer.close_snapshot(offer.token)
    assert not (tmp_path / "peer" / ".exports" / offer.token).exists()
    install_directory(incoming, target)
    assert not incoming.exists() and [p.name for p in target.parent.iterdir()] == ["p0"]
    copy = open_engine(kind, SCHEMA, target)
    try:
        assert copy.position() == Position("q", 7) and copy.count() == 500 and copy.get(-1) is None
        assert list(copy.scan(Scan())) == list(peer.engine.scan(Scan()))
    finally:
        copy.close()
        peer.engine.close()


def test_a_damaged_file_is_refused_before_anything_is_installed(kind: str, tmp_path: Path) -> None:
    peer = ExportingPeer(kind, tmp_path)
    offer = peer.open_snapshot(0)
    peer.damage = max(offer.files, key=lambda f: f.size).path
    with pytest.raises(SnapshotCorrupt, match="CRC"):
        download(peer, offer, tmp_path / ".p0.incoming", chunk=4096, cancelled=lambda: False)
    peer.engine.close()


def test_paths_leaving_the_directory_and_closed_exports_are_refused(tmp_path: Path) -> None:
    peer = ExportingPeer("memory", tmp_path, rows=3)
    offer = peer.open_snapshot(0)
    evil = SnapshotOffer(offer.token, 0, offer.position, (offer.files[0].__class__("../escape", 1, 0),))
    with pytest.raises(SnapshotCorrupt, match="refusing"):
        download(peer, evil, tmp_path / "in", cancelled=lambda: False)
    assert not (tmp_path / "escape").exists()
    peer.close_snapshot(offer.token)
    with pytest.raises(SnapshotCorrupt, match="closed or expired"):
        peer.read_snapshot(offer.token, offer.files[0].path, 0, 10)


def test_a_cancelled_download_stops_and_leftovers_are_removed(tmp_path: Path) -> None:
    peer = ExportingPeer("memory", tmp_path)
    offer = peer.open_snapshot(0)
    download(peer, offer, tmp_path / "me" / ".p0.incoming-y", chunk=64, cancelled=lambda: peer.reads >= 2)
    assert peer.reads == 2
    remove_leftovers(tmp_path / "me", "p0")
    assert list((tmp_path / "me").iterdir()) == []


def test_exports_expire_when_their_receiver_never_closes_them(tmp_path: Path) -> None:
    now = [0.0]
    exports = SnapshotExports(tmp_path / "exports", clock=lambda: now[0], ttl=10)
    token, dest = exports.new_directory()
    dest.mkdir()
    now[0] = 11
    exports.new_directory()  # opening another export sweeps the expired ones
    assert not dest.exists()
    with pytest.raises(SnapshotCorrupt):
        exports.read(token, "x", 0, 1)


def test_an_export_being_read_does_not_expire_however_long_the_copy_takes(tmp_path: Path) -> None:
    """The time ran from the export's opening: a copy slower than the TTL in all (many partitions copying
    from one peer after a node loss) found its export deleted mid-way, at another receiver's open, and never
    completed. It runs from the last read now."""
    now = [0.0]
    exports = SnapshotExports(tmp_path / "exports", clock=lambda: now[0], ttl=10)
    token, dest = exports.new_directory()
    dest.mkdir()
    (dest / "x").write_bytes(b"abcdef")
    for offset in range(6):  # a read every 8 s: 48 s in all, past the TTL of 10
        now[0] += 8
        exports.new_directory()  # another receiver's open sweeps the expired ones
        assert exports.read(token, "x", offset, 1) == b"abcdef"[offset : offset + 1]
    now[0] += 11
    exports.new_directory()
    with pytest.raises(SnapshotCorrupt, match="closed or expired"):
        exports.read(token, "x", 0, 1)


def test_a_query_cores_unclosed_export_goes_without_another_export_and_a_dead_processs_at_start(
    tmp_path: Path,
) -> None:
    """An export whose receiver went away was deleted only when the same actor exported again, maybe never:
    a RocksDB export holds the partition's SST files as they were. The probes' ``stats`` expire it now, and
    a process that was killed with exports open leaves them to the next one, which deletes them at start."""
    import pyarrow as pa

    from runtime.query import QueryCore
    from runtime.snapshots import EXPORT_TTL
    from tests.unit.fakes import kv_spec

    spec = kv_spec("s", partitions=1, actors=1)
    core = QueryCore(spec, [0], directory=tmp_path / "a")
    core.apply("q", 0, {0: pa.table({"key": ["k"], "value": ["v"]})})
    core.open_snapshot(0)
    exports = tmp_path / "a" / ".exports"
    assert len(list(exports.iterdir())) == 1
    core.stats()
    assert len(list(exports.iterdir())) == 1  # not yet expired
    assert core._exports is not None
    later = core._exports._clock() + EXPORT_TTL + 1
    core._exports._clock = lambda: later
    core.stats()
    assert list(exports.iterdir()) == []
    core.open_snapshot(0)
    assert len(list(exports.iterdir())) == 1
    for state in core.partitions.values():  # the process dies: nothing is closed, its owner lock goes with it
        state.engine.close()
    assert core._owner is not None
    core._owner.release()
    QueryCore(spec, [0], directory=tmp_path / "a").close()
    assert not exports.exists()
