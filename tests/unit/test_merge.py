import asyncio
import random

import pytest

from runtime.merge import merge_pages_async, merge_sorted, sum_counts


def test_k_way_merge_keeps_key_order() -> None:
    runs = [[("1", "a"), ("4", "d")], [], [("2", "b"), ("3", "c"), ("5", "e")]]
    assert list(merge_sorted(runs)) == [("1", "a"), ("2", "b"), ("3", "c"), ("4", "d"), ("5", "e")]


def test_merge_of_random_disjoint_runs_equals_sorting_them() -> None:
    rng = random.Random(7)
    keys = rng.sample(range(10_000), 2_000)
    runs = [sorted((k, k) for k in keys if k % 5 == r) for r in range(5)]
    assert list(merge_sorted(runs)) == sorted((k, k) for k in keys)


def test_a_key_in_two_runs_is_sent_once() -> None:
    assert list(merge_sorted([[(1, "a"), (2, "b")], [(2, "b"), (3, "c")]])) == [(1, "a"), (2, "b"), (3, "c")]


def test_merge_is_lazy() -> None:
    def endless():
        i = 0
        while True:
            yield i, i
            i += 2

    merged = merge_sorted([endless(), iter([(1, 1), (3, 3)])])
    assert [next(merged) for _ in range(5)] == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]


def test_counts_add() -> None:
    assert sum_counts([3, 0, 4]) == 7
    assert sum_counts([]) == 0


def test_reverse_merge() -> None:
    runs = [[("4", "d"), ("1", "a")], [("5", "e"), ("3", "c"), ("2", "b")]]
    assert [k for k, _ in merge_sorted(runs, reverse=True)] == ["5", "4", "3", "2", "1"]


async def _pages(entries, size):  # type: ignore[no-untyped-def]
    for i in range(0, len(entries), size):
        await asyncio.sleep(0)
        yield entries[i : i + size]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("size", [1, 3, 50, 10_000])
async def test_page_merge_matches_the_sync_merge(reverse: bool, size: int) -> None:
    rng = random.Random(size)
    keys = rng.sample(range(20_000), 3_000)
    runs = [sorted(((k, -k) for k in keys if k % 5 == r), reverse=reverse) for r in range(5)] + [[]]
    chunks = [c async for c in merge_pages_async([_pages(r, size) for r in runs], reverse=reverse)]
    merged = [e for chunk in chunks for e in chunk]
    assert merged == sorted(((k, -k) for k in keys), reverse=reverse)
    if size >= 50:
        assert len(chunks) < len(keys) / 10  # merged in chunks, not entry by entry


async def test_page_merge_skips_empty_pages_and_reports_failures() -> None:
    async def with_empty():  # type: ignore[no-untyped-def]
        yield []
        yield [(1, 1), (3, 3)]
        yield []

    async def failing():  # type: ignore[no-untyped-def]
        yield [(2, 2)]
        raise LookupError("owner gone")

    assert [c async for c in merge_pages_async([with_empty(), _pages([(2, 2)], 5)])] in (
        [[(1, 1), (2, 2)], [(3, 3)]],
        [[(1, 1), (2, 2), (3, 3)]],
    )
    with pytest.raises(LookupError):
        async for _ in merge_pages_async([with_empty(), failing()]):
            pass
