"""The Python driver API for code running inside the Ray cluster.

    import runtime
    client = runtime.connect()                      # namespace "riqr", the local Ray cluster
    orders = client.store("order-count")
    orders.get("1")                                 # 1
    orders.range("1", "5")                          # [("1", 1), ("2", 1)]
    await orders.get_async("1")                     # the same, from async code

Calls go to the facade verticle on the caller's node (any node's if that one is missing), which routes
and scatter-gathers over Ray. Errors are riqr's own (``runtime.errors``): ``KeyNotFound``,
``StoreNotFound``, ``MalformedKey``, ``PartitionUnavailable``, ``DeadlineExceeded``...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

from runtime.config import DEFAULT_NAMESPACE, facade_name
from runtime.errors import NotConnected, RiqrError
from runtime.windows import Windowed

__all__ = ["connect", "Client", "Store", "Page"]


class Page(NamedTuple):
    """A page of a scan: its entries and the cursor of the next page (None after the last)."""

    entries: list[tuple[Any, Any]]
    next: str | None


def _unwrap(envelope: tuple[str, Any]) -> Any:
    status, payload = envelope
    if status == "ok":
        return payload
    if isinstance(payload, RiqrError):
        raise payload
    raise RuntimeError(f"unexpected answer from the facade: {envelope!r}")


def _window_params(key: Any, key_from: Any, key_to: Any, time_from: Any, time_to: Any, reverse: bool) -> dict[str, Any]:
    return {
        "key": key,
        "key_from": key_from,
        "key_to": key_to,
        "time_from": time_from,
        "time_to": time_to,
        "reverse": reverse,
    }


class Store:
    """Queries on one store, in sync (``get``) and async (``get_async``) forms."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return _unwrap(ray.get(getattr(self._client.facade, method).remote(*args), timeout=self._client.timeout))

    async def _acall(self, method: str, *args: Any) -> Any:
        return _unwrap(await getattr(self._client.facade, method).remote(*args))

    def get(self, key: Any) -> Any:
        """The value of ``key``; raises ``KeyNotFound`` when absent."""
        return self._call("get", self.name, key)

    def all(self, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` in key order (or reversed). For big stores prefer ``iterate``."""
        return self._call("all", self.name, reverse)

    def range(self, lo: Any = None, hi: Any = None, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Entries with ``lo <= key <= hi`` in key order (or reversed); a ``None`` bound is open."""
        return self._call("range", self.name, lo, hi, reverse)

    def prefix(self, prefix: str, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        """Entries whose (string) key starts with ``prefix``."""
        return self._call("prefix", self.name, prefix, reverse)

    def page(
        self,
        limit: int,
        cursor: str | None = None,
        *,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool = False,
    ) -> Page:
        """At most ``limit`` entries and the cursor of the next page (``None`` after the last page).

        Pass the cursor back to continue the same scan (its bounds and direction travel in the cursor).
        Paging through a store that is being updated never repeats a key and never skips one that was
        present throughout.
        """
        entries, next_cursor = self._call("page", self.name, limit, cursor, lo, hi, prefix, reverse)
        return Page(entries, next_cursor)

    def iterate(
        self, *, lo: Any = None, hi: Any = None, prefix: str | None = None, reverse: bool = False, page_size: int = 1000
    ) -> Iterator[tuple[Any, Any]]:
        """Every entry of a range or prefix scan, fetched a page at a time (memory stays at one page)."""
        page = self.page(page_size, lo=lo, hi=hi, prefix=prefix, reverse=reverse)
        while True:
            yield from page.entries
            if page.next is None:
                return
            page = self.page(page_size, page.next)

    def approximate_num_entries(self) -> int:
        return self._call("approximate_num_entries", self.name)

    def owner(self, key: Any) -> dict[str, Any]:
        """The metadata instance that owns ``key`` (present or not)."""
        return self._call("metadata_for_key", self.name, key)

    # -- window and session stores ----------------------------------------------------------------------

    def windows(self, key: Any, time_from: Any = None, time_to: Any = None, *, reverse: bool = False) -> list[Windowed]:
        """Windows of ``key`` whose start lies in [``time_from``, ``time_to``] (datetimes or ISO-8601; None
        for open), in time order or reversed (Kafka's ``fetch``/``backwardFetch``)."""
        return self._call(
            "windowed", self.name, "windows", _window_params(key, None, None, time_from, time_to, reverse)
        )

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
        params = _window_params(None, key_from, key_to, time_from, time_to, reverse)
        return self._call("windowed", self.name, "windows", params)

    def sessions(self, key: Any) -> list[Windowed]:
        """Every session of ``key``."""
        return self._call("windowed", self.name, "sessions", {"key": key})

    def sessions_range(self, key_from: Any = None, key_to: Any = None) -> list[Windowed]:
        """Every session of the keys in [``key_from``, ``key_to``]."""
        return self._call("windowed", self.name, "sessions", {"key_from": key_from, "key_to": key_to})

    def find_sessions(self, key: Any, earliest_end: Any, latest_start: Any) -> list[Windowed]:
        """Sessions of ``key`` ending at or after ``earliest_end`` and starting at or before ``latest_start``."""
        params = {"key": key, "earliest_end": earliest_end, "latest_start": latest_start}
        return self._call("windowed", self.name, "sessions", params)

    async def windows_async(
        self, key: Any, time_from: Any = None, time_to: Any = None, *, reverse: bool = False
    ) -> list[Windowed]:
        params = _window_params(key, None, None, time_from, time_to, reverse)
        return await self._acall("windowed", self.name, "windows", params)

    async def windows_range_async(
        self,
        key_from: Any = None,
        key_to: Any = None,
        time_from: Any = None,
        time_to: Any = None,
        *,
        reverse: bool = False,
    ) -> list[Windowed]:
        params = _window_params(None, key_from, key_to, time_from, time_to, reverse)
        return await self._acall("windowed", self.name, "windows", params)

    async def sessions_async(self, key: Any) -> list[Windowed]:
        return await self._acall("windowed", self.name, "sessions", {"key": key})

    async def sessions_range_async(self, key_from: Any = None, key_to: Any = None) -> list[Windowed]:
        return await self._acall("windowed", self.name, "sessions", {"key_from": key_from, "key_to": key_to})

    async def find_sessions_async(self, key: Any, earliest_end: Any, latest_start: Any) -> list[Windowed]:
        params = {"key": key, "earliest_end": earliest_end, "latest_start": latest_start}
        return await self._acall("windowed", self.name, "sessions", params)

    # -- async forms of the key-value queries --------------------------------------------------------------

    async def get_async(self, key: Any) -> Any:
        return await self._acall("get", self.name, key)

    async def all_async(self, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        return await self._acall("all", self.name, reverse)

    async def range_async(self, lo: Any = None, hi: Any = None, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        return await self._acall("range", self.name, lo, hi, reverse)

    async def prefix_async(self, prefix: str, *, reverse: bool = False) -> list[tuple[Any, Any]]:
        return await self._acall("prefix", self.name, prefix, reverse)

    async def page_async(
        self,
        limit: int,
        cursor: str | None = None,
        *,
        lo: Any = None,
        hi: Any = None,
        prefix: str | None = None,
        reverse: bool = False,
    ) -> Page:
        entries, next_cursor = await self._acall("page", self.name, limit, cursor, lo, hi, prefix, reverse)
        return Page(entries, next_cursor)

    async def iterate_async(
        self, *, lo: Any = None, hi: Any = None, prefix: str | None = None, reverse: bool = False, page_size: int = 1000
    ) -> AsyncIterator[tuple[Any, Any]]:
        page = await self.page_async(page_size, lo=lo, hi=hi, prefix=prefix, reverse=reverse)
        while True:
            for entry in page.entries:
                yield entry
            if page.next is None:
                return
            page = await self.page_async(page_size, page.next)

    async def approximate_num_entries_async(self) -> int:
        return await self._acall("approximate_num_entries", self.name)


class Client:
    """A connection to the riqr runtime of one Ray namespace."""

    def __init__(self, facade: Any, namespace: str, timeout: float) -> None:
        self.facade = facade
        self.namespace = namespace
        self.timeout = timeout

    def store(self, name: str) -> Store:
        return Store(self, name)

    def stores(self) -> list[dict[str, Any]]:
        """The catalog: each store's name, kind, key and value schema, partitions."""
        import ray

        return _unwrap(ray.get(self.facade.catalog.remote(), timeout=self.timeout))

    def metadata(self) -> list[dict[str, Any]]:
        import ray

        return _unwrap(ray.get(self.facade.metadata.remote(), timeout=self.timeout))


def connect(namespace: str = DEFAULT_NAMESPACE, address: str | None = None, timeout: float = 30.0) -> Client:
    """Connect to riqr in ``namespace``, joining the Ray cluster at ``address`` if not connected yet."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
    node_id = ray.get_runtime_context().get_node_id()
    try:
        facade = ray.get_actor(facade_name(node_id), namespace=namespace)
    except ValueError:
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace and a["name"].startswith("riqr-facade-")
        ]
        if not names:
            raise NotConnected(
                f"no riqr facade in Ray namespace {namespace!r}; run `riqr up --namespace {namespace}`",
                namespace=namespace,
            ) from None
        facade = ray.get_actor(sorted(names)[0], namespace=namespace)
    return Client(facade, namespace, timeout)
