"""Copying one partition's engine directory from a peer: the peer's side (exports), the transfer in
chunks with verification, and the atomic install on the receiving side. Plain files and no Ray: the
calls between peers go through ``SnapshotPeer``, which ``verticles`` implements over Ray and unit tests
implement in-process.

* The peer checkpoints its partition (``PartitionEngine.start_checkpoint``: a brief capture under its
  write lock, the write-out after) into an export directory beside its data (the same file system, so
  RocksDB hard-links its SST files instead of copying them), lists every file with its size and CRC32
  (``SnapshotOffer``), and serves byte ranges of them until the receiver closes the export. Exports left
  behind by a receiver that died expire after ``EXPORT_TTL`` seconds.
* The receiver pulls each file in chunks of ``CHUNK_BYTES`` into a hidden temporary directory, so its
  memory holds one chunk at a time, and checks each file's size and CRC before anything is installed.
* ``install_directory`` swaps the verified directory into the partition's place with renames, so the
  partition directory is the old one or the new one, never a mix. A crash between the two renames
  leaves no partition directory, which reopens as an empty partition that cannot prove itself complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid as uuidlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runtime.durable import fsync_directory
from runtime.engines import Position
from runtime.errors import RiqrError

__all__ = [
    "CHUNK_BYTES",
    "EXPORT_TTL",
    "FileEntry",
    "SnapshotOffer",
    "SnapshotPeer",
    "SnapshotCorrupt",
    "SnapshotExports",
    "describe_files",
    "download",
    "install_directory",
    "remove_leftovers",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20  # per Ray call: large enough to amortise the call, small enough to bound memory
EXPORT_TTL = 600.0  # seconds an export may stay unread: a receiver that died does not pin files for ever


class SnapshotCorrupt(RiqrError):
    """A copied file did not match the size or CRC its peer announced; nothing was installed."""

    code = "snapshot-corrupt"


@dataclass(frozen=True)
class FileEntry:
    """One file of an exported engine directory: its path relative to the directory, size and CRC32."""

    path: str
    size: int
    crc32: int


@dataclass(frozen=True)
class SnapshotOffer:
    """What a peer exported: a token to read it by, the position it reflects, and its files."""

    token: str
    partition: int
    position: Position
    files: tuple[FileEntry, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


class SnapshotPeer(Protocol):
    """The calls a receiver makes to the peer it copies from (blocking; the catch-up runs in a thread)."""

    def open_snapshot(self, partition: int, at_least: Position | None = None) -> SnapshotOffer:
        """Export a consistent copy of ``partition``; ``PartitionUnavailable`` if the peer's copy is not
        serving (it cannot give what it cannot prove complete), ``CopyBehind`` if it is older than
        ``at_least`` of the same source (the receiver's own position)."""
        ...

    def read_snapshot(self, token: str, path: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of an exported file from ``offset`` (fewer only at its end)."""
        ...

    def close_snapshot(self, token: str) -> None:
        """Delete the export (idempotent)."""
        ...


def _crc_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def describe_files(directory: Path) -> tuple[FileEntry, ...]:
    """Every regular file under ``directory``, with its size and CRC32, in a stable order."""
    out = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        out.append(FileEntry(path.relative_to(directory).as_posix(), path.stat().st_size, _crc_of(path)))
    return tuple(out)


def _inside(directory: Path, relative: str) -> Path:
    """``directory / relative``, refusing a path that would leave ``directory`` (a file list comes from
    another process, and a peer's bug must not write outside the partition)."""
    if not relative or relative.startswith("/") or ".." in Path(relative).parts:
        raise SnapshotCorrupt(f"refusing the file path {relative!r} of a snapshot", path=relative)
    return directory / relative


def download(
    peer: SnapshotPeer, offer: SnapshotOffer, dest: Path, *, chunk: int = CHUNK_BYTES, cancelled: Callable[[], bool]
) -> None:
    """Copy every file of ``offer`` into the new directory ``dest``, ``chunk`` bytes per call, checking
    sizes and CRCs; ``SnapshotCorrupt`` on a mismatch. Stops early (leaving ``dest`` partial, for the
    caller to delete) once ``cancelled()`` is true."""
    dest.mkdir(parents=True)
    for entry in offer.files:
        target = _inside(dest, entry.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        crc, size = 0, 0
        with open(target, "wb") as f:
            while size < entry.size:
                if cancelled():
                    return
                data = peer.read_snapshot(offer.token, entry.path, size, min(chunk, entry.size - size))
                if not data:
                    break
                f.write(data)
                crc = zlib.crc32(data, crc)
                size += len(data)
            f.flush()
            os.fsync(f.fileno())
        if size != entry.size or crc != entry.crc32:
            raise SnapshotCorrupt(
                f"{entry.path} of the snapshot of partition {offer.partition}: got {size} bytes with CRC {crc:#x}, "
                f"expected {entry.size} with {entry.crc32:#x}",
                partition=offer.partition,
                path=entry.path,
            )
    for sub in sorted({p.parent for p in dest.rglob("*")}, key=lambda p: len(p.parts), reverse=True):
        fsync_directory(sub)


def install_directory(incoming: Path, target: Path) -> None:
    """Put the complete directory ``incoming`` in ``target``'s place: the old one is renamed aside, the new
    one renamed in, the parent synced, then the old one deleted. If the new one cannot be renamed in (a
    full disk), the old one is put back: with its ``INCOMPLETE`` marker, or the partition, opened again,
    would be an empty directory that says nothing of what it lacks (and ``remove_leftovers`` deletes what
    was set aside at the next start)."""
    parent = target.parent
    old = parent / f".{target.name}.old-{uuidlib.uuid4().hex[:8]}"
    set_aside = target.exists()
    if set_aside:
        os.rename(target, old)
    try:
        os.rename(incoming, target)
    except BaseException:
        if set_aside:
            os.rename(old, target)
            fsync_directory(parent)
        raise
    fsync_directory(parent)
    shutil.rmtree(old, ignore_errors=True)


def remove_leftovers(parent: Path, name: str) -> None:
    """Delete what an interrupted copy or install of the partition directory ``name`` left in ``parent``."""
    if parent.is_dir():
        for path in parent.glob(f".{name}.*"):
            shutil.rmtree(path, ignore_errors=True)


class SnapshotExports:
    """The peer's side: exported copies by token, in ``root``, deleted when closed, or once unread for
    ``ttl`` seconds (each read renews it: a copy that takes longer than ``ttl`` in all, as many partitions
    copying from one peer after a node loss may, still completes). ``temporary``: ``root`` was just made
    for them (a private temporary directory, kept as it is until ``close_all`` deletes it)."""

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = EXPORT_TTL,
        temporary: bool = False,
    ) -> None:
        self.root = root
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Path, float]] = {}
        if not temporary:
            shutil.rmtree(root, ignore_errors=True)  # exports do not survive their actor

    def new_directory(self) -> tuple[str, Path]:
        """A token and the (absent) directory to checkpoint into; expired exports are deleted first."""
        self.expire()
        token = uuidlib.uuid4().hex
        path = self.root / token
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._open[token] = (path, self._clock())
        return token, path

    def path(self, token: str, relative: str) -> Path:
        with self._lock:
            found = self._open.get(token)
            if found is not None:
                self._open[token] = (found[0], self._clock())  # read now: unread from here on
        if found is None:
            raise SnapshotCorrupt(f"no open snapshot export {token!r} (closed or expired)", token=token)
        return _inside(found[0], relative)

    def read(self, token: str, relative: str, offset: int, length: int) -> bytes:
        with open(self.path(token, relative), "rb") as f:
            f.seek(offset)
            return f.read(max(0, min(length, CHUNK_BYTES * 4)))

    def close(self, token: str) -> None:
        with self._lock:
            found = self._open.pop(token, None)
        if found is not None:
            shutil.rmtree(found[0], ignore_errors=True)

    def expire(self) -> None:
        now = self._clock()
        with self._lock:
            stale = [t for t, (_, last_read) in self._open.items() if now - last_read > self._ttl]
        for token in stale:
            log.warning("snapshot export %s expired unclosed; deleting it", token)
            self.close(token)

    def close_all(self) -> None:
        with self._lock:
            tokens = list(self._open)
        for token in tokens:
            self.close(token)
        shutil.rmtree(self.root, ignore_errors=True)
