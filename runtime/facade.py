"""The facade core: resolve owners from the cached view, route key queries, scatter-gather scans.

It talks to the rest of riqr only through the ``Bus`` protocol: ``fetch_view``/``fetch_epoch`` reach
the registry, ``owner(uuid)`` gives an ``OwnerClient`` for a query actor. ``verticles.bus.RayBus`` is the
Ray adapter; unit tests pass in-process fakes. Nothing here imports Ray.

The view is cached and refreshed in the background when the registry's epoch moves, so no request asks
the registry, except once when a request names a store the cached view does not know (so a store created
a moment ago is not reported missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from runtime.coalesce import Coalescer
from runtime.codec import decode_value, to_jsonable
from runtime.errors import (
    DeadlineExceeded,
    InvalidParameter,
    KeyNotFound,
    MalformedRange,
    OwnerUnavailable,
    PartitionUnavailable,
    RiqrError,
    StoreNotFound,
)
from runtime.merge import merge_pages_async, sum_counts
from runtime.ownership import ActorInfo, ClusterView, OwnershipTable, Route
from runtime.scan import Scan, decode_cursor, encode_cursor, prefix_scan
from runtime.windows import present, require_kind, session_scan, window_scan

__all__ = ["OwnerClient", "Bus", "FacadeCore", "instance_json", "check_limit", "MAX_PAGE"]

# The largest page a client may ask for; larger results are for NDJSON streaming or cursors.
MAX_PAGE = 10_000


def check_limit(limit: int, maximum: int = MAX_PAGE) -> int:
    """A page size a client asked for, or ``InvalidParameter``."""
    if not 1 <= limit <= maximum:
        raise InvalidParameter(f"limit must be between 1 and {maximum}, got {limit}", limit=limit, maximum=maximum)
    return limit


log = logging.getLogger(__name__)


class OwnerClient(Protocol):
    """How a facade calls one query actor."""

    async def get_many(self, items: list[tuple[int, Any]]) -> Sequence[bytes | None | RiqrError]: ...

    async def scan(self, partitions: Sequence[int], scan: Scan, limit: int | None) -> Sequence[tuple[Any, bytes]]: ...

    async def count(self, partitions: Sequence[int]) -> int: ...


class Bus(Protocol):
    """How a facade reaches the registry and the query actors."""

    async def fetch_view(self) -> ClusterView: ...

    async def fetch_epoch(self) -> int: ...

    def owner(self, uuid: str) -> OwnerClient: ...


def instance_json(view: ClusterView, info: ActorInfo) -> dict[str, Any]:
    """A seed-000 metadata instance for a query actor, plus riqr's fields.

    ``host``/``port`` are the HTTP verticle on the actor's node, so a client that follows the metadata
    lands on the node holding the data.
    """
    endpoint = view.endpoints.get(info.node_id)
    return {
        "host": endpoint.host if endpoint else info.node_ip,
        "port": endpoint.port if endpoint else None,
        "state-store-names": [info.store],
        "actor": info.uuid,
        "node": info.node_id,
        "partitions": list(info.partitions),
    }


class FacadeCore:
    """Routing and scatter-gather over a cached ``ClusterView``."""

    def __init__(
        self,
        bus: Bus,
        *,
        timeout: float = 10.0,
        refresh_interval: float = 1.0,
        page_size: int = 1000,
        max_page: int = MAX_PAGE,
    ) -> None:
        self._bus = bus
        self.timeout = timeout
        self.page_size = page_size
        self.max_page = max_page
        self._refresh_interval = refresh_interval
        self._view = ClusterView()
        self._refresh_lock = asyncio.Lock()
        self._coalescers: dict[str, Coalescer[tuple[int, Any], bytes | None | RiqrError]] = {}
        self._watcher: asyncio.Task[None] | None = None

    # -- the cached view ------------------------------------------------------------------------------

    @property
    def view(self) -> ClusterView:
        return self._view

    async def start(self) -> None:
        """Load the view and keep it fresh in the background."""
        await self.refresh()
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval)
            try:
                epoch = await self._bus.fetch_epoch()
                if epoch != self._view.epoch:
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # the registry may be restarting; keep serving the cached view
                log.warning("could not refresh the cluster view", exc_info=True)

    async def refresh(self) -> ClusterView:
        """Fetch the view from the registry (one fetch at a time; concurrent callers share it)."""
        epoch_before = self._view.epoch
        async with self._refresh_lock:
            if self._view.epoch != epoch_before:
                return self._view
            view = await self._bus.fetch_view()
            if view.epoch >= self._view.epoch:
                self._view = view
                stale = set(self._coalescers) - set(view.actors)
                for uuid in stale:
                    del self._coalescers[uuid]
            return self._view

    async def table(self, store: str) -> OwnershipTable:
        """The ownership table of ``store``, refreshing once if the cached view does not know it."""
        table = self._view.table(store)
        if table is None:
            table = (await self.refresh()).table(store)
        if table is None:
            raise StoreNotFound(f"store {store!r} is not known; GET /stores lists the stores", store=store)
        return table

    # -- key queries ----------------------------------------------------------------------------------

    def _coalescer(self, uuid: str) -> Coalescer[tuple[int, Any], bytes | None | RiqrError]:
        coalescer = self._coalescers.get(uuid)
        if coalescer is None:
            owner = self._bus.owner(uuid)

            async def send(items: list[tuple[int, Any]]) -> Sequence[bytes | None | RiqrError]:
                return await owner.get_many(items)

            coalescer = self._coalescers[uuid] = Coalescer(send, max_in_flight=1)
        return coalescer

    def _route(self, table: OwnershipTable, key: Any) -> Route:
        verdict = table.resolve(key)
        if not isinstance(verdict, Route):
            raise PartitionUnavailable(
                f"partition {verdict.partition} of store {table.spec.name} has no owner right now",
                store=table.spec.name,
                partition=verdict.partition,
            )
        return verdict

    async def _guard(self, awaitable: Any, what: str) -> Any:
        """Run one request under the deadline; an unreachable owner triggers a view refresh."""
        try:
            async with asyncio.timeout(self.timeout):
                return await awaitable
        except TimeoutError:
            raise DeadlineExceeded(f"{what} did not complete within {self.timeout:g}s", timeout=self.timeout) from None
        except OwnerUnavailable:
            asyncio.ensure_future(self._refresh_quietly())
            raise

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception:
            log.warning("could not refresh the cluster view", exc_info=True)

    async def get(self, store: str, key: Any) -> Any:
        """The value of ``key`` in ``store``; ``KeyNotFound`` when absent."""
        table = await self.table(store)
        require_kind(table.spec, "kv")
        typed = table.spec.key.coerce(key)
        route = self._route(table, typed)
        answer = await self._guard(self._coalescer(route.owner).submit((route.partition, typed)), f"get on {store}")
        if isinstance(answer, RiqrError):
            raise answer
        if answer is None:
            shown = to_jsonable(table.spec.key.external(typed))
            raise KeyNotFound(f"key {shown!r} is not in store {store!r}", store=store, key=shown)
        return decode_value(answer)

    # -- scatter-gather -------------------------------------------------------------------------------

    def _owners(self, table: OwnershipTable) -> dict[str, list[int]]:
        missing = table.unassigned()
        if missing:
            raise PartitionUnavailable(
                f"partitions {missing} of store {table.spec.name} have no owner right now; a partial answer "
                "would be wrong, so none is given",
                store=table.spec.name,
                partitions=missing,
            )
        return table.by_owner()

    async def make_scan(
        self, store: str, *, lo: Any = None, hi: Any = None, prefix: str | None = None, reverse: bool = False
    ) -> Scan:
        """The scan of ``store`` for a key range (both ends inclusive, ``None`` open) or a key prefix."""
        table = await self.table(store)
        key = table.spec.key
        if (lo is not None or hi is not None or prefix is not None) and table.spec.windowed:
            raise InvalidParameter(
                f"store {store!r} is a {table.spec.kind} store: use its {table.spec.kind} queries for key ranges",
                store=store,
            )
        if prefix is not None:
            if lo is not None or hi is not None:
                raise InvalidParameter("a prefix scan cannot also have from/to bounds", store=store)
            if key.type_name != "string":
                raise InvalidParameter(
                    f"prefix scans need a string key (or a string first key column); store {store!r} has "
                    f"{key.type_label} keys",
                    store=store,
                )
            return prefix_scan(prefix, reverse=reverse, composite=key.composite)
        try:
            lo_t = None if lo is None else key.coerce_bound(lo, upper=False)
            hi_t = None if hi is None else key.coerce_bound(hi, upper=True)
        except RiqrError as err:
            raise MalformedRange(err.message, store=store) from None
        return Scan.closed(lo_t, hi_t, reverse=reverse)

    async def _owner_pages(
        self, uuid: str, partitions: list[int], scan: Scan, page_size: int
    ) -> AsyncGenerator[list[tuple[Any, bytes]], None]:
        """One owner's part of a scan, a page at a time, with the next page fetched while one is used."""
        owner = self._bus.owner(uuid)
        what = f"scan page from {uuid}"
        pending: asyncio.Future[Any] | None = asyncio.ensure_future(
            self._guard(owner.scan(partitions, scan, page_size), what)
        )
        try:
            while pending is not None:
                page = list(await pending)
                pending = None
                if len(page) == page_size:
                    scan = scan.after(page[-1][0])
                    pending = asyncio.ensure_future(self._guard(owner.scan(partitions, scan, page_size), what))
                yield page
        finally:
            if pending is not None and not pending.done():
                pending.cancel()

    async def stream_chunks(
        self, store: str, scan: Scan, page_size: int | None = None, *, external: bool = True
    ) -> AsyncGenerator[list[Any], None]:
        """The entries of ``scan`` over all partitions, in order, as chunks merged from the owners' pages.

        Memory is about two pages per owner whatever the result's size, so a caller can stream a whole
        store. Each page call has the request deadline; the stream as a whole has none. Entries come as
        callers see them (``runtime.windows.present``), or as internal ``(key, raw value)`` pairs when
        ``external`` is false.
        """
        table = await self.table(store)
        if scan.is_empty():
            return
        spec = table.spec
        size = page_size or self.page_size
        sources = [self._owner_pages(u, p, scan, size) for u, p in self._owners(table).items()]
        try:
            async for chunk in merge_pages_async(sources, reverse=scan.reverse):
                yield [present(spec, k, v) for k, v in chunk] if external else chunk
        finally:
            for source in sources:
                await source.aclose()

    async def collect(
        self, store: str, scan: Scan, limit: int | None = None, *, external: bool = True
    ) -> list[tuple[Any, Any]]:
        """The entries of ``scan`` as a list (at most ``limit``)."""
        page_size = self.page_size if limit is None else min(self.page_size, limit)
        out: list[Any] = []
        if limit == 0:
            return out
        chunks = self.stream_chunks(store, scan, page_size, external=external)
        try:
            async for chunk in chunks:
                out.extend(chunk)
                if limit is not None and len(out) >= limit:
                    del out[limit:]
                    break
        finally:
            await chunks.aclose()
        return out

    async def page(
        self, store: str, scan: Scan, limit: int | None = None, cursor: str | None = None
    ) -> tuple[list[tuple[Any, Any]], str | None]:
        """One page of at most ``limit`` entries (default: the page size), and the cursor of the next page
        (None at the end).

        With a ``cursor`` the scan it encodes is continued and ``scan`` is ignored.
        """
        limit = check_limit(self.page_size if limit is None else limit, self.max_page)
        if cursor is not None:
            scan = decode_cursor(store, cursor)
        entries = await self.collect(store, scan, limit + 1, external=False)
        spec = (await self.table(store)).spec
        more = len(entries) > limit
        entries = entries[:limit]
        shown = [present(spec, k, v) for k, v in entries]
        return shown, encode_cursor(store, scan, entries[-1][0]) if more else None

    async def range(
        self, store: str, lo: Any = None, hi: Any = None, *, reverse: bool = False
    ) -> list[tuple[Any, Any]]:
        """Entries with ``lo <= key <= hi`` (a ``None`` bound is open) over all partitions, in key order."""
        return await self.collect(store, await self.make_scan(store, lo=lo, hi=hi, reverse=reverse))

    async def all(self, store: str, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Every entry of ``store`` in key order (or reversed)."""
        return await self.range(store, reverse=reverse)

    async def prefix(self, store: str, prefix: str, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Entries whose (string) key starts with ``prefix``, in key order (or reversed)."""
        return await self.collect(store, await self.make_scan(store, prefix=prefix, reverse=reverse))

    async def windows(
        self,
        store: str,
        key: Any = None,
        *,
        key_from: Any = None,
        key_to: Any = None,
        time_from: Any = None,
        time_to: Any = None,
        reverse: bool = False,
    ) -> Scan:
        """The scan of a window store's windows: of ``key``, or of a key range (both optional), whose
        start lies in [``time_from``, ``time_to``]."""
        spec = (await self.table(store)).spec
        require_kind(spec, "window")
        return window_scan(
            spec, key=key, key_from=key_from, key_to=key_to, time_from=time_from, time_to=time_to, reverse=reverse
        )

    async def sessions(
        self,
        store: str,
        key: Any = None,
        *,
        key_from: Any = None,
        key_to: Any = None,
        earliest_end: Any = None,
        latest_start: Any = None,
    ) -> Scan:
        """The scan of a session store's sessions: of ``key`` or a key range; with bounds, those ending at
        or after ``earliest_end`` and starting at or before ``latest_start``."""
        spec = (await self.table(store)).spec
        require_kind(spec, "session")
        return session_scan(
            spec, key=key, key_from=key_from, key_to=key_to, earliest_end=earliest_end, latest_start=latest_start
        )

    async def approximate_num_entries(self, store: str) -> int:
        table = await self.table(store)
        owners = self._owners(table)

        async def gather() -> list[int]:
            return list(await asyncio.gather(*(self._bus.owner(u).count(p) for u, p in owners.items())))

        return sum_counts(await self._guard(gather(), f"count of {store}"))

    # -- metadata and catalog -------------------------------------------------------------------------

    async def catalog(self) -> list[dict[str, Any]]:
        view = await self.refresh() if not self._view.tables else self._view
        return [spec.to_json() for spec in view.stores()]

    def _instances(self, view: ClusterView, store: str | None = None) -> list[dict[str, Any]]:
        infos = [i for i in view.actors.values() if store is None or i.store == store]
        infos.sort(key=lambda i: (i.store, i.partitions, i.uuid))
        return [instance_json(view, i) for i in infos]

    async def metadata(self) -> list[dict[str, Any]]:
        """Every query actor as a seed-000 instance."""
        if not self._view.actors:
            await self.refresh()
        return self._instances(self._view)

    async def metadata_for_store(self, store: str) -> list[dict[str, Any]]:
        await self.table(store)
        return self._instances(self._view, store)

    async def metadata_for_key(self, store: str, key: Any) -> dict[str, Any]:
        """The instance that owns ``key``'s partition, whether or not the key is present."""
        table = await self.table(store)
        typed = table.spec.key.coerce_bound(key, upper=False)  # only the partition column decides
        route = self._route(table, typed)
        view = self._view
        info = view.actors.get(route.owner)
        if info is None:
            raise PartitionUnavailable(
                f"the owner of partition {route.partition} of {store} is not registered",
                store=store,
                partition=route.partition,
            )
        standbys = [instance_json(view, view.actors[u]) for u in route.standbys if u in view.actors]
        return {**instance_json(view, info), "partition": route.partition, "standbys": standbys}
