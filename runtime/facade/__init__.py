"""The facade: resolves owners from the cached view, routes key queries, scatter-gathers scans.

One facade serves each caller-facing verticle: inside every HTTP verticle (the co-located facade) and in
the per-node facade verticle for Python callers. Its parts, each in its own module:

* ``view``: the cached ``ClusterView`` and its refresh;
* ``routing``: a key's owner, coalesced lookups, the request deadline;
* ``scatter``: scans, pages, streams and counts over all owners, merged in key order;
* ``metadata``: the seed-000 metadata answers and the catalog.

Key lookups, pages and counts share one set of high-water marks (``runtime.monotonic.Marks``): what this
facade has served from each partition, so that it never answers from a copy older than that. Reads are
monotonic per facade (per HTTP node, per facade verticle), not across them.

Each public method takes a query value (``runtime.queries``) built at the edge, binds it against the
store's schema here, where the schema already is, and answers in one call. Nothing here imports Ray: it
reaches the cluster through the ``Bus`` protocol (``runtime.bus``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from runtime.bus import Bus
from runtime.codec import decode_value, encode_json
from runtime.config import DEFAULT_PAGE_SIZE, DEFAULT_REQUEST_TIMEOUT, MAX_PAGE, VIEW_REFRESH_INTERVAL
from runtime.cursor import CursorCodec, issuer_of
from runtime.deadline import Deadline, within
from runtime.errors import CursorOfAnotherStore, MalformedCursor, RiqrError
from runtime.facade import metadata
from runtime.facade.routing import KeyRouter, LocalCopies, route_or_unavailable
from runtime.facade.scatter import ScatterGather
from runtime.facade.view import ViewCache
from runtime.health import ClusterProbe
from runtime.metrics import Metrics
from runtime.monotonic import Marks, position_header
from runtime.ownership import ClusterView, OwnershipTable
from runtime.pages import MSGPACK, NDJSON
from runtime.queries import KeyQuery, Page, PageRequest, ScanQuery, bind_key, bind_partition_key, check_limit
from runtime.scan import Scan
from runtime.windows import Windowed, require_kind


def _ndjson_line(entry: Any) -> bytes:
    body = entry.to_json() if isinstance(entry, Windowed) else {"key": entry[0], "value": entry[1]}
    return encode_json(body) + b"\n"


__all__ = ["Facade"]


class Facade:
    """Routing and scatter-gather over a cached ``ClusterView``, one method per kind of query."""

    def __init__(
        self,
        bus: Bus,
        *,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        refresh_interval: float = VIEW_REFRESH_INTERVAL,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_page: int = MAX_PAGE,
        cursor_key: bytes | None = None,
        metrics: Metrics | None = None,
        marks: Marks | None = None,
        local: LocalCopies | None = None,
    ) -> None:
        # Every facade of a deployment gets the same ``cursor_key`` (verticles.deploy), so a cursor one
        # node issued pages on at any other, and on the Python client's facade verticle too.
        self._bus = bus
        self.cursors = CursorCodec(cursor_key)
        self.timeout = timeout
        # This process's metrics (the HTTP verticle serves them at /metrics and mirrors them into Ray).
        self.metrics = metrics if metrics is not None else Metrics()
        self.views = ViewCache(bus, refresh_interval=refresh_interval)
        # The in-process facade of the Python client shares its marks with its callers' threads.
        self.marks = marks if marks is not None else Marks()
        self._holders: dict[str, frozenset[str]] = {}
        self.views.listeners.append(self._forget_replaced)
        # ``local``: the HTTP verticle's read replicas (``runtime.readreplica``), asked first for key lookups.
        self.router = KeyRouter(bus, self.views, timeout=timeout, metrics=self.metrics, marks=self.marks, local=local)
        self.scatter = ScatterGather(
            bus,
            self.views,
            timeout=timeout,
            page_size=page_size,
            max_page=max_page,
            marks=self.marks,
            silence=self.router.silence,
        )
        # /ready and /metrics look at the cluster through this: at most one look per second, shared.
        self.probe = ClusterProbe(bus, lambda: self.views.current)

    def _forget_replaced(self, view: ClusterView) -> None:
        """Drop the marks of stores that are gone or whose actors changed (dropped and created again): a new
        store's partitions start over, possibly at a source and batch below the old marks."""
        holders = {name: frozenset(table.all_owners()) for name, table in view.tables.items()}
        lineage = {name: table.lineage() for name, table in view.tables.items()}
        for store in self.marks.stores() | set(self._holders):
            before = self._holders.get(store)
            # Another store of that name has none of the actors this one had (a move keeps them in the
            # lineage: its marks stay, so reads stay monotonic across it).
            if before is None or store not in lineage or before.isdisjoint(lineage[store]):
                self.marks.forget(store)
        if not set(self._holders) <= set(view.tables):
            # A store was dropped: its series go (the HTTP verticle's ``/metrics`` does so at each scrape; a
            # facade whose metrics no one scrapes, the Python client's, kept every store's it ever served).
            self.metrics.retain_stores(view.tables)
        self._holders = holders

    @property
    def view(self) -> ClusterView:
        return self.views.current

    async def start(self) -> None:
        """Load the cluster view and keep it fresh."""
        await self.views.start()

    async def stop(self) -> None:
        await self.views.stop()

    async def table(self, store: str) -> OwnershipTable:
        """The ownership table of ``store`` (``StoreNotFound`` if unknown)."""
        return await self.views.table(store)

    # -- key queries ----------------------------------------------------------------------------------

    async def get(self, query: KeyQuery) -> Any:
        """The value of a key-value store's key; ``KeyNotFound`` when absent."""
        return (await self.lookup(query))[0]

    async def lookup(self, query: KeyQuery) -> tuple[Any, str]:
        """The value of a key-value store's key and what it reflects, as the ``X-Riqr-Position`` header
        says it (``runtime.monotonic.position_header``); ``KeyNotFound`` when absent, with its position."""
        table = self.views.current.table(query.store) or await self.views.table(query.store)
        require_kind(table.spec, "kv")
        found = await self.router.get(table.spec, table, bind_key(table.spec, query.key))
        return decode_value(found.value), position_header(found.partition, found.span)

    # -- scans ----------------------------------------------------------------------------------------

    async def _bind(self, query: ScanQuery, cursor: str | None = None) -> tuple[OwnershipTable, Scan]:
        """The store's table and the scan to run: ``query``'s, or the one ``cursor`` continues."""
        table, scan, _ = await self._bind_with_origin(query, cursor)
        return table, scan

    async def _bind_with_origin(self, query: ScanQuery, cursor: str | None) -> tuple[OwnershipTable, Scan, Scan]:
        """``_bind``, and the scan as the query that began it asked (what the next page's cursor carries).

        A cursor comes alone (a query with no parameters) or with the very parameters of the query that
        began the scan: with others (another prefix in the path, other bounds, the other direction) it once
        continued its own scan silently, answering entries the request did not ask for."""
        table = await self.views.table(query.store)
        scan = query.bind(table.spec)  # validates the query even when a cursor continues it
        if cursor is None:
            return table, scan, scan
        try:
            origin, continued = self.cursors.decode_with_origin(table.spec, query.shape, cursor, table.lineage())
        except CursorOfAnotherStore:
            # Issued by an actor this view may not list yet (another facade's newer view, say): a fresh look
            # before refusing a scan of the same store.
            await self.views.refresh()
            table = await self.views.table(query.store)
            scan = query.bind(table.spec)
            origin, continued = self.cursors.decode_with_origin(table.spec, query.shape, cursor, table.lineage())
        if scan != origin and query.reverse is None and origin.reverse:
            # The direction left unsaid is the cursor's own, with the other parameters repeated as without
            # them (Python's ``page(limit, next, lo=..., hi=...)`` after a reverse first page was refused).
            scan = query.backwards().bind(table.spec)
        if scan != origin and query != query.bare():
            raise MalformedCursor(
                "the cursor continues another scan than this request asks for: send it alone, or with the "
                "parameters of the request whose page gave it",
                store=query.store,
            )
        return table, continued, origin

    async def entries(self, query: ScanQuery, max_entries: int | None = None) -> list[Any]:
        """Every entry of a scan, in its order: ``(key, value)`` pairs, or ``Windowed`` entries;
        ``ResultTooLarge`` if there are more than ``max_entries`` (when given)."""
        table, scan = await self._bind(query)
        entries = await self.scatter.collect(table, scan, max_entries)
        self._scanned(query.store, len(entries))
        return entries

    async def page(self, query: ScanQuery, request: PageRequest) -> Page:
        """One page of a scan and the cursor of the next (None after the last page)."""
        table, scan, origin = await self._bind_with_origin(query, request.cursor)

        def cursor_after(last_key: Any) -> str:
            # The scan as begun, not as continued: every page's cursor then fits the query's parameters.
            return self.cursors.encode(
                table.spec.name, query.shape, origin, last_key, table.spec.key.type_label, issuer_of(table)
            )

        page = await self.scatter.page(table, scan, request.limit, cursor_after)
        self._scanned(query.store, len(page.entries))
        return page

    async def stream(self, query: ScanQuery, cursor: str | None = None) -> AsyncGenerator[list[Any], None]:
        """Every entry of a scan as chunks, with memory flat whatever the size (NDJSON, ``iterate``)."""
        table, scan = await self._bind(query, cursor)
        chunks = self.scatter.stream(table, scan)
        scanned = self.metrics.child("riqr_scan_entries_total", query.store)
        try:
            async for chunk in chunks:
                scanned.inc(len(chunk))
                yield chunk
        finally:
            await chunks.aclose()

    async def stream_ndjson(
        self, query: ScanQuery, cursor: str | None = None, limit: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Every entry of a scan (at most ``limit``) as NDJSON lines, in chunks of bytes with memory flat.
        A key-value store's owners send their pages as NDJSON already (``runtime.pages``), so values are
        never decoded here; window and session entries are rendered here. A ``limit`` goes down to the
        owners, so a small one costs a small page, not a full one."""
        table, scan = await self._bind(query, cursor)
        scanned = self.metrics.child("riqr_scan_entries_total", query.store)
        if table.spec.windowed:
            entries = self.scatter.stream(table, scan, limit)
            try:
                async for chunk in entries:
                    scanned.inc(len(chunk))
                    yield b"".join([_ndjson_line(e) for e in chunk])
            finally:
                await entries.aclose()
            return
        runs = self.scatter.packed_chunks(table, scan, NDJSON, limit=limit)
        try:
            async for run in runs:
                scanned.inc(len(run))
                yield b"".join(run.columns[0])
        finally:
            await runs.aclose()

    async def entry_chunks(self, query: ScanQuery, page_size: int | None = None) -> AsyncGenerator[list[Any], None]:
        """Every entry of a scan as callers see them, in chunks, with memory flat (``Store.iterate`` in the
        caller's process). A key-value store's owners send packed msgpack pages of about ``PAGE_BYTES``
        (``page_size`` caps their entries too), one prefetched per owner, merged here as they come; window
        and session stores stream their tuple pages."""
        table, scan = await self._bind(query)
        if table.spec.windowed:
            async for chunk in self.stream(query):
                yield chunk
            return
        if page_size is not None:
            check_limit(page_size, self.scatter.max_page)
        composite = table.spec.key.composite
        scanned = self.metrics.child("riqr_scan_entries_total", query.store)
        runs = self.scatter.packed_chunks(table, scan, MSGPACK, page_entries=page_size)
        try:
            async for run in runs:
                scanned.inc(len(run))
                keys, values = run.columns
                yield list(zip(map(tuple, keys) if composite else keys, values))
        finally:
            await runs.aclose()

    def _scanned(self, store: str, entries: int) -> None:
        if entries:
            self.metrics.inc("riqr_scan_entries_total", store, amount=entries)

    async def count(self, store: str) -> int:
        """``approximate-num-entries``: the number of keys over all partitions."""
        return await self.scatter.count(await self.views.table(store))

    # -- metadata and catalog -------------------------------------------------------------------------

    async def _positions(self, view: ClusterView, store: str | None = None) -> metadata.Positions:
        uuids = [u for u, info in view.actors.items() if store is None or info.store == store]
        return await metadata.gather_positions(self._bus, uuids, min(self.timeout, metadata.POSITIONS_DEADLINE))

    async def catalog(self) -> list[dict[str, Any]]:
        """Every store: kind, schemas, layout, engine, ingest state, and each partition's copies: position,
        state and lag (``runtime.lag``)."""
        view = await self.views.loaded()
        # The status before the positions: a copy then never looks behind a batch acknowledged after it
        # was asked.
        status = await within(Deadline.after(self.timeout), self._bus.fetch_status(), "registry status")
        return metadata.catalog(view, await self._positions(view), status)

    async def _ingest(self) -> metadata.Ingest:
        """The registry's ingest status, for lag; empty (lag unknown) when the registry does not answer
        in time, since the metadata answers need only the cached view."""
        try:
            status = await within(Deadline.after(self.timeout), self._bus.fetch_status(), "registry status")
        except RiqrError:
            return {}
        return dict(status.get("ingest", {}))

    async def metadata(self) -> list[dict[str, Any]]:
        """Every query actor as a seed-000 instance, with its partitions' positions and lag."""
        view = await self.views.loaded()
        ingest = await self._ingest()
        return metadata.instances(view, await self._positions(view), ingest=ingest)

    async def metadata_for_store(self, store: str) -> list[dict[str, Any]]:
        await self.views.table(store)
        view = self.views.current
        ingest = await self._ingest()
        return metadata.instances(view, await self._positions(view, store), store, ingest)

    async def metadata_for_key(self, query: KeyQuery) -> dict[str, Any]:
        """The instance that owns the key's partition, whether or not the key is present."""
        table = await self.views.table(query.store)
        route = route_or_unavailable(table, bind_partition_key(table.spec, query.key))
        ingest = await self._ingest()
        owners = table.partitions[route.partition]
        copies = {route.owner, *route.standbys, *owners.standbys} | ({owners.active} if owners.active else set())
        positions = await metadata.gather_positions(self._bus, copies, min(self.timeout, metadata.POSITIONS_DEADLINE))
        return metadata.owner_of(self.views.current, table, route, positions, ingest)
