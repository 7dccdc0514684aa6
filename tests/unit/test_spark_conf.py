"""``topologies.spark``: a local master gets a shuffle partition per two cores, at most 4; local paths go through
Hadoop's raw local file system."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from topologies.spark import DEFAULT_CONF, local_shuffle_partitions


def test_local_masters_get_half_their_cores_at_least_one_at_most_four() -> None:
    assert local_shuffle_partitions("local") == 1
    assert local_shuffle_partitions("local[1]") == 1
    assert local_shuffle_partitions("local[2]") == 1
    assert local_shuffle_partitions("local[4]") == 2
    assert local_shuffle_partitions("local[16]") == 4
    assert local_shuffle_partitions("local[4,3]") == 2  # local[N, maxFailures]
    assert local_shuffle_partitions("local[*]") == max(1, min(4, (os.cpu_count() or 1) // 2))


def test_cluster_masters_keep_the_default() -> None:
    assert local_shuffle_partitions("spark://host:7077") is None
    assert local_shuffle_partitions("yarn") is None
    assert local_shuffle_partitions("local-cluster[2,1,1024]") is None


def test_local_paths_are_written_without_checksum_files() -> None:
    # A .crc beside every checkpoint and state file cost each micro-batch tens of milliseconds (docs/benchmarks.md).
    assert DEFAULT_CONF["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.RawLocalFileSystem"
    assert DEFAULT_CONF["spark.hadoop.fs.AbstractFileSystem.file.impl"] == "org.apache.hadoop.fs.local.RawLocalFs"


def test_a_spark_session_without_java_says_which_java_it_looked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PySpark's own error (JAVA_GATEWAY_EXITED, a traceback through py4j's launcher) named no Java: riqr
    demo and riqr run ended in it. spark-submit finds no java here and exits at once: no JVM starts."""
    from topologies.spark import SparkNotStarted, spark_session

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))  # spark-class runs $JAVA_HOME/bin/java when set
    with pytest.raises(SparkNotStarted, match=r"JAVA_HOME=.*no-jdk \(no bin/java there\).*Java 17"):
        spark_session(app_name="riqr-test-no-java")
