"""Cursors: the position of a paged scan as an opaque token for clients.

A cursor is the scan (bounds, direction, time filter) plus the last key returned, so the next page starts
strictly after that key; msgpack in URL-safe base64, naming its store (a cursor for another store is a 400).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgpack

from runtime.errors import MalformedCursor
from runtime.keys import TOP
from runtime.scan import Bound, Scan, TimeFilter

__all__ = ["encode_cursor", "decode_cursor"]

_CURSOR_VERSION = 1
_TOP_EXT = 1


def _pack_default(obj: Any) -> Any:
    if obj is TOP:
        return msgpack.ExtType(_TOP_EXT, b"")
    raise TypeError(f"cannot put {type(obj).__name__} in a cursor")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TOP_EXT:
        return TOP
    raise MalformedCursor("the cursor is not one this server issued")


def _wire_key(key: Any) -> Any:
    return list(key) if isinstance(key, tuple) else key


def encode_cursor(store: str, scan: Scan, last_key: Any) -> str:
    """An opaque token continuing ``scan`` of ``store`` after ``last_key``."""
    hi = None if scan.hi is None else [_wire_key(scan.hi.key), scan.hi.inclusive]
    lo = None if scan.lo is None else [_wire_key(scan.lo.key), scan.lo.inclusive]
    times = None if scan.times is None else scan.times.to_wire()
    packed = msgpack.packb(
        [_CURSOR_VERSION, store, scan.reverse, lo, hi, _wire_key(last_key), times],
        use_bin_type=True,
        default=_pack_default,
    )
    return base64.urlsafe_b64encode(packed).decode("ascii").rstrip("=")


def _key_from_wire(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def decode_cursor(store: str, token: str) -> Scan:
    """The scan a cursor continues, already moved past its last key. ``MalformedCursor`` if not ours."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, cursor_store, reverse, lo, hi, last, times = msgpack.unpackb(raw, raw=False, ext_hook=_ext_hook)
    except MalformedCursor:
        raise
    except (ValueError, TypeError, binascii.Error, msgpack.UnpackException):
        raise MalformedCursor("the cursor is not one this server issued", store=store) from None
    if version != _CURSOR_VERSION or cursor_store != store:
        raise MalformedCursor(f"the cursor belongs to another query, not to store {store!r}", store=store)
    scan = Scan(
        None if lo is None else Bound(_key_from_wire(lo[0]), bool(lo[1])),
        None if hi is None else Bound(_key_from_wire(hi[0]), bool(hi[1])),
        bool(reverse),
        None if times is None else TimeFilter(*times),
    )
    return scan.after(_key_from_wire(last))
