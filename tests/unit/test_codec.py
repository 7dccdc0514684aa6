import datetime as dt
import decimal

import pytest

from runtime.codec import decode_value, encode_value, to_json, to_jsonable


@pytest.mark.parametrize(
    "value", [1, -(2**63), "adam", "", None, 1.5, True, [1, "a"], {"a": 1, "b": [None]}, b"\x00\xff"]
)
def test_round_trip(value: object) -> None:
    assert decode_value(encode_value(value)) == value


def test_non_native_types_take_their_json_form() -> None:
    when = dt.datetime(2026, 11, 22, 15, 0, tzinfo=dt.UTC)
    assert decode_value(encode_value(when)) == "2026-11-22T15:00:00+00:00"
    assert decode_value(encode_value(dt.date(2026, 1, 2))) == "2026-01-02"
    assert decode_value(encode_value(decimal.Decimal("1.10"))) == "1.10"


def test_unknown_types_fail_clearly() -> None:
    with pytest.raises(TypeError, match="object"):
        encode_value(object())


def test_to_jsonable() -> None:
    assert to_jsonable({"b": b"\x01", 1: (2, 3)}) == {"b": "AQ==", "1": [2, 3]}


def test_to_json_is_compact_and_handles_what_msgpack_values_hold() -> None:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert to_json({"key": ("42", when), "value": {1: b"\x01", "ü": None}}) == (
        '{"key":["42","2026-01-01T00:00:00+00:00"],"value":{"1":"AQ==","ü":null}}'
    )
    with pytest.raises(TypeError):
        to_json(object())


def test_encode_values_packs_each_as_encode_value_does() -> None:
    from runtime.codec import encode_values

    values = ["a", 1, None, {"x": 1.5, "y": [dt.date(2024, 1, 2)]}, decimal.Decimal("1.10"), b"\x00"]
    assert encode_values(values) == [encode_value(v) for v in values]
    with pytest.raises(TypeError):
        encode_values([object()])
