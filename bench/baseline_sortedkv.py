"""The in-memory engine riqr had before ``runtime/engines``: a dict plus a Python list kept sorted with
``bisect.insort``. Kept only as the baseline ``bench/engines.py`` measures the engines against."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Any

from runtime.scan import Scan

__all__ = ["SortedKV"]

# Past this many new keys in one batch (relative to the store size), re-sorting beats insort.
_RESORT_FRACTION = 0.05


class SortedKV:
    """An in-memory map with keys kept in their natural order. Values are opaque bytes."""

    __slots__ = ("_data", "_keys")

    def __init__(self) -> None:
        self._data: dict[Any, bytes] = {}
        self._keys: list[Any] = []

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Any) -> bytes | None:
        return self._data.get(key)

    def write_many(self, rows: Iterable[tuple[Any, bytes | None]]) -> None:
        """Apply upserts and deletes (a ``None`` value deletes) in order; the last write of a key wins."""
        data = self._data
        new_keys: set[Any] = set()
        deleted: set[Any] = set()
        for key, value in rows:
            if value is None:
                if key in data:
                    del data[key]
                    if key in new_keys:
                        new_keys.discard(key)
                    else:
                        deleted.add(key)
            else:
                if key not in data:
                    if key in deleted:
                        deleted.discard(key)
                    else:
                        new_keys.add(key)
                data[key] = value
        self._reindex(new_keys, deleted)

    def _reindex(self, new_keys: set[Any], deleted: set[Any]) -> None:
        keys = self._keys
        if deleted:
            if len(deleted) > _RESORT_FRACTION * len(keys):
                keys = [k for k in keys if k not in deleted]
            else:
                for key in deleted:
                    del keys[bisect.bisect_left(keys, key)]
        if new_keys:
            if len(new_keys) > _RESORT_FRACTION * len(keys):
                keys.extend(new_keys)
                keys.sort()
            else:
                for key in sorted(new_keys):
                    bisect.insort(keys, key)
        self._keys = keys

    def scan(self, scan: Scan) -> Iterator[tuple[Any, bytes]]:
        """The entries ``scan`` covers, in its direction. Lazy: a caller taking a page reads only that."""
        keys = self._keys
        lo, hi = scan.lo, scan.hi
        if lo is None:
            start = 0
        elif lo.inclusive:
            start = bisect.bisect_left(keys, lo.key)
        else:
            start = bisect.bisect_right(keys, lo.key)
        if hi is None:
            stop = len(keys)
        elif hi.inclusive:
            stop = bisect.bisect_right(keys, hi.key)
        else:
            stop = bisect.bisect_left(keys, hi.key)
        data = self._data
        indices = range(stop - 1, start - 1, -1) if scan.reverse else range(start, stop)
        for i in indices:
            key = keys[i]
            yield key, data[key]

    def range(self, lo: Any = None, hi: Any = None, *, reverse: bool = False) -> Iterator[tuple[Any, bytes]]:
        """Entries with ``lo <= key <= hi``; a ``None`` bound is open."""
        return self.scan(Scan.closed(lo, hi, reverse=reverse))

    def clear(self) -> None:
        self._data.clear()
        self._keys.clear()
