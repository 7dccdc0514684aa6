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

__all__ = ["merge_sorted", "merge_pages_async", "sum_counts"]

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


def sum_counts(counts: Iterable[int]) -> int:
    """The reducer of ``approximate-num-entries``: owners hold disjoint partitions, so counts add."""
    return sum(counts)
