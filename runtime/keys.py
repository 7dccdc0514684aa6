"""Key schemas: parsing keys from text, their canonical bytes, and the matching Spark SQL expression.

A store's key is one column of the DataFrame it was materialized from. Its type decides three things that
must agree everywhere:

* how a key written in a URL is parsed (``parse``): ``"10"`` is the integer 10 for a ``long`` key;
* the key's *canonical bytes*, which the partitioner hashes: UTF-8 of the string, and for integer keys
  UTF-8 of the decimal form (``-12`` -> ``b"-12"``), so any client in any language can compute them;
* the Spark SQL expression that computes the same bytes on the write path (``spark_canonical_sql``).

Keys compare in their natural order (code points for strings, numeric for integers), which is the order
of every scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import MalformedKey, SchemaError

__all__ = ["KeyType", "KeySchema", "STRING", "LONG", "INT", "key_type_for_spark"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class KeyType:
    """A supported key type: its name in the catalog and its value bounds (for integers)."""

    name: str
    integral: bool = False
    lo: int = 0
    hi: int = 0

    def parse(self, text: str) -> Any:
        """Parse a key from its URL form, raising ``MalformedKey`` when it does not fit this type."""
        if not self.integral:
            return text
        try:
            value = int(text, 10)
        except ValueError:
            raise MalformedKey(f"key {text!r} is not a valid {self.name}", key=text, type=self.name) from None
        if not self.lo <= value <= self.hi:
            raise MalformedKey(f"key {text!r} is out of range for {self.name}", key=text, type=self.name)
        return value

    def coerce(self, value: Any) -> Any:
        """Accept a key given as a Python value (or as text) from the driver API."""
        if isinstance(value, str):
            return self.parse(value)
        if self.integral and isinstance(value, int) and not isinstance(value, bool):
            if not self.lo <= value <= self.hi:
                raise MalformedKey(f"key {value} is out of range for {self.name}", key=value, type=self.name)
            return value
        raise MalformedKey(
            f"key {value!r} of type {type(value).__name__} does not fit a {self.name} key", type=self.name
        )

    def canonical_bytes(self, value: Any) -> bytes:
        """The bytes the partitioner hashes; documented in docs/partitioning.md."""
        if self.integral:
            return str(int(value)).encode("ascii")
        return value.encode("utf-8")

    def spark_canonical_sql(self, column: str) -> str:
        """A Spark SQL expression giving the same bytes as ``canonical_bytes`` for ``column``."""
        quoted = "`" + column.replace("`", "``") + "`"
        if self.integral:
            return f"CAST(CAST({quoted} AS STRING) AS BINARY)"
        return f"CAST({quoted} AS BINARY)"


STRING = KeyType("string")
LONG = KeyType("long", integral=True, lo=_INT64_MIN, hi=_INT64_MAX)
INT = KeyType("int", integral=True, lo=_INT32_MIN, hi=_INT32_MAX)
_BY_NAME = {t.name: t for t in (STRING, LONG, INT)}

# Spark's simpleString names of the types a key may have.
_SPARK_TO_KEY = {"string": STRING, "bigint": LONG, "int": INT, "smallint": INT, "tinyint": INT}


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
    """The key of a store: the column it comes from and its type."""

    column: str
    type_name: str

    @property
    def type(self) -> KeyType:
        return _BY_NAME[self.type_name]

    def parse(self, text: str) -> Any:
        return self.type.parse(text)

    def coerce(self, value: Any) -> Any:
        return self.type.coerce(value)

    def canonical_bytes(self, value: Any) -> bytes:
        return self.type.canonical_bytes(value)

    def to_json(self) -> dict[str, str]:
        return {"column": self.column, "type": self.type_name}
