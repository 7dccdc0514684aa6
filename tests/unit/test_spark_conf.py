"""``topologies.spark.local_shuffle_partitions``: a local master gets as many shuffle partitions as cores, at most 4."""

from __future__ import annotations

import os

from topologies.spark import local_shuffle_partitions


def test_local_masters_get_their_cores_at_most_four() -> None:
    assert local_shuffle_partitions("local") == 1
    assert local_shuffle_partitions("local[2]") == 2
    assert local_shuffle_partitions("local[16]") == 4
    assert local_shuffle_partitions("local[2,3]") == 2  # local[N, maxFailures]
    assert local_shuffle_partitions("local[*]") == max(1, min(4, os.cpu_count() or 1))


def test_cluster_masters_keep_the_default() -> None:
    assert local_shuffle_partitions("spark://host:7077") is None
    assert local_shuffle_partitions("yarn") is None
    assert local_shuffle_partitions("local-cluster[2,1,1024]") is None
