"""Packed scan pages (runtime.pages): the owner's encoding, the facade's merge, and the Python blob."""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.catalog import StoreSpec, ValueField
from runtime.codec import encode_json, encode_value
from runtime.engines import Position, open_engine
from runtime.engines.keycodec import KeyCodec
from runtime.keys import KeySchema
from runtime.merge import merge_sorted
from runtime.pages import (
    MSGPACK,
    NDJSON,
    Run,
    cut,
    encode_page,
    external_keys,
    merge_runs,
    run_of,
)
from runtime.query import QueryCore
from runtime.scan import Bound, Scan

STRING = KeySchema("key", "string")
LONG = KeySchema("key", "long")
COMPOSITE = KeySchema("customer", "string", (("at", "timestamp"),))

values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.none(),
    st.booleans(),
    st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**63 - 1), max_size=3),
)


def _expected_line(key: Any, value: Any) -> bytes:
    return encode_json({"key": key, "value": value}) + b"\n"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(), values), max_size=20, unique_by=lambda kv: kv[0]))
def test_ndjson_pages_hold_the_lines_the_rest_api_renders(entries: list[tuple[str, Any]]) -> None:
    codec = KeyCodec(STRING)
    entries = sorted(entries)
    keys = [codec.encode(k) for k, _ in entries]
    page = encode_page(STRING, codec, keys, [encode_value(v) for _, v in entries], NDJSON, False)
    lines = run_of(page).columns[0]
    # The same JSON as the REST renderer's (floats may be spelled differently: 1e-05 and 0.00001 alike).
    assert [json.loads(line) for line in lines] == [json.loads(_expected_line(k, v)) for k, v in entries]
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30, unique=True))
def test_integer_keys_decode_in_bulk(ints: list[int]) -> None:
    codec = KeyCodec(LONG)
    ints.sort()
    assert external_keys(LONG, codec, [codec.encode(i) for i in ints]) == ints


def test_string_keys_with_nul_take_the_exact_path() -> None:
    codec = KeyCodec(STRING)
    keys = ["", "a", "a\x00", "a\x00b", "b\x00\x01"]
    assert external_keys(STRING, codec, [codec.encode(k) for k in keys]) == keys


def test_composite_timestamp_keys_round_trip_through_msgpack_blobs() -> None:
    codec = KeyCodec(COMPOSITE)
    internal = [("alice", 0), ("alice", 1_700_000_000_000_000), ("bob", 5)]
    page = encode_page(COMPOSITE, codec, [codec.encode(k) for k in internal], [encode_value(1)] * 3, MSGPACK, True)
    keys, values = run_of(page).columns
    entries = list(zip(map(tuple, keys), values))  # as Facade.entry_chunks makes them
    assert entries == [(COMPOSITE.external(k), 1) for k in internal]
    assert isinstance(entries[1][0][1], _dt.datetime) and entries[1][0][1].tzinfo is not None
    line = encode_page(COMPOSITE, codec, [codec.encode(internal[1])], [encode_value(1)], NDJSON, False).blob
    assert json.loads(line) == {"key": ["alice", "2023-11-14T22:13:20+00:00"], "value": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=4), max_size=10), max_size=4), st.booleans())
def test_merge_runs_is_merge_sorted(runs: list[list[bytes]], reverse: bool) -> None:
    sources = [sorted(set(r), reverse=reverse) for r in runs]
    expected = list(merge_sorted([[(k, i) for k in s] for i, s in enumerate(sources)], reverse=reverse))
    merged = merge_runs([Run(s, ([(k, i) for k in s],)) for i, s in enumerate(sources)], reverse=reverse)
    assert merged.columns[0] == expected and merged.keys == [k for k, _ in expected]


@given(st.lists(st.binary(max_size=3), unique=True), st.binary(max_size=3), st.booleans())
def test_cut_counts_keys_at_or_before_the_frontier(keys: list[bytes], frontier: bytes, reverse: bool) -> None:
    keys.sort(reverse=reverse)
    assert cut(keys, frontier, reverse) == sum(1 for k in keys if (k >= frontier if reverse else k <= frontier))


@pytest.mark.parametrize("engine", ["memory", "rocksdb"])
@pytest.mark.parametrize("reverse", [False, True])
def test_read_encoded_pages_through_any_bounds(engine: str, reverse: bool) -> None:
    e = open_engine(engine, STRING, Path(tempfile.mkdtemp()) / "p")
    try:
        keys = sorted({"", "a", "a\x00", "ab", "b", "ba", "c", "d\x00e", "zz"})
        e.apply(Position("s", 0), [(k, encode_value(i)) for i, k in enumerate(keys)])
        codec = KeyCodec(STRING)
        bounds = [None] + [Bound(k, inc) for k in ("a", "b", "bb", "zz") for inc in (True, False)]
        for lo in bounds:
            for hi in bounds:
                scan = Scan(lo, hi, reverse)
                want = [(codec.encode(k), v) for k, v in e.scan(scan)]
                for limit, max_bytes in ((None, 1 << 20), (1, 1 << 20), (None, 1), (2, 5)):
                    got: list[tuple[bytes, bytes]] = []
                    rest = scan
                    while True:
                        k, v, more = e.read_encoded(rest, limit, max_bytes)
                        got += zip(k, v)
                        if not more:
                            break
                        rest = rest.after(codec.decode(k[-1]))
                    assert got == want, (lo, hi, limit, max_bytes)
    finally:
        e.close()


@pytest.mark.parametrize("max_bytes", [1, 40, 1 << 20])
def test_an_owners_packed_pages_cover_its_partitions_in_order(max_bytes: int) -> None:
    spec = StoreSpec("s", STRING, (ValueField("v", "bigint"),), partitions=3)
    core = QueryCore(spec, [0, 1, 2])
    core.begin("src")
    slices = {
        p: pa.table({"key": [f"k{i:03d}" for i in range(p, 60, 3)], "v": list(range(p, 60, 3))}) for p in range(3)
    }
    core.apply("src", 0, slices)
    for reverse in (False, True):
        scan, lines = Scan(reverse=reverse), []
        codec = KeyCodec(STRING)
        while True:
            page, spans = core.scan_packed([0, 1, 2], scan, None, max_bytes, NDJSON)
            assert set(spans) == {0, 1, 2}
            lines += run_of(page).columns[0]
            if not page.more:
                break
            scan = scan.after(codec.decode(page.keys[-1]))
        order = sorted(range(60), reverse=reverse)
        assert lines == [_expected_line(f"k{i:03d}", i) for i in order]
