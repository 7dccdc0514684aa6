"""Files that survive a crash of the machine, not only of the process.

A rename is atomic but not durable until the directory holding it is synced (POSIX): after a power loss
the directory can come back without the new name, so a file a caller was told is written, or a record a
topology has already moved past, is gone. Everything riqr tells someone is on disk goes through here:
the file's bytes synced, renamed into place, the directory synced; new directories synced into their
parents.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory", "make_directories", "write_atomically"]


def fsync_directory(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (POSIX needs the directory itself synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(path: Path) -> None:
    """``mkdir -p path``, with each directory it creates synced into its parent (a crash leaves none of a
    new topic's files behind a directory entry that was never written)."""
    missing: list[Path] = []
    at = path
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    path.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        fsync_directory(created.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old file or the new one, never a torn one."""
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
