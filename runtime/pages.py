"""Packed scan pages: what an owner sends for a page of a key-value scan, and how the facade merges them.

A page of a large scan used to cross Ray as a list of ``(internal key, packed value)`` tuples, which the
facade then decoded, presented and encoded entry by entry: producing and carrying Python tuples, not
scanning, was the limit (docs/benchmarks.md, "Streaming a large scan"). A ``PackedPage`` instead carries

* ``keys``: each entry's sort key, the order-preserving bytes of ``runtime.engines.keycodec`` (memcmp
  order is key order, so pages of different owners merge by comparing bytes, and the RocksDB engine
  reads them as they are stored, without decoding a key);
* the entries, already in the form the caller wants, as blobs made with a few calls into C:
  ``ndjson``: one NDJSON line per entry, exactly the bytes the REST API streams, concatenated (JSON lines
  hold no raw newline, so ``splitlines`` gives the entries back); ``msgpack``: the external keys as one
  msgpack array and the stored values (already msgpack) behind one array header, for the Python API.

Pages are bounded by bytes (``config.PAGE_BYTES``) as well as by an optional entry count, and say whether
more may follow (``more``). The facade merges runs of several owners with one sort of the sort keys per
chunk (``merge_runs``) and writes NDJSON bytes without decoding values; ``Store.iterate`` merges the
msgpack pages the same way in the caller's own process (``runtime.facade.inprocess``).

Only key-value stores use packed pages; window and session stores keep the tuple pages (their time
filter and ``Windowed`` entries need decoded values).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import msgpack

from runtime.codec import encode_json, json_default
from runtime.engines.keycodec import KeyCodec
from runtime.keys import KeySchema

__all__ = [
    "FORMATS",
    "NDJSON",
    "MSGPACK",
    "PackedPage",
    "Run",
    "encode_page",
    "run_of",
    "merge_runs",
    "split_run",
    "cut",
    "external_keys",
    "json_values",
    "ndjson_lines",
]

NDJSON = "ndjson"
MSGPACK = "msgpack"
FORMATS = (NDJSON, MSGPACK)

_U32 = struct.Struct(">I")
_OFFSET = 2**63
_SIMPLE = frozenset({int, float, bool, type(None)})
# The C encoder behind ``json.JSONEncoder``, built once: building it per value dominated encoding.
_C_ENCODE: Any = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, json_default, json.encoder.encode_basestring, None, ":", ",", False, False, False
)
_ENCODE_STR: Any = json.encoder.encode_basestring


def _array_header(n: int) -> bytes:
    return b"\xdd" + _U32.pack(n)


@dataclass(frozen=True)
class PackedPage:
    """One owner's page of a key-value scan (see the module docstring). ``values`` is only for msgpack."""

    fmt: str
    keys: list[bytes]
    blob: bytes
    values: bytes = b""
    more: bool = False

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class Run:
    """Sorted entries in the facade: sort keys and, in parallel, one or more columns (NDJSON lines, or
    external keys and values), plus whether the source that produced them may have more."""

    keys: list[Any]
    columns: tuple[list[Any], ...]
    more: bool = False

    def __len__(self) -> int:
        return len(self.keys)


# -- the owner's side ---------------------------------------------------------------------------------


def external_keys(schema: KeySchema, codec: KeyCodec, keys: Sequence[bytes]) -> list[Any]:
    """The external keys of encoded ``keys``; a string or integer key schema decodes in a few C calls."""
    if not keys:
        return []
    if not schema.composite:
        joined = b"".join(keys)
        kind = schema.type.kind
        if kind == "string" and b"\x00\xff" not in joined:
            # Without escaped NULs, every key is 0x01, its UTF-8, then 0x00 0x00.
            text = joined.decode("utf-8", "surrogatepass")
            parts = text[1:-2].split("\x00\x00\x01")
            if len(parts) == len(keys):
                return parts
        elif kind == "integer" and len(joined) == 9 * len(keys):
            return [v - _OFFSET for v in struct.unpack(">" + "xQ" * len(keys), joined)]
    external = schema.external
    decode = codec.decode
    return [external(decode(k)) for k in keys]


def json_values(values: list[Any]) -> list[str]:
    """Each value as compact JSON, as ``runtime.codec.to_json`` would write it. ``ValueError`` or
    ``TypeError`` for a value plain JSON cannot hold (the caller then takes the exact slow path)."""
    if not values:
        return []
    types = set(map(type, values))
    if types <= _SIMPLE:
        # Numbers, booleans and null never contain a comma: one encoding of the list, split.
        text: str = "".join(_C_ENCODE(values, 0))
        return text[1:-1].split(",")
    if types == {str}:
        return [_ENCODE_STR(v) for v in values]
    return ["".join(_C_ENCODE(v, 0)) for v in values]


def ndjson_lines(keys_json: list[str], values_json: list[str]) -> str:
    """``{"key":K,"value":V}`` lines, joined with a few list operations rather than one format per entry."""
    n = len(keys_json)
    parts: list[str] = [""] * (5 * n)
    parts[0::5] = ['{"key":'] * n
    parts[1::5] = keys_json
    parts[2::5] = [',"value":'] * n
    parts[3::5] = values_json
    parts[4::5] = ["}\n"] * n
    return "".join(parts)


def _decode_values(values: Sequence[bytes]) -> list[Any]:
    decoded: list[Any] = msgpack.unpackb(_array_header(len(values)) + b"".join(values), raw=False, strict_map_key=False)
    return decoded


def _ndjson_blob(external: list[Any], values: Sequence[bytes]) -> bytes:
    decoded = _decode_values(values)
    try:
        if all(type(k) is str for k in external):
            keys_json = [_ENCODE_STR(k) for k in external]
        else:
            keys_json = json_values(external)
        return ndjson_lines(keys_json, json_values(decoded)).encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError):
        # NaN, lone surrogates, a key type the fast path does not know: the REST renderer's own encoding.
        return b"".join(encode_json({"key": k, "value": v}) + b"\n" for k, v in zip(external, decoded))


def _key_default(obj: Any) -> Any:
    return json_default(obj)


def encode_page(
    schema: KeySchema, codec: KeyCodec, keys: list[bytes], values: list[bytes], fmt: str, more: bool
) -> PackedPage:
    """An owner's page of ``keys`` (encoded, in scan order) and their stored ``values``, in ``fmt``."""
    external = external_keys(schema, codec, keys)
    if fmt == NDJSON:
        return PackedPage(fmt, keys, _ndjson_blob(external, values), more=more)
    if fmt == MSGPACK:
        packed = msgpack.packb(external, use_bin_type=True, datetime=True, default=_key_default)
        return PackedPage(fmt, keys, packed, _array_header(len(values)) + b"".join(values), more=more)
    raise ValueError(f"unknown page format {fmt!r}")


# -- the facade's side --------------------------------------------------------------------------------


def run_of(page: PackedPage) -> Run:
    """The entries of an owner's page as a ``Run``: NDJSON lines, or (external keys, values) columns."""
    if page.fmt == NDJSON:
        return Run(page.keys, (page.blob.splitlines(keepends=True),), page.more)
    keys = msgpack.unpackb(page.blob, raw=False, timestamp=3)
    values = msgpack.unpackb(page.values, raw=False, strict_map_key=False)
    return Run(page.keys, (keys, values), page.more)


def cut(keys: list[Any], frontier: Any, reverse: bool) -> int:
    """How many leading ``keys`` (sorted in scan order, descending if ``reverse``) are at or before
    ``frontier`` in scan order: a binary search."""
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        before = keys[mid] >= frontier if reverse else keys[mid] <= frontier
        if before:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _take(column: list[Any], order: list[int]) -> list[Any]:
    if len(order) == 1:
        return [column[order[0]]]
    return list(itemgetter(*order)(column))


def merge_runs(runs: Sequence[Run], *, reverse: bool = False) -> Run:
    """The entries of ``runs`` (each sorted in scan order) in one sorted run. One sort of the sort keys:
    Python's sort finds the runs already sorted and merges them, in C. A key found in more than one run
    (a partition moving while a scan runs) keeps the entry of the first run, as ``runtime.merge`` does."""
    live = [r for r in runs if r.keys]
    if not live:
        width = len(runs[0].columns) if runs else 1
        return Run([], tuple([] for _ in range(width)))
    if len(live) == 1:
        return Run(list(live[0].keys), tuple(list(c) for c in live[0].columns))
    keys: list[Any] = []
    columns: tuple[list[Any], ...] = tuple([] for _ in live[0].columns)
    for run in live:
        keys.extend(run.keys)
        for merged, column in zip(columns, run.columns):
            merged.extend(column)
    # Stable, also with reverse=True: of equal keys, the earlier run's entry comes first.
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)
    if len(set(keys)) != len(keys):
        seen: set[Any] = set()
        order = [i for i in order if not (keys[i] in seen or seen.add(keys[i]))]  # type: ignore[func-returns-value]
    return Run(_take(keys, order), tuple(_take(c, order) for c in columns))


def split_run(run: Run, at: int) -> tuple[Run, Run]:
    """The first ``at`` entries of ``run`` and the rest (which keeps ``more``)."""
    head = Run(run.keys[:at], tuple(c[:at] for c in run.columns))
    tail = Run(run.keys[at:], tuple(c[at:] for c in run.columns), run.more)
    return head, tail
