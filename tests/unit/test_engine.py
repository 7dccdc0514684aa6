"""The store contract. Every engine runs it: add a new engine to ENGINES and it must pass."""

import random

import pytest

from runtime.engine import PartitionState, SortedKV

ENGINES = {"memory": SortedKV}


@pytest.fixture(params=sorted(ENGINES))
def kv(request: pytest.FixtureRequest) -> SortedKV:
    return ENGINES[request.param]()


def test_get_put_delete(kv: SortedKV) -> None:
    kv.write_many([("b", b"2"), ("a", b"1")])
    assert kv.get("a") == b"1" and kv.get("b") == b"2" and kv.get("c") is None
    kv.write_many([("a", None), ("zz", None)])
    assert kv.get("a") is None
    assert len(kv) == 1


def test_last_write_in_a_batch_wins(kv: SortedKV) -> None:
    kv.write_many([("k", b"1"), ("k", b"2"), ("j", b"x"), ("j", None), ("i", None), ("i", b"3")])
    assert list(kv.range()) == [("i", b"3"), ("k", b"2")]


def test_range_is_inclusive_with_open_ends(kv: SortedKV) -> None:
    kv.write_many([(k, k.encode()) for k in ["1", "2", "3", "4", "5", "6", "7"]])
    assert [k for k, _ in kv.range("2", "4")] == ["2", "3", "4"]
    assert [k for k, _ in kv.range(None, "2")] == ["1", "2"]
    assert [k for k, _ in kv.range("6", None)] == ["6", "7"]
    assert [k for k, _ in kv.range("8", None)] == []
    assert [k for k, _ in kv.range("4", "2")] == []
    assert [k for k, _ in kv.range("10", "2")] == ["2"]  # string order: "10" < "2"


def test_integer_keys_scan_numerically(kv: SortedKV) -> None:
    kv.write_many([(k, b"v") for k in [10, 2, 33, -1]])
    assert [k for k, _ in kv.range()] == [-1, 2, 10, 33]
    assert [k for k, _ in kv.range(2, 10)] == [2, 10]


def test_empty_string_key_is_a_key(kv: SortedKV) -> None:
    kv.write_many([("", b"pasta"), ("1", b"x")])
    assert kv.get("") == b"pasta"
    assert [k for k, _ in kv.range()] == ["", "1"]


@pytest.mark.parametrize("batch_size", [1, 7, 500])
def test_matches_a_dict_model_under_random_writes(kv: SortedKV, batch_size: int) -> None:
    rng = random.Random(batch_size)
    model: dict[int, bytes] = {}
    for _ in range(40):
        batch = []
        for _ in range(batch_size):
            key = rng.randrange(300)
            value = None if rng.random() < 0.3 else str(rng.random()).encode()
            batch.append((key, value))
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        kv.write_many(batch)
        assert list(kv.range()) == sorted(model.items())
    lo, hi = 50, 120
    assert list(kv.range(lo, hi)) == sorted((k, v) for k, v in model.items() if lo <= k <= hi)


def test_clear(kv: SortedKV) -> None:
    kv.write_many([("a", b"1")])
    kv.clear()
    assert len(kv) == 0 and list(kv.range()) == []


def test_a_replayed_batch_id_is_a_no_op() -> None:
    part = PartitionState(0)
    assert part.apply("q1", 0, [("1", b"1")]).applied
    assert part.apply("q1", 1, [("1", b"2")]).applied
    replay = part.apply("q1", 1, [("1", b"999"), ("2", b"new")])
    older = part.apply("q1", 0, [("1", b"old")])
    assert not replay.applied and not older.applied
    assert part.kv.get("1") == b"2" and part.kv.get("2") is None
    assert part.position() == {"source": "q1", "batch_id": 1}


def test_a_new_source_resets_the_partition() -> None:
    part = PartitionState(0)
    part.apply("q1", 5, [("stale", b"1"), ("kept", b"1")])
    result = part.apply("q2", 0, [("kept", b"2")])
    assert result.applied and result.reset
    assert list(part.kv.range()) == [("kept", b"2")]
    assert part.position() == {"source": "q2", "batch_id": 0}


def test_a_lost_partition_becomes_available_when_a_new_source_rebuilds_it() -> None:
    part = PartitionState(0, available=False)
    part.apply("q1", 3, [("a", b"1")])
    assert not part.available  # same lineage continuing: the lost keys are still missing
    part.apply("q2", 0, [("a", b"1")])
    assert part.available
