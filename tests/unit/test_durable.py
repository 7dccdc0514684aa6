"""Every file riqr says is written survives a power loss: the rename that puts it in place is followed by a
sync of its directory, and a directory made for it is synced into its parent. Checked by recording the
syncs (a real power loss is not something a unit test can cause): for each, the name must already be in
the directory when the directory is synced, or the sync makes nothing durable."""

from __future__ import annotations

from pathlib import Path

import pytest

import runtime.durable
import runtime.landing
import topologies.checkpoint
import topologies.deadletter
from runtime.durable import make_directories, write_atomically
from runtime.engines import open_engine
from runtime.feeds import FeedBook, save_book
from runtime.keys import KeySchema
from runtime.landing import CLOCK_FILE, Record, topic_dir, write_records


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, list[str]]]:
    """Each directory synced, with the names it held at that instant."""
    calls: list[tuple[Path, list[str]]] = []
    real = runtime.durable.fsync_directory

    def record(path: Path) -> None:
        calls.append((Path(path), sorted(p.name for p in Path(path).iterdir())))
        real(path)

    for module in (runtime.durable, runtime.landing, topologies.checkpoint, topologies.deadletter):
        monkeypatch.setattr(module, "fsync_directory", record)
    return calls


def test_new_directories_are_each_synced_into_their_parent(tmp_path: Path, synced: list) -> None:
    (tmp_path / "a").mkdir()
    make_directories(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert synced == [(tmp_path / "a", ["b"]), (tmp_path / "a" / "b", ["c"])]
    synced.clear()
    make_directories(tmp_path / "a" / "b" / "c")  # there already: nothing to sync
    assert synced == []


def test_an_atomic_write_syncs_its_directory_after_the_rename(tmp_path: Path, synced: list) -> None:
    write_atomically(tmp_path / "marker.json", b"{}")
    assert synced == [(tmp_path, ["marker.json"])]


def test_a_landed_file_and_its_new_topic_directory_are_synced(tmp_path: Path, synced: list) -> None:
    written = write_records(tmp_path, "order", [Record("1", "a")])
    assert written is not None
    directory = topic_dir(tmp_path, "order")
    # The topic directory made for it (and its parent, if new), then the file's name in it.
    assert synced[-1] == (directory, sorted([CLOCK_FILE, written.name]))
    assert (directory.parent, [directory.name]) in synced
    synced.clear()
    second = write_records(tmp_path, "order", [Record("2", "b")])
    assert second is not None
    assert synced == [(directory, sorted([CLOCK_FILE, written.name, second.name]))]


def test_dead_letters_are_synced_before_their_batch_is_done(tmp_path: Path, synced: list) -> None:
    topologies.deadletter._write_batch(tmp_path, "batch-1.json", iter(['{"reason": "bad"}']))
    assert synced == [(tmp_path, ["batch-1.json"])]
    synced.clear()
    topologies.deadletter._write_batch(tmp_path, "batch-2.json", iter([]))  # no letters: no file, no sync
    assert synced == []


def test_the_feed_book_is_synced_into_its_directory(tmp_path: Path, synced: list) -> None:
    save_book(FeedBook(), tmp_path / "feeds.json")
    assert synced == [(tmp_path, ["feeds.json"])]


def test_a_superseded_checkpoint_stays_superseded_after_a_crash(tmp_path: Path, synced: list) -> None:
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    target = topologies.checkpoint.supersede(str(checkpoint))
    assert not checkpoint.exists() and target.is_dir()
    assert synced == [(tmp_path, [target.name])]


def test_a_new_copys_store_and_actor_directories_are_synced_before_its_partitions(tmp_path: Path, synced: list) -> None:
    """The owner lock is taken first, and made the store's and the actor's directories with a plain mkdir:
    the partitions' syncs did not reach them (a diff review)."""
    from runtime.catalog import StoreSpec, ValueField
    from runtime.query import QueryCore

    spec = StoreSpec("s", KeySchema("key", "string"), (ValueField("value", "string"),), partitions=2)
    root = tmp_path / "ns"
    core = QueryCore(spec, [0, 1], directory=root / "s" / "uuid-1")
    try:
        names = {(path, tuple(entries)) for path, entries in synced}
        assert (tmp_path, ("ns",)) in names
        assert (root, ("s",)) in names
        assert (root / "s", ("uuid-1",)) in names
    finally:
        core.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_new_partitions_directory_is_synced_into_its_store_and_root(tmp_path: Path, synced: list, kind: str) -> None:
    # A store's first copy on a node makes the store's directory and the partition's in it: a power loss
    # after its first batch was acknowledged must not take either name, and the rows with them.
    engine = open_engine(kind, KeySchema("key", "string"), tmp_path / "store" / "p0")
    try:
        assert (tmp_path, ["store"]) in synced
        assert (tmp_path / "store", ["p0"]) in synced
    finally:
        engine.close()


def test_a_rebuild_pending_marker_is_synced_with_its_new_directory(tmp_path: Path, synced: list) -> None:
    topologies.checkpoint.mark_rebuild_pending(str(tmp_path / "checkpoints" / "order-count"))
    assert (tmp_path, ["checkpoints"]) in synced
    assert synced[-1] == (tmp_path / "checkpoints", ["order-count.rebuild-pending"])
