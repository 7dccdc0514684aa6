import pytest

from runtime.errors import MalformedKey, SchemaError
from runtime.keys import INT, LONG, STRING, KeySchema, key_type_for_spark


def test_string_keys_parse_as_themselves_including_empty_and_non_ascii() -> None:
    for text in ["", "1", "ünïcødé", "a/b", " spaced "]:
        assert STRING.parse(text) == text


def test_long_keys_parse_numerically() -> None:
    assert LONG.parse("10") == 10
    assert LONG.parse("-12") == -12
    assert LONG.parse(str(2**63 - 1)) == 2**63 - 1


@pytest.mark.parametrize("text", ["", "abc", "1.5", str(2**63), "0x10"])
def test_malformed_long_keys_are_400s(text: str) -> None:
    with pytest.raises(MalformedKey) as info:
        LONG.parse(text)
    assert info.value.status == 400


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
    assert schema.parse("3") == 3
    assert schema.to_json() == {"column": "user", "type": "long"}
