"""What a Spark checkpoint directory says about a streaming query, and setting one aside for a rebuild.

A checkpoint holds ``metadata`` (the query id, riqr's *source*: stable across restarts of the same
checkpoint), ``offsets/<batch id>`` (the batches planned, each with the event-time watermark Spark runs
it with) and ``commits/<batch id>`` (the batches done).
"""

from __future__ import annotations

import datetime as _dt
import glob
import json
import logging
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

from runtime.durable import fsync_directory, make_directories, write_atomically
from runtime.errors import SchemaError

__all__ = [
    "local_path",
    "query_id",
    "last_committed",
    "last_planned",
    "supersede",
    "mark_rebuild_pending",
    "rebuild_pending",
    "rebuild_delivered",
    "batch_watermark",
    "SUPERSEDED_KEPT",
]

log = logging.getLogger(__name__)

# How many superseded checkpoints of one checkpoint are kept (``supersede``): the newest.
SUPERSEDED_KEPT = 3


def local_path(checkpoint: str) -> Path:
    """The local directory of a checkpoint location (only local file systems are supported so far)."""
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        raise SchemaError(f"checkpoint {checkpoint!r}: only local checkpoint directories are supported so far")
    return Path(parsed.path if parsed.scheme else checkpoint)


def query_id(checkpoint: str) -> str | None:
    """The streaming query id Spark wrote to ``<checkpoint>/metadata`` (None before the first start)."""
    path = local_path(checkpoint) / "metadata"
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as f:
        return str(json.loads(f.readline())["id"])


def _last_batch(checkpoint: str, log: str) -> int | None:
    directory = local_path(checkpoint) / log
    if not directory.is_dir():
        return None
    ids = [int(name) for name in os.listdir(directory) if name.isdigit()]
    return max(ids) if ids else None


def last_committed(checkpoint: str) -> int | None:
    """The last batch id Spark committed in this checkpoint, or None if it never committed one."""
    return _last_batch(checkpoint, "commits")


def last_planned(checkpoint: str) -> int | None:
    """The last batch id Spark planned (wrote offsets for) in this checkpoint, or None if none yet."""
    return _last_batch(checkpoint, "offsets")


def _pending_path(checkpoint: str) -> Path:
    path = local_path(checkpoint)
    return path.with_name(f"{path.name}.rebuild-pending")


def mark_rebuild_pending(checkpoint: str) -> None:
    """Say, beside ``checkpoint``, that a rebuild is about to set it aside: until its first batch is
    delivered (``rebuild_delivered``), an empty checkpoint there is that rebuild's, not a new store's."""
    path = _pending_path(checkpoint)
    make_directories(path.parent)
    write_atomically(path, b"a rebuild set the checkpoint aside; its first batch is not delivered yet")


def rebuild_pending(checkpoint: str) -> bool:
    """Whether a rebuild of ``checkpoint``'s store has not delivered its first batch yet."""
    return _pending_path(checkpoint).exists()


def rebuild_delivered(checkpoint: str) -> None:
    """The rebuild's first batch is delivered: forget ``mark_rebuild_pending`` (idempotent)."""
    _pending_path(checkpoint).unlink(missing_ok=True)


def supersede(checkpoint: str) -> Path:
    """Move a checkpoint aside (kept for inspection: ``<checkpoint>.superseded-<UTC time>``) so the query
    starts again from an empty one. Returns where it went. Only the newest ``SUPERSEDED_KEPT`` of one
    checkpoint are kept: each holds Spark's state, and a store that keeps losing its copies is rebuilt up to
    twice an hour for as long as that lasts."""
    path = local_path(checkpoint)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.superseded-{stamp}")
    os.replace(path, target)
    fsync_directory(path.parent)  # a crash must not bring the superseded checkpoint back into use
    # The stamps sort as the times do (the one just made is kept whatever the clock did).
    others = sorted(p for p in path.parent.glob(f"{glob.escape(path.name)}.superseded-*") if p != target)
    older = others[: max(0, len(others) - (SUPERSEDED_KEPT - 1))]
    for stale in older:
        log.info("deleting %s: %d newer superseded checkpoints of %s are kept", stale, SUPERSEDED_KEPT, path.name)
        shutil.rmtree(stale, ignore_errors=True)
    return target


def batch_watermark(checkpoint: str, batch_id: int) -> int | None:
    """The event-time watermark (epoch millis) Spark runs batch ``batch_id`` with: ``batchWatermarkMs`` of
    its offset log entry, written before the batch runs (0 until the query has one). None when the entry
    is missing or unreadable."""
    path = local_path(checkpoint) / "offsets" / str(batch_id)
    try:
        with open(path, encoding="utf-8") as f:
            f.readline()  # the log's version, "v1"
            return int(json.loads(f.readline())["batchWatermarkMs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
