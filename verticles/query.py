"""QueryVerticle: a Ray actor named by a uuid, holding some partitions of one store.

A thin shell over ``runtime.query.QueryCore``. It is a threaded actor: reads are answered while a batch
is being applied (``QueryCore`` serialises the writes), so a large batch does not stall lookups. A batch's
rows and position land in one atomic write per partition. Its partitions live under
``<data dir>/<store>/<uuid>/p<n>`` on its node, so when Ray restarts it (a crash, ``ray.kill`` with
restart, its worker SIGKILLed) it reopens them at their last position and serves again by itself. When
a partition cannot (its data was wiped, or it missed batches) and the store has standbys, it rebuilds
the partition from a live peer (``runtime.rebuild``), and serves it once it has caught up.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from runtime import logs
from runtime.batchrows import Slice
from runtime.catalog import StoreSpec
from runtime.engines import Position
from runtime.metrics import QUERY_METRICS, Metrics
from runtime.monotonic import Spans
from runtime.pages import PackedPage
from runtime.partition import Hold
from runtime.query import ApplyResult, QueryCore
from runtime.scan import Scan
from runtime.snapshots import SnapshotOffer, SnapshotPeer
from verticles.env import PeerLink, VerticleEnv, prune_empty_dirs

# A large batch turns into Python rows (tuples, keys, packed values) that are freed after the apply; glibc
# keeps the freed memory in the process unless asked to give it back, so an actor's heap kept the high-water
# mark of its largest batches (measured in docs/benchmarks.md, "State larger than memory").
_TRIM_AFTER_ROWS = 50_000

__all__ = ["QueryVerticle"]

log = logging.getLogger(__name__)


def _trim_heap() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def _trimmed_after(results: list[ApplyResult]) -> list[ApplyResult]:
    """``results`` of an apply, once the heap is trimmed if the apply was large (``_TRIM_AFTER_ROWS``)."""
    if sum(r.rows for r in results) >= _TRIM_AFTER_ROWS:
        _trim_heap()
    return results


class StorePeers:
    """``runtime.rebuild.PeerSource`` for one store, over the verticle's ``PeerLink``."""

    def __init__(self, link: PeerLink, store: str) -> None:
        self._link, self._store = link, store

    def holders(self, partition: int) -> list[str]:
        return self._link.holders(self._store, partition)

    def peer(self, uuid: str) -> SnapshotPeer:
        return self._link.snapshot_peer(uuid)

    def reset_refused(self, source: str) -> str | None:
        """Why batch 0 of ``source`` may not reset the store's partitions (``Registry.reset_refused``)."""
        return self._link.reset_refused(self._store, source)


class QueryVerticle:
    """Holds ``partitions`` of ``spec``; its actor name is ``uuid``. ``env`` gives the node facts and the
    link to the registry; ``replacement``: the registry created it again (its node died, or Ray would not
    restart it); ``joining``: a move's new actor (``runtime.moves``), whose partitions open incomplete and
    are copied from peers when the registry says (``catch_up``), once it is in the table."""

    def __init__(
        self,
        uuid: str,
        spec: StoreSpec,
        partitions: Sequence[int],
        env: VerticleEnv,
        *,
        replacement: bool = False,
        joining: bool = False,
    ) -> None:
        logs.configure_from_env()
        self.log = logs.bind(log, store=spec.name, actor=uuid)
        self.uuid = uuid
        self.node_id = env.node_id()
        self.node_ip = env.node_ip()
        # A move's new actor not yet in its store's table (``admit``): a restarted registry that finds it
        # unlisted destroys it (its mover is gone; ``runtime.membership.merge_members``). Ray restarts an
        # actor with its first arguments: one restarted may have been admitted (and be the only copy of its
        # partitions since the switch), so it never says joining again; one restarted before its admit is
        # then taken for an extra copy, which is safe.
        self.joining = joining and not env.restarted()
        # A replacement (the registry created this actor again: its node died, or Ray would not restart
        # it) is a restart, on another node or its own: whatever it finds on disk is reopened, never
        # trusted blindly (the gap rule), and what it cannot serve is rebuilt from peers.
        restarted = env.restarted()
        recovered = restarted or replacement or joining
        root = env.data_dir()
        directory = None if root is None else root / spec.name / uuid
        self._data_root = root
        # Reads in other threads get the interpreter often while a batch is applied in Python code.
        sys.setswitchinterval(0.001)
        started = time.monotonic()
        metrics = Metrics(QUERY_METRICS)
        # Only a store with standbys rebuilds a lost copy from peers by itself; without, a lost copy waits
        # for the topology-restart rebuild path (docs/design.md, "Durability"). Any store's copies are copied
        # from peers when a move asks (``catch_up``).
        peers = StorePeers(env, spec.name)
        self.core = QueryCore(
            spec,
            partitions,
            directory=directory,
            recovered=recovered,
            new_copy=self.joining,
            metrics=metrics,
            peers=peers,
            me=uuid,
            catch_up_on_gap=(spec.standbys or 0) > 0,
            reset_check=peers.reset_refused,
            # Before a restarted actor's first catch-up asks a peer (``runtime.rebuild``): the registry then
            # lists another incarnation, and the delivery of a batch this copy acknowledged before it lost
            # its data, if the peer has not applied it yet, sees that and sends the batch again.
            # An env of an older riqr (Ray restarts an actor with its first arguments) has no report: as before.
            announce=functools.partial(report, uuid, self.node_id, self.node_ip)
            if (restarted or replacement) and (report := getattr(env, "report_restart", None)) is not None
            else None,
        )  # fmt: skip
        self.opened_in = time.monotonic() - started
        env.export_metrics(metrics)
        if restarted or replacement:
            self.log.warning("query actor restarted: %s", self.core.positions())
            env.report_moved(uuid, self.node_id, self.node_ip)
            # Ray restarts an actor with its first arguments: a store created without standbys may have been
            # given some since (``riqr standbys``); the registry then tells it so (``peers_joined``).
            self._rebuild_unserved()

    def ready(self) -> dict[str, str]:
        """Where this actor runs; the registry waits on this before publishing the actor."""
        return {"uuid": self.uuid, "node_id": self.node_id, "node_ip": self.node_ip}

    def ping(self) -> bool:
        """Whether this actor is there at all: a facade asks when a scan's call to it is long
        (``runtime.facade.silence.answer_or_silence``). Called in its own concurrency group
        (``runtime.config.PROBE_GROUP``), so threads busy with long calls do not hold it up."""
        return True

    def peers_joined(self) -> list[int]:
        """Its store gained standby copies (``Registry.keep``): from now on a copy of it that finds a gap,
        or cannot serve, catches up from peers by itself, as in a store created with standbys; returns the
        partitions that started catching up now."""
        if self.core.catch_up_on_gap:
            return []
        self.core.catch_up_on_gap = True
        self.log.info("its store has standby copies now: copies that cannot serve catch up from peers")
        return self._rebuild_unserved()

    def peers_left(self) -> bool:
        """No partition of this actor has another copy any more (``riqr standbys`` removed them): a copy that
        finds a gap, or cannot serve, waits for the rebuild path, as in a store created without standbys,
        rather than look for a peer that is not there. True if that changed."""
        if not self.core.catch_up_on_gap:
            return False
        self.core.catch_up_on_gap = False
        self.log.info("its copies have no peers any more: a copy that cannot serve waits for the rebuild path")
        return True

    def _rebuild_unserved(self) -> list[int]:
        """``QueryCore.rebuild_unserved``, said in the log when it starts any."""
        rebuilding = self.core.rebuild_unserved()
        if rebuilding:
            self.log.warning("rebuilding partitions %s from live peers", rebuilding)
        return rebuilding

    def admit(self) -> dict[str, str]:
        """A move's new actor goes into its store's table (``Registry.admit``): from now on it is a copy like
        any other, which a restarted registry keeps. Returns where it runs, as ``ready``."""
        self.joining = False
        return self.ready()

    def apply(
        self, source: str, batch_id: int, slices: Mapping[int, Slice | None], hold: Hold | None = None
    ) -> list[ApplyResult]:
        return _trimmed_after(self.core.apply(source, batch_id, slices, hold))

    def apply_parts(
        self, source: str, batch_id: int, partitions: Sequence[int], *tables: Slice | None, hold: Hold | None = None
    ) -> list[ApplyResult]:
        """``apply`` with each partition's slice a top-level argument: the sink passes large slices as
        object references, which Ray resolves (Arrow buffers mapped from the object store, not copied).
        ``hold``: the batch's watermark, for an append-mode store (``runtime.partition.Hold``)."""
        return self.apply(source, batch_id, dict(zip(partitions, tables, strict=True)), hold)

    def apply_parts_sharing(
        self, source: str, batch_id: int, partitions: Sequence[int], *tables: Slice | None, hold: Hold | None = None
    ) -> tuple[Any, ...]:
        """``apply_parts``, also returning each partition's rows as an ``EncodedSlice``: ``((results, the
        partitions with one), slice or None for each of ``partitions`` in order)``, as separate objects.
        The sink calls it with ``num_returns`` one more than the partitions, gets only the first, and hands
        each slice's reference to the partition's active copy (``topologies.delivery``)."""
        results, shared = self.core.apply_sharing(source, batch_id, dict(zip(partitions, tables, strict=True)), hold)
        _trimmed_after(results)
        encoded = sorted(p for p, table in shared.items() if table is not None)
        return ((results, encoded), *(shared.get(p) for p in partitions))

    def begin(self, source: str) -> list[int]:
        """A source starts from an empty checkpoint (see ``runtime.partition``)."""
        return self.core.begin(source)

    def get_many(self, items: Sequence[tuple[int, Any]]) -> tuple[list[bytes | None], Spans]:
        """Values and, per partition, what they reflect (``runtime.monotonic``)."""
        return self.core.get_many(items)

    def scan(
        self, partitions: Sequence[int], scan: Scan, limit: int | None = None
    ) -> tuple[list[tuple[Any, bytes]], Spans]:
        return self.core.scan(partitions, scan, limit)

    def scan_packed(
        self, partitions: Sequence[int], scan: Scan, limit: int | None, max_bytes: int, fmt: str
    ) -> tuple[PackedPage, Spans]:
        return self.core.scan_packed(partitions, scan, limit, max_bytes, fmt)

    def count(self, partitions: Sequence[int]) -> tuple[int, Spans]:
        return self.core.count(partitions)

    def positions(self) -> dict[int, dict[str, Any]]:
        return self.core.positions()

    def open_snapshot(self, partition: int, at_least: Position | None = None) -> SnapshotOffer:
        """Export a consistent copy of a serving partition for a peer rebuilding its own (``runtime.snapshots``);
        ``CopyBehind`` if it is older than the peer's own ``at_least``."""
        return self.core.open_snapshot(partition, at_least)

    def read_snapshot(self, token: str, path: str, offset: int, length: int) -> bytes:
        return self.core.read_snapshot(token, path, offset, length)

    def close_snapshot(self, token: str) -> None:
        self.core.close_snapshot(token)

    def engine_memory(self) -> dict[int, dict[str, int]]:
        return self.core.engine_memory()

    def stats(self) -> dict[str, Any]:
        """Positions and metric samples, for the HTTP verticles' readiness and metrics (``runtime.health``)."""
        return self.core.stats()

    def catch_up(self, partitions: Sequence[int], prefer: str | None = None) -> list[int]:
        """Copy ``partitions`` from live peers, ``prefer`` first, and catch them up (a move's new copy;
        ``QueryCore.catch_up``)."""
        started = self.core.catch_up(partitions, prefer)
        if started:
            self.log.info("copying partitions %s from live peers%s", started, f", {prefer} first" if prefer else "")
        return started

    def seal(self, seconds: float | None) -> dict[int, dict[str, Any]]:
        """Refuse batches for ``seconds`` (None: for good) and return the positions (``QueryCore.seal``)."""
        return self.core.seal(seconds)

    def unseal(self) -> None:
        self.core.unseal()

    def destroy(self) -> None:
        """Delete this actor's partitions from disk (its store or the runtime is going away), and the
        store's and the namespace's directories on this node if nothing else is left in them."""
        self.core.destroy()
        if self._data_root is not None:
            prune_empty_dirs(self._data_root / self.core.spec.name, self._data_root)

    def info(self) -> dict[str, Any]:
        """What this actor is, for the registry to rebuild its tables after a restart."""
        return {
            "uuid": self.uuid,
            "spec": self.core.spec,
            "partitions": sorted(self.core.partitions),
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "opened_in": self.opened_in,
            # Its data deleted, not yet killed: a restarted registry destroys it rather than take it back.
            "destroyed": self.core.destroyed,
            # A move put another actor in its place (sealed for good): likewise, never taken back.
            "moved": self.core.moved,
            # A move's new actor its registry never put in a table: its mover is gone, and so is it.
            "joining": self.joining,
        }
