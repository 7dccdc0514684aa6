"""Scatter-gather merges: identity plus a reducer, keeping key order.

Each owner returns its entries in key order (or reverse key order); the merges here k-way merge them so
the answer over all owners keeps that order (a hash-map merge, as KIQR did, loses it). Partitions are
disjoint in keys, so no key appears twice; if one ever did (a partition moving between owners while a
scan runs), the entry from the first source wins and the duplicate is dropped rather than sent twice.

``merge_pages_async`` is the streaming form: it pulls a page from a source only when the merged output
has used up that source's previous page, so memory stays at one page per source however long the scan.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from runtime.pages import Run, cut, merge_runs, split_run

__all__ = ["merge_sorted", "merge_pages_async", "merge_runs_async", "sum_counts"]

_MISSING = object()


def merge_sorted(runs: Sequence[Iterable[tuple[Any, Any]]], *, reverse: bool = False) -> Iterator[tuple[Any, Any]]:
    """K-way merge of ``(key, value)`` runs, each sorted by key (descending if ``reverse``)."""
    last: Any = _MISSING
    for key, value in heapq.merge(*runs, key=lambda entry: entry[0], reverse=reverse):
        if last is not _MISSING and key == last:
            continue
        last = key
        yield key, value


def _cut(page: list[tuple[Any, Any]], frontier: Any, reverse: bool) -> int:
    """How many leading entries of ``page`` (sorted in scan order) are at or before ``frontier``."""
    if reverse:
        return next((i for i, (key, _) in enumerate(page) if key < frontier), len(page))
    return bisect.bisect_right(page, frontier, key=lambda entry: entry[0])


async def merge_pages_async(
    sources: Sequence[AsyncIterator[list[tuple[Any, Any]]]], *, reverse: bool = False
) -> AsyncIterator[list[tuple[Any, Any]]]:
    """K-way merge of sources that yield *pages* (lists sorted by key), as merged chunks.

    Every source's next page starts after its current one, so all entries up to the smallest last key
    among the buffered pages (the frontier) are already at hand: they merge synchronously into one chunk.
    The only awaits are one per page, not one per entry, and memory stays at one page per source.
    """
    buffers: list[list[tuple[Any, Any]] | None] = [[] for _ in sources]

    async def refill(i: int) -> None:
        page = await anext(sources[i], None)
        buffers[i] = None if page is None else list(page)

    while True:
        empty = [i for i, buf in enumerate(buffers) if buf is not None and not buf]
        while empty:
            outcomes = await asyncio.gather(*(refill(i) for i in empty), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            empty = [i for i, buf in enumerate(buffers) if buf is not None and not buf]  # empty pages
        live = [buf for buf in buffers if buf]
        if not live:
            return
        lasts = [buf[-1][0] for buf in live]
        frontier = max(lasts) if reverse else min(lasts)
        runs = []
        for i, buf in enumerate(buffers):
            if buf:
                cut = _cut(buf, frontier, reverse)
                runs.append(buf[:cut])
                buffers[i] = buf[cut:]
        yield list(merge_sorted(runs, reverse=reverse))


async def merge_runs_async(sources: Sequence[AsyncIterator[Run]], *, reverse: bool = False) -> AsyncIterator[Run]:
    """``merge_pages_async`` for packed runs (``runtime.pages``): sort keys plus columns of entries.

    Everything up to the frontier (the smallest last sort key among the buffered runs) merges in one
    ``merge_runs``, a sort done in C; only the runs of owners' pages are buffered, so memory stays at one
    page per source. A merged chunk says ``more`` unless every source is known to be exhausted.
    """
    buffers: list[Run | None] = [Run([], (), True) for _ in sources]
    done = [False] * len(sources)

    async def refill(i: int) -> None:
        run = await anext(sources[i], None)
        buffers[i] = run
        done[i] = run is None

    while True:
        empty = [i for i, buf in enumerate(buffers) if not done[i] and (buf is None or not buf.keys)]
        while empty:
            outcomes = await asyncio.gather(*(refill(i) for i in empty), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            empty = [i for i, buf in enumerate(buffers) if not done[i] and (buf is None or not buf.keys)]
        live = [(i, buf) for i, buf in enumerate(buffers) if buf is not None and buf.keys]
        if not live:
            return
        lasts = [buf.keys[-1] for _, buf in live]
        frontier = max(lasts) if reverse else min(lasts)
        heads = []
        for i, buf in live:
            head, buffers[i] = split_run(buf, cut(buf.keys, frontier, reverse))
            heads.append(head)
        merged = merge_runs(heads, reverse=reverse)
        merged.more = any(
            not done[i] and buf is not None and (bool(buf.keys) or buf.more) for i, buf in enumerate(buffers)
        )
        yield merged


def sum_counts(counts: Iterable[int]) -> int:
    """The reducer of ``approximate-num-entries``: owners hold disjoint partitions, so counts add."""
    return sum(counts)
