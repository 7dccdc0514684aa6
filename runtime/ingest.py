"""Splitting a micro-batch by partition and addressing the slices to owners (pure, tested without Ray)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.catalog import StoreSpec
from runtime.ownership import OwnershipTable

__all__ = [
    "PARTITION_COLUMN",
    "WINDOW_END_COLUMN",
    "drop_unrepresentable_times",
    "drop_unrepresentable_value_times",
    "drop_null_keys",
    "time_columns",
    "split_by_partition",
    "slices_for_owners",
]

log = logging.getLogger(__name__)

T = TypeVar("T")  # a slice, or what stands for it (the sink hands over object references)

# Columns the sink adds in Spark; their names cannot clash with a user's column by accident.
PARTITION_COLUMN = "__riqr_partition"
WINDOW_END_COLUMN = "__riqr_window_end"


# The instants answers are made of: years 1 to 9999 (Python's ``datetime``, and ISO-8601's four digits).
MIN_MICROS = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_MICROS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z


def drop_unrepresentable_times(table: pa.Table, columns: Sequence[str], store: str = "") -> pa.Table:
    """``table`` without the rows whose timestamp key ``columns`` (a window's end among them) lie outside
    years 1 to 9999, with a warning naming ``store`` and how many.

    Spark holds a timestamp as a plain number and computes window bounds as numbers: a seven-day window of
    an event on 9999-12-30 ends in year 10000, a sliding window of an event in year 1 starts in year 0,
    and milliseconds read as seconds land in year 55000. Such a key stored was one no answer can hold
    (``OverflowError`` turning it into a datetime): every scan that came to it failed, and paging could
    never get past it. A batch without one (every usual batch) is returned as it is, after one min/max
    of each column."""
    outside = None
    for name in columns:
        if name not in table.column_names:
            continue
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        out = _outside(column, MIN_MICROS, MAX_MICROS)
        if out is not None:
            outside = out if outside is None else pc.or_(outside, out)
    if outside is None:
        return table
    dropped = pc.sum(outside).as_py()
    log.warning("store %s: dropped %d rows whose timestamp key or window lies outside years 1 to 9999", store,
                dropped, extra={"store": store})  # fmt: skip
    return table.filter(pc.invert(outside))


def _outside(numbers: pa.Array | pa.ChunkedArray, low: int, high: int) -> Any:
    """Which of ``numbers`` lie outside ``[low, high]`` (a null does not), or None when none does: one
    min/max, the usual case, and only then a comparison of each."""
    bounds = pc.min_max(numbers)
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if lo is None or (lo >= low and hi <= high):
        return None
    return pc.fill_null(pc.or_(pc.less(numbers, low), pc.greater(numbers, high)), False)


# A date's days since 1970-01-01 that answers can hold (Python's ``date``): 0001-01-01 to 9999-12-31.
MIN_DAYS = -719_162
MAX_DAYS = 2_932_896


def drop_unrepresentable_value_times(table: pa.Table, columns: Sequence[str], store: str = "") -> tuple[pa.Table, int]:
    """``table`` without the rows whose value ``columns`` hold a timestamp or a date outside years 1 to
    9999, at any depth (inside a struct, an array or a map), and how many those were, with a warning
    naming ``store`` and the columns.

    Spark holds such an instant as a plain number (``timestamp_seconds`` of milliseconds lands in year
    55000), and a value is turned into Python objects in the query actor's apply, where it raised
    ``OverflowError``: the batch failed, the query with it, and the same batch again at every replay, so
    the store was never fed again. Dropped and counted (``riqr_rows_dropped_total``, ``time-out-of-range``)
    as a key out of range is. Columns with no timestamp or date in their type cost nothing; those with
    one, a min/max of their instants."""
    rows = np.zeros(table.num_rows, dtype=bool)
    bad: list[str] = []
    for name in columns:
        if name not in table.column_names or not _has_time(table.schema.field(name).type):
            continue
        for chunk_start, chunk in _chunks(table.column(name)):
            out = _rows_out_of_range(chunk)
            if out is not None and out.any():
                rows[chunk_start : chunk_start + len(chunk)] |= out
                if name not in bad:
                    bad.append(name)
    if not bad:
        return table, 0
    dropped = int(rows.sum())
    log.warning("store %s: dropped %d rows whose value holds a time outside years 1 to 9999 (in %s)", store,
                dropped, ", ".join(bad), extra={"store": store})  # fmt: skip
    return table.filter(pa.array(~rows)), dropped


def _chunks(column: pa.ChunkedArray) -> list[tuple[int, pa.Array]]:
    out, at = [], 0
    for chunk in column.chunks:
        out.append((at, chunk))
        at += len(chunk)
    return out


def _has_time(kind: pa.DataType) -> bool:
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_has_time(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _has_time(kind.key_type) or _has_time(kind.item_type)
    if any(is_kind(kind) for is_kind in _LISTS):
        return _has_time(kind.value_type)
    return False


_UTC = {"UTC", "ETC/UTC", "Z", "+00:00", "GMT", "ETC/GMT"}
_LISTS = (pa.types.is_map, pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)


def _rows_out_of_range(array: pa.Array) -> np.ndarray | None:
    """Which of ``array``'s entries hold an instant outside years 1 to 9999 (None: none can)."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        if kind.unit == "ns":  # 64 bits of nanoseconds reach years 1677 to 2262 only
            return np.zeros(len(array), dtype=bool)
        scale = {"s": 1_000_000, "ms": 1_000, "us": 1}[kind.unit]
        numbers, low, high = array.cast(pa.int64()), -(-MIN_MICROS // scale), MAX_MICROS // scale
        if kind.tz is not None and kind.tz.upper() not in _UTC:
            # Turned into Python in its zone (Spark's session zone), an instant within a day of either
            # bound can leave the range there: a day's margin (a review found Asia/Tokyo's overflow).
            day = 86_400_000_000 // scale
            low, high = low + day, high - day
    elif pa.types.is_date32(kind):
        numbers, low, high = array.cast(pa.int32()), MIN_DAYS, MAX_DAYS
    elif pa.types.is_date64(kind):
        numbers, low, high = array.cast(pa.int64()), MIN_DAYS * 86_400_000, MAX_DAYS * 86_400_000 + 86_399_999
    elif pa.types.is_struct(kind):
        found = None
        for i in range(kind.num_fields):
            child = _rows_out_of_range(pc.struct_field(array, [i]))
            if child is not None:
                found = child if found is None else found | child
        return found
    elif any(is_kind(kind) for is_kind in _LISTS):
        if pa.types.is_map(kind):  # as a list of key-item structs: the struct case looks at both
            array = array.cast(pa.list_(pa.struct([kind.key_field, kind.item_field])))
        child = _rows_out_of_range(pc.list_flatten(array))
        if child is None:
            return None
        # Each flattened entry's row. Not ``list_parent_indices``: it counts a null list's values, which
        # ``list_flatten`` skips (a null over a non-empty range misaligned the two).
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        parents = np.repeat(np.arange(len(array)), lengths)
        found = np.zeros(len(array), dtype=bool)
        found[parents[child]] = True
        return found
    else:
        return None
    out = _outside(numbers, low, high)
    if out is None:
        return np.zeros(len(array), dtype=bool)
    return np.asarray(out.to_numpy(zero_copy_only=False), dtype=bool)


def drop_null_keys(table: pa.Table, columns: Sequence[str], store: str = "") -> tuple[pa.Table, int]:
    """``table`` without the rows whose key is not whole (a null in any of the key ``columns``, or in the
    partition column computed from them), and how many those were, with a warning naming ``store``: no
    answer could hold such a key, and Kafka Streams drops records with a null key too. The sink counts
    them into the store's feed (``riqr_rows_dropped_total``), so none goes unseen. A batch with no null
    key (every usual batch) costs one look at each column's null count."""
    present = [name for name in (*columns, PARTITION_COLUMN) if name in table.column_names]
    if not any(table.column(name).null_count for name in present):
        return table, 0
    null = None
    for name in present:
        column = table.column(name)
        if column.null_count:
            mask = pc.is_null(column)
            null = mask if null is None else pc.or_(null, mask)
    assert null is not None
    dropped = int(pc.sum(null).as_py() or 0)
    log.warning("store %s: dropped %d rows with a null key", store, dropped, extra={"store": store})
    return table.filter(pc.invert(null)), dropped


def time_columns(spec: StoreSpec) -> list[str]:
    """The columns of ``spec``'s rows ``drop_unrepresentable_times`` checks: its timestamp key columns, and
    a windowed store's window end."""
    columns = [name for name, key_type in spec.key.columns if key_type.kind == "timestamp"]
    return columns + [WINDOW_END_COLUMN] if spec.windowed else columns


def split_by_partition(table: pa.Table, partitions: int, store: str = "") -> dict[int, pa.Table]:
    """Rows of ``table`` grouped by ``PARTITION_COLUMN`` (dropped from the slices), in their order.

    A row whose partition is null has a null key (its partition column is computed from the key): it is
    dropped, as Kafka Streams drops them, with a warning naming ``store``. A batch of such rows only is
    empty, not an error: it was once a ``ValueError`` that failed the query, and again at every replay.
    Raises ``ValueError`` if a row names a partition outside ``[0, partitions)``, which would mean the
    write path and the store disagree on the partition count.

    Each slice is one contiguous chunk per column. Spark hands a batch over as Arrow batches of 10,000 rows,
    so a slice filtered from it as it comes has a chunk per batch: each of its hundreds of buffers is then
    a separate piece of the slice's serialization into Ray's object store and back in every actor (a
    1,000,000-row batch's eight slices took 169 ms to put against 44 ms as one chunk each), and a separate
    piece of every Arrow kernel's work in the actors. Joining the chunks first is one copy (2 ms here).
    """
    if table.num_rows == 0:
        return {}
    table = table.combine_chunks()
    part = table.column(PARTITION_COLUMN)
    if part.null_count:
        log.warning("store %s: dropped %d rows with a null key", store, part.null_count, extra={"store": store})
        if part.null_count == table.num_rows:
            return {}
    lo, hi = pc.min(part).as_py(), pc.max(part).as_py()
    if lo < 0 or hi >= partitions:
        raise ValueError(f"partition column holds values in [{lo}, {hi}] but the store has {partitions} partitions")
    body = table.drop_columns([PARTITION_COLUMN])
    out: dict[int, pa.Table] = {}
    for p in range(lo, hi + 1):
        piece = body.filter(pc.equal(part, p))
        if piece.num_rows:
            out[p] = piece
    return out


def slices_for_owners(
    table: OwnershipTable, split: Mapping[int, T], role: str | None = None
) -> dict[str, dict[int, T | None]]:
    """For every actor holding a copy of some partition: each of its partitions -> its slice or None.

    Every partition an actor holds is listed, even with no rows, so each partition records that it has
    seen the batch id (its position moves forward with every batch). ``role`` ``"standby"`` or
    ``"active"`` keeps only the copies in that role (the sink delivers to standbys first).
    """
    out: dict[str, dict[int, T | None]] = {}
    for p, owners in enumerate(table.partitions):
        active: tuple[str, ...] = (owners.active,) if owners.active else ()
        holders = {"active": active, "standby": owners.standbys}.get(role or "", active + owners.standbys)
        for uuid in holders:
            out.setdefault(uuid, {})[p] = split.get(p)
    return out
