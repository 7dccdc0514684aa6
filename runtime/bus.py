"""The bus, as the facade sees it: two small protocols with a Ray adapter (``verticles.bus``) and
in-process fakes for unit tests. Nothing here imports Ray.

Owners raise riqr's errors; the Ray adapter translates Ray's own failures through ``runtime.raycalls``,
so a facade handles ``RiqrError`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from runtime.monotonic import Spans
from runtime.ownership import ClusterView
from runtime.pages import PackedPage
from runtime.scan import Scan

__all__ = ["OwnerClient", "Bus"]


class OwnerClient(Protocol):
    """How a facade calls one query actor."""

    async def get_many(self, items: list[tuple[int, Any]]) -> tuple[Sequence[bytes | None], Spans]:
        """One answer per ``(partition, key)`` (the packed value or None) and, per partition asked about,
        what the answer reflects (``runtime.monotonic.Span``). ``PartitionUnavailable`` (with the
        ``partitions`` it concerns) if any of those partitions cannot answer."""
        ...

    async def scan(
        self, partitions: Sequence[int], scan: Scan, limit: int | None
    ) -> tuple[Sequence[tuple[Any, bytes]], Spans]:
        """Up to ``limit`` entries of ``scan`` over ``partitions``, merged in the scan's order, and the
        span of each partition."""
        ...

    async def scan_packed(
        self, partitions: Sequence[int], scan: Scan, limit: int | None, max_bytes: int, fmt: str
    ) -> tuple[PackedPage, Spans]:
        """A page of a key-value scan as a ``runtime.pages.PackedPage`` in ``fmt``, bounded by ``limit``
        entries and about ``max_bytes``, and the span of each partition."""
        ...

    async def count(self, partitions: Sequence[int]) -> tuple[int, Spans]:
        """How many keys ``partitions`` hold, and the span of each."""
        ...

    async def positions(self) -> dict[int, dict[str, Any]]:
        """Each partition's source, last batch id applied and state (``runtime.partition``)."""
        ...

    async def stats(self) -> dict[str, Any]:
        """``positions()`` as ``"partitions"`` and the actor's metric samples (``QueryCore.stats``)."""
        ...

    async def ping(self) -> bool:
        """True from an actor that is there, on a call its busy threads do not hold up (a facade asks when
        a scan's call is long: ``runtime.facade.silence.answer_or_silence``)."""
        ...


class Bus(Protocol):
    """How a facade reaches the registry and the query actors."""

    async def fetch_view(self) -> ClusterView: ...

    async def fetch_epoch(self) -> int: ...

    async def wait_epoch(self, known: int, timeout: float) -> int:
        """The registry's epoch as soon as it is not ``known``, or after about ``timeout`` seconds."""
        ...

    def suspect(self, uuid: str) -> None:
        """Tell the registry query actor ``uuid`` could not be reached (fire and forget: it checks, and
        promotes a standby if the actor is down)."""
        ...

    async def fetch_status(self) -> dict[str, Any]:
        """What the registry knows beyond routing: ingest state per store."""
        ...

    def owner(self, uuid: str) -> OwnerClient: ...
