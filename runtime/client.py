"""The Python driver API for code running inside the Ray cluster.

    import runtime
    client = runtime.connect()                      # namespace "riqr", the local Ray cluster
    orders = client.store("order-count")
    orders.get("1")                                 # 1
    orders.range("1", "5")                          # [("1", 1), ("2", 1)]
    await orders.get_async("1")                     # the same, from async code

Key lookups (``get``, ``get_async``) go straight to the query actor owning the key, in one Ray hop: the
client runs the facade's core in its own process (``runtime.facade.inprocess``, one per process and
namespace) with the cached, epoch-checked view, per-owner coalescing, failover to standbys and its own
monotonic marks. ``iterate`` and ``iterate_async`` run there too: the owners' packed pages stream into
this process and merge here. The other scans, pages, counts and metadata go to the facade verticle on
the caller's node (any node's if that one is missing), which scatter-gathers over Ray. Each call builds a query value
(``runtime.queries``). Errors are riqr's own (``runtime.errors``), whatever Ray said: ``KeyNotFound``,
``StoreNotFound``, ``MalformedKey``, ``PartitionUnavailable``, ``DeadlineExceeded``...
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from runtime import raycalls
from runtime.config import DEFAULT_NAMESPACE, DEFAULT_REQUEST_TIMEOUT, facade_name
from runtime.deadline import Deadline
from runtime.errors import DeadlineExceeded, InvalidParameter, NotConnected, OwnerUnavailable, StoreNotFound
from runtime.queries import KeyQuery, Lookup, Page, PageRequest, RangeQuery, ScanQuery, SessionQuery, WindowQuery
from runtime.windows import Windowed

if TYPE_CHECKING:
    from runtime.facade.inprocess import InProcessFacade

__all__ = ["connect", "Client", "Store", "Page", "Lookup", "JoinRefused"]

log = logging.getLogger(__name__)


class Client:
    """A connection to the riqr runtime of one Ray namespace."""

    def __init__(self, facade: Any, namespace: str, timeout: float) -> None:
        self.facade = facade
        self.namespace = namespace
        self.timeout = timeout
        self._keys: InProcessFacade | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # The in-process facade (a loop thread) stays behind; the copy finds its process's own.
        return (Client, (self.facade, self.namespace, self.timeout))

    @property
    def keys(self) -> InProcessFacade:
        """This process's facade core for key lookups and ``iterate`` in ``namespace`` (started on first use)."""
        if self._keys is None or self._keys.closed:  # closed: a client kept across close_in_process_facades
            self._keys = in_process_facade(self.namespace)
        return self._keys

    def get(self, query: KeyQuery) -> Any:
        """A key lookup, straight to its owner (failing over to standbys), within ``timeout``."""
        return self.keys.get(query, self.timeout)

    async def get_async(self, query: KeyQuery) -> Any:
        return await self.keys.get_async(query, self.timeout)

    def call(self, method: str, *args: Any) -> Any:
        """Call the facade verticle and wait, with Ray's failures as riqr's errors. A facade that died (its
        node gone) is replaced by another node's, once per call: scans and pages once failed for good with
        the node the client was connected through, while key lookups went on. A call the caller stops
        waiting for (its timeout, Ctrl-C) is cancelled in the facade (``_cancel``)."""
        deadline = Deadline.after(self.timeout)
        sent: list[Any] = []
        try:
            for attempt in (1, 2):
                try:
                    submit = partial(self._submit, method, args, sent)
                    return raycalls.call_sync(submit, method, deadline=deadline, actor=_FACADE)
                except OwnerUnavailable as err:
                    if not self._may_switch(err, attempt, deadline) or not self._switch_facade():
                        raise
        except (DeadlineExceeded, KeyboardInterrupt):
            _cancel(sent)
            raise
        raise AssertionError("unreachable")

    async def call_async(self, method: str, *args: Any) -> Any:
        deadline = Deadline.after(self.timeout)
        sent: list[Any] = []
        try:
            for attempt in (1, 2):
                try:
                    # Bounded by the deadline, as the blocking form's ``ray.get`` is.
                    submit = partial(self._submit, method, args, sent)
                    return await raycalls.call_within(submit, method, deadline=deadline, actor=_FACADE)
                except OwnerUnavailable as err:
                    # Looking for another facade blocks (Ray's actor listing, a readiness call each): not on
                    # the caller's loop.
                    if not self._may_switch(err, attempt, deadline) or not await asyncio.to_thread(self._switch_facade):
                        raise
        except (DeadlineExceeded, asyncio.CancelledError, KeyboardInterrupt):
            _cancel(sent)
            raise
        raise AssertionError("unreachable")

    def _submit(self, method: str, args: tuple[Any, ...], sent: list[Any]) -> Any:
        ref = getattr(self.facade, method).remote(*args)
        sent.append(ref)
        return ref

    @staticmethod
    def _may_switch(err: OwnerUnavailable, attempt: int, deadline: Deadline) -> bool:
        """Whether a call that failed with ``err`` may go to another facade: only the first attempt, only
        when Ray said the facade verticle itself died (not an answer it gave), and only with time left."""
        return attempt == 1 and err.details.get("actor") == _FACADE and deadline.remaining() > 0

    def _switch_facade(self) -> bool:
        """Take another live facade verticle of the namespace; False if there is none."""
        other = _other_facade(self.namespace, self.facade)
        if other is None:
            return False
        self.facade = other
        return True

    def store(self, name: str) -> Store:
        return Store(self, name)

    def stores(self) -> list[dict[str, Any]]:
        """The catalog: each store's name, kind, key and value schema, partitions, ingest, and per
        partition the active copy's position and lag plus ``replicas`` (every copy's; ``Store.replicas``)."""
        return self.call("catalog")

    def metadata(self) -> list[dict[str, Any]]:
        """Every query actor as a seed-000 metadata instance; each partition it holds with its ``role``,
        position, ``replica_state`` and ``lag_batches`` / ``lag_seconds``."""
        return self.call("metadata")

    async def stores_async(self) -> list[dict[str, Any]]:
        return await self.call_async("catalog")

    async def metadata_async(self) -> list[dict[str, Any]]:
        return await self.call_async("metadata")


class Store:
    """Queries on one store, in sync (``get``) and async (``get_async``) forms."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    # -- key-value stores -------------------------------------------------------------------------------

    def get(self, key: Any) -> Any:
        """The value of ``key``; raises ``KeyNotFound`` when absent."""
        return self._client.get(KeyQuery(self.name, key))

    def lookup(self, key: Any) -> Lookup:
        """``key``'s value and what it reflects (``Lookup(value, position)``, the position as REST's
        ``X-Riqr-Position`` says it); raises ``KeyNotFound`` when absent, its ``position`` saying as of what."""
        value, position = self._client.keys.lookup(KeyQuery(self.name, key), self._client.timeout)
        return Lookup(value, position)

    def all(self, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` in key order (or reversed). For big stores prefer ``iterate``."""
        return self._client.call("entries", RangeQuery(self.name, reverse=reverse))

    def range(self, lo: Any = None, hi: Any = None, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Entries with ``lo <= key <= hi`` in key order (or reversed); a ``None`` bound is open."""
        return self._client.call("entries", RangeQuery(self.name, lo, hi, reverse=reverse))

    def prefix(self, prefix: str, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Entries whose (string) key starts with ``prefix``."""
        return self._client.call("entries", RangeQuery(self.name, prefix=prefix, reverse=reverse))

    def page(
        self,
        limit: int,
        cursor: str | None = None,
        *,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool | None = None,
    ) -> Page:
        """At most ``limit`` entries and the cursor of the next page (``None`` after the last page).

        Pass the cursor back to continue the same scan (its bounds and direction travel in the cursor), alone
        or with this call's own arguments: ``reverse`` left out (None) is the cursor's direction, and
        ``reverse=False`` beside a reverse scan's cursor is ``MalformedCursor``.
        Paging through a store that is being updated never repeats a key and never skips one that was
        present throughout.
        """
        query = RangeQuery(self.name, lo, hi, prefix, reverse)
        return self._client.call("page", query, PageRequest(limit, cursor))

    def iterate(
        self,
        *,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool = False,
        page_size: int | None = None,
    ) -> Iterator[tuple[Any, Any]]:
        """Every entry of a range or prefix scan, fetched a page at a time (memory stays flat).

        The owners are asked directly, from this process (``Client.keys``), as NDJSON streams are: each
        sends pages of about ``PAGE_BYTES`` (``page_size`` caps their entries too) as msgpack blobs, one
        page ahead, and they merge here in key order while the caller uses the entries merged before.
        """
        return self._entries(RangeQuery(self.name, lo, hi, prefix, reverse), page_size)

    def _entries(self, query: ScanQuery, page_size: int | None = None) -> Iterator[Any]:
        """Every entry of ``query``, streamed from its owners into this process a chunk at a time."""
        for chunk in self._client.keys.chunks(lambda core: core.entry_chunks(query, page_size)):
            yield from chunk

    def approximate_num_entries(self) -> int:
        return self._client.call("count", self.name)

    def owner(self, key: Any) -> dict[str, Any]:
        """The metadata instance that owns ``key`` (present or not), with ``replicas``: every copy of the
        key's partition with its position, replica state and lag."""
        return self._client.call("metadata_for_key", KeyQuery(self.name, key))

    def instances(self) -> list[dict[str, Any]]:
        """The metadata instances of the query actors holding this store (REST's
        ``/metadata/stores/{store}``); ``StoreNotFound`` for an unknown store."""
        return self._client.call("metadata_for_store", self.name)

    def replicas(self) -> dict[int, list[dict[str, Any]]]:
        """Partition -> its copies, the active first: each one's ``role``, ``actor``, ``node``, position
        (``source``, ``batch_id``), ``state``, ``replica_state`` (active, in-sync, catching-up, incomplete,
        unavailable) and ``lag_batches`` / ``lag_seconds`` behind the newest acknowledged batch (None when
        unknown; see docs/operations.md). From the catalog; ``StoreNotFound`` for an unknown store."""
        return self._replicas_in(self._client.stores())

    def _replicas_in(self, catalog: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
        for store in catalog:
            if store["name"] == self.name:
                return {int(p["partition"]): list(p.get("replicas", ())) for p in store.get("positions", ())}
        raise StoreNotFound(f"no store named {self.name!r}", store=self.name)

    # -- window and session stores ----------------------------------------------------------------------

    def windows(self, key: Any, time_from: Any = None, time_to: Any = None, *, reverse: bool = False) -> list[Windowed]:
        """Windows of ``key`` whose start lies in [``time_from``, ``time_to``] (datetimes or ISO-8601; None
        for open), in time order or reversed (Kafka's ``fetch``/``backwardFetch``)."""
        query = WindowQuery(self.name, _one_key(self.name, key, "windows"), None, None, time_from, time_to, reverse)
        return self._client.call("entries", query)

    def windows_range(
        self,
        key_from: Any = None,
        key_to: Any = None,
        time_from: Any = None,
        time_to: Any = None,
        *,
        reverse: bool = False,
    ) -> list[Windowed]:
        """Windows of the keys in [``key_from``, ``key_to``] (None for open; both None: every key) whose
        start lies in [``time_from``, ``time_to``] (Kafka's ``fetch(keyFrom, keyTo, ...)``/``fetchAll``)."""
        query = WindowQuery(self.name, None, key_from, key_to, time_from, time_to, reverse)
        return self._client.call("entries", query)

    def windows_page(
        self,
        limit: int,
        cursor: str | None = None,
        *,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        time_from: Any = None,
        time_to: Any = None,
        reverse: bool | None = None,
    ) -> Page:
        """At most ``limit`` windows of ``key`` (or of the keys in [``key_from``, ``key_to``]) whose start lies
        in [``time_from``, ``time_to``], and the cursor of the next page, as ``page`` for key-value stores."""
        query = WindowQuery(self.name, key, key_from, key_to, time_from, time_to, reverse)
        return self._client.call("page", query, PageRequest(limit, cursor))

    def iterate_windows(
        self,
        *,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        time_from: Any = None,
        time_to: Any = None,
        reverse: bool = False,
    ) -> Iterator[Windowed]:
        """Every window ``windows_page`` would page through, streamed from the owners a page at a time."""
        return self._entries(WindowQuery(self.name, key, key_from, key_to, time_from, time_to, reverse))

    def sessions_page(
        self,
        limit: int,
        cursor: str | None = None,
        *,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        earliest_end: Any = None,
        latest_start: Any = None,
        reverse: bool | None = None,
    ) -> Page:
        """At most ``limit`` sessions of ``key`` (or of a key range; with ``earliest_end``/``latest_start``,
        those ending at or after and starting at or before them), and the cursor of the next page."""
        query = SessionQuery(self.name, key, key_from, key_to, earliest_end, latest_start, reverse)
        return self._client.call("page", query, PageRequest(limit, cursor))

    def iterate_sessions(
        self,
        *,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        earliest_end: Any = None,
        latest_start: Any = None,
        reverse: bool = False,
    ) -> Iterator[Windowed]:
        """Every session ``sessions_page`` would page through, streamed from the owners a page at a time."""
        return self._entries(SessionQuery(self.name, key, key_from, key_to, earliest_end, latest_start, reverse))

    async def windows_page_async(self, limit: int, cursor: str | None = None, **query: Any) -> Page:
        """``windows_page`` for async callers (the same keyword arguments)."""
        return await self._client.call_async("page", WindowQuery(self.name, **query), PageRequest(limit, cursor))

    async def sessions_page_async(self, limit: int, cursor: str | None = None, **query: Any) -> Page:
        """``sessions_page`` for async callers (the same keyword arguments)."""
        return await self._client.call_async("page", SessionQuery(self.name, **query), PageRequest(limit, cursor))

    def iterate_windows_async(self, **query: Any) -> AsyncIterator[Windowed]:
        """``iterate_windows`` for async callers (the same keyword arguments)."""
        return self._entries_async(WindowQuery(self.name, **query))

    def iterate_sessions_async(self, **query: Any) -> AsyncIterator[Windowed]:
        """``iterate_sessions`` for async callers (the same keyword arguments)."""
        return self._entries_async(SessionQuery(self.name, **query))

    async def _entries_async(self, query: ScanQuery, page_size: int | None = None) -> AsyncIterator[Any]:
        """``_entries`` for async callers."""
        chunks = self._client.keys.chunks_async(lambda core: core.entry_chunks(query, page_size))
        try:
            async for chunk in chunks:
                for entry in chunk:
                    yield entry
        finally:
            await chunks.aclose()

    def sessions(self, key: Any, *, reverse: bool = False) -> list[Windowed]:
        """Every session of ``key`` (``reverse``: newest first, Kafka's ``backwardFetch``)."""
        query = SessionQuery(self.name, _one_key(self.name, key, "sessions"), reverse=reverse)
        return self._client.call("entries", query)

    def sessions_range(self, key_from: Any = None, key_to: Any = None, *, reverse: bool = False) -> list[Windowed]:
        """Every session of the keys in [``key_from``, ``key_to``] (``reverse``: keys descending)."""
        query = SessionQuery(self.name, key_from=key_from, key_to=key_to, reverse=reverse)
        return self._client.call("entries", query)

    def find_sessions(self, key: Any, earliest_end: Any, latest_start: Any, *, reverse: bool = False) -> list[Windowed]:
        """Sessions of ``key`` ending at or after ``earliest_end`` and starting at or before ``latest_start``
        (``reverse``: Kafka's ``backwardFindSessions``)."""
        key = _one_key(self.name, key, "find_sessions")
        query = SessionQuery(self.name, key, earliest_end=earliest_end, latest_start=latest_start, reverse=reverse)
        return self._client.call("entries", query)

    # -- async forms ---------------------------------------------------------------------------------------

    async def get_async(self, key: Any) -> Any:
        return await self._client.get_async(KeyQuery(self.name, key))

    async def lookup_async(self, key: Any) -> Lookup:
        value, position = await self._client.keys.lookup_async(KeyQuery(self.name, key), self._client.timeout)
        return Lookup(value, position)

    async def all_async(self, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        return await self._client.call_async("entries", RangeQuery(self.name, reverse=reverse))

    async def range_async(self, lo: Any = None, hi: Any = None, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        return await self._client.call_async("entries", RangeQuery(self.name, lo, hi, reverse=reverse))

    async def prefix_async(self, prefix: str, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        return await self._client.call_async("entries", RangeQuery(self.name, prefix=prefix, reverse=reverse))

    async def page_async(
        self,
        limit: int,
        cursor: str | None = None,
        *,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool | None = None,
    ) -> Page:
        query = RangeQuery(self.name, lo, hi, prefix, reverse)
        return await self._client.call_async("page", query, PageRequest(limit, cursor))

    def iterate_async(
        self,
        *,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool = False,
        page_size: int | None = None,
    ) -> AsyncIterator[tuple[Any, Any]]:
        """``iterate`` for async code: the same pages from the owners, merged in this process."""
        return self._entries_async(RangeQuery(self.name, lo, hi, prefix, reverse), page_size)

    async def approximate_num_entries_async(self) -> int:
        return await self._client.call_async("count", self.name)

    async def owner_async(self, key: Any) -> dict[str, Any]:
        return await self._client.call_async("metadata_for_key", KeyQuery(self.name, key))

    async def instances_async(self) -> list[dict[str, Any]]:
        return await self._client.call_async("metadata_for_store", self.name)

    async def replicas_async(self) -> dict[int, list[dict[str, Any]]]:
        return self._replicas_in(await self._client.stores_async())

    async def windows_async(
        self, key: Any, time_from: Any = None, time_to: Any = None, *, reverse: bool = False
    ) -> list[Windowed]:
        query = WindowQuery(self.name, _one_key(self.name, key, "windows"), None, None, time_from, time_to, reverse)
        return await self._client.call_async("entries", query)

    async def windows_range_async(
        self,
        key_from: Any = None,
        key_to: Any = None,
        time_from: Any = None,
        time_to: Any = None,
        *,
        reverse: bool = False,
    ) -> list[Windowed]:
        query = WindowQuery(self.name, None, key_from, key_to, time_from, time_to, reverse)
        return await self._client.call_async("entries", query)

    async def sessions_async(self, key: Any, *, reverse: bool = False) -> list[Windowed]:
        query = SessionQuery(self.name, _one_key(self.name, key, "sessions"), reverse=reverse)
        return await self._client.call_async("entries", query)

    async def sessions_range_async(
        self, key_from: Any = None, key_to: Any = None, *, reverse: bool = False
    ) -> list[Windowed]:
        query = SessionQuery(self.name, key_from=key_from, key_to=key_to, reverse=reverse)
        return await self._client.call_async("entries", query)

    async def find_sessions_async(
        self, key: Any, earliest_end: Any, latest_start: Any, *, reverse: bool = False
    ) -> list[Windowed]:
        key = _one_key(self.name, key, "find_sessions")
        query = SessionQuery(self.name, key, earliest_end=earliest_end, latest_start=latest_start, reverse=reverse)
        return await self._client.call_async("entries", query)


_facades: dict[str, tuple[str, InProcessFacade]] = {}
_facades_lock = threading.Lock()


def in_process_facade(namespace: str) -> InProcessFacade:
    """The facade core serving key lookups of ``namespace`` in this process: one per namespace, shared by
    every ``Client`` of it (one view, one registry long poll, one set of marks); a new one after the
    process joined another Ray cluster or job (``ray.shutdown``, ``ray.init``)."""
    import ray

    from runtime.facade.inprocess import InProcessFacade
    from verticles.bus import RayBus

    job = ray.get_runtime_context().get_job_id()
    with _facades_lock:
        known = _facades.get(namespace)
        if known is not None and known[0] == job:
            return known[1]
        if known is not None:
            known[1].close()
        bus = RayBus(namespace, DEFAULT_REQUEST_TIMEOUT)
        facade = InProcessFacade(bus, bus.owner, timeout=DEFAULT_REQUEST_TIMEOUT, name=f"riqr-client-{namespace}")
        _facades[namespace] = (job, facade)
        return facade


# The ``actor`` riqr's Ray-error translation names for a call to the facade verticle itself.
_FACADE = "riqr-facade"


def _one_key(store: str, key: Any, method: str) -> Any:
    """``key`` for a query of one key's windows or sessions: None read as no key and answered every key's
    (Kafka's ``fetch(null)`` is an error too); the ``_range`` forms read every key."""
    if key is None:
        every = {"find_sessions": "iterate_sessions(earliest_end=, latest_start=)"}.get(method, f"{method}_range()")
        raise InvalidParameter(f"{method}() needs a key (None given); {every} reads every key's", store=store)
    return key


def _cancel(sent: list[Any]) -> None:
    """Stop the facade verticle's work on the last call of ``sent``, which its caller no longer waits for:
    without it, a caller with a short timeout that asks again piles scans up in the facade, each running to
    the facade's own deadline. The facade is an async actor, so Ray cancels the call's asyncio task (its
    awaits of the owners end; the owners' reads are not stopped: ``recursive=False``, nothing of theirs
    needs undoing). An answer already sent, or a facade gone, is nothing to cancel."""
    if not sent:
        return
    import ray

    try:
        ray.cancel(sent[-1], recursive=False)
    except Exception as err:  # noqa: BLE001 - best effort: the call ends at the facade's deadline anyway
        log.debug("could not cancel a facade call: %s", err)


def _facade_names(namespace: str) -> list[str]:
    import ray

    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"].startswith("riqr-facade-")
    ]
    return sorted(names)


def _other_facade(namespace: str, current: Any) -> Any | None:
    """A facade verticle of ``namespace`` other than ``current`` that answers (one is placed per node)."""
    import ray

    for name in _facade_names(namespace):
        try:
            handle = ray.get_actor(name, namespace=namespace)
            if handle == current:
                continue
            ray.get(handle.__ray_ready__.remote(), timeout=2.0)
            return handle
        except Exception:  # noqa: BLE001 - gone, or on a dead node: try the next one
            continue
    return None


def close_in_process_facades() -> None:
    """Stop every in-process facade of this process (their loop threads and registry long polls); call
    before ``ray.shutdown`` in a process that goes on without Ray. The next lookup starts a new one."""
    with _facades_lock:
        facades = [facade for _, facade in _facades.values()]
        _facades.clear()
    for facade in facades:
        facade.close()


def join_ray(address: str | None, namespace: str, *, probe_timeout: float = 5.0, quiet: bool = False) -> None:
    """``ray.init`` into the running cluster at ``address`` (None: ``$RAY_ADDRESS``, else the cluster this
    machine last started). Its address is tried first with a plain TCP connection: where nothing listens,
    Ray itself retries for minutes and does not stop for SIGTERM meanwhile; ``ConnectionError`` at once
    instead, naming the address. The whole try (the name's lookup included, which the socket's timeout
    does not bound) gets ``probe_timeout`` seconds. ``quiet`` keeps Ray's info lines ("Connecting to
    existing Ray cluster at ...") off stderr (the CLI's commands print their own), its warnings not."""
    import logging

    import ray

    target = address or "auto"
    answered = False  # a TCP connection opened at the address: something listens there
    if not target.startswith("ray://"):
        outcome: list[ConnectionError | bool] = []
        probe = threading.Thread(
            target=lambda: outcome.append(_probe_bootstrap(target, probe_timeout)),
            name="riqr-probe-ray",
            daemon=True,  # a lookup that never returns must not keep the process alive
        )
        probe.start()
        probe.join(probe_timeout)
        if not outcome:
            raise ConnectionError(
                f"no Ray cluster answered at {target} within {probe_timeout:g} s (the name's lookup or the "
                "connection hung); is the address right, and is it running (ray status)?"
            )
        if isinstance(outcome[0], ConnectionError):
            raise outcome[0]
        answered = outcome[0]
    try:
        options: dict[str, Any] = {"logging_level": logging.WARNING} if quiet else {}
        ray.init(address=target, namespace=namespace, log_to_driver=False, **options)
    except ConnectionError as err:
        if not answered:  # not probed (ray://, an address not read here): nothing says what answers there
            raise
        # Something listens there (the probe connected), yet Ray's client could not join: on a cluster with
        # Ray's token auth, most often a token that is not the cluster's, which Ray only logs.
        where = _canonical(target) or target
        raise JoinRefused(
            f"{err}: something answers at {where}, but Ray's client could not join it. If the cluster runs "
            "with Ray's token auth (a `ray start` with RAY_AUTH_MODE=token, or with a token under ~/.ray), this "
            "process needs RAY_AUTH_MODE=token too, and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, "
            "or the one `ray get-auth-token` shows here; compare with the head's): Ray's own lines above say "
            "'InvalidAuthToken' when it is missing or wrong"
        ) from err


class JoinRefused(ConnectionError):
    """A Ray cluster answers at the address, but Ray's client could not join it (``join_ray``)."""


def _canonical(address: str) -> str | None:
    """``address`` as Ray resolves it (``host:port``, a local host as this node's address), None if it
    cannot say."""
    try:  # Ray's own resolution of "auto" and $RAY_ADDRESS (internal, stable across Ray 2.x)
        from ray._private.services import canonicalize_bootstrap_address

        resolved = canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - nothing to compare: the caller goes on
        return None
    return str(resolved) if resolved else None


def _named(target: str, resolved: str) -> str:
    """Where ``target`` came from, for an operator: the address given, ``$RAY_ADDRESS``'s, or the local
    cluster's, with what Ray made of it when that differs (a local host is written as the node's IP)."""
    if target == "auto":
        given = os.environ.get("RAY_ADDRESS")
        origin = f"$RAY_ADDRESS={given}" if given else "this machine's Ray cluster"
        return f"{origin} ({resolved})" if given != resolved else origin
    return resolved if resolved == target else f"{target} ({resolved})"


def _probe_bootstrap(target: str, timeout: float) -> ConnectionError | bool:
    """The error that says nothing listens at ``target`` (Ray's "auto", ``host:port``); else True when a TCP
    connection opens there, False when the address cannot be read here (``ray.init`` then says what is
    wrong)."""
    import socket

    resolved = _canonical(target)
    if resolved is None:  # nothing to try first: ray.init says what is wrong
        return False
    host, _, port = resolved.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as err:
        where = _named(target, resolved)
        return ConnectionError(f"no Ray cluster answers at {where} ({err}); is it running (ray status)?")
    return True


def connect(namespace: str = DEFAULT_NAMESPACE, address: str | None = None, timeout: float = 30.0) -> Client:
    """Connect to riqr in ``namespace``, joining the Ray cluster at ``address`` if not connected yet
    (``join_ray``: ``ConnectionError`` at once if nothing answers there); ``ConnectionError`` too when this
    process is in a Ray cluster already and ``address`` names another."""
    import ray

    if not ray.is_initialized():
        join_ray(address, namespace)
    elif address not in (None, "auto") and not address.startswith("ray://"):
        # A process is in one Ray cluster: another address asked for is an error, not silently this one.
        asked, joined = _canonical(address), _canonical(ray.get_runtime_context().gcs_address)
        if asked is not None and joined is not None and asked != joined:
            raise ConnectionError(
                f"this process is in the Ray cluster at {joined} already, not {address} ({asked}): a process "
                "joins one cluster (ray.shutdown() first to join another)"
            )
    node_id = ray.get_runtime_context().get_node_id()
    try:
        facade = ray.get_actor(facade_name(node_id), namespace=namespace)
    except ValueError:
        names = _facade_names(namespace)
        if not names:
            raise NotConnected(
                f"no riqr facade in Ray namespace {namespace!r}; run `riqr up --namespace {namespace}`",
                namespace=namespace,
            ) from None
        facade = ray.get_actor(names[0], namespace=namespace)
    return Client(facade, namespace, timeout)
