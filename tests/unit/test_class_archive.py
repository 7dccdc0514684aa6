"""The class archive for Spark's driver JVM: ``riqr demo`` uses it when there, else has the JVM write it at
exit and moves it into place only when complete; a topology process only uses one (``topologies.spark``;
no JVM started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from topologies.spark import class_archive, shared_archive_options


def test_the_first_run_writes_the_archive_and_later_runs_map_it(tmp_path: Path) -> None:
    first = class_archive(tmp_path)
    assert not first.warm and first.creating is not None and first.creating.parent == tmp_path
    assert f"-XX:ArchiveClassesAtExit={first.creating}" in first.options
    assert "-Xshare:auto" in first.options  # an archive that does not match is ignored, never fatal
    first.creating.write_bytes(b"classes")  # what the JVM writes when it exits
    assert first.publish() and first.path.read_bytes() == b"classes" and not first.creating.exists()
    later = class_archive(tmp_path)
    assert later.warm and later.path == first.path and later.creating is None
    assert f"-XX:SharedArchiveFile={first.path}" in later.options
    assert not later.publish()  # nothing to move


def test_a_topology_process_maps_an_archive_that_is_there_and_never_writes_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert shared_archive_options(cache) == ()
    assert not cache.exists()  # nothing made, not even the directory
    demo = class_archive(cache)
    assert demo.creating is not None
    demo.creating.write_bytes(b"classes")
    assert demo.publish()
    options = shared_archive_options(cache)
    assert f"-XX:SharedArchiveFile={demo.path}" in options and "-Xshare:auto" in options
    assert options == class_archive(cache).options


def test_a_jvm_that_left_no_archive_or_an_empty_one_publishes_nothing(tmp_path: Path) -> None:
    gone = class_archive(tmp_path)
    assert not gone.publish() and not gone.path.exists()  # the JVM died before writing
    empty = class_archive(tmp_path)
    assert empty.creating is not None
    empty.creating.write_bytes(b"")
    assert not empty.publish() and not empty.path.exists() and not empty.creating.exists()
    assert not class_archive(tmp_path).warm


def test_publishing_keeps_the_newest_archives_and_drops_old_ones_and_dead_runs_leftovers(tmp_path: Path) -> None:
    import os

    from topologies.spark import KEEP_ARCHIVES, prune_archives

    old = []
    for i in range(3):  # archives of other checkouts, oldest first
        path = tmp_path / f"spark-classes-{i:016d}.jsa"
        path.write_bytes(b"x")
        os.utime(path, (1000.0 + i, 1000.0 + i))
        old.append(path)
    dead = tmp_path / ".spark-classes-abc.jsa.123.tmp"  # a run killed while its JVM wrote
    dead.write_bytes(b"partial")
    os.utime(dead, (1000.0, 1000.0))
    writing = tmp_path / ".spark-classes-def.jsa.456.tmp"  # a run writing one right now
    writing.write_bytes(b"partial")
    archive = class_archive(tmp_path)
    assert archive.creating is not None
    archive.creating.write_bytes(b"classes")
    assert archive.publish()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([writing.name, archive.path.name, old[-1].name])  # the newest other one stays
    assert KEEP_ARCHIVES == 2
    assert prune_archives(tmp_path, keep=archive.path) == []  # nothing more to do


def test_a_reinstalled_pyspark_gets_an_archive_of_its_own(tmp_path: Path) -> None:
    """Same version and path, jars written again (a recreated .venv): the JVM would refuse the old
    archive, so its key must differ, or the refused archive is found by name and never replaced."""
    import os

    from topologies.spark import jars_fingerprint

    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"classes")
    (jars / "README").write_text("not a jar")
    first = jars_fingerprint(jars)
    assert jars_fingerprint(jars) == first
    (jars / "README").write_text("still not a jar")
    assert jars_fingerprint(jars) == first
    stat = (jars / "spark-core.jar").stat()
    os.utime(jars / "spark-core.jar", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert jars_fingerprint(jars) != first
    assert jars_fingerprint(tmp_path / "missing") != first  # no jars: a key all the same, no error


def test_no_archive_where_the_path_cannot_be_handed_to_the_jvm_or_there_is_no_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark splits the driver's extraJavaOptions at whitespace: such a path would stop the JVM starting.
    spaced = tmp_path / "my cache"
    assert class_archive(spaced) is None and shared_archive_options(spaced) == ()
    assert not spaced.exists()
    # A cache directory that cannot be made (a read-only home): no archive, no failure.
    blocked = tmp_path / "file"
    blocked.write_bytes(b"")
    assert class_archive(blocked / "riqr") is None

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert class_archive() is None and shared_archive_options() == ()
