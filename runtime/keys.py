"""Key schemas: parsing keys, their order, their canonical bytes, and the matching Spark SQL expression.

A store's key is one or more columns of the DataFrame it was materialized from. The first column is the
*partition key*: only it decides the partition, so every key sharing it (all bookings of one customer,
all windows of one user) lives in one partition and a query over them asks one owner.

Each column's type decides:

* how it is written in a URL and parsed (``parse``): ``"10"`` is the integer 10 for a ``long`` column,
  ``2026-01-01T10:00:00Z`` a timestamp;
* its internal value, which orders the keys: code points for strings, numbers for integers, epoch
  microseconds for timestamps; a composite key is a tuple and orders column by column;
* its *canonical bytes* for the partitioner: UTF-8 of a string, ASCII decimal of an integer or of a
  timestamp's epoch microseconds (documented in docs/partitioning.md, computable in any language);
* the Spark SQL expression producing the same bytes on the write path (``spark_canonical_sql``).

Answers show keys in their *external* form: timestamps as timezone-aware ``datetime`` (ISO-8601 in JSON),
composite keys as tuples (JSON arrays).
"""

from __future__ import annotations

import datetime as _dt
import numbers
import re
from dataclasses import dataclass
from typing import Any

from runtime.errors import MalformedKey, SchemaError

__all__ = [
    "INTEGER_TEXT",
    "MAX_INTEGER_CHARS",
    "KeyType",
    "KeySchema",
    "STRING",
    "LONG",
    "INT",
    "TIMESTAMP",
    "TOP",
    "InstantOutOfRange",
    "TooPrecise",
    "key_type_for_spark",
    "micros_to_datetime",
]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


class _Top:
    """Sorts after every key component: the upper end of a prefix bound. One instance, ``TOP``."""

    _instance: _Top | None = None

    def __new__(cls) -> _Top:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> str:
        return "TOP"

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return other is not self

    def __le__(self, other: object) -> bool:
        return other is self

    def __ge__(self, other: object) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return 0x70B

    def __repr__(self) -> str:
        return "TOP"


TOP = _Top()


# The fraction of a second of an ISO-8601 time ("10:00:00.123456789", or basic "100000,5"): Python 3.11's
# fromisoformat reads any number of its digits and drops those past the sixth.
_FRACTION = re.compile(r"\d{2}:?\d{2}:?\d{2}[.,](\d+)")


class TooPrecise(MalformedKey):
    """A timestamp with digits past the microsecond that are not zero (a Java ``Instant`` or Go's
    RFC3339Nano may have nanoseconds): no stored key has them, and read as the microsecond below, a lower
    bound would let in keys before it and a lookup find another key. Refused, never truncated."""


class InstantOutOfRange(MalformedKey):
    """A timestamp whose instant falls outside years 1 to 9999 in UTC (an offset can move a date written
    inside them outside): Spark's timestamps cannot hold it, and no ``datetime`` can give it back."""


def _too_precise(text: str, type_name: str) -> TooPrecise:
    return TooPrecise(
        f"timestamp {text!r} has digits past the microsecond; riqr's timestamps hold microseconds, as Spark's "
        "do: write at most 6 fractional digits (a lower bound rounded up, an upper bound down)",
        key=text,
        type=type_name,
    )


def micros_to_datetime(micros: int) -> _dt.datetime:
    return _EPOCH + _dt.timedelta(microseconds=micros)


def _datetime_to_micros(value: _dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)  # naive timestamps are UTC, as Spark's session time zone here
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# The instants a key may name: years 1 to 9999 in UTC, Spark's TimestampType's range and the only ones a
# ``datetime`` can give back. An offset can move a date written inside them outside ("9999-12-31T23:59:59-01:00"):
# such a key is refused as malformed, never stored or looked up (its answer could not be written back).
_MIN_MICROS = _datetime_to_micros(_dt.datetime.min.replace(tzinfo=_dt.UTC))
_MAX_MICROS = _datetime_to_micros(_dt.datetime.max.replace(tzinfo=_dt.UTC))


# An integer as text, in a URL or a query parameter: ASCII digits with an optional sign, as Java's
# Long.parseLong reads them (Python's int() also takes "1_0", " 10 " and other scripts' digits), and no
# longer than MAX_INTEGER_CHARS (a sign and 19 digits fit any 64-bit integer, leading zeros aside; int()
# refuses over 4,300 digits).
INTEGER_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
MAX_INTEGER_CHARS = 64


@dataclass(frozen=True)
class KeyType:
    """A supported key column type: its name in the catalog, its kind and bounds."""

    name: str
    kind: str = "string"  # string | integer | timestamp
    lo: int = 0
    hi: int = 0

    def parse(self, text: str) -> Any:
        """The internal value of a key written as text, or ``MalformedKey``."""
        if self.kind == "string":
            return text
        if self.kind == "timestamp":
            return self._parse_timestamp(text)
        # One spelling per key in a URL: INTEGER_TEXT.
        if INTEGER_TEXT.fullmatch(text) is None:
            # A '+' sign sent raw in a query string arrives as a space (form encoding): say so.
            plus = " (a '+' in a query string arrives as a space: write it %2B, or leave it out)"
            hint = plus if text.startswith(" ") and INTEGER_TEXT.fullmatch("+" + text[1:]) else ""
            raise MalformedKey(f"key {text!r} is not a valid {self.name}{hint}", key=text, type=self.name)
        if len(text) > MAX_INTEGER_CHARS:
            raise MalformedKey(f"key {text[:24]!r}... is out of range for {_a(self.name)} key", key=text[:24],
                               type=self.name)  # fmt: skip
        return self._check_int(int(text, 10), text)

    def _check_int(self, value: int, shown: Any) -> int:
        if not self.lo <= value <= self.hi:
            raise MalformedKey(f"key {shown!r} is out of range for {_a(self.name)} key", key=str(shown), type=self.name)
        return value

    def _parse_timestamp(self, text: str) -> int:
        if len(text) > 6 and text[-6] == " " and text[-3] == ":":
            # "+01:00" in a query string arrives as " 01:00" ('+' means space there); a space is
            # never valid in that position, so read it as the '+' the caller meant.
            text = text[:-6] + "+" + text[-5:]
        elif len(text) > 5 and text[-5] == " " and text[-4:].isdigit() and ":" in text[:-5]:
            # The same for ISO-8601's basic offset, "+0100", after a time ("2026-01-31 0100", a date and
            # a basic time, is left as it is).
            text = text[:-5] + "+" + text[-4:]
        # Every fraction: the time's, and an offset's ("+01:00:00.1234567", which fromisoformat reads too).
        if any(fraction.group(1)[6:].strip("0") for fraction in _FRACTION.finditer(text)):
            raise _too_precise(text, self.name)
        try:
            parsed = _dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            raise MalformedKey(
                f"key {text!r} is not an ISO-8601 timestamp (for example 2026-01-31T10:00:00Z)",
                key=text,
                type=self.name,
            ) from None
        return self._instant(parsed, text)

    def _instant(self, value: _dt.datetime, shown: Any) -> int:
        micros = _datetime_to_micros(value)
        if not _MIN_MICROS <= micros <= _MAX_MICROS:
            raise InstantOutOfRange(
                f"timestamp {shown!r} is out of range: it falls outside years 1 to 9999 in UTC",
                key=str(shown),
                type=self.name,
            )
        return micros

    def coerce(self, value: Any) -> Any:
        """The internal value of a key given by a caller: text, or a Python value of the right type."""
        if isinstance(value, str):
            return self.parse(value)
        if self.kind == "integer" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return self._check_int(int(value), value)  # numpy's and pandas' integers too, as plain ints
        if self.kind == "timestamp" and isinstance(value, _dt.datetime):
            if getattr(value, "nanosecond", 0):  # a pandas Timestamp: its nanoseconds are past a datetime's
                raise _too_precise(str(value), self.name)
            return self._instant(value, value.isoformat())
        raise MalformedKey(
            f"key {value!r} of type {type(value).__name__} does not fit {_a(self.name)} key", type=self.name
        )

    def external(self, value: Any) -> Any:
        """The form callers see: a ``datetime`` for timestamps, the value itself otherwise."""
        if self.kind == "timestamp" and isinstance(value, int):
            return micros_to_datetime(value)
        return value

    def canonical_bytes(self, value: Any) -> bytes:
        """The bytes the partitioner hashes; documented in docs/partitioning.md."""
        if self.kind == "string":
            return str(value).encode("utf-8")
        return str(int(value)).encode("ascii")

    def spark_canonical_sql(self, column: str) -> str:
        """A Spark SQL expression giving the same bytes as ``canonical_bytes`` for ``column``."""
        quoted = "`" + column.replace("`", "``") + "`"
        if self.kind == "integer":
            return f"CAST(CAST({quoted} AS STRING) AS BINARY)"
        if self.kind == "timestamp":
            return f"CAST(CAST(unix_micros({quoted}) AS STRING) AS BINARY)"
        return f"CAST({quoted} AS BINARY)"


STRING = KeyType("string")
LONG = KeyType("long", "integer", _INT64_MIN, _INT64_MAX)
INT = KeyType("int", "integer", _INT32_MIN, _INT32_MAX)
TIMESTAMP = KeyType("timestamp", "timestamp")
_BY_NAME = {t.name: t for t in (STRING, LONG, INT, TIMESTAMP)}

# Spark's simpleString names of the types a key column may have.
_SPARK_TO_KEY = {
    "string": STRING,
    "bigint": LONG,
    "int": INT,
    "smallint": INT,
    "tinyint": INT,
    "timestamp": TIMESTAMP,
}


def key_type_for_spark(simple_string: str, column: str) -> KeyType:
    """The key type for a Spark column type (``DataType.simpleString()``), or a ``SchemaError``."""
    try:
        return _SPARK_TO_KEY[simple_string]
    except KeyError:
        supported = ", ".join(sorted(_SPARK_TO_KEY))
        raise SchemaError(
            f"key column {column!r} has type {simple_string}; supported key types are {supported}",
            column=column,
        ) from None


@dataclass(frozen=True)
class KeySchema:
    """The key of a store: its first (partition) column and type, and any further columns.

    A one-column key is a scalar; a composite key is a tuple with one value per column.
    """

    column: str
    type_name: str
    rest: tuple[tuple[str, str], ...] = ()

    @property
    def type(self) -> KeyType:
        """The type of the partition column."""
        return _BY_NAME[self.type_name]

    @property
    def columns(self) -> list[tuple[str, KeyType]]:
        return [(self.column, self.type)] + [(name, _BY_NAME[t]) for name, t in self.rest]

    @property
    def composite(self) -> bool:
        return bool(self.rest)

    @property
    def type_label(self) -> str:
        """The key's type as one word for messages: ``long``, or ``string, timestamp`` for composites."""
        return ", ".join(t.name for _, t in self.columns)

    def _components(self, value: Any, *, partial: bool) -> list[Any]:
        if not self.composite:
            return [value]
        if isinstance(value, str) and partial:
            return [value]  # a bound's leading part may be just the first column
        if isinstance(value, str):
            raise MalformedKey(
                f"this store's key has {len(self.columns)} columns ({self.type_label}); give them as a tuple "
                "in Python, or joined by '/' in a URL",
                key=value,
            )
        parts = list(value) if isinstance(value, (tuple, list)) else [value]
        n = len(self.columns)
        if not (1 <= len(parts) <= n) or (not partial and len(parts) != n):
            need = f"1 to {n}" if partial else str(n)
            raise MalformedKey(f"the key needs {need} components ({self.type_label}), got {len(parts)}")
        return parts

    def coerce(self, value: Any) -> Any:
        """A whole key (text or Python value; a tuple of components for composite keys), internal form."""
        if not self.rest:
            return _BY_NAME[self.type_name].coerce(value)  # every key lookup: no lists for one column
        parts = self._components(value, partial=False)
        typed = [t.coerce(p) for p, (_, t) in zip(parts, self.columns)]
        return tuple(typed) if self.composite else typed[0]

    def coerce_bound(self, value: Any, *, upper: bool) -> Any:
        """A range bound; for composite keys it may give only the leading components.

        A partial lower bound is the first key starting with those components; a partial upper bound
        the last one (it is padded with ``TOP``), so ``from=42&to=42`` covers every key of customer 42.
        """
        parts = self._components(value, partial=True)
        typed = [t.coerce(p) for p, (_, t) in zip(parts, self.columns)]
        if not self.composite:
            return typed[0]
        if upper and len(typed) < len(self.columns):
            typed.append(TOP)
        return tuple(typed)

    def external(self, key: Any) -> Any:
        """The key as callers see it (``KeyType.external`` per column)."""
        if not self.composite:
            return self.type.external(key)
        return tuple(t.external(v) for v, (_, t) in zip(key, self.columns))

    def partition_value(self, key: Any) -> Any:
        """The partition column's value of an internal key."""
        return key[0] if self.composite else key

    def canonical_bytes(self, key: Any) -> bytes:
        """The partitioner's bytes: those of the partition column only."""
        return self.type.canonical_bytes(self.partition_value(key))

    def to_json(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "type": self.type_name,
            "columns": [{"column": name, "type": t.name} for name, t in self.columns],
        }


def _a(word: str) -> str:
    """``word`` with its indefinite article: "an int", "a long"."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
