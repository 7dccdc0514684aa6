import asyncio
import random

import pytest

from runtime.merge import merge_sorted, merge_sorted_async, sum_counts


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


async def _agen(items):  # type: ignore[no-untyped-def]
    for item in items:
        await asyncio.sleep(0)
        yield item


@pytest.mark.parametrize("reverse", [False, True])
async def test_async_merge_matches_the_sync_merge(reverse: bool) -> None:
    rng = random.Random(3)
    keys = rng.sample(range(5_000), 1_000)
    runs = [sorted(((k, k) for k in keys if k % 4 == r), reverse=reverse) for r in range(4)] + [[]]
    merged = [e async for e in merge_sorted_async([_agen(r) for r in runs], reverse=reverse)]
    assert merged == list(merge_sorted(runs, reverse=reverse))
    assert merged == sorted(((k, k) for k in keys), reverse=reverse)


async def test_async_merge_pulls_only_what_is_consumed() -> None:
    pulled = []

    async def counting(start: int):  # type: ignore[no-untyped-def]
        for i in range(start, 1_000_000, 2):
            pulled.append(i)
            yield i, i

    merged = merge_sorted_async([counting(0), counting(1)])
    assert [await anext(merged) for _ in range(5)] == [(i, i) for i in range(5)]
    assert len(pulled) <= 7
    await merged.aclose()


async def test_a_failing_source_leaves_no_other_source_running() -> None:
    async def slow():  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.05)
        yield 1, 1

    async def failing():  # type: ignore[no-untyped-def]
        raise LookupError("owner gone")
        yield 0, 0  # pragma: no cover - makes this an async generator

    sources = [slow(), failing()]
    with pytest.raises(LookupError):
        async for _ in merge_sorted_async(sources):
            pass
    for source in sources:
        await source.aclose()  # would raise "already running" if the slow read were still in flight
