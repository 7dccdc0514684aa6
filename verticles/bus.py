"""The Ray adapter of the facade's ``Bus`` protocol: Ray calls are the bus.

Every call goes through ``runtime.raycalls``, the one place Ray's failures become riqr's errors; a query
actor that is restarting is called again within the call's deadline before it is a 503 (the facade gives
a call that long only when the owner is not silent: ``runtime.facade.silence``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from runtime import raycalls
from runtime.config import DEFAULT_REQUEST_TIMEOUT, PROBE_GROUP, REGISTRY_NAME, SUSPECT_CHECK_GAP
from runtime.deadline import Deadline
from runtime.errors import NotConnected, OwnerUnavailable
from runtime.monotonic import Spans
from runtime.ownership import ClusterView
from runtime.pages import PackedPage
from runtime.scan import Scan

__all__ = ["RayBus", "RayOwner"]

log = logging.getLogger(__name__)


def _connected() -> None:
    """``NotConnected`` once this process left Ray (``ray.shutdown``): a background task of the bus (the
    view's long poll, a retry) must not join a cluster again through Ray's automatic ``ray.init``."""
    if not ray.is_initialized():
        raise NotConnected("this process is not connected to Ray (ray.shutdown was called)")


class RayOwner:
    """A query actor reached by its uuid name."""

    def __init__(
        self, uuid: str, namespace: str, timeout: float, on_trouble: Callable[[str], None] | None = None
    ) -> None:
        self.uuid = uuid
        self._namespace = namespace
        self._timeout = timeout
        self._handle: Any = None
        # Told (at most once per SUSPECT_CHECK_GAP) when the actor is found restarting or dead, so the
        # registry can promote a standby without waiting for the request to give up on this actor.
        self._on_trouble = on_trouble
        self._troubled_at = -SUSPECT_CHECK_GAP

    def _trouble(self) -> None:
        now = time.monotonic()
        if self._on_trouble is not None and now - self._troubled_at >= SUSPECT_CHECK_GAP:
            self._troubled_at = now
            self._on_trouble(self.uuid)

    def _actor(self) -> Any:
        _connected()
        if self._handle is None:
            try:
                self._handle = ray.get_actor(self.uuid, namespace=self._namespace)
            except ValueError:
                raise OwnerUnavailable(
                    f"query actor {self.uuid} is not running", actor=self.uuid, retry_after=5
                ) from None
        return self._handle

    async def _call(self, method: str, *args: Any, group: str | None = None) -> Any:
        call = getattr(self._actor(), method)
        remote = (call if group is None else call.options(concurrency_group=group)).remote
        deadline = Deadline.after(self._timeout)
        try:
            return await raycalls.call(
                lambda: remote(*args),
                f"{_ASKED.get(method, method)} on query actor {self.uuid}",
                deadline=deadline,
                actor=self.uuid,
                on_restarting=self._trouble,
            )
        except OwnerUnavailable:
            self._trouble()
            # Look the actor up again next time: the registry may have re-created it under the same name
            # on another node (its node died), and this handle reaches the old one only.
            self._handle = None
            raise

    def get_many_blocking(self, items: list[tuple[int, Any]], timeout: float) -> tuple[Sequence[bytes | None], Spans]:
        """``get_many`` from a plain thread (the Python client's fast path): one call, no retry, at most
        ``timeout`` seconds; the caller's async facade takes over when it fails."""
        what = f"{_ASKED['get_many']} on query actor {self.uuid}"
        try:
            answer: tuple[Sequence[bytes | None], Spans] = raycalls.get(
                self._actor().get_many.remote(items), what, timeout=timeout, actor=self.uuid
            )
            return answer
        except OwnerUnavailable:
            self._trouble()
            self._handle = None
            raise

    async def get_many(self, items: list[tuple[int, Any]]) -> tuple[Sequence[bytes | None], Spans]:
        answer: tuple[Sequence[bytes | None], Spans] = await self._call("get_many", items)
        return answer

    async def scan(
        self, partitions: Sequence[int], scan: Scan, limit: int | None
    ) -> tuple[Sequence[tuple[Any, bytes]], Spans]:
        answer: tuple[Sequence[tuple[Any, bytes]], Spans] = await self._call("scan", list(partitions), scan, limit)
        return answer

    async def scan_packed(
        self, partitions: Sequence[int], scan: Scan, limit: int | None, max_bytes: int, fmt: str
    ) -> tuple[PackedPage, Spans]:
        answer: tuple[PackedPage, Spans] = await self._call(
            "scan_packed", list(partitions), scan, limit, max_bytes, fmt
        )
        return answer

    async def count(self, partitions: Sequence[int]) -> tuple[int, Spans]:
        answer: tuple[int, Spans] = await self._call("count", list(partitions))
        return answer

    async def positions(self) -> dict[int, dict[str, Any]]:
        answer: dict[int, dict[str, Any]] = await self._call("positions")
        return answer

    async def stats(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("stats")
        return answer

    async def ping(self) -> bool:
        answer: bool = await self._call("ping", group=PROBE_GROUP)
        return answer


# What each call asks of a query actor, as its errors say it (a 503's message reaches REST clients).
_ASKED = {
    "get_many": "a key lookup",
    "scan": "a scan",
    "scan_packed": "a scan",
    "count": "a count",
    "positions": "its positions",
    "stats": "its stats",
    "ping": "a ping",
}


class RayBus:
    """Reaches the registry and query actors of one namespace over Ray."""

    def __init__(self, namespace: str, timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self._registry: Any = None
        self._owners: dict[str, RayOwner] = {}

    def _registry_actor(self) -> Any:
        _connected()
        if self._registry is None:
            try:
                self._registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)
            except ValueError:
                raise NotConnected(
                    f"no riqr registry in Ray namespace {self.namespace!r}; run `riqr up` first",
                    namespace=self.namespace,
                ) from None
        return self._registry

    async def _registry_call(self, method: str) -> Any:
        remote = getattr(self._registry_actor(), method).remote
        try:
            # Bounded: a registry busy with one long call (it answers one at a time) held a view refresh, and
            # every lookup of a store not yet in the caller's view, for as long.
            return await raycalls.call_within(remote, f"registry {method}", deadline=Deadline.after(self.timeout))
        except OwnerUnavailable:
            self._registry = None  # look it up again: `riqr up` may have created it anew (a long-lived client)
            raise

    async def fetch_view(self) -> ClusterView:
        answer: ClusterView = await self._registry_call("view")
        # The handles of actors the view no longer has (moved, replaced, their store dropped): a client that
        # lives for months through moves kept one for every actor it ever called.
        # ``set(dict)`` in one C call: caller threads add owners (the driver's fast path) while this runs.
        for uuid in set(self._owners).difference(answer.actors):
            self._owners.pop(uuid, None)
        return answer

    async def fetch_epoch(self) -> int:
        answer: int = await self._registry_call("epoch")
        return answer

    async def fetch_status(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._registry_call("status")
        return answer

    async def wait_epoch(self, known: int, timeout: float) -> int:
        # In the registry's "watch" group (verticles.deploy), so waiting never holds up its other calls.
        method = self._registry_actor().wait_epoch.options(concurrency_group="watch")
        deadline = Deadline.after(timeout + self.timeout)
        try:
            return await raycalls.call_within(
                lambda: method.remote(known, timeout), "registry wait_epoch", deadline=deadline
            )
        except OwnerUnavailable:
            self._registry = None
            raise

    def suspect(self, uuid: str) -> None:
        try:
            self._registry_actor().suspect.remote(uuid)
        except Exception:  # best effort: the registry's own check finds the actor within a second
            log.debug("could not tell the registry about %s", uuid, exc_info=True)

    def owner(self, uuid: str) -> RayOwner:
        owner = self._owners.get(uuid)
        if owner is None:
            owner = self._owners[uuid] = RayOwner(uuid, self.namespace, self.timeout, on_trouble=self.suspect)
        return owner
