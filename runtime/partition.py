"""One partition on a query actor: its engine, the position it reflects, and whether that state is
provably complete (the gap rule).

A partition serves only a state it can prove complete: it applied its source from the first batch, or it
reopened at a position it had reached that way and has applied every batch id since, one after another.
Every partition receives every batch id of its source (empty slices included), so it can tell when it has
missed one. The states:

* ``serving``: complete at its position; answers reads;
* ``loading``: nothing applied yet (a new actor, or a new source whose first batch has not arrived);
* ``incomplete``: it saw a gap (for example a new, empty actor receiving batch 57), or its actor restarted
  and found nothing on disk (it may have held rows: never served as empty); it stays so, across
  restarts (an ``INCOMPLETE`` marker next to its data), until a new source's batch 0 rebuilds it;
* ``lost``: its actor restarted and the state was not durable;
* ``catching-up``: it lost its state and is being rebuilt from a live peer (``runtime.rebuild``): it
  buffers the batches that arrive, installs the peer's copy at some position ``p`` (or, a copy that
  served when the catch-up began and is ahead of every peer, keeps its own), applies the buffered
  batches after ``p`` in order, and serves only once it has applied every batch it received;
* ``rebuilding``: a new source's batch 0 reset it, but that batch does not hold the whole state: an
  append-mode aggregation with a watermark (sessions, windows written in append mode) emits a row only
  when Spark's event-time watermark closes it, and a fresh checkpoint's batch 0 runs with no watermark
  at all. It applies the batches that follow as a serving partition would and serves from the first one
  Spark runs with a watermark (``Hold``): that batch closes everything the input's event times close,
  since batch 0 read all of the input (the rebuild path's rule). A ``HELD`` marker next to its data
  keeps it so across restarts.

Only ``serving`` answers; the others are 503s that say why, never an answer from partial state.

Applying batch ``b`` of source ``s`` at position ``(s', b')``:

* ``s == s'`` and ``b <= b'``: a replay (Spark re-runs a batch after a crash): a no-op;
* ``s == s'`` and ``b == b' + 1`` while serving: applied, rows and position atomically (the engine's job);
* ``b == 0`` of a new source (a fresh checkpoint re-emits its whole state): the partition is reset and
  rebuilt from it, whatever it was (and, for an append-mode aggregation with a watermark, stays
  ``rebuilding`` until a batch with a watermark);
* anything else is a gap: nothing is applied and the partition becomes ``incomplete``.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.durable import fsync_directory, write_atomically
from runtime.engines import NONE, PartitionEngine, Position

__all__ = [
    "PartitionState",
    "ApplyResult",
    "SERVING",
    "LOADING",
    "INCOMPLETE",
    "LOST",
    "CATCHING_UP",
    "REBUILDING",
    "MARKER",
    "HELD",
    "Hold",
    "write_marker",
    "BUFFER_ROWS",
]

log = logging.getLogger(__name__)

SERVING = "serving"
LOADING = "loading"
INCOMPLETE = "incomplete"
LOST = "lost"
CATCHING_UP = "catching-up"
REBUILDING = "rebuilding"

MARKER = "INCOMPLETE"
# Next to a ``rebuilding`` partition's data (``Hold``).
HELD = "HELD"
# Rows a catching-up partition buffers at most; past it the buffer is dropped and the catch-up starts
# over from a fresher snapshot (memory stays bounded whatever the ingest rate and the copy's duration).
BUFFER_ROWS = 1_000_000

Rows = Sequence[tuple[Any, bytes | None]]


@dataclass(frozen=True)
class Hold:
    """A batch of an append-mode aggregation with an event-time watermark, as the sink sends it.

    ``watermark``: the watermark Spark closes windows and sessions with in this batch (epoch millis:
    ``batchWatermarkMs`` of its offset log entry; 0 before Spark has one, as in a fresh checkpoint's batch
    0). A partition that a new source's batch 0 resets serves only from a batch with a watermark: before
    it, its rows are none of the windows and sessions its earlier state had."""

    watermark: int

    @property
    def reached(self) -> bool:
        return self.watermark > 0


@dataclass(frozen=True)
class ApplyResult:
    """What applying one partition's slice of a batch did, and the partition's state afterwards."""

    partition: int
    applied: bool
    rows: int
    reset: bool = False
    state: str = SERVING


def write_marker(directory: Path, reason: str) -> None:
    """Mark the partition in ``directory`` incomplete for ``reason``: durably, so a restart cannot make it
    forget that its state has a hole (``PartitionState`` opens it ``incomplete``)."""
    write_atomically(directory / MARKER, reason.encode("utf-8"))


class PartitionState:
    """One partition: its engine (rows and position) and whether it may serve."""

    def __init__(
        self,
        partition: int,
        engine: PartitionEngine,
        *,
        directory: Path | None,
        lost: bool = False,
        restarted: bool = False,
        new_copy: bool = False,
        store: str = "",
    ) -> None:
        """``lost``: its actor restarted and kept nothing (no directory); ``restarted``: its actor restarted
        (or was created again) and found none of the partition's files; ``new_copy``: it is a new copy (a
        move's, or a standby added), which has nothing yet by design."""
        self.partition = partition
        self.store = store  # for log lines
        self.engine = engine
        self._marker = None if directory is None else directory / MARKER
        self._held = None if directory is None else directory / HELD
        # While catching up: the batches received, in order; the last one received; and a generation
        # that changes whenever a catch-up starts or is abandoned, so a stale one cannot install.
        self._buffer: deque[tuple[str, int, Rows]] = deque()
        self._buffered_rows = 0
        self._received: Position | None = None
        self.generation = 0
        # How often a catch-up changed this partition's engine under its reads (``swapping``).
        self.swaps = 0
        # The catch-up in progress began on a serving copy, and no install has touched its engine since:
        # that engine holds exactly the batches up to its position, so the batches buffered since may be
        # applied to it in place when every peer is behind (``Rebuilder._attempt``). Not for a copy held
        # for a watermark, incomplete (it missed batches, which a restart no longer remembers), or whose
        # engine a failed install may have left closed.
        self.whole_before_catch_up = False
        # The holder the catch-up in progress asks first (a move's new copy copies from the copy it
        # replaces: ``QueryCore.catch_up``); None: the registry's order.
        self.prefer_peer: str | None = None
        position = engine.position()
        # The position an apply or reset in progress moves to, set before any of its rows can be seen and
        # cleared after the engine's position moved: a read that overlaps it can tell (``span``).
        self.moving_to: Position | None = None
        # The source whose batch 0 reset this partition here (None: none did since it opened): a read
        # that started at batch -1 of it may have seen the partition emptied (``span``).
        self._reset_for: str | None = None
        self.state, self.reason = LOADING, ""
        if self._marker is not None and self._marker.exists():
            self.state = INCOMPLETE
            self.reason = self._marker.read_text(encoding="utf-8", errors="replace")
        elif lost and position == NONE:
            self.state = LOST
            self.reason = "its actor restarted and its state was not durable"
        elif restarted and position == NONE:
            # Durable, yet nothing on disk after a restart: a replacement on another node, or its data was
            # wiped. It may have held rows before, so it must not serve empty at a new source's start
            # (``begin``) while the source's batch 0 has yet to bring them back: incomplete, until that
            # batch or a peer's copy.
            if new_copy:  # nothing lost: said at info, not as a warning each new copy would raise
                self._mark_incomplete(-1, "it is a new copy and has nothing yet: it copies from a peer", logging.INFO)
            else:
                self._mark_incomplete(-1, "its actor restarted with nothing on disk (a new node, or its data was lost)")
        elif position.batch_id < 0:
            # Nothing of its source applied yet. (A new source's reset, reopened before its batch 0 was
            # applied, lands here too: better a 503 for a moment than an empty store.)
            self.state = LOADING
            self.reason = "it has not received its source's first batch yet"
        elif self._held is not None and self._held.exists():
            self._hold()
        else:
            self.state = SERVING

    @property
    def serving(self) -> bool:
        return self.state == SERVING

    def position(self) -> Position:
        return self.engine.position()

    def span(self, before: Position) -> tuple[str | None, int, int] | None:
        """What a read that started at ``before`` (``position()`` taken before reading rows) and has just
        finished reflects: ``(source, lo, hi)`` (``runtime.monotonic.Span``); None if the partition changed
        source meanwhile (a reset overlapped the read, so its rows may be neither state).

        The engine moves its position after the rows are visible, so ``before`` is a lower bound. A batch's
        rows become visible only after ``moving_to`` names it, and ``moving_to`` is cleared only after the
        position moved, so reading ``moving_to`` then the position gives an upper bound.

        A read that started after a new source's batch 0 reset the partition here, and before the batch
        was in (``before`` at batch -1 of that source), may have seen the partition emptied, which is no
        state any reader should see (a key that was there and will be again, missing): None too. (A
        partition that ``begin`` made serve empty is at batch -1 legitimately: its reads are answered.)
        """
        moving = self.moving_to
        after = moving if moving is not None else self.engine.position()
        if after.source != before.source or (before.batch_id < 0 and before.source == self._reset_for):
            return None
        return (before.source, before.batch_id, after.batch_id)

    def begin(self, source: str) -> bool:
        """A source starts from an empty checkpoint: a partition that never held anything is complete
        (empty) at its start. Other partitions keep what they serve until the source's batch 0."""
        if self.state == LOADING and self.engine.position() == NONE:
            self.moving_to = Position(source, -1)
            try:
                self.engine.reset(Position(source, -1))
                self._clear_held()  # left by a held reset that died before it was in: nothing to wait for
            finally:
                self.moving_to = None
            self.state, self.reason = SERVING, ""
            return True
        return False

    def resets_for(self, source: str, batch_id: int) -> bool:
        """Whether batch ``batch_id`` of ``source`` rebuilds this partition from scratch (``apply``): a new
        source's batch 0, or that batch again after a reset that did not finish. (A catching-up partition
        ends its catch-up for it, then is rebuilt so too.)"""
        position = self.engine.position()
        return batch_id == 0 and (source != position.source or (position.batch_id < 0 and self.state != SERVING))

    def apply(self, source: str, batch_id: int, rows: Rows, hold: Hold | None = None) -> ApplyResult:
        """Apply batch ``batch_id`` of ``source`` to this partition, by the rules in the module docstring.
        ``hold`` comes with every batch of an append-mode store with a watermark (see ``Hold``)."""
        position = self.engine.position()
        if self.state == CATCHING_UP:
            if not (batch_id == 0 and source != position.source):
                self.buffer(source, batch_id, rows)
                return ApplyResult(self.partition, False, 0, state=CATCHING_UP)
            # Batch 0 of a new source rebuilds the partition by itself: the catch-up is moot.
            log.info("partition %d: batch 0 of a new source ends its catch-up", self.partition)
            self._end_catch_up()
        if self.resets_for(source, batch_id):
            # A new source's batch 0 (or that batch again, after a reset whose apply failed or whose actor
            # died before it was in): the partition is rebuilt from it. It answers nothing meanwhile, and
            # if the apply fails it stays so (never serving the emptied state).
            self.moving_to = Position(source, 0)
            self._reset_for = source
            self.state, self.reason = LOADING, f"it is being rebuilt from batch 0 of source {source}"
            held = hold is not None and not hold.reached
            try:
                if held:
                    self._write_held()  # before the reset: a restart after it must not find it serving
                self.engine.reset(Position(source, -1))
                if not held:
                    # After the reset (a restart from here reopens it ``loading``, at batch -1), not before:
                    # a held partition's partial state must never reopen unmarked.
                    self._clear_held()
                self._clear_marker()
                self.engine.apply(Position(source, 0), rows)
            finally:
                self.moving_to = None
            if held:
                self._hold()
            else:
                self.state, self.reason = SERVING, ""
            return ApplyResult(self.partition, True, len(rows), reset=True, state=self.state)
        if source == position.source and batch_id <= position.batch_id:
            if self.state == REBUILDING and batch_id == position.batch_id and self._releases(hold):
                self._release()  # the batch with a watermark, again: its apply was in, the release not
            return ApplyResult(self.partition, False, 0, state=self.state)
        if self.state in (SERVING, REBUILDING) and source == position.source and batch_id == position.batch_id + 1:
            self.moving_to = Position(source, batch_id)
            try:
                self.engine.apply(Position(source, batch_id), rows)
            finally:
                self.moving_to = None
            if self.state == REBUILDING and self._releases(hold):
                self._release()
            return ApplyResult(self.partition, True, len(rows), state=self.state)
        self._mark_incomplete(
            batch_id,
            f"it received batch {batch_id} of source {source} while at batch {position.batch_id} of source "
            f"{position.source}, so it missed batches; it is rebuilt from a peer, or from the topology's input",
        )
        return ApplyResult(self.partition, False, 0, state=self.state)

    # -- catching up from a peer (driven by runtime.rebuild, under the caller's write lock) -------------

    def start_catch_up(self, prefer: str | None = None) -> int:
        """Turn ``catching-up``: from now on batches are buffered, not applied. Returns the generation the
        catch-up must present to install and to apply its buffer. The marker stays (or is written), so a
        crash before the catch-up ends reopens the partition as incomplete, not as serving an old state.
        ``prefer``: the holder to ask first (``prefer_peer``), for this catch-up only."""
        self._end_catch_up()
        self.whole_before_catch_up = self.state == SERVING
        self.prefer_peer = prefer
        self._write_marker("it lost its state and is being rebuilt from a live peer")
        self.state, self.reason = CATCHING_UP, "it is being rebuilt from a live peer and has not caught up yet"
        return self.generation

    def buffer(self, source: str, batch_id: int, rows: Rows) -> None:
        """Keep a batch received while catching up (dropping the buffer when it grows past ``BUFFER_ROWS``:
        the catch-up then sees a gap and starts over from a fresher snapshot)."""
        self._received = Position(source, batch_id)
        if self._buffered_rows + len(rows) > BUFFER_ROWS:
            log.warning("partition %d: catch-up buffer over %d rows; dropped, will copy again", self.partition,
                        BUFFER_ROWS, extra={"store": self.store or None, "partition": self.partition})  # fmt: skip
            self._buffer, self._buffered_rows = deque(), 0
        self._buffer.append((source, batch_id, rows))
        self._buffered_rows += len(rows)

    def install(self, engine: PartitionEngine, generation: int) -> bool:
        """Replace the engine with a peer's copy (already in place on disk); False if the catch-up is stale."""
        if generation != self.generation or self.state != CATCHING_UP:
            return False
        self.engine = engine
        position = engine.position()
        self.reason = f"it was rebuilt from a peer's copy at batch {position.batch_id} and is catching up"
        return True

    def catch_up_step(self, generation: int) -> str:
        """Apply the next buffered batch; one of ``"aborted"`` (the catch-up is stale), ``"applied"`` (call
        again), ``"gap"`` (the buffer does not continue from the installed position: copy again) and
        ``"in-sync"`` (every batch received is applied: the partition serves from now on)."""
        if generation != self.generation or self.state != CATCHING_UP:
            return "aborted"
        position = self.engine.position()
        if any(source == position.source for source, _, _ in self._buffer):
            # The copy is of a source the sink has moved on to (it never goes back): batches of an earlier
            # one buffered before it are superseded, not a gap (which would copy again until give-up).
            while self._buffer and self._buffer[0][0] != position.source:
                self._drop_first()
        while self._buffer and self._buffer[0][0] == position.source and self._buffer[0][1] <= position.batch_id:
            self._drop_first()  # already in the copy (or a replay)
        if self._buffer:
            source, batch_id, rows = self._buffer[0]
            if source != position.source or batch_id != position.batch_id + 1:
                return "gap"
            self.engine.apply(Position(source, batch_id), rows)
            self._drop_first()
            return "applied"
        received = self._received
        if received is not None and (received.source != position.source or received.batch_id > position.batch_id):
            return "gap"  # batches were received and dropped (the buffer overflowed): not all are here
        # The marker first: a failure to clear it (an I/O error) leaves the catch-up as it is, for its
        # thread to try again; ended first, the catch-up was stale to its own thread and the partition
        # stayed catching up, buffering every batch, until its actor restarted.
        self._clear_marker()
        self._end_catch_up()
        self.state, self.reason = SERVING, ""
        return "in-sync"

    def swapping(self) -> None:
        """Say, under the write lock and before anything changes, that a catch-up is about to replace the
        engine (an install of a peer's copy closes it) or apply its buffer in place (a memory engine writes
        key by key, its position last): a read taken as the partition served sees the count move and is no
        answer (``QueryCore._spans``), where it would have read a closed engine or unmarked rows."""
        self.swaps += 1

    def give_up(self, generation: int, reason: str) -> None:
        """End a catch-up that found no peer to copy from: back to ``incomplete`` (the next batch, or a
        restart of the topology, tries again)."""
        if generation == self.generation and self.state == CATCHING_UP:
            self._end_catch_up()
            self._mark_incomplete(-1, reason)

    def cancel_catch_up(self) -> None:
        """Make a catch-up in progress stale (its engine is closing: it must not install or apply)."""
        if self.state == CATCHING_UP:
            self._end_catch_up()

    def _drop_first(self) -> None:
        self._buffered_rows -= len(self._buffer.popleft()[2])

    def _end_catch_up(self) -> None:
        self._buffer, self._buffered_rows, self._received = deque(), 0, None
        self.whole_before_catch_up = False
        self.prefer_peer = None
        self.generation += 1

    # -- rebuilding from a new source's batch 0 until a batch with a watermark ----------------------------

    def _hold(self) -> None:
        source = self.engine.position().source
        self.state = REBUILDING
        self.reason = (
            f"it is being rebuilt from source {source}, whose batches so far ran with no watermark and so "
            "closed no window or session: it serves from the first batch with one"
        )

    def _releases(self, hold: Hold | None) -> bool:
        """Whether a batch with ``hold`` ends ``rebuilding``: Spark ran it with a watermark. A batch without
        a hold (a sink that could not tell the query has a watermark) says nothing: the partition stays
        held, a 503, rather than serve what may be partial; batch 0 of a new source resets it."""
        return hold is not None and hold.reached

    def _release(self) -> None:
        self._clear_held()
        fields = {"store": self.store or None, "partition": self.partition}
        log.info("partition %d: its rebuild reached a batch with a watermark; it serves again", self.partition,
                 extra=fields)  # fmt: skip
        self.state, self.reason = SERVING, ""

    def _write_held(self) -> None:
        if self._held is not None:
            write_atomically(self._held, b"rebuilt from a new source: serves from its first batch with a watermark")

    def _clear_held(self) -> None:
        if self._held is not None and self._held.exists():
            os.unlink(self._held)
            fsync_directory(self._held.parent)

    def _mark_incomplete(self, batch_id: int, reason: str, level: int = logging.WARNING) -> None:
        if self.state != INCOMPLETE:
            fields = {"store": self.store or None, "partition": self.partition, "batch": batch_id}
            log.log(level, "partition %d is incomplete: %s", self.partition, reason, extra=fields)
        self.state, self.reason = INCOMPLETE, reason
        self._write_marker(reason)

    def _write_marker(self, reason: str) -> None:
        if self._marker is not None and not self._marker.exists():
            write_marker(self._marker.parent, reason)

    def _clear_marker(self) -> None:
        if self._marker is not None and self._marker.exists():
            os.unlink(self._marker)
            fsync_directory(self._marker.parent)

    def describe(self) -> dict[str, Any]:
        """The partition's position and state, as ``/metadata`` and the catalog show them."""
        position = self.engine.position()
        out: dict[str, Any] = {"source": position.source, "batch_id": position.batch_id, "state": self.state}
        if self.reason:
            out["reason"] = self.reason
        if self.state == CATCHING_UP:
            out["buffered"] = len(self._buffer)
        return out
