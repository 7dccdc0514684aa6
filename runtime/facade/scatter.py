"""Scatter-gather: a scan over every owner of a store, merged in key order; pages, streams and counts.

Owners answer one page of a ``Scan`` per call; the facade keeps one page per owner plus one prefetched,
and merges them in chunks (``runtime.merge.merge_pages_async``), so memory stays flat whatever the size
of the result. Every page call has the request deadline; a stream as a whole has none. A scan is all or
nothing: if any partition has no owner the answer is a 503 listing them, never a partial result.

Pages and counts are monotonic per facade, like key lookups (``runtime.monotonic``): a page or count from
a copy older than what this facade already served from one of its partitions is refused; another copy is
asked, or the same one again shortly, and at the deadline the answer is a 503 (``CopyBehind``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from runtime.bus import Bus
from runtime.catalog import StoreSpec
from runtime.config import DEFAULT_PAGE_SIZE, MAX_PAGE, PAGE_BYTES
from runtime.deadline import Deadline, within
from runtime.engines.keycodec import KeyCodec
from runtime.errors import CopyBehind, DeadlineExceeded, OwnerUnavailable, PartitionUnavailable, ResultTooLarge
from runtime.facade.silence import NoPing, Silence, answer_or_silence, silent_owner
from runtime.facade.view import ViewCache
from runtime.keys import TOP
from runtime.merge import merge_pages_async, merge_runs_async, sum_counts
from runtime.monotonic import SEEN, Marks
from runtime.ownership import OwnershipTable
from runtime.pages import PackedPage, Run, run_of, split_run
from runtime.queries import Page, check_limit
from runtime.scan import Scan
from runtime.windows import present

__all__ = ["ScatterGather", "owners_or_unavailable", "scan_partitions"]

RawEntry = tuple[Any, bytes]

# How long to wait before asking a copy that was behind again (see ``runtime.facade.routing``).
CATCH_UP_PAUSE = 0.02
# Packed pages of one owner received and waiting to be merged, beyond the one being merged
# (``ScatterGather._owner_runs``): with one, the owner works on the next page meanwhile.
PAGES_AHEAD = 1


def _other_holders(
    table: OwnershipTable, partitions: list[int], tried: frozenset[str], silence: Silence | None = None
) -> dict[str, list[int]]:
    """For each of ``partitions``, its first copy (active, then standbys; silent ones last, with
    ``silence``) on an actor not in ``tried``, grouped by actor; partitions with no such copy are left out."""
    groups: dict[str, list[int]] = {}
    for p in partitions:
        owners = table.partitions[p]
        holders = ((owners.active,) if owners.active else ()) + owners.standbys
        if silence is not None:
            holders = silence.in_order(holders)
        holder = next((u for u in holders if u not in tried), None)
        if holder is not None:
            groups.setdefault(holder, []).append(p)
    return groups


def _actives(table: OwnershipTable, uuid: str, partitions: list[int]) -> frozenset[int]:
    """Which of ``partitions`` ``uuid`` holds the active copy of."""
    return frozenset(p for p in partitions if table.partitions[p].active == uuid)


def _copy_behind(table: OwnershipTable, uuid: str, refused: list[int], marks: Marks) -> CopyBehind:
    store = table.spec.name
    served = ", ".join(f"{p}: {m.source}@{m.batch}" for p in refused if (m := marks.get(store, p)) is not None)
    return CopyBehind(
        f"the copies of partitions {refused} of store {store} on {uuid} are older than what was already "
        f"served ({served}); an older answer would go back in time",
        store=store,
        partitions=refused,
        retry_after=1,
    )


T = TypeVar("T")


async def _merged(
    merge: Callable[..., AsyncIterator[T]], sources: list[AsyncGenerator[T, None]], *, reverse: bool
) -> AsyncGenerator[T, None]:
    """``merge`` (``merge_pages_async`` or ``merge_runs_async``) of the sources, closing every source
    however the merge ends."""
    try:
        async for chunk in merge(sources, reverse=reverse):
            yield chunk
    finally:
        for source in sources:
            await source.aclose()


def scan_partitions(table: OwnershipTable, scan: Scan) -> frozenset[int] | None:
    """The one partition a scan can touch when both its bounds hold the same partition-column value (a
    composite key's leading column: one key's windows or sessions, a range over the rest of one customer's
    bookings; or a one-key range); None when it may touch any."""
    if scan.lo is None or scan.hi is None:
        return None
    key, lo, hi = table.spec.key, scan.lo.key, scan.hi.key
    if key.composite:
        if not (isinstance(lo, tuple) and isinstance(hi, tuple) and lo and hi) or lo[0] is TOP or lo[0] != hi[0]:
            return None
    elif lo != hi or lo is TOP:
        return None
    return frozenset({table.partition_of(lo)})


def owners_or_unavailable(
    table: OwnershipTable, only: frozenset[int] | None = None, silence: Silence | None = None
) -> dict[str, list[int]]:
    """Owner uuid -> its partitions (``only`` those, if given), or ``PartitionUnavailable`` if one of them has
    no owner. With ``silence``, a partition whose active is silent goes to its first copy that is not, when
    it has one (``runtime.facade.silence``)."""
    missing = [p for p in table.unassigned() if only is None or p in only]
    if missing:
        raise PartitionUnavailable(
            f"partitions {missing} of store {table.spec.name} have no owner right now; a partial answer "
            "would be wrong, so none is given",
            store=table.spec.name,
            partitions=missing,
        )
    wanted = [p for p in range(table.spec.partitions) if only is None or p in only]
    return _other_holders(table, wanted, frozenset(), silence)  # each partition on its first copy


def _failover_groups(
    table: OwnershipTable, partitions: list[int], tried: frozenset[str], silence: Silence | None = None
) -> dict[str, list[int]]:
    """The next untried holders of ``partitions`` (``_other_holders``), or ``PartitionUnavailable`` naming
    the partitions none is left for."""
    groups = _other_holders(table, partitions, tried, silence)
    missing = sorted(set(partitions) - {p for ps in groups.values() for p in ps})
    if missing:
        raise PartitionUnavailable(
            f"partitions {missing} of store {table.spec.name} have no copy left to answer",
            store=table.spec.name,
            partitions=missing,
        )
    return groups


class ScatterGather:
    """Scans, pages, streams and counts over all owners of a store."""

    def __init__(
        self,
        bus: Bus,
        views: ViewCache,
        *,
        timeout: float,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_page: int = MAX_PAGE,
        marks: Marks | None = None,
        silence: Silence | None = None,
    ) -> None:
        self._bus = bus
        self._views = views
        self.timeout = timeout
        self.page_size = page_size
        self.max_page = max_page
        # What this facade has served per partition (shared with key lookups: ``Facade`` passes one).
        self.marks = marks if marks is not None else Marks()
        # Owners found silent (shared with key lookups: ``Facade`` passes its router's): scans start on
        # their partitions' other copies, and give one that is the last copy left ``SILENT_BUDGET``.
        self.silence = silence if silence is not None else Silence()

    async def _call(self, awaitable: Any, what: str) -> Any:
        try:
            return await within(Deadline.after(self.timeout), awaitable, what)
        except OwnerUnavailable:
            self._views.refresh_soon()
            raise

    async def _admitted(
        self,
        table: OwnershipTable,
        uuid: str,
        partitions: list[int],
        tried: frozenset[str],
        ask: Callable[[], Any],
        what: str,
    ) -> Any:
        """The answer of ``ask()`` (an owner call returning ``(answer, spans)``) once its spans are admitted.

        A copy behind what this facade served is ``CopyBehind`` at once when another copy of every one of
        ``partitions`` is left to fail over to; otherwise it is asked again after a pause, until the deadline.
        """
        silent = self.silence.silent_for(uuid)
        budget = self.silence.budget(silent, self.timeout)
        deadline = Deadline(time.monotonic() + budget, self.timeout)
        active = _actives(table, uuid, partitions)
        owner = self._bus.owner(uuid)
        while True:
            try:
                answer, spans = await answer_or_silence(deadline, ask(), owner.ping, what)
            except NoPing as err:  # a call out SILENT_AFTER, and no answer to a ping: silent, not slow
                self._views.suspect(uuid)
                self.silence.missed(uuid, err.silent)
                raise silent_owner(uuid, table.spec.name, partitions, err.silent) from None
            except (OwnerUnavailable, DeadlineExceeded) as err:  # the actor itself did not answer
                self._views.suspect(uuid)
                if isinstance(err, OwnerUnavailable):  # Ray says it is dead or restarting
                    self.silence.missed(uuid, silent)
                    self._views.refresh_soon()
                # A scan or count that outlasted its deadline may only be a large one: it does not make its
                # owner silent (key lookups, which are small, do), only asked after the other copies for a
                # while; one that is silent already gets a 503.
                if isinstance(err, DeadlineExceeded):
                    self.silence.slow(uuid)
                if silent is not None and isinstance(err, DeadlineExceeded) and budget < self.timeout:
                    raise silent_owner(uuid, table.spec.name, partitions, silent) from None
                raise
            except PartitionUnavailable:
                self.silence.heard(uuid)
                raise
            self.silence.heard(uuid)
            refused = self.marks.admit_all(table.spec.name, spans, active)
            if not refused:
                seen = SEEN.get()
                if seen is not None:
                    seen.add(spans)
                return answer
            others = _other_holders(table, partitions, tried | {uuid}, self.silence)
            covered = sorted(p for ps in others.values() for p in ps) == sorted(partitions)
            if covered or deadline.remaining() <= CATCH_UP_PAUSE:
                raise _copy_behind(table, uuid, refused, self.marks)
            await asyncio.sleep(CATCH_UP_PAUSE)

    async def _owner_pages(
        self,
        table: OwnershipTable,
        uuid: str,
        partitions: list[int],
        scan: Scan,
        page_size: int,
        tried: frozenset[str] = frozenset(),
    ) -> AsyncGenerator[list[RawEntry], None]:
        """One owner's part of a scan, a page at a time, with the next page fetched while one is used.

        If the owner fails mid-scan (dead, restarting, its copy unable to answer), the rest of the scan
        continues on standby copies of the same partitions, strictly after the last key already yielded:
        no key twice, none skipped.
        """
        owner = self._bus.owner(uuid)
        what = f"scan page from {uuid}"
        loop = asyncio.get_running_loop()

        def fetch(scan: Scan) -> Any:
            return self._admitted(table, uuid, partitions, tried, lambda: owner.scan(partitions, scan, page_size), what)

        pending: asyncio.Future[Any] | None = loop.create_task(fetch(scan))
        try:
            while pending is not None:
                try:
                    page = list(await pending)
                except (OwnerUnavailable, PartitionUnavailable, DeadlineExceeded):
                    pending = None
                    tried = tried | {uuid}
                    if not _other_holders(table, partitions, tried, self.silence):
                        raise
                    async for rest in self._failover_pages(table, partitions, scan, page_size, tried):
                        yield rest
                    return
                pending = None
                if len(page) == page_size:
                    scan = scan.after(page[-1][0])
                    pending = loop.create_task(fetch(scan))
                yield page
        finally:
            if pending is not None and not pending.done():
                pending.cancel()

    async def _failover_pages(
        self, table: OwnershipTable, partitions: list[int], scan: Scan, page_size: int, tried: frozenset[str]
    ) -> AsyncGenerator[list[RawEntry], None]:
        """The rest of a scan of ``partitions`` on their next untried holders (merged, if they differ)."""
        groups = _failover_groups(table, partitions, tried, self.silence)
        sources = [self._owner_pages(table, u, ps, scan, page_size, tried) for u, ps in groups.items()]
        async for chunk in _merged(merge_pages_async, sources, reverse=scan.reverse):
            yield chunk

    # -- packed pages (runtime.pages): key-value scans streamed or iterated as blobs -------------------

    async def _owner_runs(
        self,
        table: OwnershipTable,
        uuid: str,
        partitions: list[int],
        scan: Scan,
        fmt: str,
        max_bytes: int,
        limit: int | None = None,
        tried: frozenset[str] = frozenset(),
        page_entries: int | None = None,
    ) -> AsyncGenerator[Run, None]:
        """``_owner_pages`` with packed pages: one owner's part of a scan as runs, failing over to standby
        copies strictly after the last key already received, as ``_owner_pages`` does. With a ``limit``,
        the owner sends at most that many entries over all its pages (a merged scan never needs more from
        one source), and is asked no more once it sent them. ``page_entries`` caps each page's entries
        (besides its bytes).

        Pages are fetched by a task of their own (``fetch_pages``), which asks for the next page as soon
        as one arrives rather than when the merge has used the one before: the owner then works on a page
        while the last one travels and waits to be merged, instead of idling until the merge asks.
        """
        codec = KeyCodec(table.spec.key)
        left = [limit]
        # At most PAGES_AHEAD pages wait here beyond the one in use, plus one arrived and not yet queued;
        # pages wait as they came (keys and a blob), split into entries (``run_of``) only when merged.
        arrived: asyncio.Queue[tuple[PackedPage | None, Scan, BaseException | None]] = asyncio.Queue(PAGES_AHEAD)

        async def fetch_pages(scan: Scan) -> None:
            owner = self._bus.owner(uuid)
            what = f"scan page from {uuid}"
            while True:
                caps = [c for c in (left[0], page_entries) if c is not None]
                ask = functools.partial(owner.scan_packed, partitions, scan, min(caps, default=None), max_bytes, fmt)
                try:
                    page: PackedPage = await self._admitted(table, uuid, partitions, tried, ask, what)
                    if left[0] is not None:
                        left[0] -= len(page)
                    last = not (page.more and page.keys and left[0] != 0)
                    after = scan if last else scan.after(codec.decode(page.keys[-1]))
                except Exception as err:  # handed to the generator, which fails over or raises: never
                    await arrived.put((None, scan, err))  # left waiting for a page that will not come
                    return
                scan = after
                await arrived.put((page, scan, None))
                if last:
                    return

        fetcher = asyncio.get_running_loop().create_task(fetch_pages(scan))
        try:
            while True:
                page, after, error = await arrived.get()
                if error is not None:
                    if not isinstance(error, (OwnerUnavailable, PartitionUnavailable, DeadlineExceeded)):
                        raise error
                    tried = tried | {uuid}
                    if not _other_holders(table, partitions, tried, self.silence):
                        raise error
                    groups = _failover_groups(table, partitions, tried, self.silence)
                    sources = [
                        self._owner_runs(table, u, ps, after, fmt, max_bytes, left[0], tried, page_entries)
                        for u, ps in groups.items()
                    ]
                    async for rest in _merged(merge_runs_async, sources, reverse=scan.reverse):
                        yield rest
                    return
                assert page is not None
                yield run_of(page)
                if fetcher.done() and arrived.empty():
                    return
        finally:
            if not fetcher.done():
                fetcher.cancel()

    async def packed_chunks(
        self,
        table: OwnershipTable,
        scan: Scan,
        fmt: str,
        max_bytes: int = PAGE_BYTES,
        limit: int | None = None,
        page_entries: int | None = None,
    ) -> AsyncGenerator[Run, None]:
        """A key-value scan over all partitions as merged runs in ``fmt`` (NDJSON lines, or keys and
        values), pages of about ``max_bytes`` (and at most ``page_entries``) per owner, one prefetched:
        memory stays flat. At most ``limit`` entries, and no owner is asked for more than that."""
        if scan.is_empty():
            return
        owners = owners_or_unavailable(table, scan_partitions(table, scan), self.silence).items()
        sources = [
            self._owner_runs(table, u, p, scan, fmt, max_bytes, limit, page_entries=page_entries) for u, p in owners
        ]
        left = limit
        async for chunk in _merged(merge_runs_async, sources, reverse=scan.reverse):
            if left is not None and len(chunk) >= left:
                chunk = split_run(chunk, left)[0]
                if chunk.keys:
                    yield chunk
                return
            if left is not None:
                left -= len(chunk)
            yield chunk

    async def raw_chunks(
        self, table: OwnershipTable, scan: Scan, page_size: int | None = None
    ) -> AsyncGenerator[list[RawEntry], None]:
        """The internal ``(key, packed value)`` entries of ``scan`` over all partitions, in order, as chunks."""
        if scan.is_empty():
            return
        size = page_size or self.page_size
        owners = owners_or_unavailable(table, scan_partitions(table, scan), self.silence).items()
        sources = [self._owner_pages(table, u, p, scan, size) for u, p in owners]
        async for chunk in _merged(merge_pages_async, sources, reverse=scan.reverse):
            yield chunk

    async def stream(
        self, table: OwnershipTable, scan: Scan, limit: int | None = None
    ) -> AsyncGenerator[list[Any], None]:
        """The entries of ``scan`` as callers see them (``runtime.windows.present``), in chunks; with a
        ``limit``, owners' pages are no larger than it (the caller stops after ``limit`` entries)."""
        spec = table.spec
        chunks = self.raw_chunks(table, scan, None if limit is None else min(self.page_size, limit))
        try:
            async for chunk in chunks:
                yield [present(spec, k, v) for k, v in chunk]
        finally:
            await chunks.aclose()

    async def _collect_raw(self, table: OwnershipTable, scan: Scan, limit: int | None) -> list[RawEntry]:
        out: list[RawEntry] = []
        page_size = self.page_size if limit is None else min(self.page_size, limit)
        chunks = self.raw_chunks(table, scan, page_size)
        try:
            async for chunk in chunks:
                out.extend(chunk)
                if limit is not None and len(out) >= limit:
                    del out[limit:]
                    break
        finally:
            await chunks.aclose()
        return out

    async def collect(self, table: OwnershipTable, scan: Scan, max_entries: int | None = None) -> list[Any]:
        """Every entry of ``scan``, as callers see them; ``ResultTooLarge`` past ``max_entries``."""
        spec = table.spec
        raw = await self._collect_raw(table, scan, None if max_entries is None else max_entries + 1)
        if max_entries is not None and len(raw) > max_entries:
            raise ResultTooLarge(
                f"more than {max_entries:,} entries to answer whole: page them (limit, cursor), or stream them "
                "(Accept: application/json or application/x-ndjson)",
                limit=max_entries,
            )
        return [present(spec, k, v) for k, v in raw]

    async def page(
        self, table: OwnershipTable, scan: Scan, limit: int | None, cursor_after: Callable[[Any], str]
    ) -> Page:
        """At most ``limit`` entries of ``scan`` (default: the page size) and the cursor of the next page,
        which ``cursor_after(last key)`` issues (the facade knows the query and holds the cursor key)."""
        limit = check_limit(self.page_size if limit is None else limit, self.max_page)
        spec: StoreSpec = table.spec
        entries = await self._collect_raw(table, scan, limit + 1)
        more = len(entries) > limit
        entries = entries[:limit]
        shown = [present(spec, k, v) for k, v in entries]
        return Page(shown, cursor_after(entries[-1][0]) if more else None)

    async def count(self, table: OwnershipTable) -> int:
        """The number of entries over all partitions (owners hold disjoint partitions, so counts add); an
        owner that cannot answer, or whose copies are behind what this facade served, is replaced by
        standby copies of its partitions."""
        owners = owners_or_unavailable(table, silence=self.silence)

        async def count_on(uuid: str, partitions: list[int], tried: frozenset[str]) -> int:
            try:
                ask = lambda: self._bus.owner(uuid).count(partitions)  # noqa: E731
                counted: int = await self._admitted(table, uuid, partitions, tried, ask, f"count on {uuid}")
                return counted
            except (OwnerUnavailable, PartitionUnavailable):
                tried = tried | {uuid}
                groups = _other_holders(table, partitions, tried, self.silence)
                if sorted(p for ps in groups.values() for p in ps) != sorted(partitions):
                    raise
                return sum(await asyncio.gather(*(count_on(u, ps, tried) for u, ps in groups.items())))

        async def gather() -> list[int]:
            return list(await asyncio.gather(*(count_on(u, p, frozenset()) for u, p in owners.items())))

        return sum_counts(await self._call(gather(), f"count of {table.spec.name}"))
