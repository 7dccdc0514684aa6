import datetime as dt
import pickle

import pytest

from runtime.errors import MalformedKey, SchemaError
from runtime.keys import INT, LONG, STRING, TIMESTAMP, TOP, KeySchema, key_type_for_spark


def test_string_keys_parse_as_themselves_including_empty_and_non_ascii() -> None:
    for text in ["", "1", "ünïcødé", "a/b", " spaced "]:
        assert STRING.parse(text) == text


def test_long_keys_parse_numerically() -> None:
    assert LONG.parse("10") == 10
    assert LONG.parse("-12") == -12
    assert LONG.parse(str(2**63 - 1)) == 2**63 - 1
    assert LONG.parse("+7") == 7 and LONG.parse("007") == 7  # as Java's Long.parseLong reads them


# Python's int() reads "1_0", " 10", "10 ", other scripts' digits and "1\n": a URL must not spell one key several ways.
@pytest.mark.parametrize(
    "text", ["", "abc", "1.5", str(2**63), "0x10", "1_0", " 10", "10 ", "\u0661\u0660", "- 1", "1\n", "9" * 5000]
)
def test_malformed_long_keys_are_400s(text: str) -> None:
    with pytest.raises(MalformedKey) as info:
        LONG.parse(text)
    assert info.value.status == 400


def test_range_and_type_errors_name_the_key_type_with_its_article() -> None:
    with pytest.raises(MalformedKey, match="is out of range for an int key$"):
        INT.parse(str(2**40))
    with pytest.raises(MalformedKey, match="is out of range for a long key$"):
        LONG.parse(str(2**63))
    with pytest.raises(MalformedKey, match="of type float does not fit an int key"):
        INT.coerce(1.5)


def test_a_plus_sign_read_as_a_space_is_named_in_the_error() -> None:
    """``range?from=+2`` arrives as " 2" (a raw '+' in a query string is a space): still a 400, saying why."""
    with pytest.raises(MalformedKey, match="arrives as a space: write it %2B"):
        LONG.parse(" 2")
    for text in (" 10 ", "  2", " x"):  # not a plus sign's space: no such hint
        with pytest.raises(MalformedKey) as info:
            LONG.parse(text)
        assert "%2B" not in info.value.message


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-01T00:00:00.000000100Z",
        "2026-01-01T00:00:00.1234567+01:00",
        "2026-01-01 00:00:00,0000001",
        "20260101T000000.0000009Z",
        # An offset's own fraction, after a time with one: only the time's was checked, and the offset's
        # seventh digit dropped.
        "2026-01-01T12:00:00.5+01:00:00.1234567",
        "2026-01-01T12:00:00+01:00:00.1234567",
    ],  # fmt: skip
)
def test_timestamps_past_the_microsecond_are_refused_not_truncated(text: str) -> None:
    """Read as the microsecond below, a lower bound would let in a key before it and a lookup find another
    key: a 400 that says why. Zeros past the sixth digit (Java's nine-digit form of a whole microsecond)
    are exact and read."""
    from runtime.keys import TooPrecise

    with pytest.raises(TooPrecise, match="digits past the microsecond") as info:
        TIMESTAMP.parse(text)
    assert info.value.code == "malformed-key"
    assert TIMESTAMP.parse("2026-01-01T00:00:00.123456000Z") == TIMESTAMP.parse("2026-01-01T00:00:00.123456Z")
    import pandas

    with pytest.raises(TooPrecise):
        TIMESTAMP.coerce(pandas.Timestamp("2026-01-01T00:00:00.000000100Z"))
    assert TIMESTAMP.coerce(pandas.Timestamp("2026-01-01T00:00:00.000001Z")) == TIMESTAMP.parse(
        "2026-01-01T00:00:00.000001Z"
    )


def test_int_bounds_are_checked() -> None:
    assert INT.parse(str(2**31 - 1)) == 2**31 - 1
    with pytest.raises(MalformedKey):
        INT.parse(str(2**31))


def test_coerce_accepts_values_and_text_but_not_wrong_types() -> None:
    assert LONG.coerce(5) == 5
    assert LONG.coerce("5") == 5
    assert STRING.coerce("5") == "5"
    with pytest.raises(MalformedKey):
        STRING.coerce(5)
    with pytest.raises(MalformedKey):
        LONG.coerce(True)
    with pytest.raises(MalformedKey):
        LONG.coerce(1.5)


def test_canonical_bytes_are_utf8_and_decimal_text() -> None:
    assert STRING.canonical_bytes("é") == "é".encode()
    assert STRING.canonical_bytes("") == b""
    assert LONG.canonical_bytes(-12) == b"-12"
    assert INT.canonical_bytes(7) == b"7"


def test_spark_sql_quotes_the_column() -> None:
    assert STRING.spark_canonical_sql("key") == "CAST(`key` AS BINARY)"
    assert LONG.spark_canonical_sql("we`ird") == "CAST(CAST(`we``ird` AS STRING) AS BINARY)"


def test_spark_types_map_to_key_types() -> None:
    assert key_type_for_spark("string", "k") is STRING
    assert key_type_for_spark("bigint", "k") is LONG
    assert key_type_for_spark("int", "k") is INT
    with pytest.raises(SchemaError, match="double"):
        key_type_for_spark("double", "k")


def test_key_schema_delegates_to_its_type() -> None:
    schema = KeySchema("user", "long")
    assert schema.coerce("3") == 3
    assert schema.to_json() == {"column": "user", "type": "long", "columns": [{"column": "user", "type": "long"}]}


def test_timestamps_parse_iso_8601_into_epoch_micros_and_show_as_datetimes() -> None:
    micros = TIMESTAMP.parse("2026-01-31T10:00:00Z")
    assert micros == TIMESTAMP.parse("2026-01-31T11:00:00+01:00") == TIMESTAMP.parse("2026-01-31T10:00:00")
    assert TIMESTAMP.external(micros) == dt.datetime(2026, 1, 31, 10, tzinfo=dt.UTC)
    assert TIMESTAMP.coerce(dt.datetime(2026, 1, 31, 10, tzinfo=dt.UTC)) == micros
    assert TIMESTAMP.canonical_bytes(micros) == str(micros).encode()
    assert TIMESTAMP.parse("1969-12-31T23:59:59.999999Z") == -1
    assert TIMESTAMP.parse("2026-01-31T11:00:00 01:00") == micros  # '+01:00' after query-string decoding
    assert TIMESTAMP.parse("2026-01-31T11:00:00 0100") == micros  # '+0100', the basic form, likewise
    assert TIMESTAMP.parse("2026-01-31T11:00:00+0100") == micros
    assert TIMESTAMP.parse("2026-01-31 11:00:00 0100") == micros  # a space for the T too
    with pytest.raises(MalformedKey, match="ISO-8601"):
        TIMESTAMP.parse("yesterday")
    with pytest.raises(MalformedKey):
        TIMESTAMP.coerce(5)


def test_timestamps_outside_years_1_to_9999_in_utc_are_malformed_and_the_ends_are_kept() -> None:
    """An offset moves a date written inside Python's years outside them: such a key could be looked up,
    but not written back in an answer (``external`` raised OverflowError: a 500 for an absent key)."""
    from runtime.keys import InstantOutOfRange

    for text in ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"):
        with pytest.raises(InstantOutOfRange, match="outside years 1 to 9999"):
            TIMESTAMP.parse(text)
    with pytest.raises(InstantOutOfRange):
        TIMESTAMP.coerce(dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(-dt.timedelta(hours=2))))
    for text in ("9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59+01:00"):
        assert TIMESTAMP.external(TIMESTAMP.parse(text)) == dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


COMPOSITE = KeySchema("customer", "string", (("ts", "timestamp"),))


def test_composite_keys_are_tuples_partitioned_by_their_first_column() -> None:
    key = COMPOSITE.coerce(("42", "2026-01-01T00:00:00Z"))
    assert key == ("42", TIMESTAMP.parse("2026-01-01T00:00:00Z"))
    assert COMPOSITE.canonical_bytes(key) == b"42"
    assert COMPOSITE.coerce(("42", dt.datetime(2026, 1, 1, tzinfo=dt.UTC))) == key
    assert COMPOSITE.external(key) == ("42", dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert COMPOSITE.to_json()["columns"] == [
        {"column": "customer", "type": "string"},
        {"column": "ts", "type": "timestamp"},
    ]


def test_composite_keys_need_every_component_but_bounds_may_be_partial() -> None:
    with pytest.raises(MalformedKey, match="needs 2 components"):
        COMPOSITE.coerce(("42",))
    with pytest.raises(MalformedKey, match="joined by '/' in a URL"):
        COMPOSITE.coerce("42")
    lo, hi = COMPOSITE.coerce_bound(("42",), upper=False), COMPOSITE.coerce_bound(("42",), upper=True)
    inside = COMPOSITE.coerce(("42", "2030-01-01T00:00:00Z"))
    assert lo < inside < hi
    assert hi < COMPOSITE.coerce(("420", "1970-01-01T00:00:00Z"))
    assert hi == ("42", TOP)


def test_top_sorts_after_everything_and_pickles_to_itself() -> None:
    assert TOP > "zzz" and TOP > 10**30 and not TOP < "a" and TOP > "a" and TOP == TOP
    assert pickle.loads(pickle.dumps(TOP)) is TOP


def test_a_bound_may_be_just_the_first_column_as_a_scalar() -> None:
    assert COMPOSITE.coerce_bound("42", upper=False) == ("42",)
    assert COMPOSITE.coerce_bound("42", upper=True) == ("42", TOP)


def test_integer_keys_from_numpy_and_pandas_are_integers() -> None:
    import numpy as np

    assert LONG.coerce(np.int64(5)) == 5 and INT.coerce(np.int32(-7)) == -7 and LONG.coerce(np.uint8(3)) == 3
    with pytest.raises(MalformedKey):
        INT.coerce(np.int64(2**40))  # still bounded by the column's type
    with pytest.raises(MalformedKey):
        LONG.coerce(True)
