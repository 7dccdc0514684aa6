"""The memory engine: a ``SortedDict`` of internal keys, made durable by a changelog and periodic snapshots.

Reads never touch disk. With a directory, durability follows Spark's changelog checkpointing:

* every ``apply`` first appends one record (position + rows) to ``changelog-<gen>.log`` and flushes it
  (and fsyncs it, by default), and only then changes memory. A record is ``u32 length, u32 CRC32, msgpack
  [source, batch_id, {key: value or None}]``. A crash while appending leaves a torn or corrupt tail record;
  opening drops it (and truncates it away), so the partition reopens at the previous position with the
  previous rows: the "old or new, never a mix" guarantee. A bad record with records after it is no
  crash's doing: the partition is damaged (``EngineCorrupt``), set aside and rebuilt, never truncated back
  past batches it acknowledged.
* after ``snapshot_records`` records, or once the changelog holds ``max(snapshot_rows, count() // 2)``
  rows, the whole partition is written to ``snapshot-<gen+1>.bin`` (temporary file, fsync, rename, directory
  fsync), a fresh ``changelog-<gen+1>.log`` starts and generation ``gen``'s files are deleted. Tying the row
  threshold to half the store size bounds both costs: the snapshot (O(store)) is paid at most once per
  ``count()/2`` rows written, and a restore replays at most about half the store on top of the snapshot.
* opening loads the newest snapshot and replays its generation's changelog.

A snapshot is ``b"RIQRSNP1"``, a u32 CRC32 of the rest, then msgpack ``[source, batch_id, keys, values]`` with
the keys in order, so loading is a linear merge instead of a sort.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
from sortedcontainers import SortedDict

from runtime.engines.base import (
    NONE,
    EngineCorrupt,
    Position,
    fsync_directory,
    new_directory,
    prepare_directory,
    write_atomically,
)
from runtime.engines.keycodec import KeyCodec
from runtime.keys import KeySchema
from runtime.scan import Bound, Scan, TimeWalk

__all__ = ["MemoryEngine", "SNAPSHOT_RECORDS", "SNAPSHOT_ROWS"]

log = logging.getLogger(__name__)

# Defaults (see the module docstring and docs/design.md for the measurements behind them).
SNAPSHOT_RECORDS = 1000  # bounds the number of records a restore parses, whatever their size
SNAPSHOT_ROWS = 100_000  # small stores: at most this many rows replayed (about 0.2 s)

_RECORD = struct.Struct(">II")
_SNAPSHOT_MAGIC = b"RIQRSNP1"
_CRC = struct.Struct(">I")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


_RECORD_START = 0x93  # every record's payload is the msgpack array [source, batch_id, rows]: fixarray of 3


def _torn(data: bytes, at: int) -> bool:
    """Whether the bytes of a changelog from ``at`` (where the first bad record starts) are a torn last
    append, not damage. Each apply appends one record and syncs it before the next, so a crash (of the
    process, or a power loss during the sync) leaves at most the last record unfinished: cut short, with
    a sector of it never written (zeros, or old bytes), or a file extended and never filled. Whatever is
    left, no whole record follows it. A good record after the bad one is damage (the bad one's length,
    checksum or payload changed after it was written): truncating there would drop acknowledged batches.

    The bad record's own fields are not trusted (damage can point its length anywhere). Records that
    follow damage are whole records to the end of the file, but for a torn last one: so a start is only
    taken seriously when its payload begins as a record's does and the chain of record headers from it,
    each starting the same way, reaches the end of the file (or a torn last record), and only then is its
    checksum and its shape checked. That keeps the search linear on a large torn record, whose bytes hold
    many four-byte windows that read as a length (only opening a damaged changelog pays for it)."""
    start = data.find(_RECORD_START, at + 1 + _RECORD.size)
    while start != -1:
        candidate = start - _RECORD.size
        if _chains_to_the_end(data, candidate) and _whole_record(data, candidate):
            return False
        start = data.find(_RECORD_START, start + 1)
    return True  # nothing whole follows it


def _chains_to_the_end(data: bytes, start: int) -> bool:
    """Whether record headers from ``start`` (read without checksums) step from one record start to the
    next and end exactly at the end of the file, or at a last record that is cut short or zeros."""
    end = len(data)
    at = start
    while True:
        if at + _RECORD.size > end:
            return at != start  # the end, or a header cut short: the torn last append
        length = int.from_bytes(data[at : at + 4], "big")
        payload = at + _RECORD.size
        if length == 0:  # a header never written: the last append, if zeros to the end
            return at != start and not data[at:].strip(b"\0")
        if payload + length > end:  # the last record, cut short: it must start as a record does
            return at != start and (payload == end or data[payload] == _RECORD_START)
        if data[payload] != _RECORD_START:
            return False
        at = payload + length


def _whole_record(data: bytes, start: int) -> bool:
    """Whether a checksum-valid record of riqr's shape ``[source, batch_id, rows]`` starts at ``start``."""
    length, crc = _RECORD.unpack_from(data, start)
    payload = memoryview(data)[start + _RECORD.size : start + _RECORD.size + length]
    if zlib.crc32(payload) != crc:
        return False
    try:
        source, batch_id, rows = _unpack(payload)
    except Exception:  # noqa: BLE001 - not a record, whatever its checksum says
        return False
    return isinstance(source, str) and isinstance(batch_id, int) and isinstance(rows, dict)


def _unpack(payload: bytes | memoryview) -> Any:
    # use_list=False turns msgpack arrays back into tuples: composite keys come back as the tuples they were.
    return msgpack.unpackb(payload, use_list=False, strict_map_key=False, raw=False)


def _key_checker(schema: KeySchema) -> Callable[[Any], bool]:
    """A fast test that a key fits the schema: checked before logging, so a bad row cannot reach the log."""

    def component(kind: str) -> Callable[[Any], bool]:
        if kind == "string":
            return lambda v: type(v) is str
        return lambda v: type(v) is int and _INT64_MIN <= v <= _INT64_MAX

    checks = [component(t.kind) for _, t in schema.columns]
    if not schema.composite:
        return checks[0]
    width = len(checks)
    return lambda k: type(k) is tuple and len(k) == width and all(c(v) for c, v in zip(checks, k))


class MemoryEngine:
    """A partition in a ``SortedDict``; durable through a changelog and snapshots when given a directory."""

    kind = "memory"
    # A SortedDict may not be iterated while another thread inserts into it; point reads are dict reads.
    concurrent_scans = False

    def __init__(
        self,
        schema: KeySchema,
        path: Path | None = None,
        *,
        fsync: bool = True,
        snapshot_records: int = SNAPSHOT_RECORDS,
        snapshot_rows: int = SNAPSHOT_ROWS,
    ) -> None:
        self.schema = schema
        self.path = path
        self._fsync = fsync
        self._snapshot_records = snapshot_records
        self._snapshot_rows = snapshot_rows
        self._fits = _key_checker(schema)
        self._rows: SortedDict = SortedDict()
        self._position = NONE
        self._generation = 0
        self._log_fd: int | None = None
        self._log_size = 0
        self._log_records = 0
        self._log_rows = 0
        self._closed = False
        if path is not None:
            prepare_directory(self.kind, schema, path)
            self._recover(path)

    # -- reads -------------------------------------------------------------------------------------------

    def get(self, key: Any) -> bytes | None:
        """The value of ``key``, or None."""
        value: bytes | None = self._rows.get(key)
        return value

    def get_many(self, keys: Sequence[Any]) -> list[bytes | None]:
        """One value (or None) per key."""
        get = self._rows.get
        return [get(k) for k in keys]

    def scan(self, scan: Scan, walk: TimeWalk | None = None) -> Iterator[tuple[Any, bytes]]:
        """The entries within the scan's bounds, lazily, in its direction (``PartitionEngine.scan``)."""
        if walk is not None:
            return self._walk(scan, walk)
        return self._entries(scan.lo, scan.hi, scan.reverse)

    def _entries(self, lo: Bound | None, hi: Bound | None, reverse: bool) -> Iterator[tuple[Any, bytes]]:
        keys = self._rows.irange(
            None if lo is None else lo.key,
            None if hi is None else hi.key,
            inclusive=(lo is None or lo.inclusive, hi is None or hi.inclusive),
            reverse=reverse,
        )
        rows = self._rows
        for key in keys:
            yield key, rows[key]

    def _walk(self, scan: Scan, walk: TimeWalk) -> Iterator[tuple[Any, bytes]]:
        """The entries ``walk`` admits; a run of refused ones that ``walk`` can jump over starts a new range
        where it says (the caller holds the write lock throughout: every range reads the same rows)."""
        reverse = scan.reverse
        entries = self._entries(scan.lo, scan.hi, reverse)
        pace, refused = walk.pace(), 0
        entry = next(entries, None)
        while entry is not None:
            key, raw = entry
            if walk.admits(key, raw):
                refused = 0
                yield entry
            elif (refused := refused + 1) >= pace.patience:
                refused, to = 0, pace.jump(key)
                if to is not None and (to.key < key if reverse else to.key > key):  # never back
                    entry = next(entries, None)  # one step first: is it there already?
                    needed = entry is not None and (entry[0] > to.key if reverse else entry[0] < to.key)
                    if needed:
                        entries = self._entries(scan.lo, to, True) if reverse else self._entries(to, scan.hi, False)
                        entry = next(entries, None)
                    pace.sought(needed)
                    continue
            entry = next(entries, None)

    def read_encoded(self, scan: Scan, limit: int | None, max_bytes: int) -> tuple[list[bytes], list[bytes], bool]:
        """A page of the scan with ``KeyCodec`` keys (``PartitionEngine.read_encoded``); keys are encoded here."""
        encode = KeyCodec(self.schema).encode
        keys: list[bytes] = []
        values: list[bytes] = []
        size = 0
        cap = -1 if limit is None else limit
        for key, value in self.scan(scan):
            encoded = encode(key)
            keys.append(encoded)
            values.append(value)
            size += len(encoded) + len(value)
            if len(keys) == cap or size >= max_bytes:
                return keys, values, True
        return keys, values, False

    def count(self) -> int:
        """The exact number of keys."""
        return len(self._rows)

    def position(self) -> Position:
        """The position the rows reflect."""
        return self._position

    # -- writes ------------------------------------------------------------------------------------------

    def apply(self, position: Position, rows: Sequence[tuple[Any, bytes | None]]) -> None:
        """Log the rows and the position, then apply them; the last write of a key wins."""
        self._check_open()
        final = dict(rows)
        for key, value in final.items():
            if not self._fits(key):
                raise TypeError(f"key {key!r} does not fit the key schema ({self.schema.type_label})")
            if value is not None and type(value) is not bytes:
                raise TypeError(f"value for key {key!r} is {type(value).__name__}, not bytes")
        if self._log_fd is not None:
            self._append(msgpack.packb([position.source, position.batch_id, final], use_bin_type=True))
            self._log_records += 1
            self._log_rows += len(final)
        self._write(position, final)
        if self._log_fd is not None and self._snapshot_due():
            try:
                self._roll()
            except OSError:
                # The apply itself is durable in the changelog; a failed snapshot is retried next time.
                log.exception("memory engine %s: snapshot failed, will retry", self.path)

    def _write(self, position: Position, final: dict[Any, bytes | None]) -> None:
        rows = self._rows
        # In key order: consecutive inserts then land in the same or the next sublist of the SortedDict,
        # which keeps them in the CPU cache; 50,000 random new keys into 10 million apply about 25% faster
        # (bench/apply_reads.py), sort included.
        for key in sorted(final):
            value = final[key]
            if value is None:
                rows.pop(key, None)
            else:
                rows[key] = value
        self._position = position

    def reset(self, position: Position) -> None:
        """Drop every row and move to ``position``: an empty snapshot makes that one atomic step."""
        self._check_open()
        if self.path is not None:
            self._roll(SortedDict(), position)
        self._rows = SortedDict()
        self._position = position

    def _check_open(self) -> None:
        # Without this, a write after close() would change nothing durable yet look like it succeeded.
        if self._closed:
            raise RuntimeError(f"the memory engine at {self.path} is closed")

    def _snapshot_due(self) -> bool:
        return self._log_records >= self._snapshot_records or self._log_rows >= max(
            self._snapshot_rows, len(self._rows) // 2
        )

    # -- durability --------------------------------------------------------------------------------------

    def _append(self, payload: bytes) -> None:
        assert self._log_fd is not None
        record = _RECORD.pack(len(payload), zlib.crc32(payload)) + payload
        try:
            written = os.write(self._log_fd, record)
            if written != len(record):
                raise OSError(f"short write to the changelog ({written} of {len(record)} bytes)")
            if self._fsync:
                os.fsync(self._log_fd)
        except BaseException:
            # Cut the partial record off, or later records would sit behind garbage and be lost on replay.
            os.ftruncate(self._log_fd, self._log_size)
            raise
        self._log_size += len(record)

    def _roll(self, rows: SortedDict | None = None, position: Position | None = None) -> None:
        """Snapshot ``rows`` at ``position`` (default: the current state) as the next generation."""
        assert self.path is not None
        new = self._generation + 1
        snapshot = self.path / f"snapshot-{new:012d}.bin"
        # The new changelog first: once the snapshot is in place a restart takes it (the newest) and deletes
        # this generation's changelog, so nothing may fail after it and leave later batches in that one.
        fd = os.open(self.path / f"changelog-{new:012d}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC)
        try:
            write_snapshot(snapshot, self._rows if rows is None else rows, position or self._position)
            fsync_directory(self.path)
        except BaseException:
            os.close(fd)
            self._undo_roll(snapshot)
            raise
        self._close_log()
        self._log_fd, self._log_size, self._log_records, self._log_rows = fd, 0, 0, 0
        self._generation = new
        self._remove_older(self.path, new)

    def _undo_roll(self, snapshot: Path) -> None:
        """A roll failed: its snapshot must not outlive it, or a restart would take it over the batches the
        changelog of this generation gets after it. If it cannot be removed, the engine takes no more
        writes (a batch then fails, and is delivered again after the actor restarts)."""
        try:
            snapshot.unlink(missing_ok=True)
            fsync_directory(snapshot.parent)
        except OSError:
            self._closed = True
            log.exception("memory engine %s: a failed snapshot could not be removed; no more writes until a restart",
                          self.path)  # fmt: skip

    def _close_log(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    @staticmethod
    def _remove_older(path: Path, generation: int) -> None:
        for f in path.iterdir():
            unfinished = f.name.startswith(".") and f.name.endswith(".tmp")
            if unfinished or (f.name.startswith(("snapshot-", "changelog-")) and _generation_of(f) < generation):
                f.unlink()

    def _recover(self, path: Path) -> None:
        # The snapshot and the changelog are gathered into a plain dict and sorted once at the end: the
        # snapshot's keys come first, in order, and the keys the changelog adds after them, so the sort
        # merges one long run with the sorted new keys. Inserting the changelog's keys into a SortedDict one
        # by one cost 45 s for a 10-million-key partition (bench/engines.py, restore).
        rows: dict[Any, bytes] = {}
        snapshots = sorted((_generation_of(f), f) for f in path.glob("snapshot-*.bin"))
        if snapshots:
            self._generation, newest = snapshots[-1]
            self._position, keys, values = _read_snapshot_columns(newest)
            rows = dict(zip(keys, values))
            del keys, values
        self._remove_older(path, self._generation)
        changelog = path / f"changelog-{self._generation:012d}.log"
        if changelog.exists():
            self._replay(changelog, rows)
        self._rows = SortedDict(rows)
        self._log_fd = os.open(changelog, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        fsync_directory(path)

    def _replay(self, changelog: Path, rows: dict[Any, bytes]) -> None:
        data = changelog.read_bytes()
        at = 0
        while at + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, at)
            payload = data[at + _RECORD.size : at + _RECORD.size + length]
            if length == 0 or len(payload) != length or zlib.crc32(payload) != crc:
                break  # a torn tail, or damage: told apart below
            try:
                source, batch_id, final = _unpack(payload)
            except Exception as err:  # noqa: BLE001 - its CRC holds: written so, not torn
                what = f"changelog {changelog}: the record at byte {at} is not one"
                raise EngineCorrupt(what, path=str(changelog)) from err
            for key, value in final.items():
                if value is None:
                    rows.pop(key, None)
                else:
                    rows[key] = value
            self._position = Position(source, batch_id)
            self._log_records += 1
            self._log_rows += len(final)
            at += _RECORD.size + length
        if at != len(data):
            if not _torn(data, at):
                # Acknowledged batches follow the bad record: truncating would drop them and serve the
                # partition as if it had never had them. Damage: set aside and rebuilt (runtime.query).
                raise EngineCorrupt(
                    f"changelog {changelog}: the record at byte {at} is damaged and {len(data) - at} bytes of "
                    "records follow it",
                    path=str(changelog),
                )
            # A torn tail is the crash-mid-apply case: that apply never happened.
            log.warning("memory engine %s: dropping %d bytes of incomplete changelog", changelog, len(data) - at)
            os.truncate(changelog, at)
        self._log_size = at

    # -- copies and lifecycle ----------------------------------------------------------------------------

    def checkpoint(self, dest: Path) -> Position:
        """Write the current rows and position into the new directory ``dest`` as generation 0's snapshot."""
        return self.start_checkpoint(dest).finish()

    def start_checkpoint(self, dest: Path) -> _PendingSnapshot:
        """Copy references now, at C speed (0.08 s per million keys): the keys in order, and the dict's
        keys and values in its own order; pairing values with the ordered keys (most of the cost) and
        serialising happen in ``finish()``, outside the caller's lock.

        Values are immutable bytes and a write replaces them rather than changing them, so the copied lists
        stay the state at this instant while later applies go on.
        """
        new_directory(self.kind, self.schema, dest)
        ordered = list(self._rows.keys())
        stored = (list(dict.keys(self._rows)), list(dict.values(self._rows)))
        return _PendingSnapshot(dest / f"snapshot-{0:012d}.bin", self._position, ordered, stored)

    def memory(self) -> dict[str, int]:
        """Nothing outside Python objects: the rows are the process's own heap."""
        return {}

    def close(self) -> None:
        """Close the changelog and drop the rows."""
        self._closed = True
        self._close_log()
        self._rows = SortedDict()

    def destroy(self) -> None:
        """Close and delete the directory."""
        self.close()
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)


class _PendingSnapshot:
    """A memory partition's keys and values captured by ``start_checkpoint``, written out by ``finish``."""

    def __init__(
        self, path: Path, position: Position, ordered: list[Any], stored: tuple[list[Any], list[bytes]]
    ) -> None:
        self.path, self.position, self._ordered, self._stored = path, position, ordered, stored

    def finish(self) -> Position:
        value_of = dict(zip(*self._stored))
        _write_snapshot_lists(self.path, self._ordered, list(map(value_of.__getitem__, self._ordered)), self.position)
        self._ordered, self._stored = [], ([], [])
        return self.position


def _generation_of(path: Path) -> int:
    return int(path.name.split("-", 1)[1].split(".", 1)[0])


def write_snapshot(path: Path, rows: SortedDict, position: Position) -> None:
    """Write ``rows`` (in key order) and ``position`` to ``path`` atomically."""
    keys = list(rows.keys())
    _write_snapshot_lists(path, keys, list(map(rows.__getitem__, keys)), position)


def _write_snapshot_lists(path: Path, keys: list[Any], values: list[bytes], position: Position) -> None:
    body = msgpack.packb([position.source, position.batch_id, keys, values], use_bin_type=True)
    write_atomically(path, _SNAPSHOT_MAGIC + _CRC.pack(zlib.crc32(body)) + body)


def read_snapshot(path: Path) -> tuple[Position, SortedDict]:
    """The position and rows in a snapshot file; ``EngineCorrupt`` if it is damaged."""
    position, keys, values = _read_snapshot_columns(path)
    return position, SortedDict(zip(keys, values))


def _read_snapshot_columns(path: Path) -> tuple[Position, Sequence[Any], Sequence[bytes]]:
    """The position, keys (in order) and values in a snapshot file; ``EngineCorrupt`` if it is damaged."""
    data = path.read_bytes()
    head = len(_SNAPSHOT_MAGIC) + _CRC.size
    body = memoryview(data)[head:]
    if data[: len(_SNAPSHOT_MAGIC)] != _SNAPSHOT_MAGIC or _CRC.unpack_from(data, len(_SNAPSHOT_MAGIC))[0] != zlib.crc32(
        body
    ):
        # Snapshots are renamed into place only when complete, so damage here is not a crash's doing.
        raise EngineCorrupt(f"snapshot {path} is damaged", path=str(path))
    source, batch_id, keys, values = _unpack(body)
    return Position(source, batch_id), keys, values
