"""The sweeper of orphaned actor directories (``runtime.orphans``): what it deletes, and what it must not.

Real files and real locks (a lock held by another process, and that process SIGKILLed); the cluster's
actor names and the clock are fakes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from runtime.metrics import Metrics
from runtime.orphans import (
    DEFAULT_RECLAIM_AFTER,
    OWNER_FILE,
    OwnerLock,
    Sweeper,
    held,
    reclaim_after,
    sweep_every,
)
from runtime.query import QueryCore
from tests.unit.fakes import kv_spec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def actor_dir(root: Path, store: str = "orders") -> Path:
    directory = root / store / str(uuid.uuid4())
    (directory / "p0").mkdir(parents=True)
    (directory / "p0" / "data.sst").write_bytes(b"x" * 1000)
    return directory


class Names:
    """The cluster's named actors, and how often the sweeper asked."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.asked = 0

    def __call__(self) -> set[str]:
        self.asked += 1
        return set(self.names)


def test_an_owner_lock_is_seen_by_other_descriptors_until_released(tmp_path: Path) -> None:
    directory = tmp_path / "s" / "actor"
    lock = OwnerLock.take(directory)
    assert lock.held and (directory / OWNER_FILE).is_file()
    assert held(directory)  # flock locks belong to the open file: another open of it is refused
    lock.release()
    assert not held(directory) and not lock.held
    assert (directory / OWNER_FILE).is_file()  # a plain release leaves the file: the directory stays in use
    again = OwnerLock.take(directory)
    assert again.held
    again.release(remove=True)
    assert not (directory / OWNER_FILE).exists()
    assert not held(directory)  # no lock file: nothing holds it


def test_a_busy_lock_is_taken_as_soon_as_it_is_free_with_a_warning_if_that_takes_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweeper's probe holds the lock for an instant, a previous incarnation of the actor until it has
    exited: the new owner never goes on without the lock for good."""
    monkeypatch.setattr(OwnerLock, "WARN_AFTER", 0.2)
    first = OwnerLock.take(tmp_path / "d")
    with caplog.at_level(logging.WARNING, logger="runtime.orphans"):
        second = OwnerLock.take(tmp_path / "d")
        assert not second.held
        _until(lambda: "another process has held its owner lock" in caplog.text)
        second.release(remove=True)  # not its lock: the holder's file stays
        assert (tmp_path / "d" / OWNER_FILE).is_file() and held(tmp_path / "d")
        third = OwnerLock.take(tmp_path / "d")
        _until(lambda: caplog.text.count("another process has held its owner lock") == 2)  # the third's too
        first.release()
        _until(lambda: third.held)
        # The keeper thread logs it right after taking the lock: wait for it, not only for the lock.
        _until(lambda: "took its owner lock at last" in caplog.text)
    assert held(tmp_path / "d")
    third.release(remove=True)


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


HOLDER = """
import sys, time
from pathlib import Path
from typing import Any
from runtime.orphans import OwnerLock
lock = OwnerLock.take(Path(sys.argv[1]))
print("held" if lock.held else "not held", flush=True)
time.sleep(600)
"""


def test_a_lock_held_by_a_process_is_dropped_when_that_process_is_killed(tmp_path: Path) -> None:
    directory = tmp_path / "s" / "actor"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert held(directory)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert not held(directory)


def test_an_orphan_is_deleted_only_once_it_stayed_orphaned_for_the_grace_period(tmp_path: Path) -> None:
    clock, names, metrics = Clock(), Names(), Metrics()
    orphan = actor_dir(tmp_path)
    sweeper = Sweeper(tmp_path, names, grace=60, clock=clock, metrics=metrics)
    assert sweeper.sweep() == []  # first seen
    clock.now += 59
    assert sweeper.sweep() == [] and orphan.is_dir()
    clock.now += 1
    assert sweeper.sweep() == [orphan]
    assert not orphan.exists() and (tmp_path / "orders").is_dir()  # the store's directory is left
    assert sweeper.reclaimed_dirs == 1 and sweeper.reclaimed_bytes == 1000
    assert metrics.value("riqr_reclaimed_bytes_total") == 1000


def test_an_existing_actors_directory_is_never_deleted(tmp_path: Path) -> None:
    """An actor Ray is restarting has no process, so no lock: its name is what keeps its data."""
    clock, names = Clock(), Names()
    restarting = actor_dir(tmp_path)
    names.names.add(restarting.name)
    sweeper = Sweeper(tmp_path, names, grace=10, clock=clock)
    for _ in range(5):
        assert sweeper.sweep() == []
        clock.now += 100
    assert (restarting / "p0" / "data.sst").read_bytes() == b"x" * 1000


def test_a_locked_directory_is_never_deleted_and_costs_no_lookup(tmp_path: Path) -> None:
    """Another cluster's live actor on this host (same data directory and namespace) holds its lock."""
    clock, names = Clock(), Names()
    other = actor_dir(tmp_path)
    lock = OwnerLock.take(other)
    sweeper = Sweeper(tmp_path, names, grace=10, clock=clock)
    for _ in range(3):
        assert sweeper.sweep() == []
        clock.now += 100
    assert other.is_dir() and names.asked == 0
    lock.release()
    assert sweeper.sweep() == []  # orphaned from now: first seen
    clock.now += 10
    assert sweeper.sweep() == [other]


def test_the_grace_period_starts_again_when_a_directory_was_not_orphaned_in_between(tmp_path: Path) -> None:
    """A directory seen orphaned, then owned (an actor created under a name listed just after), then
    orphaned again is only deleted a full grace period after the second time."""
    clock, names = Clock(), Names()
    directory = actor_dir(tmp_path)
    sweeper = Sweeper(tmp_path, names, grace=60, clock=clock)
    sweeper.sweep()
    clock.now += 30
    names.names.add(directory.name)
    sweeper.sweep()
    clock.now += 30
    names.names.clear()
    assert sweeper.sweep() == []  # 60 s after the first sighting, but the run of sightings was broken
    clock.now += 59
    assert sweeper.sweep() == []
    clock.now += 1
    assert sweeper.sweep() == [directory]


def test_only_actor_directories_inside_store_directories_are_touched(tmp_path: Path) -> None:
    clock, names = Clock(), Names()
    registry = tmp_path / "_registry"
    registry.mkdir()
    (registry / "ingest.json").write_text("{}")
    (tmp_path / "orders").mkdir()
    stray = tmp_path / "orders" / "notes"  # not an actor's name
    stray.mkdir()
    (tmp_path / "orders" / "README").write_text("mine")
    hidden = tmp_path / ".cache" / str(uuid.uuid4())  # not a store's name
    hidden.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("keep")
    link = tmp_path / "orders" / str(uuid.uuid4())
    link.symlink_to(target, target_is_directory=True)
    orphan = actor_dir(tmp_path)
    sweeper = Sweeper(tmp_path, names, grace=0, clock=clock)
    assert sweeper.sweep() == []  # even without a grace period, a directory is looked at twice
    assert sweeper.sweep() == [orphan]
    assert (registry / "ingest.json").read_text() == "{}" and stray.is_dir() and hidden.is_dir()
    assert (tmp_path / "orders" / "README").read_text() == "mine"
    assert link.is_symlink() and (target / "keep").read_text() == "keep"


def test_a_missing_root_is_nothing_to_sweep(tmp_path: Path) -> None:
    names = Names()
    assert Sweeper(tmp_path / "absent", names, grace=0).sweep() == [] and names.asked == 0


def test_a_query_core_holds_its_directory_while_open_and_takes_its_lock_file_along_when_destroyed(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "s" / str(uuid.uuid4())
    core = QueryCore(kv_spec("s"), [0, 1], directory=directory)
    assert held(directory)
    names = Names()
    assert Sweeper(tmp_path, names, grace=0).sweep() == [] and directory.is_dir()
    core.close()
    assert not held(directory)
    reopened = QueryCore(kv_spec("s"), [0, 1], directory=directory)
    assert held(directory)
    reopened.destroy()
    assert not directory.exists()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, DEFAULT_RECLAIM_AFTER), ("", DEFAULT_RECLAIM_AFTER), ("off", None), ("OFF", None), ("0", 0.0),
     ("12.5", 12.5), ("soon", DEFAULT_RECLAIM_AFTER), ("-1", DEFAULT_RECLAIM_AFTER), ("nan", DEFAULT_RECLAIM_AFTER),
     ("inf", DEFAULT_RECLAIM_AFTER)],
)  # fmt: skip
def test_the_grace_period_comes_from_the_environment(value: str | None, expected: float | None) -> None:
    environ = {} if value is None else {"RIQR_RECLAIM_AFTER": value}
    assert reclaim_after(environ) == expected


def test_sweeps_come_at_a_fifth_of_the_grace_period_within_bounds() -> None:
    assert sweep_every(300) == 60 and sweep_every(3600) == 60 and sweep_every(10) == 2 and sweep_every(0) == 0.5


def test_a_failing_sweep_is_logged_and_the_next_one_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    done = threading.Event()

    def names() -> set[str]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the cluster did not answer")
        done.set()
        return set()

    orphan = actor_dir(tmp_path)
    sweeper = Sweeper(tmp_path, names, grace=0)
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="runtime.orphans"):
        thread = threading.Thread(target=sweeper.run, args=(stop,))
        thread.start()
        try:
            assert done.wait(10)
            deadline = time.monotonic() + 10
            while orphan.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(10)
    assert not orphan.exists() and not thread.is_alive()
    assert "failed" in caplog.text and "the cluster did not answer" in caplog.text


def test_taking_a_lock_makes_its_directory_again_if_a_prune_removed_it_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last actor of a store on a node prunes the store's directory when it finds it empty; a new
    actor of the store making its own directory in the same instant finds it gone once, and goes on."""
    directory = tmp_path / "s" / str(uuid.uuid4())
    real_open, pruned = os.open, []

    def open_after_a_prune(path: Any, flags: int, mode: int = 0o777) -> int:
        if not pruned:
            pruned.append(path)
            directory.rmdir()
            directory.parent.rmdir()  # the store's directory, empty again
        return real_open(path, flags, mode)

    monkeypatch.setattr("runtime.orphans.os.open", open_after_a_prune)
    lock = OwnerLock.take(directory)
    monkeypatch.undo()
    assert pruned and lock.held and held(directory)
    lock.release(remove=True)


def test_a_sweep_that_cannot_tell_which_actors_exist_deletes_nothing_and_forgets_its_sightings(
    tmp_path: Path,
) -> None:
    clock, answers = Clock(), ["ok", "fail", "ok", "ok"]

    def names() -> set[str]:
        if answers.pop(0) == "fail":
            raise RuntimeError("the registry did not answer")
        return set()

    orphan = actor_dir(tmp_path)
    sweeper = Sweeper(tmp_path, names, grace=10, clock=clock)
    assert sweeper.sweep() == []
    clock.now += 10
    with pytest.raises(RuntimeError, match="did not answer"):
        sweeper.sweep()
    assert orphan.is_dir()
    clock.now += 10
    assert sweeper.sweep() == []  # a first sighting again: the failed pass broke the run
    assert orphan.is_dir() and answers == ["ok"]


def test_a_directory_is_looked_at_once_more_just_before_it_is_deleted(tmp_path: Path) -> None:
    """The pass's names may be minutes old when it comes to a directory (deleting others first): an actor
    created under that name meanwhile keeps it."""
    clock, calls = Clock(), []
    directory = actor_dir(tmp_path)

    def names() -> set[str]:
        calls.append(1)
        return {directory.name} if len(calls) == 3 else set()  # named by the time of the last look

    sweeper = Sweeper(tmp_path, names, grace=0, clock=clock)
    assert sweeper.sweep() == []
    assert sweeper.sweep() == [] and len(calls) == 3
    assert directory.is_dir()


def test_a_store_directory_that_is_a_symbolic_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    inside = actor_dir(elsewhere)
    root = tmp_path / "root"
    root.mkdir()
    (root / "orders").symlink_to(elsewhere / "orders", target_is_directory=True)
    sweeper = Sweeper(root, Names(), grace=0)
    assert sweeper.sweep() == [] and sweeper.sweep() == []
    assert inside.is_dir()


def test_a_lock_that_cannot_be_looked_at_counts_as_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = actor_dir(tmp_path)

    def refused(path: Any, flags: int, mode: int = 0o777) -> int:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("runtime.orphans.os.open", refused)
    assert held(directory)
    sweeper = Sweeper(tmp_path, Names(), grace=0)
    assert sweeper.sweep() == [] and sweeper.sweep() == []
    monkeypatch.undo()
    assert directory.is_dir()


def test_a_core_that_fails_to_open_lets_go_of_its_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.query

    directory = tmp_path / "s" / str(uuid.uuid4())
    real_open, opened = runtime.query.open_engine, []

    def open_then_fail(*args: Any, **kwargs: Any) -> Any:
        if opened:
            raise OSError(28, "No space left on device")
        opened.append(1)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(runtime.query, "open_engine", open_then_fail)
    monkeypatch.setattr(runtime.query, "_OPEN_RETRIES", (0.0,))
    with pytest.raises(OSError, match="No space left"):
        QueryCore(kv_spec("s"), [0, 1], directory=directory)
    assert not held(directory)
    monkeypatch.undo()
    reopened = QueryCore(kv_spec("s"), [0, 1], directory=directory)  # the first partition's engine was closed
    assert held(directory)
    reopened.close()


def test_two_sweepers_of_one_disk_delete_each_directory_once_and_count_its_bytes_once(tmp_path: Path) -> None:
    """Nodes that share a data directory each sweep it: a directory both find orphaned is claimed by one
    (renamed first), which alone counts its bytes; the other finds it gone, warns of nothing."""
    for _ in range(10):
        root = tmp_path / str(uuid.uuid4())
        orphans = [actor_dir(root) for _ in range(20)]
        clock = Clock()
        sweepers = [Sweeper(root, Names(), grace=5, clock=clock) for _ in range(2)]
        for sweeper in sweepers:
            assert sweeper.sweep() == []  # first sighting
        clock.now += 10
        done: list[list[Path]] = []
        threads = [threading.Thread(target=lambda s=s, into=done: into.append(s.sweep())) for s in sweepers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(p for deleted in done for p in deleted) == sorted(orphans)  # each by one of them
        assert sum(s.reclaimed_bytes for s in sweepers) == 20 * 1000
        assert sum(s.reclaimed_dirs for s in sweepers) == 20
        assert list((root / "orders").iterdir()) == []


def test_a_directory_claimed_by_a_sweeper_that_died_mid_delete_is_deleted_by_a_later_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    left = actor_dir(tmp_path)
    claimed = left.rename(left.with_name(left.name + ".reclaiming"))
    kept = tmp_path / "orders" / "notes.reclaiming"  # not named like an actor's: never touched
    kept.mkdir()
    sweeper = Sweeper(tmp_path, Names(), grace=5, clock=Clock())
    assert sweeper.sweep() == [] and claimed.exists()  # just claimed: maybe another sweeper's, deleting it
    monkeypatch.setattr("runtime.orphans.LEFT_AFTER", 0.0)
    assert sweeper.sweep() == [] and not claimed.exists() and kept.is_dir()
    assert (sweeper.reclaimed_bytes, sweeper.reclaimed_dirs) == (1000, 1)  # its claimer never counted it


def test_a_directory_that_cannot_all_be_deleted_is_not_counted_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    orphan = actor_dir(tmp_path)
    clock = Clock()
    sweeper = Sweeper(tmp_path, Names(), grace=5, clock=clock)
    sweeper.sweep()
    clock.now += 10

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("runtime.orphans.shutil.rmtree", refuse)
    assert sweeper.sweep() == [] and not orphan.exists()
    assert (sweeper.reclaimed_bytes, sweeper.reclaimed_dirs) == (0, 0)
    assert "could not delete all of" in caplog.text and "a later pass tries again" in caplog.text
