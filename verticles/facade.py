"""Facade verticle: one per node, for Python callers inside the cluster.

A thin async shell over ``runtime.facade.FacadeCore``. Answers travel as envelopes, ``("ok", value)`` or
``("err", RiqrError)``, so the caller re-raises riqr's own exception instead of Ray's task-error wrapper.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from runtime.errors import RiqrError
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

    async def range(self, store: str, lo: Any = None, hi: Any = None) -> Envelope:
        await self._ready()
        return await _envelope(self.core.range(store, lo, hi))

    async def all(self, store: str) -> Envelope:
        await self._ready()
        return await _envelope(self.core.all(store))

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
