"""Facade verticle: one per node, for Python callers inside the cluster.

A thin async shell over ``runtime.facade.FacadeCore``. Answers travel as envelopes, ``("ok", value)`` or
``("err", RiqrError)``, so the caller re-raises riqr's own exception instead of Ray's task-error wrapper.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from runtime.errors import InvalidParameter, RiqrError
from runtime.facade import FacadeCore
from verticles.bus import RayBus

__all__ = ["FacadeVerticle", "Envelope"]

Envelope = tuple[str, Any]


async def _envelope(awaitable: Awaitable[Any]) -> Envelope:
    try:
        return ("ok", await awaitable)
    except RiqrError as err:
        return ("err", err)


class FacadeVerticle:
    """Routes and scatter-gathers for callers on its node."""

    def __init__(self, namespace: str, timeout: float = 10.0) -> None:
        self.core = FacadeCore(RayBus(namespace), timeout=timeout)
        self._started = False

    async def _ready(self) -> None:
        if not self._started:
            await self.core.start()
            self._started = True

    async def ready(self) -> bool:
        await self._ready()
        return True

    async def get(self, store: str, key: Any) -> Envelope:
        await self._ready()
        return await _envelope(self.core.get(store, key))

    async def range(self, store: str, lo: Any = None, hi: Any = None, reverse: bool = False) -> Envelope:
        await self._ready()
        return await _envelope(self.core.range(store, lo, hi, reverse=reverse))

    async def all(self, store: str, reverse: bool = False) -> Envelope:
        await self._ready()
        return await _envelope(self.core.all(store, reverse=reverse))

    async def prefix(self, store: str, prefix: str, reverse: bool = False) -> Envelope:
        await self._ready()
        return await _envelope(self.core.prefix(store, prefix, reverse=reverse))

    async def page(
        self,
        store: str,
        limit: int,
        cursor: str | None = None,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool = False,
    ) -> Envelope:
        """One page of a range or prefix scan, and the cursor of the next (see ``FacadeCore.page``)."""
        await self._ready()

        async def run() -> tuple[list[tuple[Any, Any]], str | None]:
            scan = await self.core.make_scan(store, lo=lo, hi=hi, prefix=prefix, reverse=reverse)
            return await self.core.page(store, scan, limit, cursor)

        return await _envelope(run())

    async def windowed(
        self, store: str, query: str, params: dict[str, Any], limit: int | None = None, cursor: str | None = None
    ) -> Envelope:
        """A window (``query="windows"``) or session (``"sessions"``) query: every entry, or one page."""
        await self._ready()

        async def run() -> Any:
            if query == "windows":
                scan = await self.core.windows(store, **params)
            elif query == "sessions":
                scan = await self.core.sessions(store, **params)
            else:
                raise InvalidParameter(f"unknown windowed query {query!r}")
            if limit is None and cursor is None:
                return await self.core.collect(store, scan)
            return await self.core.page(store, scan, limit, cursor)

        return await _envelope(run())

    async def approximate_num_entries(self, store: str) -> Envelope:
        await self._ready()
        return await _envelope(self.core.approximate_num_entries(store))

    async def catalog(self) -> Envelope:
        await self._ready()
        return await _envelope(self.core.catalog())

    async def metadata(self) -> Envelope:
        await self._ready()
        return await _envelope(self.core.metadata())

    async def metadata_for_key(self, store: str, key: Any) -> Envelope:
        await self._ready()
        return await _envelope(self.core.metadata_for_key(store, key))
