"""The query core: the plain class a QueryVerticle delegates to.

It holds some partitions of one store, applies Arrow slices of Spark micro-batches idempotently, and
answers batched queries: many keys in one call, one scan or count over several partitions per call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import shutil
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from runtime.batchrows import BatchRows, EncodedSlice, Slice, internal_keys, packed_values, rows_from_arrow
from runtime.catalog import StoreSpec
from runtime.codec import decode_value
from runtime.durable import fsync_directory
from runtime.engines import NONE, EngineCorrupt, PartitionEngine, Position, open_engine
from runtime.engines.keycodec import KeyCodec
from runtime.errors import (
    CopyBehind,
    CopyMoved,
    NotConnected,
    PartitionCatchingUp,
    PartitionIncomplete,
    PartitionUnavailable,
)
from runtime.merge import merge_sorted
from runtime.metrics import QUERY_METRICS, Metrics
from runtime.monotonic import Span, Spans
from runtime.orphans import OwnerLock
from runtime.pages import PackedPage, Run, cut, encode_page, merge_runs, split_run
from runtime.partition import (
    CATCHING_UP,
    INCOMPLETE,
    LOST,
    MARKER,
    REBUILDING,
    SERVING,
    ApplyResult,
    Hold,
    PartitionState,
    Rows,
    write_marker,
)
from runtime.rebuild import PeerSource, Rebuilder, RebuildSettings
from runtime.scan import Scan, TimeWalk
from runtime.snapshots import SnapshotCorrupt, SnapshotExports, SnapshotOffer, describe_files, remove_leftovers

__all__ = ["QueryCore", "ApplyResult", "rows_from_arrow", "packed_values", "internal_keys"]

log = logging.getLogger(__name__)


def _start_thread(work: Callable[[], object]) -> None:
    threading.Thread(target=work, name="riqr-rebuild", daemon=True).start()


def _window_end(raw: bytes) -> int:
    """A stored window's or session's end (the first value column of a windowed store)."""
    end: int = decode_value(raw)[0]
    return end


# A partition whose data is damaged is moved to ``p<n>.unreadable-<time>-<id>`` beside it (kept for an
# operator until the actor's data is deleted) and starts again empty and incomplete.
UNREADABLE = ".unreadable-"
# Waits between attempts to open a partition: a failure that passes is never taken for damage.
_OPEN_RETRIES = (0.1, 0.3, 1.0)
# How long to wait for the actor's owner lock before setting data aside: without it, a previous process
# of the actor may still have the partition open and write into the directory after it moved.
_OWNER_WAIT = 5.0


def _damaged(err: Exception, path: Path) -> bool:
    """Whether an engine's error at open says its files at ``path`` are damaged (not busy, missing or
    refused for another reason: those are raised, as they are no reason to put the data aside).

    RocksDB says ``Corruption:`` for a file it read and found bad, and ``IO error: No such file or
    directory`` for one its own files name (``CURRENT`` names a MANIFEST, a MANIFEST an SST) that is not
    there: damage too, where the directory and its ``CURRENT`` are (a black-box run removed a MANIFEST, and
    the actor failed its constructor over and over, taking its other partitions down with it)."""
    text = str(err)
    if isinstance(err, EngineCorrupt) or text.startswith("Corruption:"):  # RocksDB's status
        return True
    named = text.startswith("IO error: No such file or directory") and str(path) in text
    return named and any(f.is_file() for f in (path / "CURRENT", path / "rocksdb" / "CURRENT"))


def _open_partition(spec: StoreSpec, p: int, path: Path | None, owner: OwnerLock | None) -> PartitionEngine:
    """Open partition ``p``'s engine at ``path``.

    When the engine says the partition's files are damaged, even after a few attempts, and the actor holds
    its directory's owner lock (waited for at most ``_OWNER_WAIT``; otherwise the error is raised), the
    data is moved aside (kept), the partition opens empty and marked incomplete, and it is rebuilt like a wiped copy:
    from a peer, or by the topology's rebuild path. Were the actor to fail instead, Ray would not
    restart it (an error raised in an actor's constructor ends it for good), and every partition it holds
    would stay dark. Any other error is raised as it was: a busy lock, a full disk, too many open files
    or an engine of another kind are no damage of the data (docs/design.md, "Rebuilding a copy")."""
    kind = spec.engine if path is not None else "memory"
    error: Exception | None = None
    for wait in (0.0, *_OPEN_RETRIES):
        time.sleep(wait)
        try:
            engine = open_engine(kind, spec.key, path)
        except Exception as err:
            if path is None:
                raise
            error = err
            continue
        if path is not None:
            _mark_if_set_aside(path, engine)
        return engine
    assert path is not None and error is not None
    if not _damaged(error, path) or owner is None or not owner.wait_held(_OWNER_WAIT):
        # Not damage; or another process may still have the partition open: leave it as it is.
        raise error
    aside = path.with_name(f"{path.name}{UNREADABLE}{time.strftime('%Y%m%dT%H%M%S')}-{uuidlib.uuid4().hex[:6]}")
    reason = f"its data is damaged ({type(error).__name__}: {error}); it was set aside as {aside.name}"
    path.rename(aside)
    fsync_directory(path.parent)
    fresh: PartitionEngine | None = None
    try:
        fresh = open_engine(kind, spec.key, path)
        write_marker(path, reason)
    except Exception:
        if fresh is not None:
            fresh.close()
        try:
            shutil.rmtree(path, ignore_errors=True)
            aside.rename(path)  # as it was: this failure is not the data's (a full disk, say)
            fsync_directory(path.parent)
        except OSError:
            log.error("store %s: partition %d: its damaged data, set aside as %s, could not be put back", spec.name,
                      p, aside, exc_info=True, extra={"store": spec.name, "partition": p})  # fmt: skip
        raise error from None
    log.error("store %s: partition %d: %s; it starts again empty, to be rebuilt", spec.name, p, reason,
              extra={"store": spec.name, "partition": p})  # fmt: skip
    return fresh


def _mark_if_set_aside(path: Path, engine: PartitionEngine) -> None:
    """A partition that opened empty beside data set aside, with no mark: the actor died between moving
    the data and marking the fresh partition. Mark it now: unmarked, a fresh start (``begin``) would
    make it serve empty."""
    if engine.position() != NONE or (path / MARKER).exists():
        return
    aside = sorted(path.parent.glob(f"{path.name}{UNREADABLE}*"))
    if aside:
        write_marker(path, f"its data is damaged; it was set aside as {aside[-1].name}")


class _Read(NamedTuple):
    """A read as it starts (``QueryCore._start_read``): the engine of each partition it reads, the position
    each had, and how many times each had had its engine replaced (``PartitionState.swaps``)."""

    engines: dict[int, PartitionEngine]
    positions: dict[int, Position]
    swaps: dict[int, int]


class QueryCore:
    """Some partitions of one store, with idempotent batch application and batched reads.

    With a ``directory`` each partition lives in the store's engine under ``directory/p<n>`` and survives
    a restart of the actor: it reopens at its last position. Without one (unit tests), partitions are
    in memory only, and a restarted actor (``recovered``) has lost them: they answer 503, never as an
    empty store. ``new_copy``: a move's new actor or an added standby, whose empty partitions are by
    design (said at info, not as a warning of lost data). ``announce``: a restarted actor's report of its
    restart to the registry, waited for before its first catch-up asks a peer (``runtime.rebuild``).
    """

    def __init__(
        self,
        spec: StoreSpec,
        partitions: Iterable[int],
        *,
        directory: Path | None = None,
        recovered: bool = False,
        new_copy: bool = False,
        metrics: Metrics | None = None,
        peers: PeerSource | None = None,
        me: str = "",
        spawn: Callable[[Callable[[], object]], None] | None = None,
        rebuild: RebuildSettings | None = None,
        catch_up_on_gap: bool = True,
        clock: Callable[[], float] = time.monotonic,
        reset_check: Callable[[str], str | None] | None = None,
        announce: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        # Asked before a batch 0 resets a partition: why that source may not (another feed holds the store
        # now), or None (``Registry.reset_refused``). A late batch 0 of a displaced feed would otherwise
        # replace what the store holds, and serve it: a gap shows only from batch 1 on.
        self._reset_check = reset_check
        self._codec = KeyCodec(spec.key)
        self.directory = directory
        # What it applied, for Ray's metrics (the verticle mirrors them) and every HTTP node's /metrics.
        self.metrics = metrics if metrics is not None else Metrics(QUERY_METRICS)
        # One write at a time (apply, begin, close): a retried delivery may overlap the first attempt.
        # Reads take no lock, so they go on while a large batch is applied; a scan of an engine whose
        # iterators cannot run beside a write takes it too.
        self._writing = threading.Lock()
        self.partitions: dict[int, PartitionState] = {}
        self._destroyed = False  # ``destroy`` ran: its store is being dropped (or the runtime goes down)
        # Held while this process keeps its data there: a node's sweeper never deletes a directory whose
        # lock is held (``runtime.orphans``).
        self._owner = None if directory is None else OwnerLock.take(directory)
        if directory is not None:  # an earlier process's exports (killed, it could not delete them): stale now
            shutil.rmtree(directory / ".exports", ignore_errors=True)
        try:
            for p in sorted(partitions):
                path = None if directory is None else directory / f"p{p}"
                if directory is not None:
                    remove_leftovers(directory, f"p{p}")  # an interrupted copy or install of this partition
                # A restart that finds the partition's files (at no position: it was never fed) is not one
                # that lost them (a replacement on another node, a wiped disk): only the latter may have
                # held rows, and must not be made to serve empty.
                found = path is not None and path.is_dir() and any(path.iterdir())
                engine = _open_partition(spec, p, path, self._owner)
                lost = recovered and path is None
                restarted = recovered and not found
                self.partitions[p] = PartitionState(
                    p, engine, directory=path, lost=lost, restarted=restarted, new_copy=new_copy, store=spec.name
                )
        except BaseException:
            for state in self.partitions.values():
                state.engine.close()
            if self._owner is not None:
                self._owner.release()
            raise
        # With ``peers``, a copy that lost its state is rebuilt from a live peer (``runtime.rebuild``) in a
        # thread that ``spawn`` starts; peers copy from this core through the exports.
        self._rebuilder = (
            None
            if peers is None
            else Rebuilder(spec, me, peers, self._writing, directory, settings=rebuild, announce=announce)
        )
        self._spawn = spawn or _start_thread
        # Whether a copy that finds a gap or restarts with nothing starts a catch-up by itself (a store with
        # standbys); without, only ``catch_up`` starts one (a move's new copy, ``runtime.moves``). Turned
        # on when the store gains standbys after creation (``riqr standbys``: its copies have peers then).
        self.catch_up_on_gap = catch_up_on_gap
        self._exports: SnapshotExports | None = None
        # Until when batches are refused (``seal``): a move is switching this actor's copies over.
        self._clock = clock
        self._sealed_until = 0.0
        # Tells this core's counters from an earlier one's of the same actor (restarted: they start from zero).
        self._incarnation = uuidlib.uuid4().hex

    def _unavailable(self, p: int) -> PartitionUnavailable:
        name = self.spec.name
        state = self.partitions.get(p)
        if state is None and self._destroyed:
            # Until the registry kills this actor, and facades learn the drop: 503, not an error.
            return PartitionUnavailable(f"store {name} is being dropped: partition {p} is deleted here", store=name,
                                        partition=p, retry_after=1)  # fmt: skip
        if state is None:
            return PartitionUnavailable(f"partition {p} of store {name} is not held here", store=name, partition=p)
        message = f"partition {p} of store {name} is {state.state}: {state.reason}"
        if state.state == LOST:
            return PartitionUnavailable(message, store=name, partition=p, retry_after=5)
        if state.state == CATCHING_UP:
            return PartitionCatchingUp(message, store=name, partition=p, retry_after=1)
        if state.state == REBUILDING:  # serves again within a batch or two
            return PartitionIncomplete(message, store=name, partition=p, retry_after=1)
        return PartitionIncomplete(message, store=name, partition=p, retry_after=5)

    def _partition(self, p: int) -> PartitionState:
        state = self.partitions.get(p)
        if state is None or not state.serving:
            raise self._unavailable(p)
        return state

    def begin(self, source: str) -> list[int]:
        """A source starts from an empty checkpoint; returns the partitions that start serving (empty)."""
        with self._writing:
            return [p for p, state in self.partitions.items() if state.begin(source)]

    def apply(
        self, source: str, batch_id: int, slices: Mapping[int, Slice | None], hold: Hold | None = None
    ) -> list[ApplyResult]:
        """Apply one micro-batch: ``slices`` maps each partition held here to its rows (or None): a slice
        of the micro-batch, or the ``EncodedSlice`` another copy made of it (``runtime.batchrows``).
        ``hold``: the batch's watermark, for an append-mode store (``runtime.partition.Hold``)."""
        return self._apply(source, batch_id, slices, None, hold)

    def apply_sharing(
        self, source: str, batch_id: int, slices: Mapping[int, Slice | None], hold: Hold | None = None
    ) -> tuple[list[ApplyResult], dict[int, EncodedSlice | None]]:
        """``apply``, and each partition's rows as an ``EncodedSlice`` (None: no rows, or keys the encoding
        does not vectorise) for the partition's other copies to apply without encoding them again."""
        shared: dict[int, EncodedSlice | None] = {}
        return self._apply(source, batch_id, slices, shared, hold), shared

    def _apply(
        self,
        source: str,
        batch_id: int,
        slices: Mapping[int, Slice | None],
        shared: dict[int, EncodedSlice | None] | None,
        hold: Hold | None,
    ) -> list[ApplyResult]:
        started = time.perf_counter()
        if batch_id == 0 and self._reset_check is not None:
            resets = any((state := self.partitions.get(p)) is not None and state.resets_for(source, 0) for p in slices)
            why = self._reset_check(source) if resets else None
            if why is not None:
                raise NotConnected(f"{why}; batch 0 of source {source} resets no partition here",
                                   store=self.spec.name)  # fmt: skip
        results = []
        copied: set[int] = set()  # partitions that took the file another copy wrote of the batch
        for p, table in sorted(slices.items()):
            state = self.partitions.get(p)
            if state is None:
                raise self._unavailable(p)
            rows: Rows = BatchRows(self.spec, table) if table is not None and table.num_rows else []
            if shared is not None and isinstance(rows, BatchRows):
                shared[p] = rows.shareable()
                rows.share_written = True
            elif shared is not None:
                shared[p] = None
            with self._writing:
                if self._destroyed:  # destroyed since ``state`` was looked up: its engine is deleted
                    raise self._unavailable(p)
                if self.sealed:  # checked under the lock: ``seal``'s positions are final
                    raise CopyMoved(
                        f"the copies of store {self.spec.name} on this query actor are moving to another actor: "
                        f"batch {batch_id} goes to the copies the registry names now",
                        store=self.spec.name,
                        partition=p,
                        retry_after=1,
                    )
                result = state.apply(source, batch_id, rows, hold)
                if result.state == INCOMPLETE and self._rebuilder is not None and self.catch_up_on_gap:
                    result = self._start_catch_up(state, (source, batch_id, rows))
                results.append(result)
                if isinstance(rows, BatchRows):
                    # Sharing ends with this call: a batch buffered here is applied later, with nothing to share.
                    rows.share_written = False
                    written = rows.written if result.applied else None
                    if written is not None and written is rows.written_elsewhere():
                        copied.add(p)
                    elif written is not None and shared is not None and (encoded := shared.get(p)) is not None:
                        shared[p] = dataclasses.replace(encoded, written=written)  # the file goes with the rows
        name = self.spec.name
        for result in results:
            if result.applied:
                self.metrics.inc("riqr_batches_applied_total", name, str(result.partition))
                if result.rows:
                    self.metrics.inc("riqr_rows_applied_total", name, str(result.partition), amount=result.rows)
                if result.partition in copied:
                    self.metrics.inc("riqr_batches_ingested_from_copy_total", name, str(result.partition))
        self.metrics.observe("riqr_apply_duration_seconds", time.perf_counter() - started, name)
        return results

    # -- rebuilding from a peer (runtime.rebuild) -------------------------------------------------------

    def _start_catch_up(
        self, state: PartitionState, batch: tuple[str, int, Rows] | None, prefer: str | None = None
    ) -> ApplyResult:
        """Under the write lock: turn ``state`` catching-up (buffering ``batch``, the one that found the gap)
        and start copying from a peer (``prefer`` first, when it holds the partition) in the background.
        The sink's apply returns at once."""
        assert self._rebuilder is not None
        generation = state.start_catch_up(prefer)
        if batch is not None:
            state.buffer(*batch)
        rebuilder = self._rebuilder
        self._spawn(lambda: rebuilder.run(state, generation))
        return ApplyResult(state.partition, False, 0, state=CATCHING_UP)

    def rebuild_unserved(self) -> list[int]:
        """Start rebuilding every partition that cannot serve (a restarted actor whose copy was wiped,
        lost or marked incomplete); returns those partitions. Without peers, nothing happens. (A
        ``rebuilding`` partition is complete up to its position and catches up by the batches to come;
        no peer could give it more.)"""
        if self._rebuilder is None or not self.catch_up_on_gap:
            return []
        return self.catch_up([p for p, state in self.partitions.items() if state.state not in (SERVING, REBUILDING)])

    def catch_up(self, partitions: Iterable[int], prefer: str | None = None) -> list[int]:
        """Copy ``partitions`` from a live peer and catch them up (a move's new copy: ``runtime.moves``),
        whatever their state, unless one is catching up already; returns those it started. A serving
        copy stops serving until it is in sync again. Without peers, nothing happens. ``prefer``: the holder
        asked first (a move's: the copy it replaces, which holds what it must reach; the active, asked
        first otherwise, may be a batch behind that copy, a standby, and was taken again at every ask)."""
        if self._rebuilder is None:
            return []
        started = []
        with self._writing:
            for p in sorted(partitions):
                state = self.partitions.get(p)
                if state is not None and state.state != CATCHING_UP:
                    self._start_catch_up(state, None, prefer)
                    started.append(p)
        return started

    # -- a move switching this actor's copies over (runtime.moves) ----------------------------------------

    def seal(self, seconds: float | None) -> dict[int, dict[str, Any]]:
        """Refuse every batch (``CopyMoved``) for ``seconds`` (None: for good), and return the positions,
        which no batch moves from then on: the registry compares them with the new copy's before it
        switches. Sealed again, the time is replaced. Reads go on."""
        with self._writing:  # after an apply in progress, so the positions include all of it
            self._sealed_until = float("inf") if seconds is None else self._clock() + seconds
            return self.positions()

    def unseal(self) -> None:
        """Take batches again (a switch found the new copy behind)."""
        with self._writing:
            self._sealed_until = 0.0

    @property
    def sealed(self) -> bool:
        return self._clock() < self._sealed_until

    @property
    def moved(self) -> bool:
        """Sealed for good: a move put another actor in this one's place (it is destroyed next)."""
        return self._sealed_until == float("inf")

    def open_snapshot(self, partition: int, at_least: Position | None = None) -> SnapshotOffer:
        """Export a consistent copy of a serving partition for a peer to copy (``runtime.snapshots``).
        ``CopyBehind``, before anything is exported, if this copy is older than ``at_least`` of the same
        source (the asker's own position: an older copy would take it back in time).

        The engine's capture runs under the write lock (brief: a RocksDB checkpoint, or copying a memory
        partition's key and value references); writing it out and checksumming it do not.
        """
        with self._writing:  # with destroy's check: never an export directory made where the data was deleted
            if self._destroyed:
                raise self._unavailable(partition)
            if at_least is not None:
                here = self._partition(partition).engine.position()
                if here.behind(at_least):
                    raise CopyBehind(
                        f"partition {partition} of store {self.spec.name} is at batch {here.batch_id} here, behind "
                        f"the asker's {at_least.batch_id}",
                        store=self.spec.name,
                        partition=partition,
                    )
            exports = self._exports
            if exports is None:
                if self.directory is None:  # a temporary directory of its own, deleted with the exports
                    exports = SnapshotExports(Path(tempfile.mkdtemp(prefix="riqr-exports-")), temporary=True)
                else:
                    exports = SnapshotExports(self.directory / ".exports")
                self._exports = exports
            token, dest = exports.new_directory()
        try:
            with self._writing:
                state = self._partition(partition)
                pending = state.engine.start_checkpoint(dest)
            position = pending.finish()
            return SnapshotOffer(token, partition, position, describe_files(dest))
        except BaseException:
            exports.close(token)
            raise

    def read_snapshot(self, token: str, path: str, offset: int, length: int) -> bytes:
        """Bytes of a file of an export (``open_snapshot``)."""
        if self._exports is None:
            raise SnapshotCorrupt(f"no open snapshot export {token!r} here", token=token)
        return self._exports.read(token, path, offset, length)

    def close_snapshot(self, token: str) -> None:
        """Delete an export (idempotent)."""
        if self._exports is not None:
            self._exports.close(token)

    # -- reads -----------------------------------------------------------------------------------------

    def get_many(self, items: Sequence[tuple[int, Any]]) -> tuple[list[bytes | None], Spans]:
        """One answer per ``(partition, key)`` (the packed value, or None when absent), and what each
        partition read reflects (``runtime.monotonic``: one span per partition, not per key).

        If any partition asked about cannot answer, the whole call raises ``PartitionUnavailable`` naming
        those partitions (``partitions``), so the caller can ask again for the keys of the others.
        """
        read = self._start_read({p for p, _ in items}, name_all=True)
        try:
            values = [read.engines[p].get(key) for p, key in items]
        except Exception as err:
            self._raise_if_gone(err, read)
            raise
        return values, self._spans(read)

    def get_one(self, partition: int, key: Any) -> tuple[bytes | None, Span]:
        """``get_many`` of one key: its packed value (None when absent) and the span its read reflects.
        ``_start_read`` and ``_spans`` for one partition, inline (the read replica's hot path); anything
        out of the ordinary goes through them."""
        state = self.partitions.get(partition)
        if state is None:
            raise self._unavailable(partition)
        swaps, engine = state.swaps, state.engine  # in ``_start_read``'s order: the position, then the check
        before = engine.position()
        if not state.serving:
            raise self._unavailable(partition)
        try:
            value = engine.get(key)
        except Exception as err:
            self._raise_if_gone(err, _Read({partition: engine}, {partition: before}, {partition: swaps}))
            raise
        span = state.span(before)
        if span is None or state.swaps != swaps or self._destroyed or self.partitions.get(partition) is not state:
            return value, self._spans(_Read({partition: engine}, {partition: before}, {partition: swaps}))[partition]
        return value, span

    def _start_read(self, partitions: Iterable[int], *, name_all: bool = False) -> _Read:
        """The engines of ``partitions`` and their positions as a read starts (what ``_spans`` checks), or
        ``PartitionUnavailable`` for the first that cannot serve (``name_all``: naming every one of them in
        ``partitions``).

        The position is taken before the state is checked, never after: a new source's batch 0 that
        landed between a check and the position (a reset that leaves the partition ``rebuilding``, at
        batch 0 of the new source) would otherwise give a span that looks whole, for a read of a state
        that is not. Taken first, a reset after it shows as a change of source in ``span``, and one before
        it as a partition not serving. Reads take no lock: the read goes to the engines taken here, and
        ``_spans`` refuses it if a catch-up swapped one for a peer's copy meanwhile."""
        asked = dict.fromkeys(partitions)  # in the order given (a scan's runs merge in it)
        states = {p: state for p in asked if (state := self.partitions.get(p)) is not None}
        swaps = {p: state.swaps for p, state in states.items()}  # first: an install counts before it closes
        engines = {p: state.engine for p, state in states.items()}
        before = {p: engine.position() for p, engine in engines.items()}
        broken = sorted(p for p in asked if p not in states or not states[p].serving)
        if broken:
            first = self._unavailable(broken[0])
            if name_all:
                raise type(first)(first.message, **{**first.details, "partitions": broken})
            raise first
        return _Read(engines, before, swaps)

    def _swapped(self, read: _Read) -> list[int]:
        """The partitions of ``read`` whose engine a catch-up began to replace with a peer's copy since the
        read started (closing it: a closed memory engine answers nothing, a closed RocksDB one ends its
        scans early, and neither says so). Counted, not compared: the old engine is closed before the new
        one is in place, and a read can fall between the two."""
        partitions = self.partitions
        return [p for p, n in read.swaps.items() if (s := partitions.get(p)) is None or s.swaps != n]

    def _raise_if_gone(self, err: Exception, read: _Read) -> None:
        """A read that raised ``err``: unavailable (a 503) if ``destroy`` deleted the engines meanwhile, or a
        catch-up replaced one; else the caller raises ``err`` as it is."""
        if isinstance(err, PartitionUnavailable):
            return
        if self._destroyed:
            raise self._unavailable(min(read.engines, default=0)) from err
        swapped = self._swapped(read)
        if swapped:
            raise self._replaced(swapped) from err

    def _replaced(self, partitions: list[int]) -> PartitionUnavailable:
        return PartitionUnavailable(
            f"partitions {partitions} of store {self.spec.name} caught up from a peer during the read; ask again",
            store=self.spec.name,
            partitions=partitions,
            retry_after=1,
        )

    def _spans(self, read: _Read) -> Spans:
        """The spans of ``read``; a partition whose source changed during the read (a reset overlapped it),
        or whose engine a catch-up replaced, makes the call fail as unavailable, since its rows may be
        neither state (or none: the engine it read was closed under it)."""
        if self._destroyed:  # the engines were deleted during the read: what it saw is no answer
            raise self._unavailable(min(read.engines, default=0))
        swapped = self._swapped(read)
        if swapped:
            raise self._replaced(swapped)
        spans: Spans = {}
        moved = []
        for p, position in read.positions.items():
            state = self.partitions.get(p)
            if state is None:
                raise self._unavailable(p)
            span = state.span(position)
            if span is None:
                moved.append(p)
            else:
                spans[p] = span
        if moved:
            raise PartitionUnavailable(
                f"partitions {moved} of store {self.spec.name} changed source during the read (a rebuild); ask again",
                store=self.spec.name,
                partitions=moved,
                retry_after=1,
            )
        return spans

    def scan(
        self, partitions: Sequence[int], scan: Scan, limit: int | None = None
    ) -> tuple[list[tuple[Any, bytes]], Spans]:
        """Up to ``limit`` entries of ``scan`` over ``partitions``, merged in the scan's order, and the
        span of each partition read.

        The partition engines are read lazily, so a page costs its own size, not the store's.
        """
        read = self._start_read(partitions)
        if scan.is_empty():
            return [], self._spans(read)
        engines = read.engines.values()
        guard = self._writing if any(not e.concurrent_scans for e in engines) else contextlib.nullcontext()
        try:
            walk = None
            if scan.times is not None:  # each owner filters its windows, seeking past long runs it refuses
                walk = TimeWalk(scan.times, self.spec.user_key_columns, scan.reverse, _window_end)
            with guard:
                runs = [e.scan(scan, walk) for e in engines]
                merged: Iterator[tuple[Any, bytes]] = merge_sorted(runs, reverse=scan.reverse)
                entries = list(merged if limit is None else itertools.islice(merged, limit))
        except Exception as err:
            self._raise_if_gone(err, read)
            raise
        return entries, self._spans(read)

    def scan_packed(
        self, partitions: Sequence[int], scan: Scan, limit: int | None, max_bytes: int, fmt: str
    ) -> tuple[PackedPage, Spans]:
        """A page of a key-value ``scan`` over ``partitions`` as a ``runtime.pages.PackedPage`` in ``fmt``,
        and the span of each partition read.

        Each partition reads up to ``limit`` entries and its share of ``max_bytes`` as stored (no key is
        decoded to merge); the partitions' runs merge by their sort keys up to the frontier (the least last
        key among those that stopped at a bound), so the page is exact in key order, and says ``more``
        when a bound cut it.
        """
        if self.spec.windowed:
            raise ValueError("packed pages are for key-value stores; window and session stores page as tuples")
        read = self._start_read(partitions)
        if scan.is_empty() or not read.engines:
            return encode_page(self.spec.key, self._codec, [], [], fmt, False), self._spans(read)
        engines = read.engines.values()
        guard = self._writing if any(not e.concurrent_scans for e in engines) else contextlib.nullcontext()
        share = max(1, max_bytes // len(engines))
        try:
            with guard:
                reads = [e.read_encoded(scan, limit, share) for e in engines]
        except Exception as err:
            self._raise_if_gone(err, read)
            raise
        runs = [Run(keys, (values,), more) for keys, values, more in reads]
        bounded = [r.keys[-1] for r in runs if r.more and r.keys]
        merged = merge_runs(runs, reverse=scan.reverse)
        more = bool(bounded)
        if bounded:
            frontier = max(bounded) if scan.reverse else min(bounded)
            merged, _ = split_run(merged, cut(merged.keys, frontier, scan.reverse))
        if limit is not None and len(merged) > limit:
            merged, more = split_run(merged, limit)[0], True
        page = encode_page(self.spec.key, self._codec, merged.keys, merged.columns[0], fmt, more)
        return page, self._spans(read)

    def count(self, partitions: Sequence[int]) -> tuple[int, Spans]:
        """How many keys ``partitions`` hold, and the span of each."""
        read = self._start_read(partitions)
        try:
            total = sum(e.count() for e in read.engines.values())
        except Exception as err:
            self._raise_if_gone(err, read)
            raise
        return total, self._spans(read)

    def positions(self) -> dict[int, dict[str, Any]]:
        """What each partition reflects: its source, last batch id applied, and state."""
        return {p: state.describe() for p, state in self.partitions.items()}

    def engine_memory(self) -> dict[int, dict[str, int]]:
        """Each partition's ``PartitionEngine.memory()`` (benchmarks and operators)."""
        return {p: state.engine.memory() for p, state in self.partitions.items()}

    def stats(self) -> dict[str, Any]:
        """Positions and states plus this core's metric samples: what a node's probe asks for (``runtime.health``)."""
        if self._exports is not None:  # one whose receiver went away, deleted without waiting for the next export
            self._exports.expire()
        samples = [(s.name, s.labels, s.value) for s in self.metrics.samples()]
        return {"partitions": self.positions(), "samples": samples, "incarnation": self._incarnation}

    def close(self) -> None:
        """Close every partition's engine (its data stays on disk)."""
        with self._writing:
            for state in self.partitions.values():
                state.cancel_catch_up()
                state.engine.close()
        if self._exports is not None:
            self._exports.close_all()
        if self._owner is not None:
            self._owner.release()

    @property
    def destroyed(self) -> bool:
        """``destroy`` ran: the partitions' data is deleted (the store is being dropped, or riqr goes down)."""
        return self._destroyed

    def destroy(self) -> None:
        """Close every partition's engine and delete its data (the store or the runtime is going away), and
        the directory that held it once nothing else is in it."""
        with self._writing:
            # Reads that come after this answer 503 (``_unavailable``) rather than reach a deleted engine.
            held, self.partitions, self._destroyed = self.partitions, {}, True
            for p, state in held.items():
                state.cancel_catch_up()
                try:
                    state.engine.destroy()
                except Exception:  # e.g. a RocksDB scan under way in another thread: the rest still go
                    log.warning("partition %d of %s: deleting its data failed; the sweeper reclaims what is left",
                                p, self.spec.name, exc_info=True)  # fmt: skip
        if self._exports is not None:
            self._exports.close_all()
        if self.directory is None:
            return
        # Only what this core makes there: its partitions (each engine deleted its own), snapshot exports,
        # the copies a catch-up was receiving, partitions set aside as unreadable and its owner lock;
        # anything else keeps the directory.
        leftovers = [
            self.directory / ".exports",
            *self.directory.glob(".p*.incoming-*"),
            *self.directory.glob(f"p*{UNREADABLE}*"),
        ]
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        if self._owner is not None:
            self._owner.release(remove=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()
