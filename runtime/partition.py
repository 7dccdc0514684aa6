"""One partition on a query actor: its engine, the position it reflects, and whether that state is
provably complete (the gap rule).

A partition serves only a state it can prove complete: it applied its source from the first batch, or it
reopened at a position it had reached that way and has applied every batch id since, one after another.
Every partition receives every batch id of its source (empty slices included), so it can tell when it has
missed one. The states:

* ``serving``: complete at its position; answers reads;
* ``loading``: nothing applied yet (a new actor, or a new source whose first batch has not arrived);
* ``incomplete``: it saw a gap (for example a new, empty actor receiving batch 57); it stays so, across
  restarts (an ``INCOMPLETE`` marker next to its data), until a new source's batch 0 rebuilds it;
* ``lost``: its actor restarted and the state was not durable.

Only ``serving`` answers; the others are 503s that say why, never an answer from partial state.

Applying batch ``b`` of source ``s`` at position ``(s', b')``:

* ``s == s'`` and ``b <= b'``: a replay (Spark re-runs a batch after a crash): a no-op;
* ``s == s'`` and ``b == b' + 1`` while serving: applied, rows and position atomically (the engine's job);
* ``b == 0`` of a new source (a fresh checkpoint re-emits its whole state): the partition is reset and
  rebuilt from it, whatever it was;
* anything else is a gap: nothing is applied and the partition becomes ``incomplete``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.engines import NONE, PartitionEngine, Position
from runtime.engines.base import fsync_directory, write_atomically

__all__ = ["PartitionState", "ApplyResult", "SERVING", "LOADING", "INCOMPLETE", "LOST"]

log = logging.getLogger(__name__)

SERVING = "serving"
LOADING = "loading"
INCOMPLETE = "incomplete"
LOST = "lost"

_MARKER = "INCOMPLETE"


@dataclass(frozen=True)
class ApplyResult:
    """What applying one partition's slice of a batch did, and the partition's state afterwards."""

    partition: int
    applied: bool
    rows: int
    reset: bool = False
    state: str = SERVING


class PartitionState:
    """One partition: its engine (rows and position) and whether it may serve."""

    def __init__(
        self, partition: int, engine: PartitionEngine, *, directory: Path | None, lost: bool = False, store: str = ""
    ) -> None:
        self.partition = partition
        self.store = store  # for log lines
        self.engine = engine
        self._marker = None if directory is None else directory / _MARKER
        position = engine.position()
        # The position an apply or reset in progress moves to, set before any of its rows can be seen and
        # cleared after the engine's position moved: a read that overlaps it can tell (``span``).
        self.moving_to: Position | None = None
        self.reason = ""
        if self._marker is not None and self._marker.exists():
            self.state = INCOMPLETE
            self.reason = self._marker.read_text(encoding="utf-8", errors="replace")
        elif lost and position == NONE:
            self.state = LOST
            self.reason = "its actor restarted and its state was not durable"
        elif position.batch_id < 0:
            # Nothing of its source applied yet. (A new source's reset, reopened before its batch 0 was
            # applied, lands here too: better a 503 for a moment than an empty store.)
            self.state = LOADING
            self.reason = "it has not received its source's first batch yet"
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
        """
        moving = self.moving_to
        after = moving if moving is not None else self.engine.position()
        if after.source != before.source:
            return None
        return (before.source, before.batch_id, after.batch_id)

    def begin(self, source: str) -> bool:
        """A source starts from an empty checkpoint: a partition that never held anything is complete
        (empty) at its start. Other partitions keep what they serve until the source's batch 0."""
        if self.state == LOADING and self.engine.position() == NONE:
            self.moving_to = Position(source, -1)
            try:
                self.engine.reset(Position(source, -1))
            finally:
                self.moving_to = None
            self.state, self.reason = SERVING, ""
            return True
        return False

    def apply(self, source: str, batch_id: int, rows: Sequence[tuple[Any, bytes | None]]) -> ApplyResult:
        """Apply batch ``batch_id`` of ``source`` to this partition, by the rules in the module docstring."""
        position = self.engine.position()
        if batch_id == 0 and source != position.source:
            self.moving_to = Position(source, 0)
            try:
                self.engine.reset(Position(source, -1))
                self._clear_marker()
                self.engine.apply(Position(source, 0), rows)
            finally:
                self.moving_to = None
            self.state, self.reason = SERVING, ""
            return ApplyResult(self.partition, True, len(rows), reset=True)
        if source == position.source and batch_id <= position.batch_id:
            return ApplyResult(self.partition, False, 0, state=self.state)
        if self.state == SERVING and source == position.source and batch_id == position.batch_id + 1:
            self.moving_to = Position(source, batch_id)
            try:
                self.engine.apply(Position(source, batch_id), rows)
            finally:
                self.moving_to = None
            return ApplyResult(self.partition, True, len(rows))
        self._mark_incomplete(
            batch_id,
            f"it received batch {batch_id} of source {source} while at batch {position.batch_id} of source "
            f"{position.source}, so it missed batches; it is rebuilt when the topology restarts",
        )
        return ApplyResult(self.partition, False, 0, state=self.state)

    def _mark_incomplete(self, batch_id: int, reason: str) -> None:
        if self.state != INCOMPLETE:
            fields = {"store": self.store or None, "partition": self.partition, "batch": batch_id}
            log.warning("partition %d is incomplete: %s", self.partition, reason, extra=fields)
        self.state, self.reason = INCOMPLETE, reason
        if self._marker is not None and not self._marker.exists():
            # Durable, so a restart cannot make the partition forget that its state has a hole.
            write_atomically(self._marker, reason.encode("utf-8"))

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
        return out
