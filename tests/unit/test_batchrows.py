"""``runtime.batchrows``: keys encoded from Arrow columns are the key codec's bytes, and a rocksdb
partition fed ``BatchRows`` ends in the same state as one fed the row tuples."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa

from runtime.batchrows import BatchRows, encode_key_columns
from runtime.catalog import StoreSpec, ValueField
from runtime.engines import Position
from runtime.engines.keycodec import KeyCodec
from runtime.engines.rocks import RocksEngine
from runtime.keys import KeySchema
from runtime.query import internal_keys, rows_from_arrow


def _spec(key: KeySchema) -> StoreSpec:
    return StoreSpec("s", key, (ValueField("value", "string"),), partitions=1, actors=1)


def _same_as_codec(spec: StoreSpec, table: pa.Table) -> None:
    codec = KeyCodec(spec.key)
    expected = [None if k is None else codec.encode(k) for k in internal_keys(spec, table)]
    assert encode_key_columns(spec, table) == expected


def test_string_keys_encode_as_the_codec_does() -> None:
    keys = ["a", "", "a\x00b", "\x00", "żółw", "日本", None, "a\x00\x00"]
    _same_as_codec(_spec(KeySchema("key", "string")), pa.table({"key": keys, "value": ["v"] * len(keys)}))
    # Spark hands strings over as large_string with spark.sql.execution.arrow.useLargeVarTypes.
    large = pa.table(
        {"key": pa.array(keys, pa.large_string()), "value": pa.array(["v"] * len(keys), pa.large_string())}
    )
    _same_as_codec(_spec(KeySchema("key", "string")), large)
    composite = _spec(KeySchema("key", "string", (("n", "long"),)))
    _same_as_codec(composite, large.append_column("n", pa.array(range(len(keys)), pa.int64())))


def test_integer_and_timestamp_keys_encode_as_the_codec_does() -> None:
    ints = [0, -1, 1, 2**63 - 1, -(2**63), None, 42]
    _same_as_codec(_spec(KeySchema("key", "long")), pa.table({"key": ints, "value": ["v"] * len(ints)}))
    small = pa.array([3, -7, None], pa.int32())
    _same_as_codec(_spec(KeySchema("key", "long")), pa.table({"key": small, "value": ["v"] * 3}))
    when = [dt.datetime(2024, 1, 2, 3, 4, 5, 123000), None, dt.datetime(1960, 1, 1)]
    for unit in ("ms", "us"):
        column = pa.array(when, pa.timestamp(unit, tz="UTC"))
        _same_as_codec(_spec(KeySchema("key", "timestamp")), pa.table({"key": column, "value": ["v"] * 3}))


def test_composite_keys_encode_as_the_codec_does() -> None:
    spec = _spec(KeySchema("a", "string", (("b", "long"),)))
    table = pa.table({"a": ["x", "x\x00", None, "y"], "b": [1, -2, 3, None], "value": ["v"] * 4})
    _same_as_codec(spec, table)


def test_batch_rows_apply_like_tuples(tmp_path: Path) -> None:
    spec = _spec(KeySchema("key", "string"))
    first = pa.table({"key": ["b", "a", None, "c", "a"], "value": ["1", "2", "3", "4", "5"]})
    second = pa.table({"key": ["a", "c", "d"], "value": [None, "6", "7"]})
    assert len(BatchRows(spec, first)) == 4
    assert list(BatchRows(spec, first)) == rows_from_arrow(spec, first)
    engines = [RocksEngine(spec.key, tmp_path / name) for name in ("tuples", "batch")]
    for i, table in enumerate((first, second)):
        engines[0].apply(Position("s", i), rows_from_arrow(spec, table))
        engines[1].apply(Position("s", i), BatchRows(spec, table))
    try:
        a, b = engines
        assert a.count() == b.count() == 3
        assert [a.get(k) for k in "abcd"] == [b.get(k) for k in "abcd"]
        assert b.get("a") is None and b.get("c") is not None
    finally:
        for engine in engines:
            engine.close()


def test_encoded_rows_keep_each_keys_last_row_in_key_order() -> None:
    """What the rocksdb engine writes: each key once, its last row in the slice (a null value deletes),
    in the keys' byte order, null keys dropped; the same when the slice comes in several chunks."""
    import random

    from runtime.codec import encode_value

    spec = _spec(KeySchema("key", "string"))
    codec = KeyCodec(spec.key)
    rng = random.Random(11)
    for size in (1, 2, 5, 40, 300):
        keys = [rng.choice(["a", "b", "a\x00", "", "zz", None]) for _ in range(size)]
        values = [rng.choice(["x", "y", None]) for _ in range(size)]
        last: dict[str, str | None] = {}
        for k, v in zip(keys, values):
            if k is not None:
                last[k] = v
        expected = sorted((codec.encode(k), None if v is None else encode_value(v)) for k, v in last.items())
        table = pa.table({"key": keys, "value": values})
        for chunks in (table, pa.Table.from_batches(table.to_batches(max_chunksize=3))):
            encoded = BatchRows(spec, chunks).encoded()
            assert encoded is not None
            assert list(zip(*encoded)) == expected


def test_a_slice_already_in_key_order_is_not_sorted_again_and_encodes_the_same(monkeypatch: Any) -> None:
    """Spark hands a sort-based aggregation's output over in key order: one comparison of neighbours
    finds it so, and the sort is skipped. A key twice, or a null key, takes the sort as before."""
    import pyarrow.compute as pc

    from runtime.codec import encode_value

    spec = _spec(KeySchema("key", "string"))
    codec = KeyCodec(spec.key)
    keys = sorted({f"k{i}" for i in range(50)} | {"", "a", "a\x00", "żółw"}, key=codec.encode)
    values = [None if i % 7 == 0 else f"v{i}" for i in range(len(keys))]
    expected = [(codec.encode(k), None if v is None else encode_value(v)) for k, v in zip(keys, values)]
    sorts = []
    real_sort = pc.sort_indices
    monkeypatch.setattr(pc, "sort_indices", lambda *a, **k: sorts.append(1) or real_sort(*a, **k))
    in_order = pa.table({"key": keys, "value": values})
    for table in (in_order, pa.Table.from_batches(in_order.to_batches(max_chunksize=7))):
        rows = BatchRows(spec, table)
        assert list(zip(*(rows.encoded() or ([], [])))) == expected
        assert rows.has_deletes()
    assert sorts == []
    twice = pa.table({"key": ["a", "a", "b"], "value": ["1", "2", "3"]})
    assert list(zip(*(BatchRows(spec, twice).encoded() or ([], [])))) == [
        (codec.encode("a"), encode_value("2")),
        (codec.encode("b"), encode_value("3")),
    ]
    with_null = pa.table({"key": ["a", "b", None], "value": ["1", "2", "3"]})
    assert [k for k, _ in zip(*(BatchRows(spec, with_null).encoded() or ([], [])))] == [
        codec.encode("a"),
        codec.encode("b"),
    ]
    assert len(sorts) == 2
    assert not BatchRows(spec, twice).has_deletes()


def test_an_encoded_slice_applies_as_the_slice_it_was_made_of(tmp_path: Path) -> None:
    """What an active copy gets from its standby: the same state in a rocksdb partition (which takes the
    bytes as they are) and in a memory one (which decodes the keys), for several key and value types."""
    from runtime.batchrows import EncodedSlice
    from runtime.engines.memory import MemoryEngine

    composite = StoreSpec(
        "s", KeySchema("a", "string", (("b", "long"),)), (ValueField("n", "bigint"), ValueField("t", "string")),
        partitions=1, actors=1,
    )  # fmt: skip
    cases = [
        (
            _spec(KeySchema("key", "string")),
            pa.table({"key": ["b", "a", None, "c", "a"], "value": list("123") + [None, "5"]}),
        ),
        (_spec(KeySchema("key", "long")), pa.table({"key": [5, -3, 5, 2**40], "value": ["x", "y", "z", None]})),
        (
            composite,
            pa.table({"a": list("xxyx"), "b": [1, 2, 1, 1], "n": [1, None, 3, 4], "t": ["p", None, None, "q"]}),
        ),
    ]
    for i, (spec, table) in enumerate(cases):
        original = BatchRows(spec, table)
        shared = original.shareable()
        assert isinstance(shared, EncodedSlice) and shared.rows == len(original)
        copy = BatchRows(spec, shared)
        assert len(copy) == len(original)
        assert copy.encoded() == original.encoded()
        assert copy.shareable() is shared
        assert dict(copy.rows()) == dict(original.rows())
        for engines in (
            [RocksEngine(spec.key, tmp_path / f"{i}-{name}") for name in ("slice", "encoded")],
            [MemoryEngine(spec.key), MemoryEngine(spec.key)],
        ):
            engines[0].apply(Position("s", 0), BatchRows(spec, table))
            engines[1].apply(Position("s", 0), BatchRows(spec, shared))
            keys = [k for k, _ in original.rows()]
            assert engines[0].count() == engines[1].count()
            assert [engines[0].get(k) for k in keys] == [engines[1].get(k) for k in keys]
            for engine in engines:
                engine.close()


def test_string_values_pack_as_msgpack_does() -> None:
    from runtime.batchrows import packed_values
    from runtime.codec import encode_value

    spec = _spec(KeySchema("key", "string"))
    values = ["", "a", "x" * 31, "x" * 32, "ż" * 100, "y" * 255, "y" * 256, "z" * 65535, "z" * 65536, None, "日本"]
    table = pa.table({"key": [str(i) for i in range(len(values))], "value": values})
    assert packed_values(spec, table) == [None if v is None else encode_value(v) for v in values]
    assert packed_values(spec, table.slice(3, 4)) == [encode_value(v) for v in values[3:7]]
    large = table.set_column(1, "value", pa.array(values, pa.large_string()))
    assert packed_values(spec, large) == [None if v is None else encode_value(v) for v in values]


_NO_PANDAS = """
import pickle, sys, tempfile
from pathlib import Path
import pyarrow as pa
table = pa.ipc.open_file(sys.argv[1]).read_all()  # as a query actor gets a slice: Arrow buffers, no Python objects
import verticles.facade, verticles.http, verticles.query, verticles.registry, riqr.cli
from runtime.catalog import StoreSpec, ValueField
from runtime.keys import KeySchema
from runtime.query import QueryCore
for key, value in (("user", "name"), ("id", "name"), ("user", "id")):
    key_type = "string" if key == "user" else "long"
    value_field = ValueField(value, "string" if value == "name" else "bigint")
    spec = StoreSpec("s", KeySchema(key, key_type), (value_field,), partitions=1, actors=1)
    core = QueryCore(spec, [0], directory=Path(tempfile.mkdtemp()))
    core.apply("q", 0, {0: table})
    _, shared = core.apply_sharing("q", 1, {0: table})
    # As the sink hands a standby's encoded slice to the active copy: pickled (out of band, as Ray does).
    buffers = []
    data = pickle.dumps(shared[0], protocol=5, buffer_callback=buffers.append)
    core.apply("q", 2, {0: pickle.loads(data, buffers=buffers)})
    assert core.get_one(0, "b" if key == "user" else 2)[0] is not None
print("pandas" in sys.modules)
"""


def test_the_runtime_and_a_query_actors_apply_do_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on its first conversion of Python objects (``pa.scalar``, ``fill_null(0)``,
    ``to_numpy``): 0.3 s of CPU in every process of the runtime at start-up, and none needs it."""
    import subprocess
    import sys

    path = tmp_path / "slice.arrow"
    table = pa.table({"user": ["a", "b", None], "id": [1, 2, None], "name": ["x", "y" * 300, "z"]})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    done = subprocess.run([sys.executable, "-c", _NO_PANDAS, str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
