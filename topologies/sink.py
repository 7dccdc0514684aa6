"""``materialize``: the sink that wires a streaming DataFrame into a riqr store.

The partition column is computed in Spark SQL (``runtime.partitioner.spark_partition_sql``, no Python
UDF). Each micro-batch comes to the driver as Arrow (``DataFrame.toArrow``), is split by partition, and
every owner of a partition (active and standbys) receives ``apply(source, batch_id, slices)`` over Ray.
The batch completes only when all owners acknowledged (``topologies.delivery``); if one fails, the
exception fails the Spark query before it commits the batch, and the replay after restart is a no-op
wherever it had landed.

``source`` is the streaming query's id from its checkpoint: stable across restarts of the same
checkpoint, new for a fresh one (see ``runtime.partition``). When the query starts, ``plan_start``
compares the checkpoint with the partitions' positions: if some partition cannot be brought up to date
by the batches to come (new actors after ``riqr down``/``riqr up``, a wiped disk, a gap), the checkpoint
is set aside and the query starts from an empty one, whose batch 0 re-emits the whole state; partitions
that were complete keep serving their old state until it arrives. That is riqr's rebuild path.

The same path runs while the topology runs: when a batch leaves a partition with no copy that serves it
(an actor that came back with nothing to reopen and no peer to copy, a wiped or damaged copy without a
standby), batches to come cannot bring it back, so ``topologies.runner.supervise`` stops that store's query
(``stop_for_rebuild``) and starts it again (``start_again``: ``materialize`` with the same arguments, whose
``plan_start`` chooses the rebuild), at once the first time and then no more often than ``rebuild_due``
allows. An append-mode aggregation with a watermark (sessions) gets from a fresh checkpoint's batch 0
none of the windows and sessions the watermark had closed, only from the batches after it: its
partitions reset by that batch stay ``rebuilding`` (503) until a batch that Spark runs with a watermark
(``runtime.partition.Hold``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.config import (
    DEFAULT_ACTORS,
    DEFAULT_ENGINE,
    DEFAULT_NAMESPACE,
    DEFAULT_PARTITIONS,
    DEFAULT_STANDBYS,
    DEFAULT_TRIGGER,
    FEED_HEARTBEAT_INTERVAL,
    FEED_STALE_AFTER,
)
from runtime.deadline import Deadline, backoff
from runtime.errors import NotConnected, SchemaError, StoreInUse
from runtime.feeds import RUNNING, FeedReport
from runtime.ingest import PARTITION_COLUMN, WINDOW_END_COLUMN
from runtime.keys import KeySchema, key_type_for_spark
from runtime.ownership import ClusterView
from runtime.partition import REBUILDING, SERVING
from runtime.partitioner import spark_partition_sql
from topologies import lateness
from topologies.checkpoint import (
    last_committed,
    last_planned,
    mark_rebuild_pending,
    query_id,
    rebuild_pending,
    supersede,
)
from topologies.delivery import DEFAULT_DELIVERY_TIMEOUT, BatchDelivery, lineage_of, registry
from topologies.feeder import Feeder, feeder_for, run_ended_here
from topologies.inflight import stop_between_batches
from topologies.options import check_interval

__all__ = [
    "materialize",
    "materialize_all",
    "create_stores",
    "store_spec_for",
    "plan_start",
    "rebuild_due",
    "unregistered",
    "StoreUnregistered",
    "StoreSuperseded",
    "claim_feed",
    "claim_feeds",
    "query_name",
    "stop_for_rebuild",
    "stop_looking",
    "start_again",
    "BatchDelivery",
]

log = logging.getLogger(__name__)

WINDOW_START_COLUMN = "window_start"


class StoreUnregistered(NotConnected):
    """The registry answered, and its view has no such store: dropped, or a new deployment (``riqr down``
    and ``riqr up``). Unlike a registry that cannot be found or does not answer, this is a verdict."""


class StoreSuperseded(StoreUnregistered):
    """The registry answered that another topology feeds the store now: it took the store's feed while
    this one was silent past the bound (``runtime.feeds.FeedBook.refusal``). A verdict too: this topology
    must not feed it any more."""


# How long a topology starting on a store that another feed holds waits for that feed to stop or fall
# silent before giving up (``claim_feed``): a topology SIGKILLed and started again from another checkpoint
# finds its old run's feed live until the registry calls it stale.
CLAIM_WAIT = FEED_STALE_AFTER + 2 * FEED_HEARTBEAT_INTERVAL
_CLAIM_PAUSE = 0.5


# In-place rebuilds of a store whose partitions no copy serves: the first at once, each next one no sooner
# than twice the wait before it after the last (a partition that keeps losing its copies must not make the
# topology re-read its input over and over), up to REBUILD_WAIT_MAX.
REBUILD_WAIT = 60.0
REBUILD_WAIT_MAX = 1800.0
# query name -> the delivery of the query running under it, and how to start it again.
_RUNNING: dict[str, tuple[BatchDelivery, Callable[..., Any]]] = {}
# query name -> when this process rebuilt it in place (time.monotonic).
_REBUILT: dict[str, list[float]] = {}
_REBUILT_KEPT = 16
_RUNNING_LOCK = threading.Lock()
# Every store a supervised topology feeds is looked at this often (seconds), in a thread of its own, so a
# copy lost while the store gets no batch (no new input) is noticed too. A partition counts when two looks
# in a row find it without a serving copy.
PROBE_EVERY = 5.0
# Looks in a row that could not tell (an owner or the registry not answering) before a warning says so.
PROBE_FAILURES_WARN = 6
# query name -> the partitions the look before the last and the last look found unserved.
_LOOKS: dict[str, tuple[list[int], list[int]]] = {}
# query name -> looks in a row that could not tell.
_FAILED_LOOKS: dict[str, int] = {}
# query name -> when ``rebuild_due`` last asked about it (only queries a ``supervise`` runs are looked at).
_ASKED: dict[str, float] = {}
# query name -> why a look found its store no longer registered (``unregistered``).
_UNREGISTERED: dict[str, StoreUnregistered] = {}
# The thread looking at the copies, and the flag that ends it (``stop_looking``).
_LOOKER: list[tuple[threading.Thread, threading.Event]] = []
# How often a look waiting on owners sees whether it should end (``stop_looking``).
_LOOK_SLICE = 0.25


class _LooksEnded(Exception):
    """The looks were ended (``stop_looking``) while one waited on owners."""


def rebuild_due(name: str, now: float | None = None) -> list[int]:
    """The partitions of the store fed by query ``name`` that no copy serves, if the store should be
    rebuilt in place now; else []. Queries that ``materialize`` did not start here have none.

    Known from the last batch (``BatchDelivery.unheld``) or from the last two looks at the copies'
    positions against the checkpoint (``unserved``, every ``PROBE_EVERY`` seconds in a thread of their
    own: ``supervise``'s thread never waits for a look)."""
    now = time.monotonic() if now is None else now
    with _RUNNING_LOCK:
        running = _RUNNING.get(name)
        times = list(_REBUILT.get(name, ()))
        _ASKED[name] = now
        before, last = _LOOKS.get(name, ([], []))
    if running is None:
        return []
    _ensure_looker()
    unheld = list(running[0].unheld) or sorted(set(before) & set(last))
    if not unheld:
        return []
    if not running[0].rebuild_from_input:
        _say_no_rebuild(running[0])
        return []
    if times and now - times[-1] < backoff(REBUILD_WAIT, len(times), REBUILD_WAIT_MAX):
        return []
    return unheld


def record_look(name: str, found: list[int] | None) -> None:
    """Keep what a look at query ``name``'s store found (None: it could not tell, which starts the count
    over); warn when looks keep failing."""
    with _RUNNING_LOCK:
        if found is None:
            _LOOKS.pop(name, None)
            failures = _FAILED_LOOKS[name] = _FAILED_LOOKS.get(name, 0) + 1
        else:
            _LOOKS[name] = (_LOOKS.get(name, ([], []))[1], list(found))
            _FAILED_LOOKS.pop(name, None)
            failures = 0
    if failures and failures % PROBE_FAILURES_WARN == 0:
        log.warning("query %s: its store's copies could not be looked at %d times in a row (an owner or the "
                    "registry does not answer); a lost copy is noticed only by a batch meanwhile", name, failures,
                    extra={"query": name})  # fmt: skip


def _register(name: str, delivery: BatchDelivery, again: Callable[..., Any]) -> None:
    """Query ``name`` runs with ``delivery`` (``again`` starts it anew): its store was just declared, so what
    a look found of an earlier query of that name is past."""
    with _RUNNING_LOCK:
        _RUNNING[name] = (delivery, again)
        _UNREGISTERED.pop(name, None)


def unregistered(name: str) -> StoreUnregistered | None:
    """Why the store fed by query ``name`` is no longer registered, if a look found it so (dropped with
    ``riqr drop --force``, or ``riqr down`` ran, maybe followed by ``riqr up``): ``supervise`` then ends
    the topology, as the query's next batch would have, without waiting for input that may not come."""
    with _RUNNING_LOCK:
        return _UNREGISTERED.get(name)


def _look_at_all(ended: threading.Event | None = None) -> None:
    """One round of looks: every store whose query a ``supervise`` asked about lately. None once Ray is
    shut down (the process is stopping: a look would only fail, or have Ray start a cluster anew), and
    none left once ``ended`` is set."""
    import ray

    if not ray.is_initialized():
        return
    now = time.monotonic()
    with _RUNNING_LOCK:
        due = [(n, r[0]) for n, r in _RUNNING.items() if now - _ASKED.get(n, -1e9) < 2 * PROBE_EVERY]
    for name, delivery in due:
        if delivery.retired or (ended is not None and ended.is_set()):
            continue
        try:
            found: list[int] | None = unserved(delivery, ended)
        except StoreUnregistered as err:  # not a registry that cannot be found or does not answer: no verdict
            with _RUNNING_LOCK:
                _UNREGISTERED[name] = err
            continue
        except _LooksEnded:
            return
        except Exception:
            log.debug("could not look at the copies of %s", delivery.spec.name, exc_info=True)
            found = None
        if ended is not None and ended.is_set():  # the looks were ended meanwhile: nothing to say
            return
        record_look(name, found)


def _ensure_looker() -> None:
    with _RUNNING_LOCK:
        if _LOOKER and _LOOKER[0][0].is_alive() and not _LOOKER[0][1].is_set():
            return
        ended = threading.Event()
        thread = threading.Thread(target=_looks, args=(ended,), name="riqr-copy-looks", daemon=True)
        _LOOKER[:] = [(thread, ended)]
    thread.start()


def _looks(ended: threading.Event) -> None:
    """The looker's thread: a round of looks every ``PROBE_EVERY`` seconds until ``ended`` is set."""
    while not ended.wait(PROBE_EVERY):
        try:
            _look_at_all(ended)
        except Exception:
            log.warning("looking at the stores' copies failed", exc_info=True)


def stop_looking(timeout: float = 2 * _LOOK_SLICE) -> bool:
    """End the thread looking at the copies (the topology is stopping; a later ``supervise`` starts another)
    and wait up to ``timeout`` seconds for it; True if it ended. A look waiting on owners that do not
    answer ends within ``_LOOK_SLICE``: one still inside a Ray call when the process ends and Ray shuts
    down (at exit) would have Ray end the process with exit status 1 as the call returns."""
    with _RUNNING_LOCK:
        looker = _LOOKER[:]
    if not looker:
        return True
    thread, ended = looker[0]
    ended.set()
    thread.join(timeout)
    return not thread.is_alive()


def unserved(delivery: BatchDelivery, ended: threading.Event | None = None) -> list[int]:
    """The partitions of ``delivery``'s store that no copy serves at its checkpoint's source, at or past
    its last committed batch: what ``plan_start`` would rebuild. [] before the first commit. Raises
    ``_LooksEnded`` if ``ended`` is set while it waits on the copies' owners.

    Raises ``StoreUnregistered`` when the registry's view (at its current epoch) no longer has the store,
    and ``StoreSuperseded`` when the registry said another topology feeds it now."""
    name = delivery.spec.name
    superseded = delivery.feeder.superseded(name)
    if superseded is not None:
        raise StoreSuperseded(f"{superseded}; this topology stops feeding it", store=name)
    view = delivery.current_view(get=_getter(ended))
    if delivery.table(view) is None:
        if delivery.replaced:
            raise StoreUnregistered(f"{delivery.gone()} (namespace {delivery.namespace!r})", store=name)
        raise StoreUnregistered(f"store {name!r} is no longer registered in namespace {delivery.namespace!r} (dropped "
                           "with riqr drop --force, or riqr down ran); started again, the topology declares it "
                           "again and rebuilds it from its input", store=name)  # fmt: skip
    committed = last_committed(delivery.checkpoint)
    if committed is None:
        return []
    positions = _copies_positions(delivery, view=view, timeout=5, ended=ended)
    if positions is None:
        return []
    return partitions_without_a_current_copy(positions, query_id(delivery.checkpoint), committed)


def _copies_positions(
    delivery: BatchDelivery,
    *,
    view: ClusterView | None = None,
    timeout: float,
    ended: threading.Event | None = None,
) -> dict[str, Mapping[int, Mapping[str, Any]]] | None:
    """``positions()`` of every copy of ``delivery``'s store, by actor, as ``view`` has them (None: a fresh
    view); None if the store is not registered. A failed call makes the sink look every owner up again
    next time (one may have been re-created under its name)."""
    view = view if view is not None else delivery.current_view(fresh=True)
    ownership = delivery.table(view)
    if ownership is None:
        return None
    uuids = sorted(ownership.all_owners())
    what = f"positions of {delivery.spec.name}"
    try:
        answers = _getter(ended)([delivery.handle(u).positions.remote() for u in uuids], what, timeout=timeout)
    except _LooksEnded:
        raise
    except Exception:
        delivery.forget_handles()
        raise
    return dict(zip(uuids, answers))


def _getter(ended: threading.Event | None) -> Callable[..., Any]:
    """``raycalls.get``, or with ``ended``, the same in slices of ``_LOOK_SLICE`` that raises
    ``_LooksEnded`` once ``ended`` is set (the looks' thread: ``stop_looking``)."""
    if ended is None:
        return raycalls.get

    def get(refs: Any, what: str, *, timeout: float) -> Any:
        def look() -> None:
            if ended.is_set():
                raise _LooksEnded(what)

        look()
        listed = refs if isinstance(refs, list) else [refs]
        waiting = raycalls.wait_looking(listed, Deadline.after(timeout), _LOOK_SLICE, look)
        # Every answer in (or the time up: the error raycalls.get gives for a call not answered in time).
        return raycalls.get(refs, what, timeout=0.001 if waiting else timeout)

    return get


def stop_for_rebuild(name: str, query: Any) -> None:
    """Stop ``query`` (running under ``name``) to rebuild its store in place; ``start_again`` follows. The
    feed says ``rebuilding`` meanwhile: the query is detached from the heartbeat (its stop is not the
    feed's end) and its delivery retired (a batch the stop cancels is not the feed failing). Waits for
    the batch in progress to end, bounded (``topologies.inflight``), rather than cancelling it."""
    with _RUNNING_LOCK:
        delivery = _RUNNING[name][0]
        rebuilt = _REBUILT.setdefault(name, [])
        rebuilt.append(time.monotonic())
        del rebuilt[:-_REBUILT_KEPT]  # the wait stops growing long before: a store rebuilt for weeks keeps a few
        _LOOKS.pop(name, None)  # looks at the old checkpoint say nothing of the new one
    delivery.retired = True
    delivery.feeder.attach(delivery.spec.name, None)
    delivery.report(state="rebuilding", incomplete=delivery.unheld)
    stop_between_batches([query])
    # Said again once the stop has waited for the batch in progress: one that looked at ``retired`` just
    # before it was set may have reported ``running`` (or ``failed``) over the first report.
    delivery.report(state="rebuilding", incomplete=delivery.unheld)


def start_again(name: str) -> Any:
    """Start the query stopped by ``stop_for_rebuild`` as ``materialize`` first did; returns it.
    ``plan_start`` then finds the partitions no copy serves and rebuilds the store: its checkpoint is set
    aside, and batch 0 of the new one re-emits the whole state."""
    with _RUNNING_LOCK:
        delivery, again = _RUNNING[name]
    return again(_rebuilding=True, _owners=delivery.owners)


def store_spec_for(
    schema: Any,
    store: str,
    key: str | Sequence[str],
    value: str | Sequence[str] | None = None,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    actors: int = DEFAULT_ACTORS,
    standbys: int | None = DEFAULT_STANDBYS,
    kind: str = "kv",
    engine: str = DEFAULT_ENGINE,
    read_replicas: bool = False,
) -> StoreSpec:
    """The store definition for a DataFrame ``schema`` (a Spark ``StructType``).

    ``key`` names the key column, or several for a composite key (the first is the partition column).
    """
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    key_cols = [key] if isinstance(key, str) else list(key)
    if not key_cols:
        raise SchemaError("a store needs at least one key column")
    for column in key_cols:
        if column not in types:
            raise SchemaError(
                f"key column {column!r} is not in the DataFrame (columns: {', '.join(types)})", column=column
            )
    if value is None:
        value_cols = [c for c in types if c not in key_cols and c != WINDOW_END_COLUMN]
    elif isinstance(value, str):
        value_cols = [value]
    else:
        value_cols = list(value)
    missing = [c for c in value_cols if c not in types]
    if missing:
        raise SchemaError(f"value columns {missing} are not in the DataFrame (columns: {', '.join(types)})")
    overlap = [c for c in key_cols if c in value_cols]
    if overlap:
        raise SchemaError(f"columns {overlap} cannot be both in the key and in the value")
    key_types = [key_type_for_spark(types[c], c).name for c in key_cols]
    return StoreSpec(
        name=store,
        key=KeySchema(key_cols[0], key_types[0], tuple(zip(key_cols[1:], key_types[1:]))),
        value_fields=tuple(ValueField(c, types[c]) for c in value_cols),
        partitions=partitions,
        actors=actors,
        standbys=standbys,
        kind=kind,
        engine=engine,
        read_replicas=read_replicas,
    ).placeable()


def _say_no_rebuild(delivery: BatchDelivery) -> None:
    """Say, once a run (at its start or at a later look), that ``delivery``'s store cannot be rebuilt from
    its source's input."""
    if delivery.said_no_rebuild:
        return
    delivery.said_no_rebuild = True
    store = delivery.spec.name
    log.error("store %s: partitions no copy serves cannot be rebuilt from this source (it starts at the latest "
              "offsets, so a fresh checkpoint would hold only what comes from now on): they answer 503 and the "
              "query goes on from its checkpoint; start the topology with --starting-offsets earliest to rebuild "
              "them", store, extra={"store": store})  # fmt: skip


def plan_start(delivery: BatchDelivery, checkpoint: str) -> str:
    """How the query feeding a store starts from ``checkpoint``: ``"fresh"`` (the checkpoint never planned
    a batch), ``"resume"`` (every partition of the store has a copy at the checkpoint's source, at or past
    its last committed batch, and serving; or nothing was committed yet, so batch 0 comes again and brings
    every partition up), or ``"rebuild"`` (some partition has no such copy, so the batches to come cannot
    bring it up to date: new actors after ``riqr down``/``riqr up``, a wiped disk, a gap).

    A copy that is not at the checkpoint (catching up from a peer, incomplete, lost, at an older source)
    does not force a rebuild while another copy of its partition is: the next batch finds its gap and it
    copies that peer (docs/design.md, "Rebuilding a copy from a peer")."""
    committed = last_committed(checkpoint)
    if committed is None:
        # Batch 0 planned but not committed (the query stopped in between) is delivered again: the
        # partitions must not be told they start empty, or they would answer 404s until it lands.
        return "fresh" if last_planned(checkpoint) is None else "resume"
    source = query_id(checkpoint)
    positions = _copies_positions(delivery, timeout=30)
    if positions is None:
        raise NotConnected(delivery.gone(), store=delivery.spec.name)
    planned = last_planned(checkpoint) or committed
    ahead = sorted({p for answer in positions.values() for p, pos in answer.items()
                    if pos["source"] == source and pos["batch_id"] > planned})  # fmt: skip
    if ahead:
        # The store holds batches the checkpoint never planned: its last files did not reach the disk (a
        # machine crash: Spark does not fsync them) or it was restored from an older copy. Spark would plan
        # those batch ids again with other records, which the copies would skip as replays: lost.
        name = delivery.spec.name
        log.warning("store %s: partitions %s hold batches of source %s past the last one checkpoint %s planned "
                    "(%d): it lost batches the store has; rebuilding from a fresh checkpoint", name, ahead, source,
                    checkpoint, planned, extra={"store": name, "batch": planned})  # fmt: skip
        return "rebuild"
    # A copy ``rebuilding`` at the checkpoint waits for the next batch Spark runs: one planned and not
    # committed runs again at the start, but with none, a query started again runs no batch until new
    # input comes, so the copy could wait for good on an idle source; the store is rebuilt again then.
    pending = planned > committed
    behind = partitions_without_a_current_copy(positions, source, committed, rebuilding_current=pending)
    if behind:
        log.warning(
            "store %s: partitions %s have no copy at batch %d of the checkpoint's source %s: rebuilding them "
            "from a fresh checkpoint",
            delivery.spec.name,
            behind,
            committed,
            source,
            extra={"store": delivery.spec.name, "batch": committed},
        )
        return "rebuild"
    return "resume"


def partitions_without_a_current_copy(
    positions: Mapping[str, Mapping[int, Mapping[str, Any]]],
    source: str | None,
    committed: int,
    *,
    rebuilding_current: bool = True,
) -> list[int]:
    """The partitions none of whose copies serves at ``source``, at or past batch ``committed``, given each
    holder's ``positions()`` by actor.

    With ``rebuilding_current``, a copy ``rebuilding`` there counts: it is complete up to its position,
    and serves from the next batch Spark runs, which a running query runs at once since the watermark
    moved (``runtime.partition``; ``plan_start`` says when it counts at a start)."""
    counted = (SERVING, REBUILDING) if rebuilding_current else (SERVING,)
    held: set[int] = set()
    current: set[int] = set()
    for answer in positions.values():
        for p, pos in answer.items():
            held.add(p)
            if pos["source"] == source and pos["batch_id"] >= committed and pos["state"] in counted:
                current.add(p)
    return sorted(held - current)


def _flatten_window(df: Any, window_column: str) -> Any:
    """Spark's window struct as two columns: ``window_start`` (the key's last column) and the end."""
    from pyspark.sql import functions as F

    if window_column not in df.columns:
        raise SchemaError(
            f"the DataFrame has no window column {window_column!r} (columns: {', '.join(df.columns)}); "
            "pass window_column=",
            column=window_column,
        )
    others = [c for c in df.columns if c != window_column]
    return df.select(
        *others,
        F.col(f"`{window_column}`.start").alias(WINDOW_START_COLUMN),
        F.col(f"`{window_column}`.end").alias(WINDOW_END_COLUMN),
    )


def _declare(
    df: Any,
    store: str,
    key: str | Sequence[str],
    value: str | Sequence[str] | None,
    kind: str,
    window_column: str | None,
    partitions: int,
    actors: int,
    standbys: int | None,
    engine: str,
    read_replicas: bool = False,
) -> tuple[Any, list[str], StoreSpec]:
    """``(df, key columns, spec)`` of a store ``materialize`` feeds: the window struct flattened for the
    windowed kinds."""
    key_cols = [key] if isinstance(key, str) else list(key)
    if kind in ("window", "session"):
        df = _flatten_window(df, window_column or ("session_window" if kind == "session" else "window"))
        key_cols = [*key_cols, WINDOW_START_COLUMN]
    spec = store_spec_for(
        df.schema, store, key_cols, value, partitions=partitions, actors=actors, standbys=standbys, kind=kind,
        engine=engine, read_replicas=read_replicas,
    )  # fmt: skip
    return df, key_cols, spec


def create_stores(namespace: str, specs: Sequence[StoreSpec]) -> ClusterView:
    """Create the stores of ``specs`` that do not exist yet, with all their query actors started in one
    round (``Registry.create_stores``); returns the registry's view then."""
    names = ", ".join(s.name for s in specs)
    view: ClusterView = raycalls.get(registry(namespace).create_stores.remote(list(specs)), f"creating stores {names}")
    return view


_OUTPUT_MODES = ("append", "update", "complete")


def _check_arguments(
    trigger: str, delivery_timeout: float, kind: str = "kv", output_mode: str | None = None
) -> str | None:
    """ValueError for a trigger, delivery timeout or output mode ``materialize`` cannot run with, before the store
    is created: Spark itself would refuse a bad interval or mode only when the query starts, after the
    store's actors. Returns the output mode in lower case, as Spark reads it ("Append" was once compared
    with "append" and held no window for its watermark). A session store takes append mode only: Spark
    refuses update mode for sessions, and in complete mode a session that grew into another is written again
    under its new start while the row under its old start is never written again, so the store would keep
    both (two sessions overlapping, their counts summed by any reader)."""
    check_interval(trigger)
    if not delivery_timeout > 0:
        raise ValueError(f"delivery_timeout must be a positive number of seconds, got {delivery_timeout!r}")
    mode = None if output_mode is None else str(output_mode).lower()  # Spark reads it in any case
    if mode is not None and mode not in _OUTPUT_MODES:
        raise ValueError(f"output_mode must be one of {', '.join(_OUTPUT_MODES)}, got {output_mode!r}")
    if kind == "session" and mode not in (None, "append"):
        raise ValueError(
            f"a session store takes append mode only, got output_mode={output_mode!r}: in {mode} mode "
            "a session that merges with another leaves its old row behind in the store"
        )
    return mode


# The stores this process was told it takes over (said once each, not at every claim of a rebuild in place).
_TOLD_TAKE_OVER: set[tuple[str, str]] = set()


def claim_feed(
    namespace: str, feeder: Feeder, report: FeedReport, wait: float | None = None, take_over: bool = False
) -> None:
    """Take ``report.store``'s feed at the registry of ``namespace`` (``Registry.claim_feed``) for
    ``feeder``'s run: granted at once when nothing else feeds it, when this process did, or when the feed
    that held it stopped, failed or fell silent past the bound; and at once too when it is a run on this
    very checkpoint whose process is gone from this host (``run_ended_here``: a topology SIGKILLed and
    started again). Otherwise try again every half second for up to ``wait`` seconds (``CLAIM_WAIT`` by
    default: the other may be a run killed a moment ago on another host), saying so once; then
    ``StoreInUse``, naming the topology that feeds it. Once granted the feed beats (``Feeder.claimed``).

    A store that holds what another checkpoint fed it, or whose checkpoint is empty here where it was
    not, is ``StoreInUse`` at once, unless ``take_over`` (``runtime.feeds.FeedBook.replacing``): this
    topology's first batch would replace the store's contents."""
    claim_feeds(namespace, feeder, [report], wait, {report.store} if take_over else ())


def claim_feeds(
    namespace: str,
    feeder: Feeder,
    reports: Sequence[FeedReport],
    wait: float | None = None,
    take_over: Collection[str] = (),
) -> None:
    """``claim_feed`` for several stores of one topology at once (``take_over``: the stores it takes over
    on purpose), all or none (``Registry.claim_feeds``): refused on one store, the topology holds none of
    the others' feeds either, and ``StoreInUse`` names every store refused, not only the first. A
    registry of the riqr before it (upgraded in place), which has no ``claim_feeds``, is asked store by
    store, as that riqr did: the stores claimed before a refusal are let go by ``materialize_all``."""
    wait = CLAIM_WAIT if wait is None else wait
    reg = registry(namespace)
    if len(reports) > 1 and not hasattr(reg, "claim_feeds"):
        for report in reports:
            claim_feeds(namespace, feeder, [report], wait, take_over)
        return
    deadline = time.monotonic() + wait
    waiting: set[str] = set()
    displace: dict[str, str] = {}
    while True:
        refusals = _ask_claims(reg, reports, displace, take_over)
        if not any(refusals):
            for report in reports:
                _claimed(namespace, feeder, report, report.store in waiting, displace.get(report.store),
                         report.store in take_over)  # fmt: skip
            return
        refused = [(report, why) for report, why in zip(reports, refusals) if why is not None]
        if any(why.get("final") for _, why in refused):  # another checkpoint's contents: waiting changes nothing
            raise _in_use(refused, len(reports))
        again = False
        for report, why in refused:
            store = report.store
            if why["same_checkpoint"] and why["feeder"] != displace.get(store) and run_ended_here(why["feeder"]):
                displace[store] = why["feeder"]  # a run of this checkpoint whose process is gone: ask again, now
                again = True
        if again:
            continue
        if time.monotonic() + _CLAIM_PAUSE > deadline:
            raise _in_use(refused, len(reports))
        for report, why in refused:
            if report.store not in waiting:
                log.warning("store %s: %s; waiting up to %.0fs for it to stop or fall silent", report.store,
                            why["why"], wait, extra={"store": report.store})  # fmt: skip
                waiting.add(report.store)
        time.sleep(_CLAIM_PAUSE)


def _ask_claims(
    reg: Any, reports: Sequence[FeedReport], displace: Mapping[str, str], take_over: Collection[str]
) -> list[dict[str, Any] | None]:
    """The registry's answer to each of ``reports``' claims, in one call: for one store the call every
    riqr's registry has (``take_over`` passed only when asked, since a registry of the riqr before it
    takes two arguments), for several ``claim_feeds``."""
    what = f"taking the feed of store{'s' if len(reports) > 1 else ''} {', '.join(r.store for r in reports)}"
    if len(reports) == 1:
        (report,) = reports
        over, gone = report.store in take_over, displace.get(report.store)
        call = reg.claim_feed.remote(report, gone, True) if over else reg.claim_feed.remote(report, gone)
        return [raycalls.get(call, what)]
    claims = [(r, displace.get(r.store), r.store in take_over) for r in reports]
    answers: list[dict[str, Any] | None] = raycalls.get(reg.claim_feeds.remote(claims), what)
    return answers


def _claimed(namespace: str, feeder: Feeder, report: FeedReport, waited: bool, displaced: str | None,
             take_over: bool) -> None:  # fmt: skip
    """``report``'s store is this run's to feed now: its feed beats, and the log says how it came to it."""
    store = report.store
    feeder.claimed(report)
    if waited or displaced:
        log.info("store %s: this topology feeds it now (%s)", store,
                 f"run {displaced} had ended" if displaced else "the other feed let it go",
                 extra={"store": store})  # fmt: skip
    if take_over and (namespace, store) not in _TOLD_TAKE_OVER:
        _TOLD_TAKE_OVER.add((namespace, store))
        log.warning("store %s: started with take-over: if the store holds what another checkpoint (or this "
                    "one before it was emptied) fed it, this topology's first batch replaces that (the "
                    "registry's log names the checkpoint replaced)", store, extra={"store": store})  # fmt: skip


def _in_use(refused: Sequence[tuple[FeedReport, Mapping[str, Any]]], stores: int) -> StoreInUse:
    """``StoreInUse`` for the ``refused`` claims of a start of ``stores`` stores: one store's reason as
    the registry gave it, or every refused store's, numbered (the topology starts none of them)."""
    if len(refused) == 1:
        report, why = refused[0]
        return StoreInUse(why["why"], store=report.store)
    names = [report.store for report, _ in refused]
    reasons = " ".join(f"({i}) {why['why']}." for i, (_, why) in enumerate(refused, 1))
    return StoreInUse(f"{len(refused)} of this topology's {stores} stores are refused, so it feeds none: {reasons}",
                      store=names[0], stores=names)  # fmt: skip


def query_name(namespace: str, store: str) -> str:
    """The name of the streaming query that feeds ``store`` in ``namespace`` (Spark's, and the feed's)."""
    return f"riqr-{namespace}-{store}"


def _claim_report(namespace: str, feeder: Feeder, store: str, checkpoint: str, owners: Any) -> FeedReport:
    """What ``claim_feed`` sends for ``store`` fed from ``checkpoint`` (``owners``: its actors' uuids):
    ``plan`` is ``"fresh"`` when the checkpoint never planned a batch and is no rebuild's (read only)."""
    fresh = last_planned(checkpoint) is None and not rebuild_pending(checkpoint)
    return FeedReport(store, feeder.id, RUNNING, query=query_name(namespace, store), checkpoint=lineage_of(checkpoint),
                      owners=tuple(sorted(owners)), plan="fresh" if fresh else None, at=feeder.now())  # fmt: skip


def materialize_all(df_and_options: Sequence[tuple[Any, Mapping[str, Any]]]) -> list[Any]:
    """``materialize(df, **options)`` for each pair, in order, with every store's query actors created
    first in one round: a topology feeding several stores then waits for their actors once, and none of
    them starts while an earlier store's first micro-batch takes the CPU. Returns the queries."""
    by_namespace: dict[str, list[StoreSpec]] = {}
    for df, options in df_and_options:
        _check_arguments(
            options.get("trigger", DEFAULT_TRIGGER), options.get("delivery_timeout", DEFAULT_DELIVERY_TIMEOUT),
            options.get("kind", "kv"), options.get("output_mode"),
        )  # fmt: skip
        spec = _declare(
            df, options["store"], options["key"], options.get("value"), options.get("kind", "kv"),
            options.get("window_column"), options.get("partitions", DEFAULT_PARTITIONS),
            options.get("actors", DEFAULT_ACTORS), options.get("standbys", DEFAULT_STANDBYS),
            options.get("engine", DEFAULT_ENGINE), options.get("read_replicas", False),
        )[2]  # fmt: skip
        by_namespace.setdefault(options.get("namespace", DEFAULT_NAMESPACE), []).append(spec)
    views = {namespace: create_stores(namespace, specs) for namespace, specs in by_namespace.items()}
    # Every store's feed taken before any of them starts, all or none (one claim per namespace): refused
    # on one, the topology has started none and holds none.
    reports: dict[str, list[FeedReport]] = {}
    taken_over: dict[str, set[str]] = {}
    for _, options in df_and_options:
        namespace, store = options.get("namespace", DEFAULT_NAMESPACE), options["store"]
        table = views[namespace].table(store)
        owners = table.all_owners() if table is not None else ()
        reports.setdefault(namespace, []).append(
            _claim_report(namespace, feeder_for(namespace), store, options["checkpoint"], owners)
        )
        if options.get("take_over", False):
            taken_over.setdefault(namespace, set()).add(store)
    held = {namespace: set(feeder_for(namespace).live_stores()) for namespace in reports}
    queries: list[Any] = []
    try:
        for namespace, claims in reports.items():
            claim_feeds(namespace, feeder_for(namespace), claims, take_over=taken_over.get(namespace, ()))
        for df, options in df_and_options:
            queries.append(materialize(df, **options))
    except BaseException:
        # The stores claimed whose query did not start let their feed go (the one whose start failed said
        # so already): held by a process that feeds them nothing, they would refuse every other topology.
        # (Refused, a claim took none; a registry of the riqr before is asked store by store, and the
        # stores taken before the one refused are let go here too.)
        for _, options in df_and_options[len(queries) :]:
            namespace, store = options.get("namespace", DEFAULT_NAMESPACE), options["store"]
            feeder = feeder_for(namespace)
            if store in feeder.live_stores() and store not in held[namespace]:
                feeder.update(store, state="stopped")
        raise
    return queries


def materialize(
    df: Any,
    *,
    store: str,
    key: str | Sequence[str],
    value: str | Sequence[str] | None = None,
    checkpoint: str,
    kind: str = "kv",
    window_column: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    partitions: int = DEFAULT_PARTITIONS,
    actors: int = DEFAULT_ACTORS,
    standbys: int | None = DEFAULT_STANDBYS,
    engine: str = DEFAULT_ENGINE,
    trigger: str = DEFAULT_TRIGGER,
    output_mode: str | None = None,
    delivery_timeout: float = DEFAULT_DELIVERY_TIMEOUT,
    read_replicas: bool = False,
    rebuild_from_input: bool = True,
    take_over: bool = False,
    _rebuilding: bool = False,
    _owners: frozenset[str] | None = None,
) -> Any:
    """Start a streaming query that keeps store ``store`` equal to ``df`` keyed by ``key``.

    ``key`` names the key column, or a list of columns for a composite key (the first one decides the
    partition). ``value`` names the value column(s); by default every other column. The store is created
    (with its query actors) if it does not exist; ``engine`` (``rocksdb`` or ``memory``) is where its
    partitions live; ``standbys`` how many standby copies each partition has (None: 1 when the cluster
    has more than one node, else 0, decided when the store is created); ``read_replicas`` keeps a copy of
    the whole store in every HTTP verticle, which then answers key lookups without a Ray hop (opt-in;
    docs/design.md, "Read replicas"). Returns the ``StreamingQuery``.

    ``kind="window"`` takes the output of a ``window(...)`` aggregation and ``kind="session"`` of a
    ``session_window(...)`` one: the window struct (``window_column``, by default ``window`` or
    ``session_window``) becomes the key's last column, ``window_start``, and the window end is kept with
    the value. The output mode defaults to ``update``, except for sessions, which take ``append`` only (a
    session's range changes as it grows, and neither update mode, which Spark refuses for sessions, nor
    complete mode retracts the old one): sessions reach the store once, final, when the watermark passes
    their end.

    An owner that does not acknowledge a batch within ``delivery_timeout`` seconds (retried meanwhile)
    fails the query. A ``trigger`` Spark would not take (``topologies.options.check_interval``) or a
    ``delivery_timeout`` that is not positive is a ValueError before anything is created or started.

    One store has one feed: the store's feed is claimed at the registry (``claim_feed``) before the
    checkpoint or any copy is touched, and ``StoreInUse`` says, after up to ``CLAIM_WAIT`` seconds, that
    another topology (another run, from another checkpoint or alive on this one) still feeds it. A
    store's contents belong to the checkpoint that fed them: a store that holds batches of another
    checkpoint, or of this one's location while it is empty now (deleted, or another host's disk), is
    ``StoreInUse`` at once, since this query's first batch would replace them; ``take_over=True`` says
    that is meant.

    ``rebuild_from_input=False`` says that a fresh checkpoint of ``df``'s source does not read its input
    again (Kafka from the latest offsets): a partition no copy serves is then never rebuilt by setting the
    checkpoint aside, which would reset the store to the records from now on; it answers 503, the query
    goes on from its checkpoint, and an error line says how to rebuild it (docs/design.md, "The rebuild
    path").

    ``_rebuilding`` (``start_again``, internal): the store is being rebuilt in place, so an empty
    checkpoint is one a failed start had already set aside, not a new store's: its partitions are not
    told they start empty (``begin``), and they answer 503 until batch 0 is in. ``_owners`` (``start_again``,
    internal): the query actors the first start declared the store with (``BatchDelivery.declared``); the
    store is then not created, and ``StoreUnregistered`` if it is gone or another one has its name.
    """
    output_mode = _check_arguments(trigger, delivery_timeout, kind, output_mode)
    again = functools.partial(
        materialize, df, store=store, key=key, value=value, checkpoint=checkpoint, kind=kind,
        window_column=window_column, namespace=namespace, partitions=partitions, actors=actors, standbys=standbys,
        engine=engine, trigger=trigger, output_mode=output_mode, delivery_timeout=delivery_timeout,
        read_replicas=read_replicas, rebuild_from_input=rebuild_from_input, take_over=take_over,
    )  # fmt: skip
    df, key_cols, spec = _declare(
        df, store, key, value, kind, window_column, partitions, actors, standbys, engine, read_replicas
    )
    if _owners is None:
        view = raycalls.get(registry(namespace).create_store.remote(spec), f"creating store {store}")
    else:  # started again in place: its store, never one created anew (a drop meanwhile ends the topology)
        view = raycalls.get(registry(namespace).view.remote(), f"the registry's view of {store}")
    value_cols = [f.name for f in spec.value_fields]
    extra = [WINDOW_END_COLUMN] if spec.windowed else []
    partition_sql = spark_partition_sql(spec.key.type, spec.key.column, spec.partitions)
    from pyspark.sql import functions as F

    shaped = df.select(*key_cols, *value_cols, *extra, F.expr(partition_sql).alias(PARTITION_COLUMN))
    name = query_name(namespace, store)
    delivery = BatchDelivery(spec, namespace, checkpoint, delivery_timeout=delivery_timeout, query_name=name)
    delivery.rebuild_from_input = rebuild_from_input
    # This store, not one declared again under its name later; started again in place, the store the first
    # start declared (``_owners``, internal): dropped meanwhile, or dropped and declared again, it is refused
    # here, before a query starts.
    if _owners is None:
        delivery.declared(view)
    else:
        delivery.owners = _owners
        if delivery.table(view) is None:
            raise StoreUnregistered(f"{delivery.gone()}; not started again", store=store)
    # One store, one feed: taken at the registry before the checkpoint or any copy is touched. Started again
    # in place, this process holds it already, unless another took it meanwhile: then no point waiting.
    report = _claim_report(namespace, delivery.feeder, store, checkpoint, delivery.owners or ())
    claim_feed(namespace, delivery.feeder, report, wait=0 if _owners is not None else None, take_over=take_over)
    return _start(delivery, shaped, df, kind, output_mode, trigger, _rebuilding, again)


def _start(
    delivery: BatchDelivery, shaped: Any, df: Any, kind: str, output_mode: str | None, trigger: str,
    rebuilding: bool, again: Callable[[], Any],
) -> Any:  # fmt: skip
    """``materialize``'s start of the query, once its store's feed is taken; returns it. A start that fails
    before the query runs says so as the feed's last word (``failed``; ``stopped`` for an interrupt), so
    the claim neither stays live nor goes stale; rebuilding in place, the runner tries again and says the
    last word if it gives up."""
    store, checkpoint, name = delivery.spec.name, delivery.checkpoint, delivery.query_name
    assert name is not None
    try:
        plan = plan_start(delivery, checkpoint)
        if plan == "rebuild" and not delivery.rebuild_from_input:
            _say_no_rebuild(delivery)
            plan = "resume"
        mode = output_mode or ("append" if kind == "session" else "update")  # lower case (``_check_arguments``)
        analyzed = _analyzed_plan(df)
        delivery.holds = mode == "append" and _holds_until_a_watermark(analyzed, default=kind in ("window", "session"))
        if plan == "rebuild":
            # Said first: a start that dies after the swap leaves an empty checkpoint, which the next start
            # must not take for a new store's (``begin`` would make the partitions that lost their state
            # serve empty); the delivery of the first batch forgets it.
            mark_rebuild_pending(checkpoint)
            moved = supersede(checkpoint)
            log.warning("store %s: the old checkpoint is kept at %s", store, moved, extra={"store": store})
        delivery.rebuild_pending = rebuild_pending(checkpoint)
        query = (
            shaped.writeStream.foreachBatch(delivery)
            .outputMode(mode)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger)
            .queryName(name)
            .start()
        )
    except BaseException as err:
        why = f"not started: {type(err).__name__}: {err}"
        if rebuilding:  # the runner tries again, and says the last word if it gives up
            delivery.report(state="rebuilding", error=why)
        else:
            stopping = isinstance(err, (KeyboardInterrupt, SystemExit))
            delivery.report(state="stopped" if stopping else "failed", error=None if stopping else why)
        raise
    delivery.report(
        state="rebuilding" if plan == "rebuild" or rebuilding else "running", plan=plan, **_resumed_at(plan, checkpoint)
    )
    delivery.feeder.attach(store, query)  # from now on the heartbeat also says whether the query runs
    if analyzed is not None and "EventTimeWatermark" in analyzed:  # only a query under a watermark drops late rows
        _count_late_rows(df, query, delivery)
    _register(name, delivery, again)
    if plan == "fresh" and not rebuilding and not delivery.rebuild_pending:
        source = _wait_for_query_id(checkpoint)
        began = delivery.begin(source)
        if began:
            log.info("store %s: source %s starts empty; partitions %s serve (empty) from now", store, source, began,
                     extra={"store": store})  # fmt: skip
        else:  # the store held rows: its partitions serve them until the new source's batch 0 replaces them
            log.info("store %s: source %s starts empty; every partition serves what it holds until its batch 0",
                     store, source, extra={"store": store})  # fmt: skip
    return query


def _count_late_rows(df: Any, query: Any, delivery: BatchDelivery) -> None:
    """A query under an event-time watermark drops late input rows: count them into the store's feed
    (``topologies.lateness``). Best effort: a count that cannot be kept is logged, and the store is fed."""
    store = delivery.spec.name
    try:
        lateness.watch(df.sparkSession, query, store, delivery.checkpoint, delivery.feeder)
    except Exception as err:
        log.warning("store %s: its late rows are not counted (%s: %s)", store, type(err).__name__, err,
                    extra={"store": store})  # fmt: skip


def _resumed_at(plan: str, checkpoint: str) -> dict[str, Any]:
    """A resumed query's feed starts from the batch its checkpoint last committed (``batch_id`` and
    ``source``): delivered by the run before, and what the store's positions show, so ``GET /stores`` can
    be compared with ``X-Riqr-Position`` before the first batch of this run (none comes on an idle input).
    Nothing for a fresh or rebuilt checkpoint, or one that committed nothing."""
    if plan != "resume":
        return {}
    committed, source = last_committed(checkpoint), query_id(checkpoint)
    return {} if committed is None or source is None else {"batch_id": committed, "source": source}


def _analyzed_plan(df: Any) -> str | None:
    """The text of ``df``'s analyzed plan, once per start (what ``_holds_until_a_watermark`` and the late-row
    count look at); None when it cannot be read (not a classic Spark DataFrame: Spark Connect has no _jdf)."""
    try:
        return str(df._jdf.queryExecution().analyzed().toString())
    except Exception as err:
        log.warning("could not read the query's plan (%s: %s): whether it aggregates under a watermark is taken "
                    "from the store's kind, and its late rows are not counted", type(err).__name__, err)  # fmt: skip
        return None


def _holds_until_a_watermark(plan: str | None, *, default: bool) -> bool:
    """Whether a streaming query in append mode (its analyzed ``plan``) emits its rows only as the
    event-time watermark closes them: its plan aggregates and sets a watermark (``withWatermark``; Spark
    requires one for an append-mode aggregation). A fresh checkpoint's batch 0 (which runs with none) emits
    none of them, and Spark runs the next batch at once. (A stateless append-mode query emits every row as
    it comes, and runs no batch without new input.) ``default`` when the plan could not be read."""
    if plan is None:
        return default
    return "EventTimeWatermark" in plan and "Aggregate" in plan


def _wait_for_query_id(checkpoint: str, timeout: float = 30.0) -> str:
    """The query id Spark writes to the checkpoint as the query starts."""
    deadline = time.monotonic() + timeout
    while True:
        source = query_id(checkpoint)
        if source is not None:
            return source
        if time.monotonic() > deadline:
            raise NotConnected(f"the streaming query wrote no metadata to {checkpoint} within {timeout:g}s")
        time.sleep(0.05)
