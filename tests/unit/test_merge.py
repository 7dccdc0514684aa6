import random

from runtime.merge import merge_sorted, sum_counts


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
