"""Scatter-gather merges: identity plus a reducer, keeping key order.

Each owner returns its entries in key order (or reverse key order); the merges here k-way merge them so
the answer over all owners keeps that order (a hash-map merge, as KIQR did, loses it). Partitions are
disjoint in keys, so no key appears twice; if one ever did (a partition moving between owners while a
scan runs), the entry from the first source wins and the duplicate is dropped rather than sent twice.

``merge_sorted_async`` is the streaming form: it pulls from each source only as far as the merged
output has been consumed, so memory stays at one buffered page per source however long the scan.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

__all__ = ["merge_sorted", "merge_sorted_async", "sum_counts"]

_MISSING = object()


def merge_sorted(runs: Sequence[Iterable[tuple[Any, Any]]], *, reverse: bool = False) -> Iterator[tuple[Any, Any]]:
    """K-way merge of ``(key, value)`` runs, each sorted by key (descending if ``reverse``)."""
    last: Any = _MISSING
    for key, value in heapq.merge(*runs, key=lambda entry: entry[0], reverse=reverse):
        if last is not _MISSING and key == last:
            continue
        last = key
        yield key, value


class _Desc:
    """Inverts the order of a key, for a min-heap that yields largest first."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.key < self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.key == other.key


async def merge_sorted_async(
    sources: Sequence[AsyncIterator[tuple[Any, Any]]], *, reverse: bool = False
) -> AsyncIterator[tuple[Any, Any]]:
    """K-way merge of async ``(key, value)`` sources, each sorted by key (descending if ``reverse``)."""

    async def first(i: int) -> tuple[int, Any]:
        return i, await anext(sources[i], _MISSING)

    heap: list[tuple[Any, int, Any]] = []

    def push(i: int, entry: Any) -> None:
        if entry is not _MISSING:
            key, value = entry
            heapq.heappush(heap, (_Desc(key) if reverse else key, i, value))

    # Every first read completes (or fails) before we go on, so a failure never leaves another source's
    # generator running while the caller closes it.
    firsts = await asyncio.gather(*(first(i) for i in range(len(sources))), return_exceptions=True)
    for outcome in firsts:
        if isinstance(outcome, BaseException):
            raise outcome
    for i, entry in firsts:  # type: ignore[misc]
        push(i, entry)
    last: Any = _MISSING
    while heap:
        sort_key, i, value = heapq.heappop(heap)
        key = sort_key.key if reverse else sort_key
        if last is _MISSING or key != last:
            last = key
            yield key, value
        push(i, await anext(sources[i], _MISSING))


def sum_counts(counts: Iterable[int]) -> int:
    """The reducer of ``approximate-num-entries``: owners hold disjoint partitions, so counts add."""
    return sum(counts)
