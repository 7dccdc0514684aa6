"""Read replicas: a copy of a whole store inside an HTTP verticle, answering its key lookups without a Ray hop.

A store declared with ``read_replicas`` gets one in every HTTP verticle. It is a ``QueryCore`` holding every
partition in memory, fed over Ray like any standby copy and bound by the same rules:

* **Published before fed.** The verticle makes a replica (every partition lost, so it serves nothing),
  publishes it in the registry (``ClusterView.readers``) and only then starts copying each partition from a
  live peer (``runtime.rebuild``: a snapshot, then the batches buffered since). From the batch after the
  publication on, the sink delivers every batch to it together with the standbys, before any active copy
  gets it, so the replica is never behind the active copy a lookup would otherwise reach.
* **The in-sync rule.** A partition answers only while it serves (not lost, loading, catching up or
  incomplete): a batch it missed shows as a gap, and the partition copies a peer again meanwhile.
* **Fed once before it answers.** A snapshot taken right after the publication may predate a batch the sink
  planned with the view before it; with no batch after it, nothing would show that gap. So the replica
  answers only once a batch has reached it through the sink, which proves the sink knows it; until then
  (an idle stream) lookups take the Ray hop as before.
* **Dropped, not waited for.** A replica that does not acknowledge a batch in time is unpublished by the sink
  before the active copies get that batch (``topologies.delivery``); the verticle sees it gone from the view,
  stops reading it, and makes a new one. Ingest never waits for a read replica beyond that timeout.
* **Monotonic reads.** Its answers carry spans like any copy's, and the facade admits them against the same
  marks (``runtime.monotonic``), as a standby's: a replica older than what this facade served is not read.

This module is plain code: the HTTP verticle (``verticles.http``) calls the registry and runs ``apply`` in
a worker thread; unit tests drive it with a fake peer source.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from runtime.catalog import StoreSpec
from runtime.errors import OwnerUnavailable, PartitionUnavailable
from runtime.monotonic import Span
from runtime.ownership import ClusterView, ReaderCopy
from runtime.partition import SERVING, ApplyResult, Hold
from runtime.query import QueryCore
from runtime.rebuild import PeerSource

__all__ = ["ReadReplica", "ReadReplicas"]

log = logging.getLogger(__name__)


@dataclass
class ReadReplica:
    """One store's replica in this verticle: ``published_at`` is the registry epoch that listed it (None
    while it is being published); ``fed`` is set by the first batch the sink delivers to it."""

    reader: ReaderCopy
    core: QueryCore
    holders: frozenset[str]
    published_at: int | None = None
    fed: bool = False
    listed: bool = False
    lookups: int = field(default=0)

    @property
    def uuid(self) -> str:
        return self.reader.uuid


class ReadReplicas:
    """The read replicas of one HTTP verticle (``actor``, on ``node_id``): which stores want one, keeping
    them in step with the cluster view, and answering lookups and batches."""

    def __init__(
        self,
        actor: str,
        node_id: str,
        peers_for: Callable[[str], PeerSource],
        *,
        new_uuid: Callable[[], str] = lambda: str(uuidlib.uuid4()),
        spawn: Callable[[Callable[[], object]], None] | None = None,
    ) -> None:
        self.actor = actor
        self.node_id = node_id
        self._peers_for = peers_for
        self._new_uuid = new_uuid
        self._spawn = spawn  # how catch-ups run (a thread each; unit tests collect them)
        self._by_store: dict[str, ReadReplica] = {}
        self._by_uuid: dict[str, ReadReplica] = {}

    def __len__(self) -> int:
        return len(self._by_store)

    def replicas(self) -> list[ReadReplica]:
        return [self._by_store[name] for name in sorted(self._by_store)]

    def follow(self, view: ClusterView) -> list[ReadReplica]:
        """Bring the replicas in step with ``view``; returns the new ones, which the caller publishes
        (``published``). A replica goes when its store is gone, no longer wants replicas, was created
        again (none of its actors in the table's lineage), or is no longer listed in a view at or past the
        epoch that published it (the sink dropped it, or the registry restarted without it): a new one
        replaces it."""
        new: list[ReadReplica] = []
        for name, table in view.tables.items():
            current = self._by_store.get(name)
            holders = frozenset(table.all_owners())
            if current is not None:
                listed = current.uuid in view.readers
                dropped = current.published_at is not None and view.epoch >= current.published_at and not listed
                # Another store of that name has none of this one's actors; a move keeps them in the lineage.
                other = current.holders.isdisjoint(table.lineage())
                if not table.spec.read_replicas or other or dropped:
                    why = "dropped from the view" if dropped else "its store changed"
                    self._discard(current, why)
                    current = None
                else:
                    current.listed, current.holders = listed, holders
            if current is None and table.spec.read_replicas:
                new.append(self._make(table.spec, holders))
        for name in [n for n in self._by_store if n not in view.tables]:
            self._discard(self._by_store[name], "its store is gone")
        return new

    def _make(self, spec: StoreSpec, holders: frozenset[str]) -> ReadReplica:
        uuid = self._new_uuid()
        # Every partition starts lost: it serves nothing until copied from a peer after the publication.
        peers = self._peers_for(spec.name)
        core = QueryCore(
            spec, range(spec.partitions), recovered=True, peers=peers, me=uuid, spawn=self._spawn,
            reset_check=getattr(peers, "reset_refused", None),  # a displaced feed's late batch 0 resets no replica
        )  # fmt: skip
        replica = ReadReplica(ReaderCopy(uuid, spec.name, self.node_id, self.actor), core, holders)
        self._by_store[spec.name] = replica
        self._by_uuid[uuid] = replica
        return replica

    def published(self, replica: ReadReplica, epoch: int) -> None:
        """The registry lists ``replica`` from ``epoch`` on: copy its partitions from peers now."""
        if self._by_uuid.get(replica.uuid) is not replica:
            return  # discarded meanwhile
        replica.published_at = epoch
        replica.core.rebuild_unserved()

    def forget(self, replica: ReadReplica, why: str) -> None:
        """Drop ``replica`` (its publication failed)."""
        if self._by_uuid.get(replica.uuid) is replica:
            self._discard(replica, why)

    def _discard(self, replica: ReadReplica, why: str) -> None:
        log.info("read replica %s of %s discarded: %s", replica.uuid, replica.reader.store, why,
                 extra={"store": replica.reader.store, "actor": replica.uuid})  # fmt: skip
        self._by_store.pop(replica.reader.store, None)
        self._by_uuid.pop(replica.uuid, None)
        replica.core.close()

    def close(self) -> list[ReadReplica]:
        """Drop every replica; returns them (the caller unpublishes them)."""
        gone = self.replicas()
        for replica in gone:
            self._discard(replica, "the verticle stops")
        return gone

    # -- the sink's batches ---------------------------------------------------------------------------

    def apply(
        self,
        uuid: str,
        source: str,
        batch_id: int,
        slices: Mapping[int, pa.Table | None],
        hold: Hold | None = None,
    ) -> list[ApplyResult]:
        """Apply a batch the sink delivered to replica ``uuid`` (blocking: the verticle runs it in a worker
        thread). ``OwnerUnavailable`` when this verticle has no such replica (it restarted, or discarded it):
        the sink then drops it from the view. ``hold``: as for a query actor's copies."""
        replica = self._by_uuid.get(uuid)
        if replica is None:
            raise OwnerUnavailable(f"read replica {uuid} is not held by {self.actor}", actor=uuid)
        results = replica.core.apply(source, batch_id, slices, hold)
        replica.fed = True
        return results

    # -- lookups --------------------------------------------------------------------------------------

    def get(self, store: str, partition: int, key: Any) -> tuple[bytes | None, Span] | None:
        """The packed value of ``key`` (None: absent) and the span it reflects, from this verticle's replica
        of ``store``; None when it cannot answer (no replica, not listed in the current view, not fed yet,
        or the partition does not serve): the caller asks the query actors."""
        replica = self._by_store.get(store)
        if replica is None or not (replica.listed and replica.fed):
            return None
        try:
            found = replica.core.get_one(partition, key)
        except PartitionUnavailable:
            return None
        replica.lookups += 1
        return found

    def describe(self) -> list[dict[str, Any]]:
        """Each replica's uuid, store, whether it answers lookups (listed, fed, and every partition
        serving), how many it answered, and its partitions' positions."""
        out = []
        for r in self.replicas():
            positions = r.core.positions()
            serving = all(p["state"] == SERVING for p in positions.values())
            out.append(
                {
                    "uuid": r.uuid,
                    "store": r.reader.store,
                    "answers": r.listed and r.fed and serving,
                    "listed": r.listed,
                    "fed": r.fed,
                    "lookups": r.lookups,
                    "partitions": positions,
                }
            )
        return out
