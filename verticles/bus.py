"""The Ray adapter of the facade's ``Bus`` protocol: Ray calls are the bus.

Ray's own failures are told apart here and become riqr errors: a dead actor and a restarting actor are
both ``OwnerUnavailable`` (503, with a longer Retry-After for the dead one, whose restart takes longer),
an error raised inside the actor is re-raised as itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from runtime.config import REGISTRY_NAME
from runtime.errors import NotConnected, OwnerUnavailable, RiqrError
from runtime.ownership import ClusterView
from runtime.scan import Scan

__all__ = ["RayBus", "RayOwner"]

T = TypeVar("T")


async def _call(uuid: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except RayTaskError as err:
        cause = err.cause if hasattr(err, "cause") else None
        if isinstance(cause, RiqrError):
            raise cause from None
        raise
    except ActorUnavailableError:
        raise OwnerUnavailable(f"query actor {uuid} is restarting", actor=uuid, retry_after=1) from None
    except (ActorDiedError, RayActorError):
        raise OwnerUnavailable(f"query actor {uuid} died", actor=uuid, retry_after=5) from None


class RayOwner:
    """A query actor reached by its uuid name."""

    def __init__(self, uuid: str, namespace: str) -> None:
        self.uuid = uuid
        self._namespace = namespace
        self._handle: Any = None

    def _actor(self) -> Any:
        if self._handle is None:
            try:
                self._handle = ray.get_actor(self.uuid, namespace=self._namespace)
            except ValueError:
                raise OwnerUnavailable(
                    f"query actor {self.uuid} is not running", actor=self.uuid, retry_after=5
                ) from None
        return self._handle

    async def get_many(self, items: list[tuple[int, Any]]) -> Sequence[bytes | None | RiqrError]:
        return await _call(self.uuid, self._actor().get_many.remote(items))

    async def scan(self, partitions: Sequence[int], scan: Scan, limit: int | None) -> Sequence[tuple[Any, bytes]]:
        return await _call(self.uuid, self._actor().scan.remote(list(partitions), scan, limit))

    async def count(self, partitions: Sequence[int]) -> int:
        return await _call(self.uuid, self._actor().count.remote(list(partitions)))


class RayBus:
    """Reaches the registry and query actors of one namespace over Ray."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._registry: Any = None
        self._owners: dict[str, RayOwner] = {}

    def _registry_actor(self) -> Any:
        if self._registry is None:
            try:
                self._registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)
            except ValueError:
                raise NotConnected(
                    f"no riqr registry in Ray namespace {self.namespace!r}; run `riqr up` first",
                    namespace=self.namespace,
                ) from None
        return self._registry

    async def fetch_view(self) -> ClusterView:
        return await _call(REGISTRY_NAME, self._registry_actor().view.remote())

    async def fetch_epoch(self) -> int:
        return await _call(REGISTRY_NAME, self._registry_actor().epoch.remote())

    def owner(self, uuid: str) -> RayOwner:
        owner = self._owners.get(uuid)
        if owner is None:
            owner = self._owners[uuid] = RayOwner(uuid, self.namespace)
        return owner
