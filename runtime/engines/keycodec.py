"""Order-preserving bytes for internal keys: byte order (memcmp) equals the keys' Python order.

The persistent engine stores keys in RocksDB, which orders them by their bytes; scans and bounds only work
if those bytes sort exactly as the internal keys do. The encoding is driven by the store's ``KeySchema``
(the schema, not the bytes, says which type each column has), and it is reversible.

Layout: every component is a marker byte ``0x01`` followed by the component's bytes:

* string: UTF-8 (lone surrogates kept with ``surrogatepass``, so any Python ``str`` encodes), with each
  ``0x00`` written as ``0x00 0xFF``, then the terminator ``0x00 0x00``. UTF-8 byte order is code point order,
  and the terminator sorts below any continuation, so ``"a" < "a\\x00" < "ab"`` holds in bytes too; the
  encoding is prefix-free, so the components after a string never influence how two strings compare.
* integer and timestamp (epoch micros): the signed 64-bit value plus 2**63, as 8 big-endian bytes.

``TOP`` (the upper end of a partial composite bound) is the single marker byte ``0x02``: it sorts after
``0x01``, so ``(a, TOP)`` comes after every key starting with ``a``. A shorter tuple is a prefix of its
extensions' bytes, so it sorts before them, as in Python. Encoded keys never start with ``0x00``: the
persistent engine keeps its own metadata under that byte (``META_PREFIX``) where no key can collide.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any

from runtime.keys import TOP, KeySchema

__all__ = ["KeyCodec", "META_PREFIX", "KEYS_LO", "KEYS_HI"]

_COMPONENT = b"\x01"
_TOP = b"\x02"
META_PREFIX = b"\x00"
# Every encoded key k satisfies KEYS_LO <= k < KEYS_HI (it starts with the component marker).
KEYS_LO = _COMPONENT
KEYS_HI = _TOP

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_OFFSET = 2**63
_U64 = struct.Struct(">Q")


def _encode_str(value: Any) -> bytes:
    if type(value) is not str:
        raise TypeError(f"a string key column got {type(value).__name__} {value!r}")
    raw = value.encode("utf-8", "surrogatepass")
    if b"\x00" in raw:
        raw = raw.replace(b"\x00", b"\x00\xff")
    return raw + b"\x00\x00"


def _encode_int(value: Any) -> bytes:
    if type(value) is not int:
        raise TypeError(f"an integer key column got {type(value).__name__} {value!r}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"key component {value} does not fit a signed 64-bit integer")
    return _U64.pack(value + _OFFSET)


def _decode_str(data: bytes, at: int) -> tuple[str, int]:
    out = bytearray()
    while True:
        nul = data.index(b"\x00", at)
        out += data[at:nul]
        follower = data[nul + 1]
        if follower == 0x00:
            return out.decode("utf-8", "surrogatepass"), nul + 2
        if follower != 0xFF:
            raise ValueError("malformed string component in an encoded key")
        out += b"\x00"
        at = nul + 2


def _decode_int(data: bytes, at: int) -> tuple[int, int]:
    return _U64.unpack_from(data, at)[0] - _OFFSET, at + 8


_ENCODERS: dict[str, Callable[[Any], bytes]] = {"string": _encode_str, "integer": _encode_int, "timestamp": _encode_int}
_DECODERS: dict[str, Callable[[bytes, int], tuple[Any, int]]] = {
    "string": _decode_str,
    "integer": _decode_int,
    "timestamp": _decode_int,
}


class KeyCodec:
    """Encodes and decodes the internal keys (and scan bounds) of one key schema."""

    __slots__ = ("schema", "_composite", "_encoders", "_decoders", "_width")

    def __init__(self, schema: KeySchema) -> None:
        self.schema = schema
        kinds = [t.kind for _, t in schema.columns]
        self._composite = schema.composite
        self._encoders = [_ENCODERS[k] for k in kinds]
        self._decoders = [_DECODERS[k] for k in kinds]
        self._width = len(kinds)

    def encode(self, key: Any) -> bytes:
        """The key's bytes. Composite keys are tuples of 1..n components (fewer for bounds), and a tuple
        bound may end in ``TOP``. ``TypeError``/``ValueError`` for a key that does not fit the schema."""
        if not self._composite:
            if key is TOP:
                return _TOP
            return _COMPONENT + self._encoders[0](key)
        if type(key) is not tuple:
            raise TypeError(f"a composite key must be a tuple, got {type(key).__name__} {key!r}")
        if not 1 <= len(key) <= self._width + 1:
            raise ValueError(f"a key of this store has {self._width} components, got {len(key)}")
        parts = []
        for i, component in enumerate(key):
            if component is TOP:
                if i != len(key) - 1:
                    raise ValueError("TOP may only be the last component of a bound")
                parts.append(_TOP)
                break
            if i == self._width:
                raise ValueError(f"a key of this store has {self._width} components, got {len(key)}")
            parts.append(_COMPONENT)
            parts.append(self._encoders[i](component))
        return b"".join(parts)

    def encode_many(self, keys: Iterable[Any]) -> list[bytes]:
        """``encode`` of each key (a batch's keys: a single-column key skips the per-key dispatch)."""
        if self._composite:
            return [self.encode(k) for k in keys]
        encoder = self._encoders[0]
        out = []
        for key in keys:
            out.append(_TOP if key is TOP else _COMPONENT + encoder(key))
        return out

    def decode(self, data: bytes) -> Any:
        """The internal key (or bound) that ``encode`` turned into ``data``."""
        parts: list[Any] = []
        at = 0
        while at < len(data):
            marker = data[at]
            if marker == _TOP[0] and at == len(data) - 1:
                parts.append(TOP)
                break
            if marker != _COMPONENT[0] or len(parts) >= self._width:
                raise ValueError(f"bytes {data!r} are not a key of this schema")
            value, at = self._decoders[len(parts)](data, at + 1)
            parts.append(value)
        if not self._composite:
            if len(parts) != 1:
                raise ValueError(f"bytes {data!r} are not a key of this schema")
            return parts[0]
        return tuple(parts)
