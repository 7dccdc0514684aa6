"""Scatter-gather merges: identity plus a reducer, keeping key order.

Each owner returns its entries in key order; ``merge_sorted`` k-way merges them so the answer over all
owners is in key order too (a hash-map merge, as KIQR did, loses the order). Partitions are disjoint in
keys, so no key appears twice; if one ever did (a partition moving between owners while a scan runs), the
entry from the earlier source wins and the duplicate is dropped rather than sent twice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = ["merge_sorted", "sum_counts"]

_MISSING = object()


def merge_sorted(runs: Sequence[Iterable[tuple[Any, Any]]]) -> Iterator[tuple[Any, Any]]:
    """K-way merge of ``(key, value)`` runs, each sorted by key, into one run sorted by key."""
    last: Any = _MISSING
    for key, value in heapq.merge(*runs, key=lambda entry: entry[0]):
        if last is not _MISSING and key == last:
            continue
        last = key
        yield key, value


def sum_counts(counts: Iterable[int]) -> int:
    """The reducer of ``approximate-num-entries``: owners hold disjoint partitions, so counts add."""
    return sum(counts)
