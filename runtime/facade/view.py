"""The facade's cached cluster view, and keeping it fresh.

Every request routes from the cached ``ClusterView``; no request asks the registry, except once when it
names a store the cached view does not know (so a store created a moment ago is not reported missing).
A background task compares the registry's epoch with the cached one and refetches when it moved; an
owner that turns out to be unreachable triggers a refresh at once (``refresh_soon``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from runtime.bus import Bus
from runtime.config import VIEW_REFRESH_INTERVAL
from runtime.errors import StoreNotFound
from runtime.ownership import ClusterView, OwnershipTable

__all__ = ["ViewCache"]

log = logging.getLogger(__name__)


class ViewCache:
    """The latest ``ClusterView`` a facade knows, refreshed when the registry's epoch moves."""

    def __init__(self, bus: Bus, *, refresh_interval: float = VIEW_REFRESH_INTERVAL) -> None:
        self._bus = bus
        self._interval = refresh_interval
        self._view = ClusterView()
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._soon: asyncio.Task[None] | None = None
        # Called with every new view (the router drops batchers of actors that are gone).
        self.listeners: list[Callable[[ClusterView], None]] = []

    @property
    def current(self) -> ClusterView:
        return self._view

    async def start(self) -> None:
        """Load the view and keep it fresh in the background."""
        await self.refresh()
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="riqr-view-watch")

    async def stop(self) -> None:
        for task in (self._watcher, self._soon):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watcher = self._soon = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                if await self._bus.fetch_epoch() != self._view.epoch:
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # the registry may be restarting; keep serving the cached view
                log.warning("could not refresh the cluster view", exc_info=True)

    async def refresh(self) -> ClusterView:
        """Fetch the view from the registry (one fetch at a time; concurrent callers share it)."""
        epoch_before = self._view.epoch
        async with self._lock:
            if self._view.epoch != epoch_before:
                return self._view
            view = await self._bus.fetch_view()
            if view.epoch >= self._view.epoch:
                self._view = view
                for listener in self.listeners:
                    listener(view)
            return self._view

    def refresh_soon(self) -> None:
        """Refresh in the background (an owner looked unreachable); one such refresh at a time."""
        if self._soon is None or self._soon.done():
            self._soon = asyncio.get_running_loop().create_task(self._refresh_quietly(), name="riqr-view-refresh")

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception:
            log.warning("could not refresh the cluster view", exc_info=True)

    async def table(self, store: str) -> OwnershipTable:
        """The ownership table of ``store``, refreshing once if the cached view does not know it."""
        table = self._view.table(store)
        if table is None:
            table = (await self.refresh()).table(store)
        if table is None:
            raise StoreNotFound(f"store {store!r} is not known; GET /stores lists the stores", store=store)
        return table

    async def loaded(self) -> ClusterView:
        """The view, fetched again first if it knows no store yet (one may have been created since)."""
        return self._view if self._view.tables else await self.refresh()
