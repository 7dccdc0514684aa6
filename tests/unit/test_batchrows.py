"""``runtime.batchrows``: keys encoded from Arrow columns are the key codec's bytes, and a rocksdb
partition fed ``BatchRows`` ends in the same state as one fed the row tuples."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

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


def test_string_values_pack_as_msgpack_does() -> None:
    from runtime.batchrows import packed_values
    from runtime.codec import encode_value

    spec = _spec(KeySchema("key", "string"))
    values = ["", "a", "x" * 31, "x" * 32, "ż" * 100, "y" * 255, "y" * 256, "z" * 65535, "z" * 65536, None, "日本"]
    table = pa.table({"key": [str(i) for i in range(len(values))], "value": values})
    assert packed_values(spec, table) == [None if v is None else encode_value(v) for v in values]
    assert packed_values(spec, table.slice(3, 4)) == [encode_value(v) for v in values[3:7]]


_NO_PANDAS = """
import sys, tempfile
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
    core.apply("q", 1, {0: table})
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
