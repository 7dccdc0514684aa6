"""Key routing: resolve a key's owner from the cached view, coalesce lookups per owner, enforce the
request deadline.

Concurrent lookups bound for one owner share one ``get_many`` call (``runtime.coalesce``), with one call in
flight per owner: a query actor runs its calls one at a time anyway, so more calls in flight would only
queue there while making batches smaller (measured in docs/design.md).
"""

from __future__ import annotations

import logging
from typing import Any

from runtime.bus import Bus
from runtime.catalog import StoreSpec
from runtime.coalesce import Coalescer
from runtime.codec import to_jsonable
from runtime.deadline import Deadline, within
from runtime.errors import KeyNotFound, OwnerUnavailable, PartitionUnavailable
from runtime.facade.view import ViewCache
from runtime.ownership import ClusterView, OwnershipTable, Route

__all__ = ["KeyRouter", "route_or_unavailable"]

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

    def __init__(self, bus: Bus, views: ViewCache, *, timeout: float) -> None:
        self._bus = bus
        self._views = views
        self.timeout = timeout
        self._batchers: dict[str, Batcher] = {}
        views.listeners.append(self._forget_gone)

    def _forget_gone(self, view: ClusterView) -> None:
        for uuid in set(self._batchers) - set(view.actors):
            del self._batchers[uuid]

    def _batcher(self, uuid: str) -> Batcher:
        batcher = self._batchers.get(uuid)
        if batcher is None:
            batcher = self._batchers[uuid] = Coalescer(self._bus.owner(uuid).get_many, max_in_flight=1)
        return batcher

    async def get(self, spec: StoreSpec, table: OwnershipTable, key: Any) -> Any:
        """The packed value of the internal ``key``; ``KeyNotFound`` when absent."""
        route = route_or_unavailable(table, key)
        deadline = Deadline.after(self.timeout)
        what = f"get on {spec.name}"
        # A batch fails as a whole when one of its partitions cannot answer; a key of another partition
        # that shared the batch is asked again (once), in a batch of its own kind.
        for attempt in (1, 2):
            try:
                answer = await within(deadline, self._batcher(route.owner).submit((route.partition, key)), what)
            except PartitionUnavailable as err:
                if attempt == 1 and route.partition not in err.details.get("partitions", [route.partition]):
                    continue
                raise
            except OwnerUnavailable:
                self._views.refresh_soon()
                raise
            if answer is None:
                shown = to_jsonable(spec.key.external(key))
                raise KeyNotFound(f"key {shown!r} is not in store {spec.name!r}", store=spec.name, key=shown)
            return answer
        raise AssertionError("unreachable")  # pragma: no cover
