import pytest

from runtime.engines import PartitionEngine, Position, open_engine
from runtime.keys import KeySchema
from runtime.scan import Bound, Scan, prefix_scan


@pytest.fixture
def kv() -> PartitionEngine:
    store = open_engine("memory", KeySchema("key", "string"), None)
    store.apply(Position("q", 0), [(k, k.encode()) for k in ["a", "ab", "abc", "abd", "ac", "b", "b\U0010ffff", "c"]])
    return store


def keys(kv: PartitionEngine, scan: Scan) -> list[str]:
    return [k for k, _ in kv.scan(scan)]


def test_bounds_inclusive_and_exclusive(kv: PartitionEngine) -> None:
    assert keys(kv, Scan(Bound("ab"), Bound("ac"))) == ["ab", "abc", "abd", "ac"]
    assert keys(kv, Scan(Bound("ab", False), Bound("ac", False))) == ["abc", "abd"]
    assert keys(kv, Scan(Bound("ab"), Bound("ac"), reverse=True)) == ["ac", "abd", "abc", "ab"]


def test_after_resumes_strictly_past_the_key_in_either_direction(kv: PartitionEngine) -> None:
    assert keys(kv, Scan.closed("a", "b").after("abc")) == ["abd", "ac", "b"]
    assert keys(kv, Scan.closed("a", "b", reverse=True).after("abc")) == ["ab", "a"]
    assert keys(kv, Scan().after("zzz")) == []


def test_prefix(kv: PartitionEngine) -> None:
    assert keys(kv, prefix_scan("ab")) == ["ab", "abc", "abd"]
    assert keys(kv, prefix_scan("ab", reverse=True)) == ["abd", "abc", "ab"]
    assert keys(kv, prefix_scan("b")) == ["b", "b\U0010ffff"]
    assert keys(kv, prefix_scan("\U0010ffff")) == []
    assert keys(kv, prefix_scan("")) == ["a", "ab", "abc", "abd", "ac", "b", "b\U0010ffff", "c"]
    assert keys(kv, prefix_scan("zz")) == []


def test_emptiness() -> None:
    assert Scan.closed("b", "a").is_empty()
    assert Scan(Bound("a"), Bound("a", False)).is_empty()
    assert not Scan.closed("a", "a").is_empty()
    assert not Scan().is_empty()
