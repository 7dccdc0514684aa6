"""Key routing: resolve a key's owner from the cached view, coalesce lookups per owner, enforce the
request deadline, and never serve a copy older than what this facade already served (``runtime.monotonic``).

Concurrent lookups bound for one owner share one ``get_many`` call (``runtime.coalesce``), with one call in
flight per owner: a query actor runs its calls one at a time anyway, so more calls in flight would only
queue there while making batches smaller (measured in docs/design.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

from runtime.bus import Bus, OwnerClient
from runtime.catalog import StoreSpec
from runtime.coalesce import Coalescer
from runtime.codec import to_jsonable
from runtime.deadline import Deadline
from runtime.errors import (
    CopyBehind,
    DeadlineExceeded,
    KeyNotFound,
    OwnerUnavailable,
    PartitionUnavailable,
    RiqrError,
)
from runtime.facade import silence as quiet
from runtime.facade.silence import NoPing, Silence, ping_verdict, silent_owner
from runtime.facade.view import ViewCache
from runtime.metrics import Metrics
from runtime.monotonic import Marks, Span, position_header, span_text
from runtime.ownership import ClusterView, OwnershipTable, Route

__all__ = [
    "KeyRouter",
    "Found",
    "LocalCopies",
    "route_or_unavailable",
    "FAILOVER_AFTER",
    "CATCH_UP_PAUSE",
]

# How long a request waits for the active owner before asking a standby (when the partition has one).
FAILOVER_AFTER = 1.0
# When every copy that answered is older than what this facade served, how long to wait before asking
# them again (a copy behind is one batch delivery behind: tens of milliseconds).
CATCH_UP_PAUSE = 0.02
log = logging.getLogger(__name__)

Answer = tuple[bytes | None, Span]
Batcher = Coalescer[tuple[int, Any], Answer]


class Found(NamedTuple):
    """A key's packed value, and what it reflects: its partition and that partition's span."""

    value: bytes
    partition: int
    span: Span


class LocalCopies(Protocol):
    """Copies held in the facade's own process (an HTTP verticle's read replicas, ``runtime.readreplica``)."""

    def get(self, store: str, partition: int, key: Any) -> Answer | None:
        """The packed value (None: absent) and its span, or None when no local copy can answer."""
        ...


def _per_item(owner: OwnerClient) -> Callable[[list[tuple[int, Any]]], Awaitable[Sequence[Answer]]]:
    """``owner.get_many`` as the coalescer wants it: one ``(value, span of its partition)`` per item."""

    async def send(items: list[tuple[int, Any]]) -> Sequence[Answer]:
        values, spans = await owner.get_many(items)
        return [(value, spans[p]) for (p, _), value in zip(items, values)]

    return send


def route_or_unavailable(table: OwnershipTable, key: Any) -> Route:
    """The owner of an internal key's partition, or ``PartitionUnavailable`` (503) if it has none."""
    verdict = table.resolve(key)
    if not isinstance(verdict, Route):
        raise PartitionUnavailable(
            f"partition {verdict.partition} of store {table.spec.name} has no owner right now",
            store=table.spec.name,
            partition=verdict.partition,
        )
    return verdict


class KeyRouter:
    """Answers key lookups: one coalesced batch per owner, under the request deadline."""

    def __init__(
        self,
        bus: Bus,
        views: ViewCache,
        *,
        timeout: float,
        metrics: Metrics | None = None,
        marks: Marks | None = None,
        local: LocalCopies | None = None,
    ) -> None:
        self._bus = bus
        self._views = views
        # Read replicas in this process: asked first, without a Ray hop, under the same marks.
        self.local = local
        self.timeout = timeout
        self.metrics = metrics if metrics is not None else Metrics()
        # What this facade has served per partition (shared with scans and counts: ``Facade`` passes one).
        self.marks = marks if marks is not None else Marks()
        self._batchers: dict[str, Batcher] = {}
        # Owners that gave no answer (``runtime.facade.silence``; shared with the facade's scans).
        self.silence = Silence(self._busy_for)
        views.listeners.append(self._forget_gone)

    def _forget_gone(self, view: ClusterView) -> None:
        for uuid in set(self._batchers) - set(view.actors):
            del self._batchers[uuid]
        self.silence.keep_only(view.actors)

    def _busy_for(self, uuid: str, now: float) -> float | None:
        batcher = self._batchers.get(uuid)
        return batcher.busy_for(now) if batcher is not None else None

    def silent_for(self, uuid: str) -> float | None:
        """For how long ``uuid`` has given no answer (``Silence.silent_for``); None: it is not silent."""
        return self.silence.silent_for(uuid)

    def _batcher(self, uuid: str, store: str) -> Batcher:
        batcher = self._batchers.get(uuid)
        if batcher is None:
            sizes = self.metrics.child("riqr_coalesced_batch_size", store)  # an actor holds one store
            owner = self._bus.owner(uuid)
            batcher = self._batchers[uuid] = Coalescer(
                _per_item(owner),
                max_in_flight=1,
                on_send=sizes.observe,
                # A call out SILENT_AFTER: its owner is pinged, and with no answer its waiters answer at once.
                probe=ping_verdict(owner.ping, "lookup", heard=functools.partial(self.silence.pinged, uuid)),
                probe_after=quiet.SILENT_AFTER,
            )
        return batcher

    async def get(self, spec: StoreSpec, table: OwnershipTable, key: Any) -> Found:
        """The packed value of the internal ``key`` and what it reflects; ``KeyNotFound`` (with its
        ``position``) when absent.

        The active owner is asked first; if it is dead, restarting, slower than ``FAILOVER_AFTER``, or its
        copy of the partition cannot answer, each standby is asked in turn, within the same deadline. An
        owner that did not answer is reported to the registry (``ViewCache.suspect``), which promotes a
        standby if the owner is down, so later lookups go to a live copy first. Until then, and for an owner
        whose call has been out ``SILENT_AFTER``, it is silent (``silent_for``): asked after the other
        copies, and as the last one given ``SILENT_BUDGET`` before the answer is 503 (``OwnerUnavailable``);
        a lookup already waiting on a call out ``SILENT_AFTER`` gets that 503 as soon as a ping of the owner
        goes unanswered (the coalescer's probe), not at its deadline.
        An answer from a copy older than what this facade already served from the partition is refused
        (``runtime.monotonic``) and the next copy asked; when every copy that answered was older, all are
        asked again after ``CATCH_UP_PAUSE`` until one catches up, and at the deadline the answer is
        ``CopyBehind`` (503), never the older value.
        """
        route = route_or_unavailable(table, key)
        if self.local is not None:
            found = self.local.get(spec.name, route.partition, key)
            # A local copy is fed with the standbys, so the marks treat it as one.
            if found is not None and self.marks.admit(spec.name, route.partition, found[1], active=False):
                self.metrics.record("riqr_local_reads_total", (spec.name,))
                return self._found(spec, key, route.partition, *found)
        deadline = Deadline.after(self.timeout)
        holders = self.silence.in_order((route.owner, *route.standbys))
        if holders[0] != route.owner:  # the active is silent: the registry is asked to look (rate-limited)
            self._views.suspect(route.owner)
        # A copy found behind stays the verdict at the deadline even if, in the last round, that copy did
        # not answer in time: the client learns that the copies it could reach were behind.
        behind: CopyBehind | None = None
        while True:
            failure: RiqrError | None = None
            for index, uuid in enumerate(holders):
                last = index == len(holders) - 1
                silent = self.silence.silent_for(uuid)
                wait = quiet.SILENT_BUDGET if silent is not None else (None if last else FAILOVER_AFTER)
                budget = deadline if wait is None else Deadline(min(deadline.at, time.monotonic() + wait), self.timeout)
                try:
                    answer, span = await self._ask(uuid, spec.name, route.partition, key, budget)
                except (NoPing, OwnerUnavailable, PartitionUnavailable, DeadlineExceeded) as caught:
                    err = self._no_answer(
                        uuid, spec.name, route.partition, caught, silent, last and budget.at < deadline.at
                    )
                    if last and behind is None:
                        raise err from None  # the error itself, or the 503 that stands for it
                    failure = err
                    log.info("failing over from %s for partition %d: %s", uuid, route.partition, err.message)
                    continue
                self.silence.heard(uuid)
                if not self.marks.admit(spec.name, route.partition, span, active=uuid == route.owner):
                    behind = self._behind(spec.name, route.partition, uuid, span)
                    continue
                return self._found(spec, key, route.partition, answer, span)
            if behind is None:
                raise failure or AssertionError("a route has at least one holder")  # pragma: no cover
            if deadline.remaining() <= CATCH_UP_PAUSE:
                raise behind
            await asyncio.sleep(CATCH_UP_PAUSE)

    def _no_answer(
        self,
        uuid: str,
        store: str,
        partition: int,
        err: NoPing | RiqrError,
        silent: float | None,
        cut_short: bool,
    ) -> RiqrError:
        """What holder ``uuid`` not answering a lookup says of it (recorded: silence, a suspect, a view to
        refresh), and the error that stands for it. ``silent``: its ``silent_for`` when asked;
        ``cut_short``: it was the last copy and its budget ended before the request's deadline."""
        if isinstance(err, NoPing):  # its call out SILENT_AFTER, and no answer to a ping: silent
            self.silence.missed(uuid, err.silent)
            self._views.suspect(uuid)
            return silent_owner(uuid, store, [partition], err.silent)
        if isinstance(err, OwnerUnavailable):
            self._views.refresh_soon()
        if isinstance(err, PartitionUnavailable):  # it answered: its copy cannot serve
            self.silence.heard(uuid)
            return err
        self.silence.missed(uuid, silent)  # the actor itself did not answer
        self._views.suspect(uuid)
        # A 503 for the silence, unless the request's own deadline ran out (then its 504).
        if cut_short and silent is not None and isinstance(err, DeadlineExceeded):
            return silent_owner(uuid, store, [partition], silent)
        return err

    @staticmethod
    def _found(spec: StoreSpec, key: Any, partition: int, answer: bytes | None, span: Span) -> Found:
        if answer is None:
            shown = to_jsonable(spec.key.external(key))
            missing = KeyNotFound(f"key {shown!r} is not in store {spec.name!r}", store=spec.name, key=shown)
            missing.position = position_header(partition, span)
            raise missing
        return Found(answer, partition, span)

    def _behind(self, store: str, partition: int, uuid: str, span: Span) -> CopyBehind:
        mark = self.marks.get(store, partition)
        served = "nothing" if mark is None else f"{mark.source}@{mark.batch}"
        return CopyBehind(
            f"every copy of partition {partition} of store {store} that answered is older than what was already "
            f"served ({served}; {uuid} is at {span_text(span)}); an older answer would go back in time",
            store=store,
            partition=partition,
            partitions=[partition],
            retry_after=1,
        )

    async def _ask(self, uuid: str, store: str, partition: int, key: Any, deadline: Deadline) -> Answer:
        # A batch fails as a whole when one of its partitions cannot answer; a key of another partition
        # that shared the batch is asked again (once).
        # The coalescer bounds the wait itself (one timer for all its waiters, not one per request).
        for attempt in (1, 2):
            try:
                return await self._batcher(uuid, store).submit((partition, key), deadline.at)
            except TimeoutError:
                raise deadline.exceeded(f"get on {store}") from None
            except PartitionUnavailable as err:
                if attempt == 1 and partition not in err.details.get("partitions", [partition]):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover
