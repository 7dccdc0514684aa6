"""Queries as values: built once at the edge (a REST request, a Python client call), carried unchanged to
the facade, and bound there against the store's schema into what owners execute (a ``Scan``).

* ``KeyQuery``: one key (``get``, and the metadata of the key's owner);
* ``RangeQuery``: ``all``, ``range`` and ``prefix``, in either direction;
* ``WindowQuery``: a window store's windows of a key or key range within a time range (Kafka Streams'
  ``fetch``/``backwardFetch``/``fetchAll``);
* ``SessionQuery``: a session store's sessions of a key or key range (``fetch``, ``findSessions``);
* ``PageRequest``: how much of a scan to return, and where to resume (a cursor).

Keys arrive either as Python values (the client) or as ``UrlKey``: the still percent-encoded text of a
URL, which only the store's key schema can split into components. The facade, which has the schema,
decodes it; the HTTP handler never needs to look the store up first.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol
from urllib.parse import unquote, unquote_plus

from runtime.catalog import StoreSpec
from runtime.config import MAX_KEY_CHARS, MAX_PAGE
from runtime.errors import InvalidParameter, KeyTooLong, MalformedKey, MalformedRange, RiqrError
from runtime.scan import Scan, prefix_scan
from runtime.windows import require_kind, session_scan, window_scan

__all__ = [
    "UrlKey",
    "KeyQuery",
    "RangeQuery",
    "WindowQuery",
    "SessionQuery",
    "ScanQuery",
    "PageRequest",
    "Page",
    "bind_key",
    "bind_partition_key",
    "check_limit",
]

# A '%' not followed by two hex digits is not percent-encoding.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _decode(text: str, *, in_query: bool) -> str:
    if len(text) > MAX_KEY_CHARS:
        raise KeyTooLong(f"the key is {len(text)} characters long in the URL; the limit is {MAX_KEY_CHARS}",
                         limit=MAX_KEY_CHARS)  # fmt: skip
    if _BAD_ESCAPE.search(text):
        raise MalformedKey(f"{text!r} has a '%' that is not followed by two hex digits", key=text)
    try:
        return (unquote_plus if in_query else unquote)(text, errors="strict")
    except UnicodeDecodeError:
        raise MalformedKey(f"{text!r} percent-encodes bytes that are not UTF-8", key=text) from None


@dataclass(frozen=True)
class UrlKey:
    """A key as written in a URL, still percent-encoded. A key of several columns is written as its
    components joined by '/', each percent-encoded on its own (so a '/' inside a component is '%2F');
    that is why it is split before decoding, which needs the store's schema."""

    raw: str
    in_query: bool = False

    def text(self) -> str:
        """The whole key decoded as one text (a prefix; a store name); ``MalformedKey`` for bad escapes."""
        return _decode(self.raw, in_query=self.in_query)

    def decode(self, columns: int) -> str | tuple[str, ...]:
        """The key's text (one column) or the texts of its components; ``MalformedKey`` for bad escapes."""
        if columns > 1:
            if len(self.raw) > MAX_KEY_CHARS:
                return self.text()  # refused for its length before it is split
            return tuple(_decode(part, in_query=self.in_query) for part in self.raw.split("/"))
        return self.text()


def _user_key(spec: StoreSpec, key: Any) -> Any:
    """A key in the form the key schema coerces: ``UrlKey`` decoded by the store's user key columns."""
    return key.decode(spec.user_key_columns) if isinstance(key, UrlKey) else key


def bind_key(spec: StoreSpec, key: Any) -> Any:
    """A whole key of ``spec`` in its internal form, or ``MalformedKey``."""
    return spec.key.coerce(_user_key(spec, key))


def bind_partition_key(spec: StoreSpec, key: Any) -> Any:
    """A key or its leading part (only the partition column decides the owner), internal form."""
    return spec.key.coerce_bound(_user_key(spec, key), upper=False)


def check_limit(limit: int, maximum: int = MAX_PAGE) -> int:
    """A page size a client asked for, or ``InvalidParameter``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise InvalidParameter(f"limit must be an integer between 1 and {maximum}", parameter="limit", maximum=maximum)
    return limit


@dataclass(frozen=True)
class KeyQuery:
    """One key of one store."""

    store: str
    key: Any


class ScanQuery(Protocol):
    """A query over a range of keys: it names its store and binds to a ``Scan`` given the store's spec."""

    # Which kind of scan this is ("range", "window", "session"): a cursor is valid only for its own kind.
    shape: ClassVar[str]

    @property
    def store(self) -> str: ...

    @property
    def reverse(self) -> bool | None: ...

    def bind(self, spec: StoreSpec) -> Scan: ...

    def backwards(self) -> ScanQuery:
        """The same query with ``reverse`` said: what one leaving it out asks beside a reverse scan's cursor."""
        ...

    def bare(self) -> ScanQuery:
        """The same kind of query on the same store with none of its parameters: a cursor given alone. A
        parameter given with its default value (``reverse=false``) is given: the query is not bare."""
        ...


@dataclass(frozen=True)
class RangeQuery:
    """``all`` (no bounds), ``range`` (``lo``/``hi`` inclusive, either optional) or ``prefix``."""

    shape: ClassVar[str] = "range"

    store: str
    lo: Any = None
    hi: Any = None
    prefix: str | None = None
    reverse: bool | None = None  # None: not given (forward, or a cursor's own direction)

    def bare(self) -> RangeQuery:
        return RangeQuery(self.store)

    def backwards(self) -> RangeQuery:
        return dataclasses.replace(self, reverse=True)

    def bind(self, spec: StoreSpec) -> Scan:
        key = spec.key
        bounded = self.lo is not None or self.hi is not None or self.prefix is not None
        if bounded and spec.windowed:
            raise InvalidParameter(
                f"store {spec.name!r} is a {spec.kind} store: use its {spec.kind} queries for key ranges",
                store=spec.name,
            )
        if self.prefix is not None:
            if self.lo is not None or self.hi is not None:
                raise InvalidParameter("a prefix scan cannot also have from/to bounds", store=spec.name)
            if key.type_name != "string":
                raise InvalidParameter(
                    f"prefix scans need a string key (or a string first key column); store {spec.name!r} has "
                    f"{key.type_label} keys",
                    store=spec.name,
                )
            return prefix_scan(self.prefix, reverse=_direction(self.reverse, spec), composite=key.composite)
        bounds = []
        for parameter, bound, upper in (("from", self.lo, False), ("to", self.hi, True)):
            try:
                bounds.append(None if bound is None else key.coerce_bound(_user_key(spec, bound), upper=upper))
            except KeyTooLong:
                raise
            except RiqrError as err:  # named as the window and session bounds are
                raise MalformedRange(err.message, store=spec.name, parameter=parameter) from None
        return Scan.closed(bounds[0], bounds[1], reverse=_direction(self.reverse, spec))


@dataclass(frozen=True)
class WindowQuery:
    """Windows of ``key`` (or of the keys in [``key_from``, ``key_to``], each optional) whose start lies
    in [``time_from``, ``time_to``] (datetimes or ISO-8601; None is open)."""

    shape: ClassVar[str] = "window"

    store: str
    key: Any = None
    key_from: Any = None
    key_to: Any = None
    time_from: Any = None
    time_to: Any = None
    reverse: bool | None = None  # None: not given (forward, or a cursor's own direction)

    def bare(self) -> WindowQuery:
        return WindowQuery(self.store)

    def backwards(self) -> WindowQuery:
        return dataclasses.replace(self, reverse=True)

    def bind(self, spec: StoreSpec) -> Scan:
        require_kind(spec, "window")
        return window_scan(
            spec,
            key=_maybe(spec, self.key),
            key_from=_maybe_bound(spec, self.key_from, "keyFrom"),
            key_to=_maybe_bound(spec, self.key_to, "keyTo"),
            time_from=self.time_from,
            time_to=self.time_to,
            reverse=_direction(self.reverse, spec),
        )


@dataclass(frozen=True)
class SessionQuery:
    """Sessions of ``key`` (or of a key range); with bounds, those ending at or after ``earliest_end`` and
    starting at or before ``latest_start`` (Kafka's ``findSessions``); ``reverse`` walks them backwards."""

    shape: ClassVar[str] = "session"

    store: str
    key: Any = None
    key_from: Any = None
    key_to: Any = None
    earliest_end: Any = None
    latest_start: Any = None
    reverse: bool | None = None  # None: not given (forward, or a cursor's own direction)

    def bare(self) -> SessionQuery:
        return SessionQuery(self.store)

    def backwards(self) -> SessionQuery:
        return dataclasses.replace(self, reverse=True)

    def bind(self, spec: StoreSpec) -> Scan:
        require_kind(spec, "session")
        return session_scan(
            spec,
            key=_maybe(spec, self.key),
            key_from=_maybe_bound(spec, self.key_from, "keyFrom"),
            key_to=_maybe_bound(spec, self.key_to, "keyTo"),
            earliest_end=self.earliest_end,
            latest_start=self.latest_start,
            reverse=_direction(self.reverse, spec),
        )


def _direction(reverse: Any, spec: StoreSpec) -> bool:
    """A scan's direction: ``reverse`` True, or False or None (not given) for forwards. Anything else from
    Python code is refused: ``bool()`` read ``reverse="false"`` as backwards."""
    if reverse is None or isinstance(reverse, bool):
        return bool(reverse)
    raise InvalidParameter(f"reverse must be True or False, got {reverse!r}", store=spec.name)


def _maybe(spec: StoreSpec, key: Any) -> Any:
    return None if key is None else _user_key(spec, key)


def _maybe_bound(spec: StoreSpec, key: Any, parameter: str) -> Any:
    """A key range's bound (``parameter``: ``keyFrom``, ``keyTo``): a malformed one is ``MalformedRange``
    naming it, as for ``range``."""
    try:
        return _maybe(spec, key)
    except KeyTooLong:
        raise
    except RiqrError as err:
        raise MalformedRange(err.message, parameter=parameter, store=spec.name) from None


@dataclass(frozen=True)
class PageRequest:
    """At most ``limit`` entries (None: the default page size) of a scan, from its start or, with a
    ``cursor``, from where the previous page ended (the cursor carries the scan: the query comes without
    parameters or with those of the query that issued it, ``Facade._bind``)."""

    limit: int | None = None
    cursor: str | None = None


class Lookup(NamedTuple):
    """A key's value and what it reflects: its partition, the source and the batch, as REST's
    ``X-Riqr-Position`` header says it (``partition=3; source=<id>; batch=41``)."""

    value: Any
    position: str


class Page(NamedTuple):
    """A page of a scan: its entries and the cursor of the next page (None after the last)."""

    entries: list[Any]
    next: str | None
