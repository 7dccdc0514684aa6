"""Key routing: resolve a key's owner from the cached view, coalesce lookups per owner, enforce the
request deadline.

Concurrent lookups bound for one owner share one ``get_many`` call (``runtime.coalesce``), with one call in
flight per owner: a query actor runs its calls one at a time anyway, so more calls in flight would only
queue there while making batches smaller (measured in docs/design.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from runtime.bus import Bus
from runtime.catalog import StoreSpec
from runtime.coalesce import Coalescer
from runtime.codec import to_jsonable
from runtime.deadline import Deadline, within
from runtime.errors import DeadlineExceeded, KeyNotFound, OwnerUnavailable, PartitionUnavailable, RiqrError
from runtime.facade.view import ViewCache
from runtime.metrics import Metrics
from runtime.ownership import ClusterView, OwnershipTable, Route

__all__ = ["KeyRouter", "route_or_unavailable", "FAILOVER_AFTER"]

# How long a request waits for the active owner before asking a standby (when the partition has one).
FAILOVER_AFTER = 1.0

log = logging.getLogger(__name__)

Batcher = Coalescer[tuple[int, Any], bytes | None]


def route_or_unavailable(table: OwnershipTable, key: Any) -> Route:
    """The owner of an internal key's partition, or ``PartitionUnavailable`` (503) if it has none."""
    verdict = table.resolve(key)
    if not isinstance(verdict, Route):
        raise PartitionUnavailable(
            f"partition {verdict.partition} of store {table.spec.name} has no owner right now",
            store=table.spec.name,
            partition=verdict.partition,
        )
    return verdict


class KeyRouter:
    """Answers key lookups: one coalesced batch per owner, under the request deadline."""

    def __init__(self, bus: Bus, views: ViewCache, *, timeout: float, metrics: Metrics | None = None) -> None:
        self._bus = bus
        self._views = views
        self.timeout = timeout
        self.metrics = metrics if metrics is not None else Metrics()
        self._batchers: dict[str, Batcher] = {}
        views.listeners.append(self._forget_gone)

    def _forget_gone(self, view: ClusterView) -> None:
        for uuid in set(self._batchers) - set(view.actors):
            del self._batchers[uuid]

    def _batcher(self, uuid: str, store: str) -> Batcher:
        batcher = self._batchers.get(uuid)
        if batcher is None:
            sizes = self.metrics.child("riqr_coalesced_batch_size", store)  # an actor holds one store
            owner = self._bus.owner(uuid)
            batcher = self._batchers[uuid] = Coalescer(owner.get_many, max_in_flight=1, on_send=sizes.observe)
        return batcher

    async def get(self, spec: StoreSpec, table: OwnershipTable, key: Any) -> Any:
        """The packed value of the internal ``key``; ``KeyNotFound`` when absent.

        The active owner is asked first; if it is dead, restarting, slower than ``FAILOVER_AFTER``, or its
        copy of the partition cannot answer, each standby is asked in turn, within the same deadline.
        A standby that answers is in sync: it received every batch the active did, and before it.
        """
        route = route_or_unavailable(table, key)
        deadline = Deadline.after(self.timeout)
        holders = (route.owner, *route.standbys)
        failure: RiqrError | None = None
        for index, uuid in enumerate(holders):
            last = index == len(holders) - 1
            budget = deadline if last else Deadline(min(deadline.at, time.monotonic() + FAILOVER_AFTER), self.timeout)
            try:
                answer = await self._ask(uuid, spec.name, route.partition, key, budget)
            except (OwnerUnavailable, PartitionUnavailable, DeadlineExceeded) as err:
                if isinstance(err, OwnerUnavailable):
                    self._views.refresh_soon()
                if last:
                    raise
                failure = err
                log.info("failing over from %s for partition %d: %s", uuid, route.partition, err.message)
                continue
            if answer is None:
                shown = to_jsonable(spec.key.external(key))
                raise KeyNotFound(f"key {shown!r} is not in store {spec.name!r}", store=spec.name, key=shown)
            return answer
        raise failure or AssertionError("a route has at least one holder")  # pragma: no cover

    async def _ask(self, uuid: str, store: str, partition: int, key: Any, deadline: Deadline) -> bytes | None:
        # A batch fails as a whole when one of its partitions cannot answer; a key of another partition
        # that shared the batch is asked again (once).
        for attempt in (1, 2):
            try:
                return await within(deadline, self._batcher(uuid, store).submit((partition, key)), f"get on {store}")
            except PartitionUnavailable as err:
                if attempt == 1 and partition not in err.details.get("partitions", [partition]):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover
