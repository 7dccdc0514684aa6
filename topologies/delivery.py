"""The foreachBatch function of ``materialize``: split a micro-batch by partition and deliver the slices
to every owner over Ray, until every owner has acknowledged it.

* Every partition of every owner gets every batch id (an empty slice when it has no rows), so each can
  tell when it missed one (``runtime.partition``).
* Standby copies get the batch first, actives after: an active never shows a batch its standbys lack,
  so a read that fails over to a standby never sees the store go back in time.
* An owner that is restarting or briefly unreachable is asked again with backoff, up to
  ``delivery_timeout`` (a minute by default); only then does the batch fail, which fails the Spark query
  before it commits the batch. A replay after a restart is a no-op wherever the batch had landed.
* A copy that is catching up from a peer (``runtime.rebuild``) answers at once that it buffered the
  batch (state ``catching-up``): not a failure, and the batch is acknowledged to Spark once the other
  copies applied it. That is safe because the buffered copy serves nothing until it has applied the
  batch, and the in-sync copies hold it durably; if the catching-up copy dies, it reopens incomplete and
  copies again from them (docs/design.md, "Rebuilding a copy from a peer").
* In a batch of ``SHARE_ENCODED_ROWS`` or more, a rocksdb store's standby copies encode their slices (keys
  to their stored bytes, in key order, values packed) and return them, as separate objects, with their
  acknowledgement; each active copy then gets its partitions' encoded slices instead of the micro-batch's
  and skips the encoding, about half of an apply (``runtime.batchrows``). A slice large enough for the
  engine to write as an SST file comes with that file, which the active ingests as it is when it was
  where the standby was (``runtime.engines.rocks``). If an active copy's call with them fails for any
  reason (the standby's node gone with the objects, say), it is asked again with the micro-batch's own
  slices.
* An append-mode aggregation with an event-time watermark (sessions, windows in append mode) gets each
  batch with its watermark (``holds``; ``runtime.partition.Hold``): a partition that a new source's batch
  0 resets then serves only from a batch with a watermark, since batch 0 (run with none) closes none of
  the windows and sessions the partition had.
* Read replicas (``runtime.readreplica``: copies of the whole store inside HTTP verticles) get the batch
  with the standbys. One that does not acknowledge it within ``READ_REPLICA_APPLY_TIMEOUT`` is dropped
  from the view, in the registry, before any active copy gets the batch; the registry is asked again while
  it restarts, and if it cannot be told within the batch's minute, the batch fails. So a listed replica is
  never behind an active copy, and ingest never waits for one.
* The registry hears how ingest goes, through this process's ``Feeder`` (``topologies.feeder``, which
  also beats for the store while its query runs): the batch applied and when, partitions that are not
  complete, or why it failed. ``GET /stores`` shows it.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import ray

from runtime import raycalls
from runtime.catalog import StoreSpec
from runtime.config import READ_REPLICA_APPLY_TIMEOUT, REGISTRY_NAME
from runtime.deadline import Deadline
from runtime.errors import CopyMoved, DeadlineExceeded, NotConnected, OwnerUnavailable, RiqrError
from runtime.ingest import (
    drop_null_keys,
    drop_unrepresentable_times,
    drop_unrepresentable_value_times,
    slices_for_owners,
    split_by_partition,
    time_columns,
)
from runtime.ownership import ClusterView, OwnershipTable, ReaderCopy
from runtime.partition import CATCHING_UP, INCOMPLETE, REBUILDING, SERVING, Hold
from topologies.checkpoint import batch_watermark, query_id, rebuild_delivered
from topologies.feeder import Feeder, feeder_for
from topologies.inflight import IN_FLIGHT, BatchGivenUp

__all__ = ["BatchDelivery", "registry", "lineage_of", "DEFAULT_DELIVERY_TIMEOUT"]

log = logging.getLogger(__name__)

DEFAULT_DELIVERY_TIMEOUT = 60.0
_CALL_TIMEOUT = 30.0
# How often a batch waiting on owners looks whether a stop has given up on it (``InFlight.given_up``).
_STOP_LOOK = 0.25
# A slice at least this large is put in Ray's object store once per batch and handed to every copy as a
# reference (a top-level argument, which Ray resolves: the actor maps the Arrow buffers without a copy);
# a smaller one goes inline with each call, which costs less than a put.
PUT_SLICE_BYTES = 256 << 10
# A batch of at least this many rows has its standbys encode each partition's rows for the actives too
# (see the module docstring). Below it the sharing costs more than it saves: in a small batch the
# encoding is a few milliseconds, and the extra objects and calls cost more per batch; freshness under
# load measured 685 ms at p50 without sharing against 818 ms with it (bench/ingest.py, batches of a
# few thousand rows). At 1,000,000 rows the active round fell by a third.
SHARE_ENCODED_ROWS = 100_000

Shared = Any  # pa.Table | ray.ObjectRef | None: a slice as handed to the actors: inline, put once, or none


def lineage_of(checkpoint: str) -> str:
    """A feed's lineage (``runtime.feeds.FeedReport.checkpoint``): its checkpoint's location, a local path
    made absolute with its symbolic links resolved (the same home reached another way is the same feed;
    a ``file://`` URI is read as its path, so ``file:///x`` and ``/x`` are one), another URI (hdfs://,
    s3a://) as given."""
    if checkpoint.startswith("file://"):
        from urllib.parse import unquote, urlparse

        parsed = urlparse(checkpoint)
        if parsed.netloc in ("", "localhost"):
            return os.path.realpath(unquote(parsed.path))
    if "://" in checkpoint:
        return checkpoint
    return os.path.realpath(checkpoint)


def registry(namespace: str) -> Any:
    """The registry actor of ``namespace``, or ``NotConnected``."""
    try:
        return ray.get_actor(REGISTRY_NAME, namespace=namespace)
    except ValueError:
        raise NotConnected(
            f"no riqr runtime in Ray namespace {namespace!r}; start it with `riqr up --namespace {namespace}`",
            namespace=namespace,
        ) from None


def _drop_reader(reg: Any, *, uuid: str, reason: str) -> Any:
    """The registry's call that drops read replica ``uuid`` (``BatchDelivery._settle_readers``)."""
    return reg.drop_reader.remote(uuid, reason)


class BatchDelivery:
    """Delivers micro-batches of one store; called by Spark as ``foreachBatch(df, batch_id)``."""

    def __init__(
        self,
        spec: StoreSpec,
        namespace: str,
        checkpoint: str,
        *,
        delivery_timeout: float = DEFAULT_DELIVERY_TIMEOUT,
        query_name: str | None = None,
        feeder: Feeder | None = None,
    ) -> None:
        self.spec = spec
        self._times = time_columns(spec)  # the timestamp columns a batch's rows are checked on (the sink)
        self._keys = [name for name, _ in spec.key.columns]
        self._values = [f.name for f in spec.value_fields]  # checked for times too, at any depth (the sink)
        self.namespace = namespace
        self.checkpoint = checkpoint
        self.delivery_timeout = delivery_timeout
        self.query_name = query_name
        self._source: str | None = None
        self._view: ClusterView | None = None
        self._handles: dict[str, Any] = {}
        self.feeder = feeder if feeder is not None else feeder_for(namespace)
        # Seconds spent per stage of delivery, summed over batches (logged per batch at debug level;
        # bench/ingest.py reads them): batch (Spark's plan run and toArrow), split, view, standby, active,
        # report.
        self.timings: dict[str, float] = {}
        self.share_encoded_rows = SHARE_ENCODED_ROWS
        # The partitions that no copy serves after the last batch (incomplete, or catching up with no peer
        # to copy): batches to come cannot bring them back, so the topology rebuilds the store in place
        # (``topologies.sink.rebuild_due``, ``topologies.runner.supervise``).
        self.unheld: list[int] = []
        # Set when its query is being stopped to be started again (``topologies.sink.stop_for_rebuild``): a
        # batch the stop cancels is not the feed failing.
        self.retired = False
        # Set for an append-mode aggregation with a watermark (``topologies.sink.materialize``): every
        # batch then goes with a ``Hold``.
        self.holds = False
        # Set while a rebuild has delivered no batch yet (``topologies.checkpoint.mark_rebuild_pending``).
        self.rebuild_pending = False
        # False for a source whose fresh checkpoint does not read its input again (Kafka from the latest
        # offsets): a rebuild would reset the store to what comes from now on (``topologies.sink``).
        self.rebuild_from_input = True
        self.said_no_rebuild = False
        # The query actors of the store this delivery declared (``declared``): a table of the same name none
        # of whose owners is among them is another store, dropped and declared again meanwhile (``table``).
        self.owners: frozenset[str] | None = None
        self.replaced = False
        self._replaced_lock = threading.Lock()

    # -- the cluster ----------------------------------------------------------------------------------

    def current_view(
        self,
        *,
        fresh: bool = False,
        get: Callable[..., Any] | None = None,
        feeding: bool = False,
        source: str | None = None,
    ) -> ClusterView:
        """The registry's view (cached while its epoch holds). Called from the batch's thread and from the
        looks at the copies (``topologies.sink.unserved``): each caller gets the view it fetched, and the
        cache never goes back to an older epoch than it holds. ``get`` waits for the registry's answers
        (``raycalls.get``'s arguments; that function itself by default, looked up at the call, so a test's
        or a caller's replacement of it is seen). ``feeding`` (a batch about to be delivered): the same call also
        asks whether another feed holds the store now, and ``NotConnected`` says so if it does; it names the
        batch's ``source``, whose batch 0 alone may then reset the store's partitions (a displaced feed's
        late one may not: ``Registry.reset_refused``)."""
        ask = functools.partial(self._ask_registry, get=get, patient=feeding)
        if feeding:
            owners = sorted(self.owners or ())
            # The source only when there is one: a registry of the riqr before takes four arguments.
            args = (self.spec.name, self.feeder.id, self.lineage, owners) + ((source,) if source else ())
            epoch, taken = ask(lambda reg: reg.feed_epoch.remote(*args), "registry epoch")
            if taken is not None:
                raise NotConnected(f"{taken}; this topology stops feeding it", store=self.spec.name)
        else:
            epoch = ask(lambda reg: reg.epoch.remote(), "registry epoch")
        view = self._view
        if fresh or view is None or view.epoch != epoch:
            view = ask(lambda reg: reg.view.remote(), "registry view")
            cached = self._view
            if cached is None or view.epoch >= cached.epoch:
                self._view = view
        return view

    def _ask_registry(
        self,
        call: Callable[[Any], Any],
        what: str,
        *,
        get: Callable[..., Any] | None = None,
        patient: bool = True,
        deadline: Deadline | None = None,
    ) -> Any:
        """The registry's answer to ``call(registry)``. ``patient`` (a batch's calls): a registry that is
        restarting or does not answer in time (Ray restarts it, on another node if its own is gone) is asked
        again, with a growing pause, for up to the delivery timeout: before, a batch that met a registry
        restart failed its query, and the topology with it (a black-box run). A registry that is gone
        (``riqr down``) is ``NotConnected`` at once. ``deadline``: the batch's, when the caller has it."""
        deadline = deadline or Deadline.after(self.delivery_timeout)
        pause, said, get = 0.1, False, get or raycalls.get
        while True:
            try:
                return get(call(registry(self.namespace)), what, timeout=_CALL_TIMEOUT)
            except (OwnerUnavailable, DeadlineExceeded) as err:
                if not patient or deadline.remaining() <= pause:
                    raise
                if not said:
                    name = self.spec.name
                    log.warning("store %s: the registry did not answer (%s); asking again for up to %.0fs", name,
                                err.message, deadline.remaining(), extra={"store": name})  # fmt: skip
                    said = True
                self._pause(pause, f"{what} of store {self.spec.name}")
                pause = min(pause * 2, 2.0)

    def declared(self, view: ClusterView) -> None:
        """Remember the store as ``view`` has it when this delivery's topology declares it (the view
        ``create_store`` answers with): from then on only that store, not another one a drop and a new
        declaration give the same name, is fed (``table``)."""
        table = view.table(self.spec.name)
        if table is not None:
            self.owners = frozenset(table.all_owners())

    def table(self, view: ClusterView) -> OwnershipTable | None:
        """The store's table in ``view``; None if the store is not registered, and None too if the table of
        that name is another store's: dropped (``riqr drop --force``) and declared again, by another
        topology or a new deployment, between two of this delivery's looks at the registry. A store's
        actors keep their uuids when re-created or promoted, a move's new actor is in the table's
        ``lineage`` with the one it replaced, and a new store gets new ones, so a table whose lineage has
        none of the owners this delivery last saw is not its store: feeding it would overwrite the other
        feed's state (``replaced`` says so from then on)."""
        table = view.table(self.spec.name)
        if table is None or self.owners is None:
            return table
        if not self.owners.isdisjoint(table.lineage()):
            # The same store; a move may have replaced actors (``runtime.moves``): follow its owners now.
            self.owners = frozenset(table.all_owners())
            return table
        with self._replaced_lock:  # the batch's thread and the looks' may both find it: said once
            said, self.replaced = self.replaced, True
        if not said:
            log.error("store %s was dropped and declared again (its query actors are all new): this topology "
                      "no longer feeds it", self.spec.name, extra={"store": self.spec.name})  # fmt: skip
        return None

    def gone(self) -> str:
        """Why ``table`` found no store: the words of the errors that end the feed."""
        if self.replaced:
            return (f"store {self.spec.name!r} was dropped and declared again since this topology declared it "
                    "(its query actors are all new): this topology no longer feeds it, so as not to overwrite "
                    "what now feeds it")  # fmt: skip
        return f"store {self.spec.name!r} is no longer registered"

    @functools.cached_property
    def lineage(self) -> str:
        """The feed's lineage (``FeedReport.checkpoint``): ``lineage_of`` its checkpoint, resolved once (it
        goes with every report and every batch's epoch call)."""
        return lineage_of(self.checkpoint)

    def handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            try:
                handle = self._handles[uuid] = ray.get_actor(uuid, namespace=self.namespace)
            except ValueError:
                raise OwnerUnavailable(f"query actor {uuid} is not running", actor=uuid) from None
        return handle

    def _keep_handles(self, ownership: OwnershipTable, readers: Sequence[ReaderCopy]) -> None:
        """Forget the handles of actors the view no longer names (a move's old actors, dropped readers):
        kept, they grew by every actor a long-running feed ever sent to."""
        named = set(ownership.all_owners()) | {reader.actor for reader in readers}
        handles = dict(self._handles)  # the copy looks' thread adds to it meanwhile: walk a copy
        if any(uuid not in named for uuid in handles):
            self._handles = {uuid: handle for uuid, handle in handles.items() if uuid in named}

    def forget_handles(self) -> None:
        """Look every owner up again at its next call (one may have been re-created under its name)."""
        self._handles.clear()

    def report(self, **info: Any) -> None:
        """Tell the registry how ingest of this store goes (``runtime.feeds.FeedReport``'s fields; best
        effort: never fails or holds up a batch)."""
        info.setdefault("query", self.query_name)
        if self.owners is not None:  # which store of this name the report is about (``FeedReport.owners``)
            info.setdefault("owners", tuple(sorted(self.owners)))
        info.setdefault("checkpoint", self.lineage)
        self.feeder.update(self.spec.name, **info)

    # -- delivery -------------------------------------------------------------------------------------

    def hold(self, batch_id: int) -> Hold | None:
        """What goes with batch ``batch_id`` when ``holds`` (else None): its watermark from the checkpoint's
        offset log (0 when it cannot be read: the partitions held then wait for a batch whose can)."""
        if not self.holds:
            return None
        watermark = batch_watermark(self.checkpoint, batch_id)
        if watermark is None:
            log.warning("store %s: the watermark of batch %d cannot be read from %s/offsets; partitions rebuilding "
                        "wait for a batch whose can", self.spec.name, batch_id, self.checkpoint,
                        extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
        return Hold(watermark or 0)

    def _apply_everywhere(
        self, source: str, batch_id: int, split: Mapping[int, Shared], rows: int, hold: Hold | None = None
    ) -> list[Any]:
        """``apply`` on every standby copy, then on every active one (see the module docstring). A copy
        that is moving to another actor refuses the batch (``CopyMoved``) while the move switches over:
        the batch is delivered again, to the copies the registry names then (the copies that took it
        already skip it as a replay)."""
        deadline = Deadline.after(self.delivery_timeout)
        pause = 0.02
        while True:
            try:
                return self._apply_rounds(source, batch_id, split, rows, hold, deadline)
            except CopyMoved as err:
                if deadline.remaining() <= pause:
                    raise OwnerUnavailable(
                        f"delivering batch {batch_id} of {self.spec.name}: {err.message}, and no switch-over "
                        f"ended within {self.delivery_timeout:g}s",
                        store=self.spec.name,
                        batch_id=batch_id,
                    ) from None
                log.info("store %s: a copy is moving (%s); delivering batch %d again", self.spec.name, err.message,
                         batch_id, extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
                self._pause(pause, f"delivering batch {batch_id} of {self.spec.name}")
                pause = min(pause * 2, 0.5)

    def _apply_rounds(
        self,
        source: str,
        batch_id: int,
        split: Mapping[int, Shared],
        rows: int,
        hold: Hold | None,
        deadline: Deadline,
    ) -> list[Any]:
        clock = time.perf_counter()
        view = self.current_view(feeding=True, source=source)
        ownership = self.table(view)
        if ownership is None:
            raise NotConnected(self.gone(), store=self.spec.name)
        readers = view.readers_of(self.spec.name)
        self._keep_handles(ownership, readers)
        clock = self._lap("view", clock)
        results: list[Any] = []
        # The memory engine keeps Python keys: nothing to share. Small batches neither (SHARE_ENCODED_ROWS).
        share = self.spec.engine == "rocksdb" and rows >= self.share_encoded_rows
        encoded: dict[int, Shared] = {}
        for role in ("standby", "active"):
            slices = dict(split) if role == "standby" else {**split, **encoded}
            pending = slices_for_owners(ownership, slices, role)
            sent = self._send_to_readers(readers, source, batch_id, split, hold) if role == "standby" else {}
            if pending and role == "standby":
                results.extend(
                    self._apply_to(source, batch_id, pending, deadline, share=encoded if share else None, hold=hold)
                )
            elif pending:
                results.extend(
                    self._apply_to(source, batch_id, pending, deadline, fallback=split if encoded else None, hold=hold)
                )
            if sent:
                self._settle_readers(sent, batch_id, deadline)
            if pending or sent:
                clock = self._lap(role, clock)
        results.extend(self._to_copies_changed_meanwhile(view, ownership, source, batch_id, split, deadline, hold))
        return results

    def _to_copies_changed_meanwhile(
        self,
        view: ClusterView,
        ownership: OwnershipTable,
        source: str,
        batch_id: int,
        split: Mapping[int, Shared],
        deadline: Deadline,
        hold: Hold | None,
    ) -> list[Any]:
        """The batch for the copies the registry admitted while it went out (a move's new actor, a copy
        ``riqr standbys`` adds): ``view`` did not list them, so neither round reached them, and one that
        copied a peer from before this batch, with nothing buffered, would call itself in sync and serve
        the batch before this one after the batch is acknowledged (a write-path review). Likewise for a copy
        that restarted meanwhile (another ``ActorInfo.incarnation``): one that acknowledged the batch in the
        standby round, then lost its data and copied the active before the active round reached it, would
        serve the batch before (a read-path review; it tells the registry of its restart before it asks a
        peer, ``runtime.rebuild``). One epoch call a batch; a copy listed by now gets the batch like any
        other (it buffers it while catching up, or skips it if its copy had it already)."""
        if self._ask_registry(lambda reg: reg.epoch.remote(), "registry epoch", deadline=deadline) == view.epoch:
            return []
        latest = self._ask_registry(lambda reg: reg.view.remote(), "registry view", deadline=deadline)
        now = self.table(latest)
        if now is None:
            return []
        before = slices_for_owners(ownership, split)
        pending: dict[str, dict[int, Shared | None]] = {}
        restarted = set()
        for uuid, slices in slices_for_owners(now, split).items():
            then, since = view.actors.get(uuid), latest.actors.get(uuid)
            again = then is not None and since is not None and since.incarnation != then.incarnation
            if again:
                restarted.add(uuid)
            for p, rows in slices.items():
                if again or p not in before.get(uuid, {}):  # a copy of partition p the batch may have missed
                    pending.setdefault(uuid, {})[p] = rows
        if not pending:
            return []
        named = ", ".join(f"{u} (restarted)" if u in restarted else u for u in sorted(pending))
        log.info("store %s: batch %d goes to copies admitted or restarted while it was delivered too: %s",
                 self.spec.name, batch_id, named, extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
        return self._apply_to(source, batch_id, pending, deadline, hold=hold)

    def _send_to_readers(
        self, readers: list[ReaderCopy], source: str, batch_id: int, split: Mapping[int, Shared], hold: Hold | None
    ) -> dict[str, Any]:
        """Start ``apply`` on every read replica (every partition: a replica holds the whole store)."""
        partitions = list(range(self.spec.partitions))
        tables = [split.get(p) for p in partitions]
        sent: dict[str, Any] = {}
        for reader in readers:
            try:
                apply = self.handle(reader.actor).apply_replica_parts
                sent[reader.uuid] = apply.remote(reader.uuid, source, batch_id, partitions, *tables, hold=hold)
            except OwnerUnavailable as err:
                sent[reader.uuid] = err
        return sent

    def _settle_readers(self, sent: dict[str, Any], batch_id: int, batch_deadline: Deadline | None = None) -> None:
        """Wait for the read replicas' acknowledgements, up to ``READ_REPLICA_APPLY_TIMEOUT`` in all, and
        drop from the view every one that did not give it (their results are not the store's copies: the
        sink's verdicts on partitions count only actives and standbys)."""
        deadline = Deadline.after(READ_REPLICA_APPLY_TIMEOUT)
        what = f"delivering batch {batch_id} of {self.spec.name} to a read replica"
        for uuid, ref in sent.items():
            if isinstance(ref, RiqrError):
                failure: RiqrError = ref
            else:
                try:
                    raycalls.get(ref, what, timeout=max(deadline.remaining(), 0.001), actor=uuid)
                    continue
                except RiqrError as err:
                    failure = err
            reason = f"it did not acknowledge batch {batch_id} ({failure.message})"
            log.warning("store %s: dropping read replica %s: %s", self.spec.name, uuid, reason,
                        extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
            # Asked as the batch's other registry calls are: a registry restarting meanwhile is asked again.
            drop = functools.partial(_drop_reader, uuid=uuid, reason=reason)
            self._ask_registry(drop, "dropping a read replica", deadline=batch_deadline)

    def _lap(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + (now - since)
        return now

    def _apply_to(
        self,
        source: str,
        batch_id: int,
        pending: dict[str, dict[int, Shared]],
        deadline: Deadline,
        *,
        share: dict[int, Shared] | None = None,
        fallback: Mapping[int, Shared] | None = None,
        hold: Hold | None = None,
    ) -> list[Any]:
        """``apply`` on the given owners, retrying the ones that fail transiently until ``deadline``.

        With ``share``, each owner also returns its partitions' rows as encoded slices, and ``share`` gets
        the reference of each partition's first one. ``fallback`` (the micro-batch's own slices) says the
        pending slices may be such references: an owner whose call fails in any way is asked again with
        the fallback's slices, and fails for good only if that fails as any call would."""
        what = f"delivering batch {batch_id} of {self.spec.name}"
        results: list[Any] = []
        backoff = 0.05
        while True:
            refs: dict[str, tuple[list[int], Any]] = {}
            failed: dict[str, RiqrError] = {}
            for uuid, slices in pending.items():
                try:
                    partitions = sorted(slices)
                    tables = [slices[p] for p in partitions]
                    handle = self.handle(uuid)
                    if share is not None:
                        sharing = handle.apply_parts_sharing.options(num_returns=len(partitions) + 1)
                        refs[uuid] = partitions, sharing.remote(source, batch_id, partitions, *tables, hold=hold)
                    else:
                        apply = handle.apply_parts
                        refs[uuid] = partitions, apply.remote(source, batch_id, partitions, *tables, hold=hold)
                except OwnerUnavailable as err:
                    failed[uuid] = err
            until = self._await([ref if share is None else ref[0] for _, ref in refs.values()], deadline, what)
            retry_plain: list[str] = []
            for uuid, (partitions, ref) in refs.items():
                try:
                    # The calls' one bound, spent waiting above: one still pending times out at once.
                    timeout = max(until.remaining(), 0.001)
                    if share is None:
                        results.extend(raycalls.get(ref, what, timeout=timeout, actor=uuid))
                        continue
                    applied, encoded_parts = raycalls.get(ref[0], what, timeout=timeout, actor=uuid)
                    results.extend(applied)
                    for p, slice_ref in zip(partitions, ref[1:]):
                        if p in encoded_parts:
                            share.setdefault(p, slice_ref)
                except (OwnerUnavailable, DeadlineExceeded) as err:
                    failed[uuid] = err
                except CopyMoved:
                    raise  # the whole batch again, to the copies the registry names now (``_apply_everywhere``)
                except Exception as err:
                    if fallback is None:
                        raise
                    log.warning("%s: %s failed with the standbys' encoded slices (%s); asking again with the batch's "
                                "own", what, uuid, err, extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
                    retry_plain.append(uuid)
            again = [*failed, *retry_plain]
            if fallback is not None and again:
                # The standbys' encoded slices may be what fails (their objects lost with a node): every
                # owner asked again gets the batch's own slices.
                pending = {uuid: {p: fallback.get(p) for p in pending[uuid]} for uuid in again}
                fallback = None
            else:
                pending = {uuid: pending[uuid] for uuid in again}
            if not failed:
                if not pending:
                    return results
                continue  # only owners to ask again with the batch's own slices: at once
            if deadline.remaining() <= backoff:
                first = next(iter(failed.values()))
                raise OwnerUnavailable(
                    f"{what}: {len(failed)} owner(s) did not acknowledge within {self.delivery_timeout:g}s "
                    f"({first.message})",
                    store=self.spec.name,
                    batch_id=batch_id,
                    actors=sorted(failed),
                )
            log.warning("%s: %d owner(s) not reachable, retrying in %.2fs", what, len(failed), backoff,
                        extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
            self._pause(backoff, what)
            backoff = min(backoff * 2, 2.0)
            for uuid in failed:
                self._handles.pop(uuid, None)  # look the actor up again: it may have been restarted

    def _given_up(self, what: str) -> None:
        if IN_FLIGHT.given_up(self.query_name):
            raise BatchGivenUp(f"{what}: the topology is stopping and gave up on this batch; it runs again at "
                               "the next start")  # fmt: skip

    def _await(self, refs: Sequence[Any], deadline: Deadline, what: str) -> Deadline:
        """Wait for ``refs`` for at most a call's timeout (and until ``deadline``), in slices: a stop that
        gives up on the batch is seen within ``_STOP_LOOK`` seconds, not after the owners' call timeout.
        Returns the calls' deadline. The common case, owners that answer at once, costs one ``ray.wait``."""
        until = Deadline.after(min(deadline.remaining(), _CALL_TIMEOUT))
        raycalls.wait_looking(refs, until, _STOP_LOOK, lambda: self._given_up(what))
        return until

    def _pause(self, seconds: float, what: str) -> None:
        """Sleep ``seconds`` before asking owners again, unless a stop gives up on the batch meanwhile."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            self._given_up(what)
            time.sleep(min(left, _STOP_LOOK))
        self._given_up(what)

    def deliver(self, source: str, batch_id: int, table: pa.Table, hold: Hold | None = None) -> int:
        """Deliver an Arrow ``table`` (with the partition column) as batch ``batch_id``, with ``hold`` (see
        ``hold``); returns rows sent."""
        clock = time.perf_counter()
        table, nulls = drop_null_keys(table, self._keys, self.spec.name)
        dropped = {"null-key": nulls} if nulls else {}
        if self._times:
            whole = table.num_rows
            table = drop_unrepresentable_times(table, self._times, self.spec.name)
            if table.num_rows < whole:
                dropped["time-out-of-range"] = whole - table.num_rows
        table, in_values = drop_unrepresentable_value_times(table, self._values, self.spec.name)
        if in_values:
            dropped["time-out-of-range"] = dropped.get("time-out-of-range", 0) + in_values
        if dropped:  # this run's totals, carried by the feed's reports (the batch's below among them)
            self.feeder.dropped_rows(self.spec.name, dropped)
        split = split_by_partition(table, self.spec.partitions, self.spec.name)
        # Each slice is serialized once for all its copies and rounds, not once per call.
        shared: dict[int, Shared] = {p: ray.put(t) if t.nbytes >= PUT_SLICE_BYTES else t for p, t in split.items()}
        self._lap("split", clock)
        results = self._apply_everywhere(source, batch_id, shared, table.num_rows, hold)
        clock = time.perf_counter()
        incomplete = sorted({r.partition for r in results if r.state == INCOMPLETE})
        if incomplete:
            log.warning(
                "store %s: partitions %s missed batches and answer 503 until rebuilt (from a peer, or by a "
                "rebuild of the store from a fresh checkpoint)",
                self.spec.name,
                incomplete,
                extra={"store": self.spec.name, "batch": batch_id},
            )
        catching_up = sorted({r.partition for r in results if r.state == CATCHING_UP})
        if catching_up:
            log.info("store %s: partitions %s are catching up from a peer and buffered batch %d", self.spec.name,
                     catching_up, batch_id, extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
        rebuilding = sorted({r.partition for r in results if r.state == REBUILDING})
        if rebuilding and hold is not None:
            log.info("store %s: partitions %s are rebuilt from a new source and serve from its first batch with "
                     "a watermark (batch %d ran with none)", self.spec.name, rebuilding, batch_id,
                     extra={"store": self.spec.name, "batch": batch_id})  # fmt: skip
        # A partition rebuilding until a batch with a watermark is held: the batches to come bring it up.
        held = {r.partition for r in results if r.state in (SERVING, REBUILDING)}
        unheld = sorted({r.partition for r in results} - held)
        self.unheld = unheld
        if unheld:
            log.warning(
                "store %s: no in-sync copy of partitions %s holds batch %d; they answer 503 until rebuilt (a "
                "topology run by `supervise` rebuilds the store in place)",
                self.spec.name,
                unheld,
                batch_id,
                extra={"store": self.spec.name, "batch": batch_id},
            )
        if not self.retired:  # a retired delivery's last batch: the feed says ``rebuilding`` (stop_for_rebuild)
            self.report(
                # Partitions reset by a new source's batch 0 and waiting for a batch with a watermark: the
                # feed is still rebuilding the store (``GET /stores`` said ``running`` while they answered 503).
                state="rebuilding" if rebuilding else "running",
                batch_id=batch_id,
                source=source,
                delivered=self.lineage,  # the store's contents are this checkpoint's from now on
                rows=table.num_rows,
                incomplete=incomplete,
                catching_up=catching_up,
            )
        self._lap("report", clock)
        return int(table.num_rows)

    def begin(self, source: str) -> list[int]:
        """A query starts from an empty checkpoint: owners' never-loaded partitions serve (empty) from now;
        returns them, each once whatever its copies (a partition and its standby both begin)."""
        self._source = source
        view = self.current_view(fresh=True)
        ownership = self.table(view)
        if ownership is None:
            return []
        refs = [self.handle(uuid).begin.remote(source) for uuid in ownership.all_owners()]
        began = raycalls.get(refs, f"starting store {self.spec.name}", timeout=_CALL_TIMEOUT)
        return sorted({p for partitions in began for p in partitions})

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        # Counted while it runs: a stop of the topology lets the batch end rather than cancel it
        # (``topologies.inflight``). One the stop gives up on, or cancels, ends as Spark expects of a function
        # its stop interrupted: the query ends stopped, not failed.
        with IN_FLIGHT.batch(self.query_name, jvm=lambda: batch_df.sparkSession._jvm):
            self._deliver_batch(batch_df, batch_id)

    def _deliver_batch(self, batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        try:
            superseded = self.feeder.superseded(self.spec.name)
            if superseded is not None:  # another topology took the store while this one was silent
                raise NotConnected(f"{superseded}; this topology stops feeding it", store=self.spec.name)
            if self._source is None:
                self._source = query_id(self.checkpoint)
            if self._source is None:
                raise NotConnected(f"the checkpoint {self.checkpoint} has no query id", store=self.spec.name)
            clock = time.perf_counter()
            table = batch_df.toArrow()
            self._lap("batch", clock)  # Spark running the micro-batch's plan and collecting it as Arrow
            rows = self.deliver(self._source, batch_id, table, self.hold(batch_id))
            if self.rebuild_pending:
                rebuild_delivered(self.checkpoint)
                self.rebuild_pending = False
        except Exception as err:
            # A batch a stop gave up on, or that ended while its query was being stopped: the feed's last
            # word (``stopped``) is said already, or the stop's caller says it.
            # ``batch_id`` stays the newest batch delivered (the feed's own, as docs/operations.md says); the
            # batch that failed is named in the error.
            if not self.retired and not isinstance(err, BatchGivenUp) and not IN_FLIGHT.given_up(self.query_name):
                self.report(state="failed", error=f"batch {batch_id}: {type(err).__name__}: {err}")
            raise
        log.info(
            "store %s: batch %d delivered, %d rows in %.0f ms",
            self.spec.name,
            batch_id,
            rows,
            (time.monotonic() - started) * 1000,
            extra={"store": self.spec.name, "batch": batch_id, "query": self.query_name},
        )
