"""The key encoding: bytes order equals the internal keys' order, and decoding gives the key back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from runtime.engines.keycodec import KEYS_HI, KEYS_LO, META_PREFIX, KeyCodec
from runtime.keys import TOP, KeySchema

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Every code point, lone surrogates included: a Python str may hold them and they must still round-trip.
TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=12)
# Few distinct characters make shared prefixes and NULs common, where an encoding would go wrong.
DENSE_TEXT = st.text(alphabet=st.sampled_from(["\x00", "\x01", "a", "\xff", "\U0001f600", "\ud800"]), max_size=5)
STRINGS = st.one_of(TEXT, DENSE_TEXT)
INTS = st.one_of(INT64, st.sampled_from([-(2**63), -1, 0, 1, 2**63 - 1]))

STRING_KEY = KeySchema("k", "string")
LONG_KEY = KeySchema("k", "long")
TIMESTAMP_KEY = KeySchema("k", "timestamp")
WINDOWED = KeySchema("user", "string", (("window_start", "timestamp"),))
MIXED = KeySchema("id", "long", (("name", "string"), ("at", "timestamp")))

COMPONENT = {"string": STRINGS, "integer": INTS, "timestamp": INTS}


def keys_of(schema: KeySchema) -> st.SearchStrategy[Any]:
    parts = [COMPONENT[t.kind] for _, t in schema.columns]
    return st.tuples(*parts) if schema.composite else parts[0]


def bounds_of(schema: KeySchema) -> st.SearchStrategy[Any]:
    """Keys, their leading parts, and leading parts closed with TOP, as ``coerce_bound`` makes them."""
    return st.tuples(keys_of(schema), st.integers(1, len(schema.columns)), st.booleans()).map(
        lambda t: t[0][: t[1]] + ((TOP,) if t[2] else ())
    )


def sign(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


@pytest.mark.parametrize("schema", [STRING_KEY, LONG_KEY, TIMESTAMP_KEY, WINDOWED, MIXED], ids=lambda s: s.type_label)
@given(data=st.data())
def test_order_and_round_trip(schema: KeySchema, data: st.DataObject) -> None:
    codec = KeyCodec(schema)
    a, b = data.draw(keys_of(schema)), data.draw(keys_of(schema))
    ea, eb = codec.encode(a), codec.encode(b)
    assert codec.decode(ea) == a and codec.decode(eb) == b
    assert sign(ea, eb) == sign(a, b)
    assert KEYS_LO <= ea < KEYS_HI and not ea.startswith(META_PREFIX)


@pytest.mark.parametrize("schema", [WINDOWED, MIXED], ids=lambda s: s.type_label)
@given(data=st.data())
def test_partial_and_top_bounds_order_like_the_keys(schema: KeySchema, data: st.DataObject) -> None:
    codec = KeyCodec(schema)
    bound, key = data.draw(bounds_of(schema)), data.draw(keys_of(schema))
    encoded = codec.encode(bound)
    assert codec.decode(encoded) == bound
    assert sign(encoded, codec.encode(key)) == sign(bound, key)


@given(prefix=STRINGS, rest=INTS)
@example(prefix="", rest=2**63 - 1)
@example(prefix="\x00", rest=2**63 - 1)
def test_a_top_bound_sorts_after_every_key_sharing_its_prefix(prefix: str, rest: int) -> None:
    codec = KeyCodec(WINDOWED)
    assert codec.encode((prefix, rest)) < codec.encode((prefix, TOP))
    assert codec.encode((prefix,)) < codec.encode((prefix, rest))
    assert codec.encode((prefix + "\x00", -(2**63))) > codec.encode((prefix, TOP))


@pytest.mark.parametrize(
    "smaller, larger",
    [("", "\x00"), ("\x00", "\x00\x00"), ("\x00", "\x01"), ("a", "a\x00"), ("a\x00", "ab"), ("\uffff", "\U00010000")],
)
def test_string_edge_cases(smaller: str, larger: str) -> None:
    codec = KeyCodec(STRING_KEY)
    assert codec.encode(smaller) < codec.encode(larger)
    assert codec.decode(codec.encode(larger)) == larger


def test_int64_extremes_and_sign() -> None:
    codec = KeyCodec(LONG_KEY)
    ordered = [-(2**63), -(2**32), -1, 0, 1, 2**32, 2**63 - 1]
    encoded = [codec.encode(v) for v in ordered]
    assert encoded == sorted(encoded)
    assert [codec.decode(e) for e in encoded] == ordered


@pytest.mark.parametrize(
    "schema, key",
    [
        (LONG_KEY, 2**63),
        (LONG_KEY, "1"),
        (LONG_KEY, True),
        (STRING_KEY, 1),
        (WINDOWED, "alice"),
        (WINDOWED, ("alice", 1, 2)),
        (WINDOWED, (TOP, 1)),
    ],
)
def test_keys_that_do_not_fit_the_schema_are_refused(schema: KeySchema, key: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        KeyCodec(schema).encode(key)


@pytest.mark.parametrize("schema", [STRING_KEY, LONG_KEY, TIMESTAMP_KEY, WINDOWED, MIXED], ids=lambda s: s.type_label)
@given(data=st.data())
def test_encode_many_is_encode_of_each(schema: KeySchema, data: st.DataObject) -> None:
    codec = KeyCodec(schema)
    batch = data.draw(st.lists(keys_of(schema), max_size=8))
    assert codec.encode_many(batch) == [codec.encode(k) for k in batch]


def test_encode_many_rejects_a_key_of_the_wrong_type() -> None:
    with pytest.raises(TypeError):
        KeyCodec(STRING_KEY).encode_many(["a", 1])
