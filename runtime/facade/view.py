"""The facade's cached cluster view, and keeping it fresh.

Every request routes from the cached ``ClusterView``; no request asks the registry, except once when it
names a store the cached view does not know (so a store created a moment ago is not reported missing).
A background task long-polls the registry for the next epoch (``Bus.wait_epoch``) and refetches the view
when it moved, so a promotion reaches the facade milliseconds after the registry made it; if the long
poll fails (the registry restarting), it compares epochs every ``VIEW_REFRESH_INTERVAL`` until it works
again. An owner that turns out to be unreachable triggers a refresh at once (``refresh_soon``) and is
reported to the registry (``suspect``), which promotes a standby if the owner is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from runtime.bus import Bus
from runtime.config import EPOCH_WAIT, SUSPECT_CHECK_GAP, VIEW_REFRESH_INTERVAL
from runtime.errors import RiqrError, StoreNotFound
from runtime.ownership import ClusterView, OwnershipTable

__all__ = ["ViewCache"]

log = logging.getLogger(__name__)


class ViewCache:
    """The latest ``ClusterView`` a facade knows, refreshed when the registry's epoch moves."""

    def __init__(
        self, bus: Bus, *, refresh_interval: float = VIEW_REFRESH_INTERVAL, epoch_wait: float = EPOCH_WAIT
    ) -> None:
        self._bus = bus
        self._interval = refresh_interval
        self._epoch_wait = epoch_wait
        self._suspected: dict[str, float] = {}
        self._view = ClusterView()
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._soon: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed refreshes of the watcher
        self._fetches = 0  # fetches begun (``refresh``), and the number of the last that succeeded
        self._fetched = -1
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
            try:
                epoch = await self._bus.wait_epoch(self._view.epoch, self._epoch_wait)
                if epoch != self._view.epoch and (await self.refresh()).epoch < epoch:
                    await asyncio.sleep(self._interval)  # the view lags the epoch it announced: do not spin
                if self._failures:
                    log.info("the cluster view is fresh again after %d failed refreshes", self._failures)
                    self._failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the registry may be restarting (or gone: riqr down); keep the cached view
                self._failures += 1
                self._log_failure(err)
                await asyncio.sleep(self._interval)

    def _log_failure(self, err: Exception) -> None:
        """The first failed refresh and then one in a minute's worth: a registry that is gone for good
        (``riqr down`` under a running driver) must not fill its log. riqr's own errors are expected
        conditions and say what happened; anything else is a bug, logged with its traceback."""
        if self._failures != 1 and self._failures % 60:
            return
        expected = isinstance(err, RiqrError)
        what = err.message if isinstance(err, RiqrError) else f"{type(err).__name__}: {err}"
        log.warning("could not refresh the cluster view (%d in a row), serving the cached one: %s",
                    self._failures, what, exc_info=not expected)  # fmt: skip

    async def refresh(self) -> ClusterView:
        """Fetch the view from the registry (one fetch at a time; concurrent callers share it: a caller
        that waited on a fetch begun after it asked takes that fetch's view, which is as new as any it could
        fetch itself. Before, each request naming a store that does not exist cost the registry a call of
        its own, one after the other.)"""
        asked = self._fetches
        async with self._lock:
            # Not "the epoch moved meanwhile": a fetch begun before this caller asked can bring a newer
            # epoch and still predate the store it asks for (made between that fetch and this request).
            if self._fetched >= asked:
                return self._view
            fetch, self._fetches = self._fetches, self._fetches + 1
            view = await self._bus.fetch_view()
            self._fetched = fetch  # a failed fetch is no one's answer: the callers waiting try their own
            if view.epoch >= self._view.epoch:
                self._view = view
                for gone in [uuid for uuid in self._suspected if uuid not in view.actors]:
                    del self._suspected[gone]  # an actor moved or dropped is not suspected again
                for listener in self.listeners:
                    listener(view)
            return self._view

    def refresh_soon(self) -> None:
        """Refresh in the background (an owner looked unreachable); one such refresh at a time."""
        if self._soon is None or self._soon.done():
            self._soon = asyncio.get_running_loop().create_task(self._refresh_quietly(), name="riqr-view-refresh")

    def suspect(self, uuid: str) -> None:
        """Query actor ``uuid`` did not answer (dead, restarting, too slow): tell the registry, at most
        once per ``SUSPECT_CHECK_GAP`` per actor, so it can promote a standby; the new view comes back
        through the long poll."""
        now = time.monotonic()
        if now - self._suspected.get(uuid, -SUSPECT_CHECK_GAP) >= SUSPECT_CHECK_GAP:
            self._suspected[uuid] = now
            self._bus.suspect(uuid)

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
            raise StoreNotFound(
                f"store {store!r} is not known (GET /stores, Client.stores() and riqr status list them)", store=store
            )
        return table

    async def loaded(self) -> ClusterView:
        """The view, fetched again first if it knows no store yet (one may have been created since)."""
        return self._view if self._view.tables else await self.refresh()
