"""A micro-batch slice's rows for one partition, converted from Arrow only as far as the engine needs.

An engine that stores Python keys (memory) takes ``(key, packed value or None)`` tuples; one that stores
encoded bytes (rocksdb) only needs each key's bytes (``runtime.engines.keycodec``), and those can be made
from the Arrow columns in a few vectorised calls, without building a Python object per key first and
encoding it in a Python loop (which was about a third of an apply into rocksdb). ``BatchRows`` is a
``Sequence`` of the tuples, built on first use, and ``encoded`` gives the bytes; both come from the
same slice, so either path writes the same state.

``BatchRows.shareable`` gives those bytes back as an ``EncodedSlice`` (two binary Arrow arrays), and
``BatchRows`` of an ``EncodedSlice`` takes them as they are: the sink has a partition's standby copy encode
the slice once and hands the result to the active copy, which then skips the encoding (the sort
included), about half of its apply (``topologies.delivery``). It is not an Arrow table because Ray
serializes tables with a reducer of its own whose first use in a process imports pandas (0.25 s of each
query actor's first batch, measured); Arrow arrays pickle as their buffers, out of band.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.codec import encode_values
from runtime.ingest import WINDOW_END_COLUMN

if TYPE_CHECKING:  # annotations only: the catalog imports the engines, whose RocksDB engine imports this
    from runtime.catalog import StoreSpec

__all__ = [
    "BatchRows",
    "EncodedSlice",
    "Slice",
    "WrittenFile",
    "encode_key_columns",
    "rows_from_arrow",
    "packed_values",
    "internal_keys",
]

log = logging.getLogger(__name__)

# The scalars here are built from buffers: ``pa.scalar`` (and ``fill_null(0)``, which calls it) goes
# through pyarrow's conversion of Python objects, whose first use imports pandas: 0.2 s of CPU in every
# process that imports the runtime (the registry, facades, HTTP verticles, clients) and in every query
# actor's first apply, none of which needs pandas.


def _binary_scalar(value: bytes, large: bool = False) -> pa.Scalar:
    offsets = pa.py_buffer(np.array([0, len(value)], dtype=np.int64 if large else np.int32).tobytes())
    kind = pa.large_binary() if large else pa.binary()
    return pa.Array.from_buffers(kind, 1, [None, offsets, pa.py_buffer(value)])[0]


_INTS: dict[pa.DataType, np.dtype[Any]] = {pa.int32(): np.dtype(np.int32), pa.int64(): np.dtype(np.int64)}
_ZEROS = {
    kind: pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(np.zeros(1, dtype=dtype).tobytes())])[0]
    for kind, dtype in _INTS.items()
}


def _zero_for_null(array: pa.Array) -> np.ndarray:
    """An int32 or int64 array as int64 numpy, nulls as 0 (read from its data buffer: ``to_numpy`` too
    imports pandas)."""
    dtype = _INTS[array.type]
    filled = array.fill_null(_ZEROS[array.type]) if array.null_count else array
    data = np.frombuffer(filled.buffers()[1], dtype=dtype, count=len(filled), offset=filled.offset * dtype.itemsize)
    return data.astype(np.int64)


_COMPONENT = _binary_scalar(b"\x01")
_STRING_END = _binary_scalar(b"\x00\x00")
_NOTHING = _binary_scalar(b"")
# The same for large_string columns (64-bit offsets, as Spark hands strings over with
# spark.sql.execution.arrow.useLargeVarTypes): binary_join_element_wise takes one binary type throughout.
_LARGE_COMPONENT = _binary_scalar(b"\x01", large=True)
_LARGE_STRING_END = _binary_scalar(b"\x00\x00", large=True)
_LARGE_NOTHING = _binary_scalar(b"", large=True)


def _encode_string(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """``0x01``, the UTF-8 with each ``0x00`` as ``0x00 0xFF``, then ``0x00 0x00`` (the key codec's layout)."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    if pa.types.is_string(column.type):
        raw = pc.replace_substring(column.cast(pa.binary()), b"\x00", b"\x00\xff")
        return pc.binary_join_element_wise(_COMPONENT, raw, _STRING_END, _NOTHING)
    # large_string: joined with large scalars, then as binary like every other key part (None, the key-by-key
    # path, in the unlikely case of a slice whose keys take 2 GiB or more).
    raw = pc.replace_substring(column.cast(pa.large_binary()), b"\x00", b"\x00\xff")
    joined = pc.binary_join_element_wise(_LARGE_COMPONENT, raw, _LARGE_STRING_END, _LARGE_NOTHING)
    if (pc.sum(pc.binary_length(joined)).as_py() or 0) >= 2**31:
        return None
    return joined.cast(pa.binary())


def _encode_int64(column: pa.ChunkedArray, kind: str) -> pa.ChunkedArray | None:
    """``0x01`` then the signed 64-bit value plus 2**63, big-endian (the key codec's layout)."""
    if kind == "timestamp":
        if not pa.types.is_timestamp(column.type):
            return None
        if column.type.unit != "us":
            column = column.cast(pa.timestamp("us", tz=column.type.tz))
        column = column.cast(pa.int64())
    elif not pa.types.is_integer(column.type) or pa.types.is_uint64(column.type):
        return None  # a uint64 may not fit; the Python path says which key does not
    array = column.combine_chunks().cast(pa.int64())
    values = _zero_for_null(array)
    out = np.empty((len(values), 9), dtype=np.uint8)
    out[:, 0] = 1
    out[:, 1:] = (values.view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").view(np.uint8).reshape(-1, 8)
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(9), len(values), [array.buffers()[0] if array.null_count else None, pa.py_buffer(out)],
        null_count=array.null_count, offset=0,
    )  # fmt: skip
    return pa.chunked_array([fixed.cast(pa.binary())])


def _encoded_key_array(spec: StoreSpec, table: pa.Table) -> pa.ChunkedArray | None:
    parts = []
    for name, t in spec.key.columns:
        column = table.column(name)
        encoded = _encode_string(column) if t.kind == "string" else _encode_int64(column, t.kind)
        if encoded is None:
            return None
        parts.append(encoded)
    return parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, _NOTHING)


def encode_key_columns(spec: StoreSpec, table: pa.Table) -> list[bytes | None] | None:
    """Every row's encoded key (None where a key column is null), computed from the Arrow columns, or
    None if a column's Arrow type is not one this handles (the caller then encodes key by key)."""
    joined = _encoded_key_array(spec, table)
    if joined is None:
        return None
    keys: list[bytes | None] = joined.to_pylist()
    return keys


def _internal_column(column: pa.ChunkedArray, kind: str) -> list[Any]:
    """A key column's internal values: timestamps as epoch microseconds, others as they are."""
    if kind == "timestamp":
        if pa.types.is_timestamp(column.type) and column.type.unit != "us":
            column = column.cast(pa.timestamp("us", tz=column.type.tz))
        column = column.cast(pa.int64())
    values: list[Any] = column.to_pylist()
    return values


def internal_keys(spec: StoreSpec, table: pa.Table) -> list[Any]:
    """The internal key of every row (a tuple for composite keys; None where any key column is null)."""
    columns = [_internal_column(table.column(name), t.kind) for name, t in spec.key.columns]
    if len(columns) == 1:
        return columns[0]
    return [None if any(v is None for v in parts) else tuple(parts) for parts in zip(*columns)]


def _values(names: list[str], columns: list[list[Any]]) -> list[Any]:
    """Each row's value: the scalar of a one-column value, else a ``{column: value}`` map; None where
    the row deletes (its value, or every value column, is null)."""
    if len(columns) == 1:
        return columns[0]
    out: list[Any] = []
    for i in range(len(columns[0]) if columns else 0):
        record = {name: col[i] for name, col in zip(names, columns)}
        out.append(None if all(v is None for v in record.values()) else record)
    return out


def _value_objects(spec: StoreSpec, table: pa.Table) -> list[Any]:
    """Each row's value as stored before packing (None: the row deletes)."""
    names = [f.name for f in spec.value_fields]
    values = _values(names, [table.column(name).to_pylist() for name in names])
    if spec.windowed:
        ends = _internal_column(table.column(WINDOW_END_COLUMN), "timestamp")
        values = [None if v is None else [end, v] for end, v in zip(ends, values)]
    return values


def _packed_string_array(column: pa.ChunkedArray) -> pa.Array:
    """msgpack of each string of ``column`` (None for a null), built from the Arrow column: each header
    (fixstr, str8, str16 or str32 by length, as msgpack's packer picks) joined to the UTF-8 in one call,
    instead of a Python string per row packed one by one."""
    raw = column.combine_chunks().cast(pa.binary())
    lengths = _zero_for_null(pc.binary_length(raw))
    size = np.where(lengths < 32, 1, np.where(lengths < 256, 2, np.where(lengths < 65536, 3, 5)))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(size, out=offsets[1:])
    data = np.zeros(int(offsets[-1]), dtype=np.uint8)
    at = offsets[:-1]
    fix, s8, s16, s32 = size == 1, size == 2, size == 3, size == 5
    data[at[fix]] = 0xA0 | lengths[fix]
    data[at[s8]], data[at[s8] + 1] = 0xD9, lengths[s8]
    data[at[s16]] = 0xDA
    for i in range(2):
        data[at[s16] + 1 + i] = (lengths[s16] >> (8 * (1 - i))) & 0xFF
    data[at[s32]] = 0xDB
    for i in range(4):
        data[at[s32] + 1 + i] = (lengths[s32] >> (8 * (3 - i))) & 0xFF
    headers = pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    packed: pa.Array = pc.binary_join_element_wise(headers, raw, _NOTHING)
    return packed


def _strictly_increasing(keys: pa.Array | pa.ChunkedArray) -> bool:
    """Whether ``keys`` (no nulls) are in strictly increasing byte order: one vectorised comparison of
    neighbours, a millisecond or two for 250,000 keys (the sort, take and search for a key twice it
    spares in key order cost about 12 ms more: bench/apply_batch.py --order key)."""
    if len(keys) < 2:
        return True
    return bool(pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py())


def _binary_array(values: list[bytes | None]) -> pa.Array:
    """A binary Arrow array of ``values`` (None: null), built from buffers (``pa.array`` of Python objects
    would import pandas)."""
    lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("a slice's packed values exceed 2 GiB")
    data = pa.py_buffer(b"".join(v for v in values if v is not None))
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    nulls = len(values) - int(present.sum())
    validity = pa.py_buffer(np.packbits(present, bitorder="little").tobytes()) if nulls else None
    return pa.Array.from_buffers(
        pa.binary(), len(values), [validity, pa.py_buffer(offsets.astype(np.int32).tobytes()), data], null_count=nulls
    )


def _packed(spec: StoreSpec, table: pa.Table) -> pa.Array | list[bytes | None]:
    """Each row's packed value, null (None) where the row deletes (see ``rows_from_arrow``): a binary Arrow
    array when the values were packed from the Arrow column, else the packer's list (made into Arrow only
    if the rows are shared: ``BatchRows.shareable``)."""
    if not spec.windowed and len(spec.value_fields) == 1:
        column = table.column(spec.value_fields[0].name)
        if pa.types.is_string(column.type) or (
            pa.types.is_large_string(column.type) and (pc.sum(pc.binary_length(column)).as_py() or 0) < 2**31 - 2**26
        ):
            return _packed_string_array(column)
    values = _value_objects(spec, table)
    packed: list[bytes | None] = list(encode_values(values))  # one packer for the batch
    if None in values:
        packed = [None if value is None else raw for value, raw in zip(values, packed)]
    return packed


def packed_values(spec: StoreSpec, table: pa.Table) -> list[bytes | None]:
    """Each row's packed value, or None where the row deletes (see ``rows_from_arrow``)."""
    packed = _packed(spec, table)
    return packed if isinstance(packed, list) else packed.to_pylist()


def rows_from_arrow(spec: StoreSpec, table: pa.Table) -> list[tuple[Any, bytes | None]]:
    """Turn an Arrow slice into ``(key, packed value or None)`` rows, in the slice's order.

    A one-column value is stored as the scalar; several columns as a ``{column: value}`` map; a window
    or session store stores ``[window end, value]``. A null value (every value column null) is a delete.
    Rows with a null key are dropped, as Kafka Streams drops records with a null key.
    """
    keys = internal_keys(spec, table)
    values = _value_objects(spec, table)
    # One packer for the batch; nulls (deletes) are packed too and dropped below, cheaper than a filter.
    packed = encode_values(values)
    if None not in keys and None not in values:  # the usual batch: no deletes, no null keys
        return list(zip(keys, packed))
    rows: list[tuple[Any, bytes | None]] = []
    dropped = 0
    for key, value, raw in zip(keys, values, packed):
        if key is None:
            dropped += 1
        else:
            rows.append((key, None if value is None else raw))
    if dropped:
        warn_null_keys(spec, dropped)
    return rows


def warn_null_keys(spec: StoreSpec, dropped: int) -> None:
    log.warning("store %s: dropped %d rows with a null key", spec.name, dropped, extra={"store": spec.name})


@dataclass(frozen=True)
class WrittenFile:
    """A partition's batch as the SST file one copy of the partition wrote and ingested (the rocksdb
    engine): ``data``, the file's bytes (the rows, and the engine's metadata after the batch), and that
    copy's ``(source, batch_id, count)`` ``before`` and ``after`` the batch. A copy in the ``before`` state
    holds the same rows, so it ingests the same bytes instead of writing the rows itself."""

    data: bytes
    before: tuple[str | None, int, int]
    after: tuple[str | None, int, int]


@dataclass(frozen=True)
class EncodedSlice:
    """A partition's slice as ``BatchRows.encoded`` gives it: ``keys`` encoded (each once, in byte order),
    ``values`` packed (null: delete), and ``rows``, the ``BatchRows``' length it was made from (rows with a
    key, before each key's last write was kept: the rows-applied count); with ``written``, the file the copy
    that made it wrote of the batch (a rocksdb engine's large batch)."""

    keys: pa.Array
    values: pa.Array
    rows: int
    written: WrittenFile | None = None  # the file its copy wrote of it, if it wrote one

    @property
    def num_rows(self) -> int:
        return len(self.keys)


Slice: TypeAlias = "pa.Table | EncodedSlice"  # what a partition's copy is handed for one batch


class BatchRows(Sequence[tuple[Any, "bytes | None"]]):
    """The rows of one partition's slice: ``(key, packed value or None)``, null keys dropped (see
    ``runtime.query.rows_from_arrow``), with ``encoded`` for engines that store keys as bytes. The slice
    is a micro-batch's, or the ``EncodedSlice`` another copy of the partition made of one."""

    __slots__ = ("spec", "table", "_rows", "_encoded", "_arrays", "_length", "share_written", "written")

    def __init__(self, spec: StoreSpec, table: Slice) -> None:
        self.spec = spec
        self.table = table
        self._rows: list[tuple[Any, bytes | None]] | None = None
        self._encoded: tuple[list[bytes], list[bytes | None]] | None = None
        self._arrays: tuple[pa.Array | pa.ChunkedArray, pa.Array | list[bytes | None]] | None = None
        self._length: int
        # Set by whoever shares these rows: an engine that writes them as a file keeps it in ``written``
        # (as it does the file of ``written_elsewhere`` when it ingested that one).
        self.share_written = False
        self.written: WrittenFile | None = None
        if isinstance(table, EncodedSlice):
            self._arrays = (table.keys, table.values)
            self._length = table.rows
            return
        nulls = 0
        if table.num_rows:
            valid = None
            for name, _ in spec.key.columns:
                ok = pc.is_valid(table.column(name))
                valid = ok if valid is None else pc.and_(valid, ok)
            nulls = table.num_rows - pc.sum(valid).as_py() if valid is not None else 0
        self._length = int(table.num_rows - nulls)

    def rows(self) -> list[tuple[Any, bytes | None]]:
        if self._rows is None:
            if isinstance(self.table, EncodedSlice):
                # Here, not at the top: importing runtime.engines runs its package, which imports this module.
                from runtime.engines.keycodec import KeyCodec

                decode = KeyCodec(self.spec.key).decode
                keys, values = self.encoded() or ([], [])
                self._rows = [(decode(k), v) for k, v in zip(keys, values)]
            else:
                self._rows = rows_from_arrow(self.spec, self.table) if self.table.num_rows else []
        return self._rows

    def _encoded_arrays(self) -> tuple[pa.Array | pa.ChunkedArray, pa.Array | list[bytes | None]] | None:
        """Encoded keys as Arrow, and packed values as Arrow or a list (see ``encoded``); or None."""
        if self._arrays is None:
            if not self.table.num_rows:
                self._arrays = (_binary_array([]), _binary_array([]))
                return self._arrays
            table = self.table
            assert isinstance(table, pa.Table)  # an EncodedSlice came with its arrays
            joined = _encoded_key_array(self.spec, table)
            if joined is None:
                return None
            if self._length == len(joined) and _strictly_increasing(joined):
                # Already in key order, each key once, none null: what Spark hands over from a sort-based
                # aggregation (``max_by``, as latest-value stores use) in one shuffle partition.
                self._arrays = (joined, _packed(self.spec, table))
                return self._arrays
            order = pc.sort_indices(joined)  # stable; nulls (null keys) last
            if self._length != len(order):
                warn_null_keys(self.spec, len(order) - self._length)
                order = order.slice(0, self._length)
            ordered = joined.take(order)
            if len(ordered) > 1:
                last_of_run = pc.not_equal(ordered.slice(0, len(ordered) - 1), ordered.slice(1))
                if not pc.all(last_of_run).as_py():
                    keep = pa.concat_arrays([*last_of_run.chunks, pa.array([True])])
                    order, ordered = order.filter(keep), ordered.filter(keep)
            self._arrays = (ordered, _packed(self.spec, table.take(order)))
        return self._arrays

    def encoded(self) -> tuple[list[bytes], list[bytes | None]] | None:
        """The rows as encoded keys and packed values (None: delete), null keys dropped, each key once (its
        last row in the slice: the last write wins), in the keys' byte order; None when the key columns'
        types need the key-by-key path (then use the tuples).

        Byte order because RocksDB takes a write batch in key order several times faster than in Spark's
        hash order (its memtable inserts, and the presence multi-get, walk memory in order), and Arrow's
        stable sort of the encoded keys costs less than the difference. The sort is stable, so a key's
        rows stay in the slice's order next to each other, and keeping the last of each run takes one
        vectorised comparison of neighbours (a key is in a batch once as a rule: Spark's update output)."""
        if self._encoded is None:
            arrays = self._encoded_arrays()
            if arrays is None:
                return None
            keys: list[bytes] = arrays[0].to_pylist()
            values = arrays[1] if isinstance(arrays[1], list) else arrays[1].to_pylist()
            self._encoded = (keys, values)
        return self._encoded

    def has_deletes(self) -> bool:
        """Whether a row of ``encoded`` deletes (its value is None), from the Arrow values' null count when
        they were packed from Arrow (no look at each value)."""
        arrays = self._encoded_arrays()
        if arrays is None or isinstance(arrays[1], list):
            return None in (self.encoded() or ([], []))[1]
        return bool(arrays[1].null_count)

    def shareable(self) -> EncodedSlice | None:
        """The rows as an ``EncodedSlice``, for another copy of the partition to apply without encoding
        them again; None when the key columns' types need the key-by-key path."""
        if isinstance(self.table, EncodedSlice):
            return self.table
        arrays = self._encoded_arrays()
        if arrays is None:
            return None
        keys = arrays[0].combine_chunks() if isinstance(arrays[0], pa.ChunkedArray) else arrays[0]
        values = _binary_array(arrays[1]) if isinstance(arrays[1], list) else arrays[1]
        return EncodedSlice(keys, values, self._length)

    def written_elsewhere(self) -> WrittenFile | None:
        """The file another copy of the partition wrote of these rows, if they came with one."""
        return self.table.written if isinstance(self.table, EncodedSlice) else None

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> tuple[Any, bytes | None]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[Any, bytes | None]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self.rows()[index]

    def __iter__(self) -> Iterator[tuple[Any, bytes | None]]:
        return iter(self.rows())
