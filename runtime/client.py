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

from typing import Any

from runtime.config import DEFAULT_NAMESPACE, facade_name
from runtime.errors import NotConnected, RiqrError

__all__ = ["connect", "Client", "Store"]


def _unwrap(envelope: tuple[str, Any]) -> Any:
    status, payload = envelope
    if status == "ok":
        return payload
    if isinstance(payload, RiqrError):
        raise payload
    raise RuntimeError(f"unexpected answer from the facade: {envelope!r}")


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

    def all(self) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` in key order."""
        return self._call("all", self.name)

    def range(self, lo: Any = None, hi: Any = None) -> list[tuple[Any, Any]]:
        """Entries with ``lo <= key <= hi`` in key order; a ``None`` bound is open."""
        return self._call("range", self.name, lo, hi)

    def approximate_num_entries(self) -> int:
        return self._call("approximate_num_entries", self.name)

    def owner(self, key: Any) -> dict[str, Any]:
        """The metadata instance that owns ``key`` (present or not)."""
        return self._call("metadata_for_key", self.name, key)

    async def get_async(self, key: Any) -> Any:
        return await self._acall("get", self.name, key)

    async def all_async(self) -> list[tuple[Any, Any]]:
        return await self._acall("all", self.name)

    async def range_async(self, lo: Any = None, hi: Any = None) -> list[tuple[Any, Any]]:
        return await self._acall("range", self.name, lo, hi)

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
