"""REST JSON: the fast encoder (orjson) answers exactly what the json module's encoder answers, for every
value a store can hold, including those JSON has no form for (NaN, integers beyond 64 bits, lone
surrogates), which take the exact slow path."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.codec import _encode_json_exactly, decode_value, encode_json, encode_value

# What a stored value decodes to: msgpack's types, maps with string or integer keys, any float.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary(max_size=16)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(min_value=-1000, max_value=1000), inner, max_size=4)
    ),
    max_leaves=12,
)


def _parsed(data: bytes) -> Any:
    return json.loads(data)  # strict: NaN or Infinity as bare tokens would not parse as riqr sends them


@settings(max_examples=300, deadline=None)
@given(_values)
def test_the_fast_encoder_answers_what_the_exact_one_does(value: Any) -> None:
    value = decode_value(encode_value(value))  # as a query actor hands it over
    body = {"response": value}
    assert _parsed(encode_json(body)) == _parsed(_encode_json_exactly(body))


def test_values_json_has_no_form_for_are_spelled_as_before() -> None:
    body = {"response": {"a": math.nan, "b": [math.inf, -math.inf], "c": None}, "big": 2**70, "s": "\ud800"}
    assert encode_json(body) == _encode_json_exactly(body)
    assert _parsed(encode_json({"response": math.nan})) == {"response": "NaN"}
    assert _parsed(encode_json({"response": None})) == {"response": None}  # a real null stays null
    assert _parsed(encode_json({"n": 2**70})) == {"n": 2**70}


def test_a_value_is_spelled_the_same_whatever_else_its_answer_holds() -> None:
    """An answer with a NaN anywhere went through ``_json_safe``, which made every finite float in it text:
    ``1.5`` read back as ``"1.5"`` in an ``all`` that also held a NaN, and as ``1.5`` alone."""
    alone = _parsed(encode_json({"result": [{"key": "z", "value": {1: [None, True, 1.5]}}]}))
    together = _parsed(
        encode_json({"result": [{"key": "n", "value": math.nan}, {"key": "z", "value": {1: [None, True, 1.5]}}]})
    )
    assert together["result"][1] == alone["result"][0] == {"key": "z", "value": {"1": [None, True, 1.5]}}
    assert _parsed(encode_json({"a": [1.5, "\ud800"]})) == {"a": [1.5, "\\ud800"]}


def test_bytes_datetimes_and_integer_keys() -> None:
    import datetime as dt

    body = {"b": b"\x00\xff", "t": dt.datetime(2026, 11, 23, 7, 30, 0, 1234), 7: "seven", "d": dt.date(2026, 1, 2)}
    assert encode_json(body) == _encode_json_exactly(body)
