"""How far each copy of a partition is behind the newest acknowledged batch, and its replica state.

Pure: the inputs are a copy's position as its query actor reports it (``QueryCore.positions()``) and the
store's ingest record from the registry's status (``runtime.feeds.FeedBook.status``), so the rules are
unit-tested with numbers.

* **The newest acknowledged batch** of a store is the last batch its sink reported delivered to every
  holder (the sink acknowledges a batch to Spark only then). Its source is the streaming query's id.
* **Lag in batches**: how many batch ids of that source up to the newest acknowledged one the copy does
  not show. A copy at another source (or none) lacks all of them, batch 0 included: ``newest + 1``. A copy
  at or past the newest (its position was read after the status) is at 0.
* **Lag in seconds**: 0 when the lag in batches is 0; otherwise how long ago the registry heard that the
  first batch the copy lacks was acknowledged, that is, for how long the copy has been missing
  acknowledged data. The registry keeps the times of a store's last ``ACK_LOG_LENGTH`` batches (and
  hears of each a report's latency after the acknowledgement, so the figure is low by that much). For a
  copy further behind, it is the age of the oldest kept batch: a lower bound. Unknown (None) when no
  times are kept (nothing has been acknowledged since the registry started).

Replica states (``REPLICA_STATES``), from the copy's own partition state and its role:

* ``active``: the copy the ownership table answers with, and it serves;
* ``in-sync``: a standby that serves: complete by the gap rule, so it has every batch it was sent;
* ``catching-up``: being rebuilt from a live peer (``runtime.rebuild``): not serving yet;
* ``incomplete``: cannot prove its state complete and nothing is rebuilding it yet (``incomplete``,
  ``lost``, or ``loading``: no batch of its source yet);
* ``unavailable``: its actor did not answer, is not running, or the partition has no owner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACTIVE",
    "IN_SYNC",
    "CATCHING_UP",
    "INCOMPLETE",
    "UNAVAILABLE",
    "REPLICA_STATES",
    "Newest",
    "replica_state",
    "lag",
    "with_lag",
]

ACTIVE = "active"
IN_SYNC = "in-sync"
CATCHING_UP = "catching-up"
INCOMPLETE = "incomplete"
UNAVAILABLE = "unavailable"
REPLICA_STATES = (ACTIVE, IN_SYNC, CATCHING_UP, INCOMPLETE, UNAVAILABLE)

# A partition's own states (runtime.partition), and the replica state each maps to.
_BY_PARTITION_STATE = {
    "catching-up": CATCHING_UP,
    "rebuilding": CATCHING_UP,  # from its source's batches, until a batch with a watermark
    "incomplete": INCOMPLETE,
    "lost": INCOMPLETE,
    "loading": INCOMPLETE,
}


def replica_state(role: str, partition_state: str | None) -> str:
    """The replica state of a copy in ``role`` (``"active"`` or ``"standby"``) whose partition reports
    ``partition_state`` (``serving``, ``catching-up``, ...; ``unavailable``/``unknown``/None when its actor
    did not say)."""
    if partition_state == "serving":
        return ACTIVE if role == "active" else IN_SYNC
    return _BY_PARTITION_STATE.get(partition_state or "", UNAVAILABLE)


@dataclass(frozen=True)
class Newest:
    """A store's newest acknowledged batch, and the ages of its last acknowledged batches."""

    batch_id: int
    source: str | None = None  # None: the sink did not say (then only batch ids are compared)
    acked: Sequence[tuple[int, float]] = ()  # (batch id, seconds since acknowledged), oldest first

    @classmethod
    def from_ingest(cls, ingest: Mapping[str, Any] | None) -> Newest | None:
        """From a store's entry in the registry's status (``FeedBook.status``); None when nothing was
        acknowledged (no feed yet, or a failed first batch)."""
        if not ingest:
            return None
        source = ingest.get("source") if isinstance(ingest.get("source"), str) else None
        acked = [(int(b), float(age)) for b, age in ingest.get("acked") or ()]
        if acked:
            return cls(acked[-1][0], source, acked)
        batch_id = ingest.get("batch_id")
        if not isinstance(batch_id, int) or ingest.get("state") == "failed":
            return None  # a failed report names the batch that failed, not one acknowledged
        return cls(batch_id, source)

    def first_lacking(self, position: Mapping[str, Any]) -> int | None:
        """The first batch id of the newest source ``position`` does not show; None if it shows them all
        (or its batch id is unknown)."""
        batch_id = position.get("batch_id")
        if not isinstance(batch_id, int):
            return None
        if self.source is not None and position.get("source") != self.source:
            return 0
        return batch_id + 1 if batch_id < self.batch_id else None

    def age_of(self, batch_id: int) -> float | None:
        """Seconds since ``batch_id`` was acknowledged: the age of the first kept batch at or past it (a
        lower bound when it is older than every kept one); None when no times are kept."""
        for b, age in self.acked:
            if b >= batch_id:
                return age
        return None


def lag(position: Mapping[str, Any], newest: Newest | None) -> tuple[int | None, float | None]:
    """``(lag in batches, lag in seconds)`` of a copy at ``position`` (``source``, ``batch_id``) behind
    ``newest``; either is None when unknown (no acknowledged batch, or the copy did not say where it is)."""
    if newest is None or not isinstance(position.get("batch_id"), int):
        return None, None
    first = newest.first_lacking(position)
    if first is None:
        return 0, 0.0
    seconds = newest.age_of(first)
    return newest.batch_id - first + 1, None if seconds is None else round(seconds, 3)


def with_lag(position: Mapping[str, Any], role: str, newest: Newest | None) -> dict[str, Any]:
    """``position`` (a partition's entry from its query actor) with ``role``, ``replica_state``,
    ``lag_batches`` and ``lag_seconds`` added."""
    batches, seconds = lag(position, newest)
    state = position.get("state")
    return {
        **position,
        "role": role,
        "replica_state": replica_state(role, state if isinstance(state, str) else None),
        "lag_batches": batches,
        "lag_seconds": seconds,
    }
