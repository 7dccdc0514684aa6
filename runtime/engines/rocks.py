"""The rocksdb engine: one RocksDB database (through ``rocksdict``) per partition directory.

Layout of a partition directory: ``riqr-engine.json`` (the manifest) and ``rocksdb/`` (the database, in
rocksdict's raw mode: bytes in, bytes out). User keys are stored under their ``KeyCodec`` bytes, which start
with ``0x01``; the engine's metadata lives under ``META_PREFIX`` (``0x00``), where no user key can be:
``0x00 "meta"`` holds msgpack ``[source, batch_id, count]``.

``apply`` writes the rows, the new position and the new exact count in ONE ``WriteBatch``: RocksDB applies
a batch atomically (one WAL record), so after a crash the partition has the old rows, position and count or
the new ones. A large batch (``INGEST_FILE_ROWS`` rows or more, of keys encoded from Arrow) goes in as SST
files instead: its rows in one, the metadata in another, written in ``ingest/`` and moved into the database
by ONE ingestion, as atomic; a copy of the partition that was where this one was can ingest the same rows'
file (``_ingest_copy``). The count needs to know which keys exist
already: one ``multi_get`` over the batch's keys (rocksdict: ``Rdict.get(list)``) answers that for a batch
of few keys next to the partition's, one iterator walking the partition in step with the batch's sorted
keys for a batch of many (``WALK_SHARE``).

Options, kept modest for a 2-core node holding many partitions: two background jobs, 16 MiB memtables (at
most two per partition), LZ4, a 10-bit Bloom filter for point gets, one block cache shared by every
partition in the process (``ROCKSDB_CACHE_BYTES``: 256 MiB unless ``RIQR_ROCKSDB_CACHE_MB`` says otherwise),
at most 2 info logs kept. Index and filter blocks are partitioned and live in that cache (only their small
top-level blocks are pinned), so what a query actor holds for RocksDB is bounded by the cache and the
memtables, whatever the key count: state larger than memory stays on disk (bench/large_state.py). Writes
are synced (``WriteOptions.sync``) by default, so a batch acknowledged to Spark survives a machine crash, not
only a process crash.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import itertools
import shutil
import uuid
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import msgpack
from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    RdictIter,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

from runtime.batchrows import BatchRows, WrittenFile
from runtime.config import ROCKSDB_CACHE_BYTES
from runtime.engines.base import NONE, Position, new_directory, prepare_directory
from runtime.engines.keycodec import KEYS_HI, KEYS_LO, META_PREFIX, KeyCodec
from runtime.keys import KeySchema
from runtime.scan import Scan, TimeWalk

__all__ = ["RocksEngine"]

_META = META_PREFIX + b"meta"
# A batch with at least this share of the partition's count in keys reads their presence by walking the
# partition with one iterator from the batch's first key to its last, in step with the batch's sorted
# keys, rather than by one multi-get: a step of the walk costs about a fifth of a multi-get's lookup, and
# the walk steps over every key of the partition in that range. 250,000 keys of a 250,000-key partition:
# 0.063 s walked against 0.289 s multi-got; a quarter of them 0.054 s against 0.066 s; 2% of them 0.050 s
# against 0.005 s (docs/benchmarks.md, "Seventh pass").
WALK_SHARE = 0.25
_DB_DIR = "rocksdb"
_INGEST_DIR = "ingest"  # SST files being written, before RocksDB ingests (moves) them into _DB_DIR
# A batch of at least this many encoded rows is written as an ingested SST file, not a write batch: per
# row, a write batch costs the memtable insert, the write-ahead log and the flush that writes the rows
# again as an SST file later; a file ingested costs a fixed few milliseconds more (docs/design.md,
# "Ingest", fifth pass).
INGEST_FILE_ROWS = 50_000
_MEMORY_PROPERTIES = (
    ("block_cache", "block-cache-usage"),
    ("block_cache_pinned", "block-cache-pinned-usage"),
    ("memtables", "cur-size-all-mem-tables"),
    ("table_readers", "estimate-table-readers-mem"),
)
_shared_cache: Cache | None = None


def _options() -> Options:
    global _shared_cache
    if _shared_cache is None:
        _shared_cache = Cache(ROCKSDB_CACHE_BYTES)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_background_jobs(2)
    options.set_write_buffer_size(16 << 20)
    options.set_max_write_buffer_number(2)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_keep_log_file_num(2)
    table = BlockBasedOptions()
    table.set_block_cache(_shared_cache)
    table.set_bloom_filter(10, False)
    # Outside the cache (RocksDB's default) index and filter blocks cost about 1.4 bytes per key for good.
    # Whole filters inside the cache stalled loading past 10 million keys (every apply's multi-get paged
    # multi-megabyte filters through it); partitioned ones move in 4 KiB pieces (measured in
    # docs/benchmarks.md, "State larger than memory").
    table.set_format_version(5)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    options.set_block_based_table_factory(table)
    return options


def _meta(position: Position, count: int) -> bytes:
    """The metadata key's value: the partition's position and count."""
    packed: bytes = msgpack.packb([position.source, position.batch_id, count], use_bin_type=True)
    return packed


def _write_rows(
    put: Callable[[bytes, bytes], object],
    delete: Callable[[bytes], object],
    keys: list[bytes],
    values: list[bytes | None],
    deletes: bool,
) -> None:
    """Each key's put, or its delete where ``values`` has None (``deletes``: there is one), in order, into
    a write batch or SST file."""
    if deletes:
        for key, value in zip(keys, values):
            if value is None:
                delete(key)
            else:
                put(key, value)
    else:  # no deletes (the usual batch): one C-level pass
        collections.deque(map(put, keys, cast(list[bytes], values)), maxlen=0)


def _ingest_options() -> IngestExternalFileOptions:
    options = IngestExternalFileOptions()
    options.set_move_files(True)  # a hard link: the file is ours, in the same file system
    return options


class _DoneCheckpoint:
    """A checkpoint written in full by ``start_checkpoint``: ``finish`` has nothing left to do."""

    def __init__(self, position: Position) -> None:
        self.position = position

    def finish(self) -> Position:
        return self.position


class RocksEngine:
    """A partition in its own RocksDB database; rows, position and count change in one atomic write (a
    write batch, or an ingested SST file for a large batch)."""

    kind = "rocksdb"
    # RocksDB iterators read a consistent view while writes go on.
    concurrent_scans = True

    def __init__(self, schema: KeySchema, path: Path, *, sync: bool = True) -> None:
        self.schema = schema
        self.path = path
        prepare_directory(self.kind, schema, path)
        self._codec = KeyCodec(schema)
        self._db: Rdict | None = Rdict(str(path / _DB_DIR), _options())
        # Files a crash left before their ingestion; only now, with the database's lock held, so that an
        # engine opened on a partition in use fails on the lock without touching that one's files.
        shutil.rmtree(path / _INGEST_DIR, ignore_errors=True)
        self._write_options = WriteOptions()
        self._write_options.sync = sync
        # Live scans hold RocksDB iterators, which keep the database (and its lock) alive past close().
        self._scans: weakref.WeakSet[Generator[tuple[Any, bytes], None, None]] = weakref.WeakSet()
        meta = self._db.get(_META)
        if meta is None:
            self._position, self._count = NONE, 0
        else:
            source, batch_id, self._count = msgpack.unpackb(meta, raw=False)
            self._position = Position(source, batch_id)

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise RuntimeError(f"the rocksdb engine at {self.path} is closed")
        return self._db

    # -- reads -------------------------------------------------------------------------------------------

    def get(self, key: Any) -> bytes | None:
        """The value of ``key``, or None."""
        value: bytes | None = self.db.get(self._codec.encode(key))
        return value

    def get_many(self, keys: Sequence[Any]) -> list[bytes | None]:
        """One value (or None) per key, in one multi-get."""
        if not keys:
            return []
        encode = self._codec.encode
        return self._multi_get([encode(k) for k in keys])

    def _present(self, keys: list[bytes]) -> list[bool]:
        """Whether each of ``keys`` (encoded, each once, in byte order) is in the partition (``WALK_SHARE``
        says how it is read)."""
        if not keys:
            return []
        if len(keys) < WALK_SHARE * self._count:
            return [value is not None for value in self._multi_get(keys)]
        it = self.db.iter()
        it.seek(keys[0])
        valid, key, step = it.valid, it.key, it.next
        current: bytes | None = key() if valid() else None
        present: list[bool] = []
        for wanted in keys:
            while current is not None and current < wanted:
                step()
                current = key() if valid() else None
            present.append(current == wanted)
        return present

    def _multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        return cast(list[bytes | None], self.db.get(cast(list[Any], keys)))

    def scan(self, scan: Scan, walk: TimeWalk | None = None) -> Iterator[tuple[Any, bytes]]:
        """The entries within the scan's bounds, in its direction, read from a RocksDB iterator as consumed
        (``PartitionEngine.scan``; with ``walk``, the same iterator seeks where it says: one snapshot).

        The iterator is created here, so the scan sees the partition as it is at this call.
        """
        encode = self._codec.encode
        lo = None if scan.lo is None else (encode(scan.lo.key), scan.lo.inclusive)
        hi = None if scan.hi is None else (encode(scan.hi.key), scan.hi.inclusive)
        it = self.db.iter()
        entries = self._backward(it, lo, hi, walk) if scan.reverse else self._forward(it, lo, hi, walk)
        self._scans.add(entries)
        return entries

    @staticmethod
    def _seek(it: RdictIter, key: bytes, inclusive: bool) -> None:
        """``it`` at the first key at or after ``key`` (after it, if not ``inclusive``)."""
        it.seek(key)
        if not inclusive and it.valid() and it.key() == key:
            it.next()

    @staticmethod
    def _seek_back(it: RdictIter, key: bytes, inclusive: bool) -> None:
        """``it`` at the last key at or before ``key`` (before it, if not ``inclusive``)."""
        it.seek_for_prev(key)
        if not inclusive and it.valid() and it.key() == key:
            it.prev()

    def _forward(
        self, it: RdictIter, lo: tuple[bytes, bool] | None, hi: tuple[bytes, bool] | None, walk: TimeWalk | None
    ) -> Generator[tuple[Any, bytes], None, None]:
        if lo is None:
            it.seek(KEYS_LO)
        else:
            self._seek(it, *lo)

        def past(key: bytes) -> bool:
            return key >= KEYS_HI or (hi is not None and (key > hi[0] or (key == hi[0] and not hi[1])))

        if walk is not None:
            yield from self._walk(it, past, it.next, self._seek, walk)
            return
        decode = self._codec.decode
        while it.valid():
            key = it.key()
            if key >= KEYS_HI or (hi is not None and (key > hi[0] or (key == hi[0] and not hi[1]))):
                return
            yield decode(key), it.value()
            it.next()
        it.status()

    def _backward(
        self, it: RdictIter, lo: tuple[bytes, bool] | None, hi: tuple[bytes, bool] | None, walk: TimeWalk | None
    ) -> Generator[tuple[Any, bytes], None, None]:
        if hi is None:
            it.seek_for_prev(KEYS_HI)
        else:
            self._seek_back(it, *hi)

        def past(key: bytes) -> bool:
            return key < KEYS_LO or (lo is not None and (key < lo[0] or (key == lo[0] and not lo[1])))

        if walk is not None:
            yield from self._walk(it, past, it.prev, self._seek_back, walk)
            return
        decode = self._codec.decode
        while it.valid():
            key = it.key()
            if key < KEYS_LO or (lo is not None and (key < lo[0] or (key == lo[0] and not lo[1]))):
                return
            yield decode(key), it.value()
            it.prev()
        it.status()

    def _walk(
        self,
        it: RdictIter,
        past: Callable[[bytes], bool],
        step: Callable[[], None],
        seek: Callable[[RdictIter, bytes, bool], None],
        walk: TimeWalk,
    ) -> Generator[tuple[Any, bytes], None, None]:
        """The entries from ``it`` on, in scan order (``step``), until one is ``past`` the far bound, that
        ``walk`` admits; after a run of refused ones it can jump over, ``seek`` where it says."""
        decode, encode, reverse = self._codec.decode, self._codec.encode, walk.reverse
        pace, refused = walk.pace(), 0
        while it.valid():
            key = it.key()
            if past(key):
                return
            entry, raw = decode(key), it.value()
            if walk.admits(entry, raw):
                refused = 0
                yield entry, raw
            elif (refused := refused + 1) >= pace.patience:
                refused, to = 0, pace.jump(entry)
                target = None if to is None else encode(to.key)
                if to is not None and target is not None and (target < key if reverse else target > key):  # not back
                    step()  # one step first: is it there already?
                    needed = it.valid() and (it.key() > target if reverse else it.key() < target)
                    if needed:
                        seek(it, target, to.inclusive)
                    pace.sought(needed)
                    continue
            step()
        it.status()

    def read_encoded(self, scan: Scan, limit: int | None, max_bytes: int) -> tuple[list[bytes], list[bytes], bool]:
        """A page of the scan as stored (``PartitionEngine.read_encoded``): keys are not decoded, and entries
        come from RocksDB's iterator in runs of up to 256 per call, each checked against the far bound once
        (it is sorted), so a page costs a few calls per run rather than three per entry."""
        encode = self._codec.encode
        lo = None if scan.lo is None else (encode(scan.lo.key), scan.lo.inclusive)
        hi = None if scan.hi is None else (encode(scan.hi.key), scan.hi.inclusive)
        # As half-open byte bounds [lower, upper): b + 0x00 is the least key above b (encoded keys are
        # prefix-free, and a bound's extensions sort above it).
        lower = KEYS_LO if lo is None else lo[0] if lo[1] else lo[0] + b"\x00"
        upper = KEYS_HI if hi is None else hi[0] + b"\x00" if hi[1] else hi[0]
        if scan.reverse:
            # Seeks to the last key at or before ``hi``; an exclusive ``hi`` itself is dropped below.
            items = self.db.items(backwards=True, from_key=KEYS_HI if hi is None else hi[0])
        else:
            items = self.db.items(from_key=lower)
        keys: list[bytes] = []
        values: list[bytes] = []
        size = 0
        left = -1 if limit is None else limit
        first = True
        while left != 0:
            run = cast(list[tuple[bytes, bytes]], list(itertools.islice(items, 256 if left < 0 else min(256, left))))
            if first and run and hi is not None and scan.reverse and not hi[1] and run[0][0] == hi[0]:
                run = run[1:] + cast(list[tuple[bytes, bytes]], list(itertools.islice(items, 1)))
            first = False
            if not run:
                return keys, values, False
            run_keys = [k for k, _ in run]
            # The far bound: keys are ascending (forward) or descending (reverse) within the run.
            if scan.reverse and run_keys[-1] < lower:
                end = next(i for i, k in enumerate(run_keys) if k < lower)
                return keys + run_keys[:end], values + [v for _, v in run[:end]], False
            if not scan.reverse and run_keys[-1] >= upper:
                end = bisect.bisect_left(run_keys, upper)
                return keys + run_keys[:end], values + [v for _, v in run[:end]], False
            run_values = [v for _, v in run]
            keys += run_keys
            values += run_values
            left -= len(run)
            size += sum(map(len, run_keys)) + sum(map(len, run_values))
            if size >= max_bytes:
                break
        return keys, values, True

    def count(self) -> int:
        """The exact number of keys (kept with the rows, not counted)."""
        return self._count

    def position(self) -> Position:
        """The position the rows reflect."""
        return self._position

    def memory(self) -> dict[str, int]:
        """RocksDB's own accounting. The block cache is shared by every partition of the process."""
        db = self.db
        return {name: int(db.property_int_value(f"rocksdb.{prop}") or 0) for name, prop in _MEMORY_PROPERTIES}

    # -- writes ------------------------------------------------------------------------------------------

    def apply(self, position: Position, rows: Sequence[tuple[Any, bytes | None]]) -> None:
        """Rows, position and count in one atomic write; the last write of a key wins.

        A batch of ``INGEST_FILE_ROWS`` rows or more whose keys were encoded from Arrow (``BatchRows.encoded``;
        each key once) is written as SST files RocksDB ingests (``_ingest``; always synced, whatever
        ``sync`` says); any other batch as a write batch. A batch another copy of the partition wrote as a
        file (``BatchRows.written``, handed over in its ``EncodedSlice``) is that same file ingested here,
        when this copy was where that one was before it (same position, same count)."""
        if isinstance(rows, BatchRows) and self._ingest_copy(position, rows):
            return
        encoded = rows.encoded() if isinstance(rows, BatchRows) else None
        if encoded is not None:
            # Keys encoded from the Arrow columns (runtime.batchrows): each once (its last write), in key order.
            keys, values = encoded
        else:
            final = dict(rows)
            # Everything that can fail on a bad row fails here, before the batch is written.
            keys = self._codec.encode_many(final)
            values = list(final.values())
        # The count is kept exact, so each key's old presence is read; an empty partition (a fresh store,
        # or the reset before a new source's batch 0, which re-emits the whole state) has none to read.
        count = self._count
        if encoded is None:
            # In key order the presence read walks each block once, and the write batch's inserts into the
            # memtable follow each other in memory: several times faster than Spark's (hash) order, sort
            # included (bench/apply_batch.py).
            order = sorted(range(len(keys)), key=keys.__getitem__)
            keys = [keys[i] for i in order]
            values = [values[i] for i in order]
        # Whether any row deletes: known from the Arrow values' null count, else one look at the list.
        deletes = rows.has_deletes() if encoded is not None and isinstance(rows, BatchRows) else None in values
        present = self._present(keys) if count else []
        # Every row is written, a delete of a key that is not there too (a harmless tombstone): what is
        # written depends on the batch alone, not on this copy's rows, which a copy ingesting another's
        # file relies on (``_ingest_copy``). Only the count depends on the rows.
        if not deletes:  # the usual batch: every row is a put, the new keys count
            count += present.count(False) if count else len(keys)
        else:
            for value, old in zip(values, present if count else itertools.repeat(False)):
                if value is None:
                    count -= old
                else:
                    count += not old
        if encoded is not None and len(keys) >= INGEST_FILE_ROWS:
            assert isinstance(rows, BatchRows)
            self._ingest(position, count, keys, values, deletes, rows)
        else:
            batch = WriteBatch(raw_mode=True)
            _write_rows(batch.put, batch.delete, keys, values, deletes)
            batch.put(_META, _meta(position, count))
            self.db.write(batch, self._write_options)
        self._count, self._position = count, position

    def _ingest(
        self,
        position: Position,
        count: int,
        keys: list[bytes],
        values: list[bytes | None],
        deletes: bool,
        rows: BatchRows,
    ) -> None:
        """Write the batch's rows as one SST file (each key's put, or delete where ``values`` has None, in
        key order) and have RocksDB ingest it with the metadata (``_ingest_files``): atomic and durable
        like a synced write batch, without a write batch's memtable inserts, write-ahead log and later
        flush. With ``rows.share_written``, the file's bytes go to ``rows.written`` for the partition's
        other copies (``_ingest_copy``)."""
        with self._ingest_paths(position) as (rows_path, meta_path):
            writer = SstFileWriter(_options())
            writer.open(str(rows_path))
            _write_rows(writer.__setitem__, writer.__delitem__, keys, values, deletes)
            writer.finish()
            if rows.share_written:
                rows.written = WrittenFile(
                    rows_path.read_bytes(),
                    before=(self._position.source, self._position.batch_id, self._count),
                    after=(position.source, position.batch_id, count),
                )
            self._ingest_files(rows_path, meta_path, position, count)

    def _ingest_copy(self, position: Position, rows: BatchRows) -> bool:
        """Ingest the rows' file another copy wrote of this batch, if it came with one and this copy was in
        the state that copy was in (same position, same count: the file's count follows from that copy's);
        False when not, to apply the rows."""
        written = rows.written_elsewhere()
        if written is None:
            return False
        if written.before != (self._position.source, self._position.batch_id, self._count):
            return False
        if written.after[:2] != (position.source, position.batch_id):
            return False
        count = written.after[2]
        with self._ingest_paths(position) as (rows_path, meta_path):
            rows_path.write_bytes(written.data)
            self._ingest_files(rows_path, meta_path, position, count)
        self._count, self._position = count, position
        rows.written = written  # the batch is in this copy as that file
        return True

    @contextlib.contextmanager
    def _ingest_paths(self, position: Position) -> Iterator[tuple[Path, Path]]:
        """Where a batch's rows' file and metadata file are written; both removed on the way out (moved
        into the database by a successful ingestion, or left by a failed one)."""
        directory = self.path / _INGEST_DIR
        directory.mkdir(exist_ok=True)
        stem = f"{position.batch_id}-{uuid.uuid4().hex}"
        paths = directory / f"{stem}-rows.sst", directory / f"{stem}-meta.sst"
        try:
            yield paths
        finally:
            for path in paths:
                path.unlink(missing_ok=True)

    def _ingest_files(self, rows_path: Path, meta_path: Path, position: Position, count: int) -> None:
        """Ingest the rows' file and a one-key file of the metadata (``position``, ``count``) in ONE call:
        RocksDB adds both files to the database in one manifest record, so rows, position and count change
        together. The metadata has a file of its own because its key is in every batch's: a rows' file
        holding it would overlap every earlier one and go to level 0, into compactions, instead of to the
        lowest level its keys allow (for keys new to the partition, the bottom one)."""
        writer = SstFileWriter(_options())
        writer.open(str(meta_path))
        writer[_META] = _meta(position, count)
        writer.finish()
        self.db.ingest_external_file([str(meta_path), str(rows_path)], _ingest_options())

    def reset(self, position: Position) -> None:
        """Drop every row (one range deletion) and move to ``position``, in one write batch."""
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(KEYS_LO, KEYS_HI)
        batch.put(_META, _meta(position, 0))
        self.db.write(batch, self._write_options)
        self._count, self._position = 0, position

    # -- copies and lifecycle ----------------------------------------------------------------------------

    def checkpoint(self, dest: Path) -> Position:
        """A RocksDB checkpoint (hard-linked SST files where possible) in the new directory ``dest``."""
        new_directory(self.kind, self.schema, dest)
        # The position and count are rows of the database, so the checkpoint carries them consistently.
        Checkpoint(self.db).create_checkpoint(str(dest / _DB_DIR))
        return self._position

    def start_checkpoint(self, dest: Path) -> _DoneCheckpoint:
        """A RocksDB checkpoint is cheap (a memtable flush and hard links), so it is all done here."""
        return _DoneCheckpoint(self.checkpoint(dest))

    def close(self) -> None:
        """End live scans (they pin the database) and close it."""
        if self._db is None:
            return
        for walk in list(self._scans):
            walk.close()
        self._scans.clear()
        self._db.close()
        self._db = None

    def destroy(self) -> None:
        """Close and delete the directory."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
