"""Rebuilding a copy of a partition that lost its state from a live peer, and catching it up.

The query actor holding the copy drives it (``QueryCore`` starts one when a partition turns incomplete
and the store has standbys, or when a restarted actor finds a partition it cannot serve). One catch-up:

1. The partition turns ``catching-up`` (``PartitionState.start_catch_up``) and buffers every batch that
   arrives from then on; the sink's ``apply`` returns at once, saying so.
2. A peer holding a serving copy (active first, then standbys, from the registry's table) at the copy's
   own batch or past it exports a consistent snapshot at position ``p`` (``runtime.snapshots``); it is
   copied in chunks, checked, and installed atomically in the partition's place, marked incomplete until
   step 3 ends. A copy that served when the catch-up began, ahead of every peer that answered, keeps its
   own engine (``p`` is its own position) and goes on to step 3 in place.
3. The buffered batches after ``p`` are applied in order, one per hold of the write lock (so the sink
   never waits behind more than one batch). If the buffer does not continue from ``p`` (the peer was
   behind the first batch buffered, or the buffer overflowed), a fresh snapshot is taken and step 2
   repeats; the buffer is kept. Once every batch received is applied the partition is in sync and serves.

If no catch-up succeeds within ``give_up_after`` seconds of its start (no peer gives a snapshot, or each
snapshot misses batches that came since) the partition goes back to ``incomplete``
(the topology-restart rebuild path remains); a new source's batch 0 ends a catch-up at once, since it
rebuilds the partition by itself. Nothing here imports Ray: peers are reached through ``PeerSource``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runtime.catalog import StoreSpec
from runtime.durable import make_directories
from runtime.engines import PartitionEngine, open_engine
from runtime.engines.base import MANIFEST, write_atomically
from runtime.errors import CopyBehind, RiqrError
from runtime.partition import MARKER, PartitionState
from runtime.scan import Scan
from runtime.snapshots import (
    CHUNK_BYTES,
    SnapshotCorrupt,
    SnapshotOffer,
    SnapshotPeer,
    download,
    install_directory,
)

__all__ = ["PeerSource", "RebuildSettings", "Rebuilder"]

log = logging.getLogger(__name__)


class PeerSource(Protocol):
    """How a query actor finds and reaches the other copies of its partitions."""

    def holders(self, partition: int) -> list[str]:
        """The actors holding a copy of ``partition``, active first (from the registry's table)."""
        ...

    def peer(self, uuid: str) -> SnapshotPeer: ...


@dataclass(frozen=True)
class RebuildSettings:
    """How patient a catch-up is, and the transfer's chunk size."""

    chunk: int = CHUNK_BYTES
    first_backoff: float = 0.2
    max_backoff: float = 5.0
    give_up_after: float = 120.0


class Rebuilder:
    """Runs catch-ups for the partitions of one ``QueryCore``: ``run`` is blocking (a thread per catch-up
    in the actor; called directly by unit tests). ``lock`` is the core's write lock."""

    def __init__(
        self,
        spec: StoreSpec,
        me: str,
        peers: PeerSource,
        lock: threading.Lock,
        directory: Path | None,
        *,
        settings: RebuildSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        announce: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        # A restarted actor's first catch-up tells the registry of the restart, and waits for its answer,
        # before it asks any peer (``announce``; a RiqrError is tried again like a failed copy): the peer it
        # copies may not have the batch this copy acknowledged before it restarted (a standby is fed before
        # its active), and the delivery of that batch, which asks the registry's epoch after its rounds,
        # then sees the new incarnation and sends the batch again (``BatchDelivery``). Once per process.
        self._announce = announce
        self._announcing = threading.Lock()
        self.me = me
        self.peers = peers
        self.lock = lock
        self.directory = directory
        self.settings = settings or RebuildSettings()
        self._clock = clock
        self._sleep = sleep

    def run(self, state: PartitionState, generation: int) -> str:
        """Catch ``state`` up; returns ``"in-sync"``, ``"aborted"`` (a new source took over, or another
        catch-up started) or ``"gave-up"`` (no copy taken from a peer caught up in time)."""
        fields = {"store": self.spec.name, "partition": state.partition}
        deadline = self._clock() + self.settings.give_up_after
        backoff = self.settings.first_backoff
        why = "no other copy is serving"
        while True:
            try:
                outcome = self._attempt(state, generation)
            except Exception as err:  # noqa: BLE001 - a bug or an engine's own error (RocksDB raises Exception)
                # Any error is retried, then given up: a catch-up thread that ended here left its partition
                # catching-up for good, buffering acknowledged batches no one would apply. One riqr or the
                # OS did not foresee is an error, with its traceback.
                foreseen = isinstance(err, (RiqrError, OSError))
                why = err.message if isinstance(err, RiqrError) else f"{type(err).__name__}: {err}"
                log.log(logging.WARNING if foreseen else logging.ERROR, "partition %d: copy from a peer failed: %s",
                        state.partition, why, extra=fields, exc_info=not foreseen)  # fmt: skip
                outcome = "retry"
            if outcome in _TRIED_AGAIN:
                why, outcome = _TRIED_AGAIN[outcome], "retry"
            if outcome != "retry":
                log.info("partition %d: catch-up %s", state.partition, outcome, extra=fields)
                return outcome
            if self._clock() + backoff > deadline:
                reason = (
                    f"it lost its state and could not take a peer's copy ({why}); it is rebuilt when a batch "
                    "arrives, or from the topology's input"
                )
                with self.lock:
                    state.give_up(generation, reason)
                return "gave-up"
            self._sleep(backoff)
            backoff = min(backoff * 2, self.settings.max_backoff)

    def _attempt(self, state: PartitionState, generation: int) -> str:
        if state.generation != generation:
            return "aborted"
        with self._announcing:
            if self._announce is not None:
                self._announce()
                self._announce = None
        found = self._open(state)
        if found == "behind" and state.whole_before_catch_up:
            # Every peer that answered is behind this copy, which served when the catch-up began and whose
            # engine no install has touched since: it holds every batch up to its position (batches apply
            # in order), and the batches buffered since may continue from there. Else it waits for a peer
            # that reaches its batch (the sink feeds standbys first).
            with self.lock:
                if state.generation != generation:
                    return "aborted"
                state.swapping()
            where = {"store": self.spec.name, "partition": state.partition}
            log.info("partition %d: every peer that answered is behind this copy (batch %d): it catches up in place",
                     state.partition, state.engine.position().batch_id, extra=where)  # fmt: skip
            step = self._apply_buffer(state, generation)
            return "behind" if step == "gap" else step
        if isinstance(found, str):
            return found
        peer, offer = found
        incoming = self._incoming_dir(state.partition)
        try:
            try:
                download(
                    peer, offer, incoming, chunk=self.settings.chunk, cancelled=lambda: state.generation != generation
                )
            finally:
                with contextlib.suppress(RiqrError):  # else the export expires by itself
                    peer.close_snapshot(offer.token)
            if state.generation != generation:
                return "aborted"
            write_atomically(incoming / MARKER, b"it was rebuilt from a peer's copy and is catching up")
            if not self._install(state, generation, incoming):
                return "aborted"
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
            if self.directory is None:  # the temporary directory made for it (``_incoming_dir``)
                shutil.rmtree(incoming.parent, ignore_errors=True)
        log.info("partition %d: installed a peer's copy at batch %d (%d bytes); applying the batches since",
                 state.partition, offer.position.batch_id, offer.size,
                 extra={"store": self.spec.name, "partition": state.partition})  # fmt: skip
        return self._apply_buffer(state, generation)

    def _apply_buffer(self, state: PartitionState, generation: int) -> str:
        """Apply the buffered batches to the partition's engine: ``"in-sync"``, ``"gap"`` or ``"aborted"``."""
        while True:
            with self.lock:  # one batch per hold: the sink's apply never waits behind the whole buffer
                step = state.catch_up_step(generation)
            if step != "applied":
                return step

    def _open(self, state: PartitionState) -> tuple[SnapshotPeer, SnapshotOffer] | str:
        """A peer's snapshot of the partition, from the first holder that gives one no older than the copy
        itself: a copy ahead of a peer (a standby is fed before its active) that took the peer's older
        snapshot went back in time, serving a batch it had acknowledged as applied no longer (the peer
        refuses, given the copy's position, before it exports anything). Else why not: ``"no-peer"``, or
        ``"behind"`` (peers serve, all older)."""
        partition = state.partition
        own = state.engine.position()
        outcome = "no-peer"
        holders = self.peers.holders(partition)
        if state.prefer_peer in holders:
            holders = [state.prefer_peer, *(u for u in holders if u != state.prefer_peer)]
        for uuid in holders:
            if uuid == self.me:
                continue
            try:  # a holder Ray no longer names is skipped like one that gives no snapshot
                peer = self.peers.peer(uuid)
                offer = peer.open_snapshot(partition, own if own.batch_id >= 0 else None)
            except CopyBehind as err:  # refused before anything was exported
                log.info("partition %d: peer %s is behind: %s", partition, uuid, err.message)
                outcome = "behind"
                continue
            except RiqrError as err:
                log.info("partition %d: peer %s gives no snapshot: %s", partition, uuid, err.message)
                continue
            if offer.position.behind(own):
                log.info("partition %d: peer %s is at batch %d, behind this copy's %d; not taken", partition, uuid,
                         offer.position.batch_id, own.batch_id)  # fmt: skip
                with contextlib.suppress(RiqrError):
                    peer.close_snapshot(offer.token)
                outcome = "behind"
                continue
            return peer, offer
        return outcome

    def _incoming_dir(self, partition: int) -> Path:
        name = f".p{partition}.incoming-{uuidlib.uuid4().hex[:8]}"
        if self.directory is None:
            return Path(tempfile.mkdtemp(prefix="riqr-rebuild-")) / name
        make_directories(self.directory)
        return self.directory / name

    def _install(self, state: PartitionState, generation: int, incoming: Path) -> bool:
        """Swap the copy in under the write lock (the catch-up may have been overtaken meanwhile)."""
        kind = _kind_of(incoming)
        target = None if self.directory is None else self.directory / f"p{state.partition}"
        if target is not None and kind != self.spec.engine:
            raise SnapshotCorrupt(f"the peer's copy is a {kind} engine, this store's copies are {self.spec.engine}")
        with self.lock:
            if state.generation != generation:
                return False
            state.swapping()  # before the old engine closes
            state.whole_before_catch_up = False  # its engine is the peer's copy from here, or a failed one
            if target is None:
                engine = _copy_into_memory(self.spec, kind, incoming)
            else:
                state.engine.close()
                try:
                    install_directory(incoming, target)
                finally:  # whatever is in place now (the copy, or the old directory) is what the partition has
                    missing = not target.exists()  # neither (the old one could not be put back): an empty one,
                    engine = state.engine = open_engine(self.spec.engine, self.spec.key, target)
                    if missing:  # marked, or a restart would take it for a partition never loaded
                        write_atomically(target / MARKER, b"a peer's copy could not be installed in its place")
            state.install(engine, generation)
            return True


# Why an attempt of a catch-up is tried again, as its give-up says it (``Rebuilder.run``).
_TRIED_AGAIN = {
    "no-peer": "no other copy is serving",
    "behind": "every peer's copy is behind this one",
    "gap": "each copy it took missed batches received since (they came faster than a copy)",
}


def _kind_of(directory: Path) -> str:
    import json

    try:
        return str(json.loads((directory / MANIFEST).read_text())["kind"])
    except (OSError, ValueError, KeyError) as err:
        raise SnapshotCorrupt(f"the peer's copy has no readable {MANIFEST}: {err}") from None


def _copy_into_memory(spec: StoreSpec, kind: str, incoming: Path) -> PartitionEngine:
    """A copy for a partition kept in memory only: its rows read out of the copied directory."""
    source = open_engine(kind, spec.key, incoming)
    try:
        engine = open_engine("memory", spec.key, None)
        engine.apply(source.position(), list(source.scan(Scan())))
        return engine
    finally:
        source.close()
