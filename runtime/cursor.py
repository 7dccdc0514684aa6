"""Cursors: the position of a paged scan as an opaque, authenticated token for clients.

A cursor is the scan (bounds, direction, time filter) plus the last key returned, so the next page starts
strictly after that key. Its body is msgpack naming the store and the kind of query that issued it,
deflated when that makes it shorter (a window scan of one key carries that key three times: in both
bounds and as the last key; deflated bodies start with a zero byte, which no msgpack array does); an
HMAC-SHA-256 tag (truncated to 128 bits, as RFC 4868 does for IPsec) keyed per deployment follows it, and
both travel as URL-safe base64: ``<body>.<tag>``. A cursor that does not fit in a URL (a scan's last key
of thousands of characters: keys the sink stored, not ones a URL could name) is still a valid cursor
for the Python API; over REST, the NDJSON stream reads such a store without one.

Why both a tag and validation: the tag makes a cursor unforgeable (any change is a 400 before anything is
unpacked), and it is keyed per deployment so every node's facades accept each other's cursors and a
restarted verticle keeps accepting the ones it issued. The body is still checked against the store's key
schema and the shape of its scans on decode, because a genuine cursor can outlive its store: a store
dropped and recreated under the same name with other key types must get a 400, never an error inside an
owner. With the same key types it must get a 400 too: the new store's keys before the cursor's last one
would be skipped without a word. So a cursor names one query actor of the store that issued it (its
``issuer``: the active copy of partition 0), and is taken only while that actor is in the store's lineage
(its copies now, and the ones moves replaced or ``riqr standbys`` removed): a store declared again has
new actors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import zlib
from collections.abc import Collection
from typing import Any

import msgpack

from runtime.catalog import StoreSpec
from runtime.errors import CursorOfAnotherStore, MalformedCursor
from runtime.keys import TOP, KeyType
from runtime.ownership import OwnershipTable
from runtime.scan import Bound, Scan, TimeFilter

__all__ = ["CursorCodec", "MAX_CURSOR_CHARS", "generate_cursor_key", "issuer_of"]

_CURSOR_VERSION = 2
_TOP_EXT = 1
_TAG_BYTES = 16
# Refused unread above this: far above a cursor a URL can carry (``MAX_URL_CHARS``), and room for the
# Python API's cursors after long stored keys.
MAX_CURSOR_CHARS = 65536
_DEFLATED = b"\x00"
_NOT_OURS = "the cursor is not one this server issued"


def issuer_of(table: OwnershipTable) -> str | None:
    """The query actor a cursor of ``table``'s store names: the active copy of the first partition that has
    one (a promotion keeps it as a standby, a move in ``moved_from``: in the lineage either way), else any
    copy; None for a table with no copy."""
    for owners in table.partitions:
        if owners.active is not None:
            return owners.active
    return min(table.all_owners(), default=None)


def generate_cursor_key() -> bytes:
    """A fresh 256-bit HMAC key for a deployment's cursors."""
    return secrets.token_bytes(32)


def _pack_default(obj: Any) -> Any:
    if obj is TOP:
        return msgpack.ExtType(_TOP_EXT, b"")
    raise TypeError(f"cannot put {type(obj).__name__} in a cursor")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TOP_EXT and data == b"":
        return TOP
    raise MalformedCursor(_NOT_OURS)


def _wire_key(key: Any) -> Any:
    return list(key) if isinstance(key, tuple) else key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CursorCodec:
    """Issues and checks the cursors of one deployment, keyed by ``key`` (see ``generate_cursor_key``).

    Without a key it makes a random one: cursors are then good only for this codec (unit tests, a
    facade used on its own).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else generate_cursor_key()
        if len(self._key) < 16:
            raise ValueError("a cursor key needs at least 128 bits")

    def __repr__(self) -> str:
        return "CursorCodec(key=<hidden>)"

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:_TAG_BYTES]

    def encode(
        self, store: str, shape: str, scan: Scan, last_key: Any, key_types: str | None = None, issuer: str | None = None
    ) -> str:
        """An opaque token continuing ``scan`` of ``store`` (issued by a ``shape`` query) after ``last_key``;
        ``key_types`` (the store's ``KeySchema.type_label``) and ``issuer`` (one query actor of the store,
        ``issuer_of``), when given, are checked by ``decode``."""
        hi = None if scan.hi is None else [_wire_key(scan.hi.key), scan.hi.inclusive]
        lo = None if scan.lo is None else [_wire_key(scan.lo.key), scan.lo.inclusive]
        times = None if scan.times is None else scan.times.to_wire()
        fields = [_CURSOR_VERSION, store, shape, scan.reverse, lo, hi, _wire_key(last_key), times]
        if key_types is not None or issuer is not None:
            fields.append(key_types)
        if issuer is not None:
            fields.append(issuer)
        body = msgpack.packb(fields, use_bin_type=True, default=_pack_default)
        if len(body) > 64:  # short bodies do not shrink
            deflated = _DEFLATED + zlib.compress(body, 9)
            body = deflated if len(deflated) < len(body) else body
        return f"{_b64(body)}.{_b64(self._tag(body))}"

    def decode(self, spec: StoreSpec, shape: str, token: str, lineage: Collection[str] | None = None) -> Scan:
        """The scan a cursor continues, already moved past its last key; ``MalformedCursor`` unless this
        deployment issued it for ``spec``'s store and a ``shape`` query, it fits the store's schema, and
        (given the store's ``lineage``, ``OwnershipTable.lineage``) the store that issued it is this one."""
        return self.decode_with_origin(spec, shape, token, lineage)[1]

    def decode_with_origin(
        self, spec: StoreSpec, shape: str, token: str, lineage: Collection[str] | None = None
    ) -> tuple[Scan, Scan]:
        """``(the scan that issued the cursor, that scan moved past its last key)``, checked as ``decode``."""
        body = self._verified_body(spec.name, token)
        try:
            if body[:1] == _DEFLATED:  # ours (the tag checked out), so its size is bounded by what we issue
                inflate = zlib.decompressobj()
                body = inflate.decompress(body[1:], 16 * MAX_CURSOR_CHARS)
                if not inflate.eof:
                    raise ValueError("not a whole deflated body")
            fields = msgpack.unpackb(body, raw=False, ext_hook=_ext_hook, strict_map_key=True)
            # The key's types and the issuer came later (a cursor issued before has eight or nine fields, and
            # is taken as it was).
            version, store, issued_for, reverse, lo, hi, last, times, *later = fields
        except MalformedCursor:
            raise MalformedCursor(_NOT_OURS, store=spec.name) from None
        except (ValueError, TypeError, zlib.error, msgpack.UnpackException):
            raise MalformedCursor(_NOT_OURS, store=spec.name) from None
        types = later[:1] if later and later[0] is not None else []
        issuer = later[1] if len(later) > 1 else None
        if version != _CURSOR_VERSION or store != spec.name or issued_for != shape or len(later) > 2:
            raise MalformedCursor(f"the cursor belongs to another query, not to this {shape} query of store "
                                  f"{spec.name!r}", store=spec.name)  # fmt: skip
        if types and types[0] != spec.key.type_label:
            # A store dropped and declared again with other key types: a long's bound read as a timestamp's
            # (both integers inside) would continue the scan from a meaningless place.
            raise MalformedCursor(
                f"the cursor was issued for store {spec.name!r} when its key was {types[0]}; it is "
                f"{spec.key.type_label} now (the store was declared again)",
                store=spec.name,
            )
        if issuer is not None and lineage is not None and issuer not in lineage:
            # Another store of that name, dropped and declared again since: it has other actors.
            raise CursorOfAnotherStore(
                f"the cursor was issued by an earlier store {spec.name!r}, dropped and declared again since: "
                "begin the scan again",
                store=spec.name,
            )
        try:
            scan = Scan(_bound(spec, lo), _bound(spec, hi), _flag(reverse), _times(spec, times))
            return scan, scan.after(_key(spec, last, whole=True))
        except _Invalid:
            raise MalformedCursor(f"the cursor does not fit store {spec.name!r}", store=spec.name) from None

    def _verified_body(self, store: str, token: Any) -> bytes:
        if isinstance(token, str) and len(token) > MAX_CURSOR_CHARS:
            # Issued after a page that ended at a very long stored key (``encode`` has no limit: its page is
            # right), or not ours: either way unread, and said so rather than "not one this server issued".
            raise MalformedCursor(
                f"the cursor is {len(token):,} characters long, over the limit of {MAX_CURSOR_CHARS:,} (a page "
                "that ends at a key of tens of thousands of characters gives one): read on with Store.iterate or "
                "the NDJSON stream (Accept: application/x-ndjson)",
                store=store,
                limit=MAX_CURSOR_CHARS,
            )
        if not isinstance(token, str) or token.count(".") != 1:
            raise MalformedCursor(_NOT_OURS, store=store)
        body_text, _, tag_text = token.partition(".")
        try:
            body, tag = _unb64(body_text), _unb64(tag_text)
        except (ValueError, binascii.Error):
            raise MalformedCursor(_NOT_OURS, store=store) from None
        if not hmac.compare_digest(tag, self._tag(body)):
            raise MalformedCursor(_NOT_OURS, store=store)
        return body


class _Invalid(Exception):
    """A cursor part that does not fit the store (turned into one ``MalformedCursor``)."""


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid
    return value


def _component(key_type: KeyType, value: Any) -> Any:
    """One key column's internal value, checked: text for strings, an integer in range otherwise."""
    if key_type.kind == "string" and isinstance(value, str):
        return value
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key_type.kind == "timestamp" and is_int:
        return value
    if key_type.kind == "integer" and is_int and key_type.lo <= value <= key_type.hi:
        return value
    raise _Invalid


def _key(spec: StoreSpec, value: Any, *, whole: bool) -> Any:
    """An internal key (``whole``) or bound of ``spec``: leading components, maybe ending with ``TOP``."""
    columns = [t for _, t in spec.key.columns]
    if not spec.key.composite:
        return _component(columns[0], value)
    if not isinstance(value, list) or not 1 <= len(value) <= len(columns):
        raise _Invalid
    if whole and len(value) != len(columns):
        raise _Invalid
    parts: list[Any] = []
    for i, part in enumerate(value):
        last = i == len(value) - 1
        parts.append(TOP if part is TOP and last and not whole else _component(columns[i], part))
    return tuple(parts)


def _bound(spec: StoreSpec, value: Any) -> Bound | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise _Invalid
    return Bound(_key(spec, value[0], whole=False), _flag(value[1]))


def _times(spec: StoreSpec, value: Any) -> TimeFilter | None:
    if value is None:
        return None
    if not spec.windowed or not isinstance(value, list) or len(value) != 3:
        raise _Invalid
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value):
        raise _Invalid
    return TimeFilter(*value)
