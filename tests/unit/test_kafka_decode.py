"""riqr's Kafka source: keys and values that are not UTF-8 become dead letters, not altered records."""

from topologies.kafka_source import _decode, _problem


def test_utf8_is_text_and_anything_else_is_flagged_with_its_bytes_escaped() -> None:
    assert _decode(None) == (None, True)
    assert _decode("café".encode()) == ("café", True)
    # U+FFFD for both would have made these two keys one
    assert _decode(b"\xff\xfe") == ("\\xff\\xfe", False)
    assert _decode(b"\xff\xfd") == ("\\xff\\xfd", False)


def test_the_problem_names_what_is_not_utf8() -> None:
    assert _problem(True, True) is None
    assert "key is not UTF-8" in (_problem(False, True) or "")
    assert "value is not UTF-8" in (_problem(True, False) or "")
    assert "key and value are not UTF-8" in (_problem(False, False) or "")
