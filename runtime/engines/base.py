"""The contract every partition engine keeps, the position it records, and the factory that opens one.

A partition engine holds the rows of one partition of one store and the position they reflect (the source
and the last batch id applied). ``apply`` changes rows and position together, atomically: a process killed
at any instant reopens with either the old rows and position or the new ones. The engine does not decide
whether a batch is the next one; ``PartitionState`` (the caller) does, from ``position()``.

An engine directory starts with a small manifest (``riqr-engine.json``: engine kind, key schema, format
version), so a directory is never opened by the wrong engine or read with the wrong key schema: both would
silently misread the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtime.config import ENGINES
from runtime.durable import fsync_directory, make_directories, write_atomically
from runtime.errors import RiqrError
from runtime.keys import KeySchema
from runtime.scan import Scan, TimeWalk

__all__ = [
    "Position",
    "NONE",
    "PartitionEngine",
    "PendingCheckpoint",
    "EngineMismatch",
    "EngineCorrupt",
    "ENGINES",
    "MANIFEST",
    "prepare_directory",
    "new_directory",
    "fsync_directory",
    "write_atomically",
]

MANIFEST = "riqr-engine.json"
_FORMAT = 1


@dataclass(frozen=True)
class Position:
    """What a partition reflects: the source (Spark query id) and the last batch id applied (-1: none)."""

    source: str | None
    batch_id: int

    def behind(self, other: Position) -> bool:
        """Whether this is an earlier batch of ``other``'s source (positions of two sources do not compare:
        the sink's order of its sources is not kept anywhere a copy can read it)."""
        return self.source == other.source and self.batch_id < other.batch_id


NONE = Position(None, -1)


class EngineMismatch(RiqrError):
    """An engine directory was opened with another engine kind or key schema than it was written with."""

    code = "engine-mismatch"


class EngineCorrupt(RiqrError):
    """An engine directory's durable files are damaged beyond the torn tail a crash can leave."""

    code = "engine-corrupt"


class PendingCheckpoint(Protocol):
    """A point-in-time copy that has been captured but not yet fully written out (``start_checkpoint``)."""

    position: Position

    def finish(self) -> Position:
        """Write what is left of the copy into its directory (no lock needed) and return its position."""
        ...


class PartitionEngine(Protocol):
    """One partition's rows (internal key -> opaque bytes) and its position.

    Keys are internal keys of the store's ``KeySchema``; scan bounds may be partial tuples ending in ``TOP``.
    Writes (``apply``, ``reset``, ``close``) are serialised by the caller. ``get``, ``get_many`` and
    ``count`` may run in other threads while a write is in progress, seeing each key's old value or its
    new one; a ``scan`` may too when ``concurrent_scans`` is true, and otherwise must not overlap a write.
    """

    concurrent_scans: bool

    def get(self, key: Any) -> bytes | None:
        """The value of ``key``, or None."""
        ...

    def get_many(self, keys: Sequence[Any]) -> list[bytes | None]:
        """One value (or None) per key, in order."""
        ...

    def scan(self, scan: Scan, walk: TimeWalk | None = None) -> Iterator[tuple[Any, bytes]]:
        """The entries within the scan's bounds, lazily, in its direction. ``scan.times`` is not applied;
        with ``walk`` (a window or session store's time filter) only the entries it admits come out, and
        the engine seeks where it says rather than stepping over long runs of refused windows."""
        ...

    def read_encoded(self, scan: Scan, limit: int | None, max_bytes: int) -> tuple[list[bytes], list[bytes], bool]:
        """A page of the scan as two lists, in its direction: the keys' ``KeyCodec`` bytes and the values.
        It stops after ``limit`` entries or once keys and values reach ``max_bytes`` (always at least one
        entry), and says whether it stopped at such a bound (``True``: more may follow). ``scan.times`` is
        not applied. Read at once, so no iterator outlives the call."""
        ...

    def count(self) -> int:
        """The exact number of keys."""
        ...

    def position(self) -> Position:
        """The position the rows reflect."""
        ...

    def apply(self, position: Position, rows: Sequence[tuple[Any, bytes | None]]) -> None:
        """Upsert and delete (a None value deletes; the last write of a key wins) and move to ``position``,
        atomically and durably (when the engine has a directory)."""
        ...

    def reset(self, position: Position) -> None:
        """Drop every row and move to ``position`` (a new source starts over), atomically."""
        ...

    def checkpoint(self, dest: Path) -> Position:
        """Write a point-in-time copy into the new directory ``dest`` (``open_engine`` opens it)."""
        ...

    def start_checkpoint(self, dest: Path) -> PendingCheckpoint:
        """Capture a point-in-time copy for the new directory ``dest``, cheaply: the caller holds its write
        lock only for this call, and writes the rest out with ``finish()`` after releasing it, so a peer
        copying a partition stalls its writes for the capture, not for the whole write-out."""
        ...

    def memory(self) -> dict[str, int]:
        """Bytes the engine holds outside Python objects, by what holds them (rocksdb: block cache, pinned
        blocks, memtables, table readers); empty when it keeps nothing but its rows. For benchmarks and
        operators, not for the hot path."""
        ...

    def close(self) -> None:
        """Release files and memory. The engine is unusable afterwards."""
        ...

    def destroy(self) -> None:
        """Close and delete the engine's directory."""
        ...


def _manifest(kind: str, schema: KeySchema) -> dict[str, Any]:
    return {"format": _FORMAT, "kind": kind, "key": schema.to_json()}


def prepare_directory(kind: str, schema: KeySchema, path: Path) -> bool:
    """Create ``path`` with its manifest, or check the manifest already there. True if it already existed.

    ``EngineMismatch`` if the directory belongs to another kind or key schema, or is not an engine's.
    """
    wanted = _manifest(kind, schema)
    manifest = path / MANIFEST
    if manifest.exists():
        found = json.loads(manifest.read_text())
        if found.get("format") != _FORMAT or found.get("kind") != kind:
            raise EngineMismatch(
                f"{path} holds a {found.get('kind')!r} engine (format {found.get('format')}), not {kind!r}",
                path=str(path),
            )
        if found.get("key") != wanted["key"]:
            raise EngineMismatch(
                f"{path} was written with key schema {found.get('key')}, not {wanted['key']}", path=str(path)
            )
        return True
    if path.exists() and any(path.iterdir()):
        raise EngineMismatch(f"{path} is not empty and has no {MANIFEST}: not an engine directory", path=str(path))
    make_directories(path)  # a new partition's directory must survive a power loss as its files do
    # The manifest comes first: files an engine writes later are only ever read after it was checked.
    write_atomically(manifest, json.dumps(wanted, sort_keys=True).encode())
    return False


def new_directory(kind: str, schema: KeySchema, dest: Path) -> None:
    """Create ``dest`` (absent or empty) as an engine directory for a checkpoint; never reuse a full one."""
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"checkpoint destination {dest} is not empty")
    prepare_directory(kind, schema, dest)
