"""The value codec: values are stored and carried between verticles as msgpack bytes.

Spark hands values over as Arrow; the query actor turns each into a plain Python value (a scalar for a
one-column value, a ``{column: value}`` map for several) and packs it. Types msgpack has no native form
for are turned into their JSON-friendly form once, here, so REST and Python callers see the same value:
timestamps and dates as ISO-8601 strings, decimals as strings, bytes stay bytes (base64 in JSON).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
from collections.abc import Iterable
from typing import Any

import msgpack
import orjson

__all__ = [
    "encode_value",
    "encode_values",
    "decode_value",
    "to_json",
    "to_jsonable",
    "json_default",
    "encode_json",
]


def _default(obj: Any) -> Any:
    if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
        return obj.isoformat()
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    if isinstance(obj, _dt.timedelta):
        return obj.total_seconds()
    raise TypeError(f"cannot encode a value of type {type(obj).__name__}")


def encode_value(value: Any) -> bytes:
    """Pack a value as msgpack."""
    packed: bytes = msgpack.packb(value, default=_default, use_bin_type=True)
    return packed


def encode_values(values: Iterable[Any]) -> list[bytes]:
    """``encode_value`` of each value, with one packer for all (a micro-batch's values: building a packer
    per value cost about six times the packing itself)."""
    packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)
    return list(map(packer.pack, values))


def decode_value(data: bytes) -> Any:
    """Unpack a value packed by ``encode_value``."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def json_default(obj: Any) -> Any:
    """What JSON has no type for: bytes as base64 text, datetimes ISO-8601, decimals as text."""
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
        return obj.isoformat()
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    raise TypeError(f"cannot encode a value of type {type(obj).__name__} as JSON")


# One encoder for every answer: json.dumps with options builds a new encoder per call, which dominated
# the cost of streaming entries. Tuples become arrays, non-string map keys strings, as usual for JSON.
# NaN and infinities raise (``allow_nan=False``) instead of producing text no JSON parser accepts; the REST
# renderer then spells them as strings (``encode_json`` below).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=json_default, allow_nan=False)


def to_json(value: Any) -> str:
    """Compact JSON of a decoded value or answer; bytes become base64 text, datetimes ISO-8601.
    ``ValueError`` for NaN or infinite floats."""
    return _ENCODER.encode(value)


def to_jsonable(value: Any) -> Any:
    """Make a decoded value JSON-serializable: bytes become base64 text, tuples lists, datetimes ISO-8601."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, _dt.datetime, _dt.date)):
        return json_default(value)
    return value


def _json_safe(value: Any) -> Any:
    """``value`` with what JSON cannot hold made text: only used once plain encoding has failed."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates
    if value is None or isinstance(value, (bool, int, float, bytes, _dt.date, _dt.time)):
        return value  # a finite float stays a number: it once became text whenever its answer held a NaN
    return str(value)


# orjson writes the same JSON as ``_ENCODER`` for every value a store holds (msgpack-decoded: str, int,
# float, bool, None, bytes, lists, maps with string or integer keys) at a tenth of its cost (0.3 against
# 5 us for an order), which was a tenth of a read replica's whole GET. Datetimes and dataclasses still go
# through ``json_default`` (ISO-8601 text, as before); integer map keys become strings, as ``json`` does.
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _non_finite(value: Any) -> bool:
    """Whether ``value`` holds a NaN or infinite float (which orjson writes as ``null``)."""
    if isinstance(value, float):
        return value != value or value in (math.inf, -math.inf)
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    if isinstance(value, (list, tuple)):
        return any(map(_non_finite, value))
    return False


def encode_json(body: Any) -> bytes:
    """``body`` as UTF-8 JSON; values plain JSON cannot hold (NaN, infinities, lone surrogates) are made
    text rather than failing. What the REST API answers with, and the lines of its NDJSON streams."""
    try:
        out: bytes = orjson.dumps(body, default=json_default, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: integers beyond 64 bits, lone surrogates, unknown types
        return _encode_json_exactly(body)
    if b"null" in out and _non_finite(body):
        return _encode_json_exactly(body)  # orjson wrote NaN as null; riqr spells it "NaN"
    return out


def _encode_json_exactly(body: Any) -> bytes:
    try:
        return to_json(body).encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError):
        return to_json(_json_safe(body)).encode("utf-8")
