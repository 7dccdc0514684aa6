"""Facade verticle: one per node, for Python callers inside the cluster.

A thin async shell over ``runtime.facade.Facade``: it takes the query values the client built and
answers, or raises riqr's own errors, which ``runtime.raycalls`` gives back to the caller as themselves.
"""

from __future__ import annotations

from typing import Any

from runtime import logs
from runtime.bus import Bus
from runtime.config import DEFAULT_REQUEST_TIMEOUT
from runtime.facade import Facade
from runtime.queries import KeyQuery, Page, PageRequest, ScanQuery

__all__ = ["FacadeVerticle"]


class FacadeVerticle:
    """Routes and scatter-gathers for callers on its node."""

    def __init__(self, bus: Bus, timeout: float = DEFAULT_REQUEST_TIMEOUT, *, cursor_key: bytes | None = None) -> None:
        # The deployment's cursor key: the Python client pages with the same cursors as REST callers.
        logs.configure_from_env()
        self.core = Facade(bus, timeout=timeout, cursor_key=cursor_key)
        self._started = False

    async def _ready(self) -> Facade:
        if not self._started:
            await self.core.start()
            self._started = True
        return self.core

    async def ready(self) -> bool:
        await self._ready()
        return True

    async def get(self, query: KeyQuery) -> Any:
        return await (await self._ready()).get(query)

    async def entries(self, query: ScanQuery) -> list[Any]:
        return await (await self._ready()).entries(query)

    async def page(self, query: ScanQuery, request: PageRequest) -> Page:
        return await (await self._ready()).page(query, request)

    async def count(self, store: str) -> int:
        return await (await self._ready()).count(store)

    async def catalog(self) -> list[dict[str, Any]]:
        return await (await self._ready()).catalog()

    async def metadata(self) -> list[dict[str, Any]]:
        return await (await self._ready()).metadata()

    async def metadata_for_store(self, store: str) -> list[dict[str, Any]]:
        return await (await self._ready()).metadata_for_store(store)

    async def metadata_for_key(self, query: KeyQuery) -> dict[str, Any]:
        return await (await self._ready()).metadata_for_key(query)
