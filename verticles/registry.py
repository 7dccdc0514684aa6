"""Registry verticle: one detached named actor holding the catalog and the ownership tables.

A thin shell over ``runtime.registry.RegistryState``. Creating a store also creates its query actors
(through ``ClusterOps``, which ``verticles.deploy`` implements over Ray). If the registry itself restarts,
it rebuilds its tables from the query actors, which each know their store and partitions, and from the
members it saved (``runtime.membership``: the actors that cannot answer then are not forgotten), and its
endpoints from the HTTP verticles, and starts its epoch past any value it handed out before (epochs are
wall-clock based, from the start and again on a rebuild, and never below the bound its saved members carry,
whatever the node's clock says), so facades refresh.

Ingest records (``runtime.feeds.FeedBook``: each store's feed, its liveness and dead-letter totals) are not
in the query actors, so the registry keeps them in a file under its node's data directory and reads it
back after a restart; live feeders also re-send their whole state with every heartbeat.

About every second it checks which nodes Ray reports alive (``check_nodes``): the query actors of a node
that died are re-created, same name, on live nodes, and rebuild their copies from peers (docs/design.md,
"Node loss"). A query actor gone for good on a live node (killed without a restart, or failed in its
constructor: Ray brings neither back) is created again on its own node, where its data is, once it has
been gone for ``RIQR_RECREATE_AFTER`` seconds, with a growing wait between failed attempts (docs/design.md,
"An actor gone for good"), and one Ray lists alive that has left the registry's ping unanswered for
``RIQR_RESTART_SILENT_AFTER`` seconds (its process stopped or hung) is restarted (``runtime.liveness``).
``retire`` (``riqr down``) stops all three. The same check promotes a standby
wherever an active copy's actor is not alive (dead, restarting, being re-created), and gives the
partition back to its first active once that copy serves again; a facade that finds an owner
unreachable asks for the check at once (``suspect``). Facades learn of every change by waiting on
``wait_epoch`` (a long poll), so a promotion reaches them in milliseconds. Once ``riqr up`` for every
node asked for it (``follow_nodes``), the check also starts a facade and an HTTP verticle on each node that
joins, with the running ones' settings (docs/design.md, "``riqr up`` and ``riqr down``").
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runtime import logs
from runtime.auth import DeploymentSecrets
from runtime.catalog import StoreSpec
from runtime.config import (
    DEFAULT_RECREATE_AFTER,
    DEFAULT_RESTART_SILENT_AFTER,
    EPOCH_WAIT_MAX,
    FEED_SAVE_INTERVAL,
    FEED_STALE_AFTER,
    MOVE_LEAVE_GRACE,
    MOVE_SEAL_SECONDS,
    MOVE_START_SECONDS,
    RECREATE_ENV,
    RESTART_SILENT_ENV,
    RESTARTED_MOVE_SECONDS,
    SILENCE_PING_EVERY,
    SUSPECT_CHECK_GAP,
    seconds_setting,
)
from runtime.deadline import backoff
from runtime.errors import Conflict, InvalidParameter, NotFound, RiqrError, StoreInUse, StoreNotFound, Unavailable
from runtime.feeds import RUNNING, FeedBook, FeedReport, delete_book, load_book, save_book
from runtime.liveness import Pings
from runtime.membership import UndecodableRecord, epochs_below, membership_record, merge_members
from runtime.moves import behind, removable_standby
from runtime.ownership import (
    ActorInfo,
    ClusterView,
    Endpoint,
    OwnershipTable,
    ReaderCopy,
    plan_placement,
    replacement_node,
    table_from_holdings,
    table_from_placement,
)
from runtime.registry import RegistryState
from verticles.env import RegistryEnv, prune_empty_dirs

__all__ = ["Registry", "recreate_after", "restart_silent_after"]

log = logging.getLogger(__name__)

# The ingest records' file, under the namespace's data directory (no store name starts with "_").
INGEST_FILE = Path("_registry") / "ingest.json"


# A restarted registry that cannot read its saved members (Ray's GCS not answering) tries again after
# this long, then twice as long each time, up to MEMBERS_READ_WAIT_MAX seconds.
# How far ahead of the epoch the saved members' bound on epochs is put (``_save_members``): epochs move by
# one per change, so it is written again only after that many moves without a change of members.
EPOCH_RESERVE = 1_000_000
MEMBERS_READ_WAIT = 0.5
MEMBERS_READ_WAIT_MAX = 5.0

# The longest wait between two attempts at creating again an actor whose attempts failed.
RECREATE_BACKOFF_MAX = 60.0
# A node that joins (``follow_nodes``): the wait after its verticles failed to start doubles from this, up
# to ``RECREATE_BACKOFF_MAX``; and how long the registry waits before it looks again for a running REST API
# to take the settings from, when none runs.
FOLLOW_RETRY = 5.0
# A node's start that has not finished in this long is counted as failed (the running REST APIs asked for
# their settings may all be on nodes that are gone) and tried again after the wait above.
FOLLOW_START_SECONDS = 120.0


def _new_uuid() -> str:
    return str(uuidlib.uuid4())


def recreate_after(environ: Mapping[str, str] = os.environ) -> float | None:
    """How long ``$RIQR_RECREATE_AFTER`` says a query actor must be gone for good before the registry
    creates it again, in seconds (None: ``off``, never)."""
    return seconds_setting(environ, RECREATE_ENV, DEFAULT_RECREATE_AFTER, meant_for_tests_under=1)


def restart_silent_after(environ: Mapping[str, str] = os.environ) -> float | None:
    """How long ``$RIQR_RESTART_SILENT_AFTER`` lets a query actor Ray lists alive leave the registry's ping
    unanswered before the registry restarts it, in seconds (None: ``off``, never)."""
    return seconds_setting(environ, RESTART_SILENT_ENV, DEFAULT_RESTART_SILENT_AFTER, meant_for_tests_under=5)


@dataclass
class _Gone:
    """A query actor Ray holds no actor for, as the registry's checks have seen it."""

    since: float  # seen gone at every check from this time on
    sightings: int = 0  # checks in a row that listed the cluster's actors and not this one


@dataclass
class _Failures:
    """Failed attempts at creating a query actor again (kept when it shows up in between: an attempt
    whose wait timed out leaves it listed while its constructor runs, then fails)."""

    attempts: int
    next_try: float

    @staticmethod
    def after(failures: _Failures | None, first_wait: float, now: float) -> _Failures:
        """One more failed attempt after ``failures`` (None: the first): the next try waits ``first_wait``,
        doubled at each attempt since, up to ``RECREATE_BACKOFF_MAX``."""
        attempts = 1 if failures is None else failures.attempts + 1
        return _Failures(attempts, now + backoff(first_wait, attempts, RECREATE_BACKOFF_MAX))


class Registry:
    """The catalog and ownership table of one namespace. ``env`` reaches the cluster; ``clock`` and
    ``new_uuid`` are injectable so the rebuild and creation logic is testable without Ray."""

    def __init__(
        self,
        namespace: str,
        env: RegistryEnv,
        *,
        clock: Callable[[], float] = time.time,
        new_uuid: Callable[[], str] = _new_uuid,
        secrets: DeploymentSecrets | None = None,
        stale_after: float = FEED_STALE_AFTER,
        recreate_after: float | None = DEFAULT_RECREATE_AFTER,
        restart_silent_after: float | None = DEFAULT_RESTART_SILENT_AFTER,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        logs.configure_from_env()
        self.namespace = namespace
        # verticles.deploy passes them, so a restart (same constructor arguments) keeps them; generating
        # here is for tests only, since a restarted registry would then hand out new ones.
        self._secrets = secrets if secrets is not None else DeploymentSecrets.generate()
        self._env = env
        self._new_uuid = new_uuid
        self._clock = clock
        # Epochs are wall-clock milliseconds from the start, a new registry's and a rebuilt one's alike: a new
        # deployment's are past an earlier one's in the same namespace, so a client that cached a view across
        # ``riqr down`` and ``riqr up`` never takes it for the new registry's (it did when both counted from 0
        # and their counts met), and 0 stays "never saw a registry" (``ClusterView``'s default).
        first_epoch = int(clock() * 1000)
        self.state = RegistryState(epoch=first_epoch)
        self._epochs_below = 0  # the bound on epochs handed out that the saved members carry (_save_members)
        # Woken on every epoch bump; ``wait_epoch`` callers (facades) wait on it in their own threads.
        self._changed = threading.Condition()
        # (store, partition) -> the active a promotion replaced, given the partition back once it serves.
        self._first_active: dict[tuple[str, int], str] = {}
        self._actors_checked_at = 0.0
        # Query actors gone for good on live nodes, and when to create them again (None: never).
        self._recreate_after = recreate_after
        self._gone: dict[str, _Gone] = {}
        self._failures: dict[str, _Failures] = {}
        # Query actors Ray lists alive that answer no ping (stopped, hung) are restarted after this long.
        self._restart_silent_after = restart_silent_after
        every = (
            SILENCE_PING_EVERY if restart_silent_after is None else min(SILENCE_PING_EVERY, restart_silent_after / 4)
        )
        # Silence is a duration: the monotonic clock, unless a test gives its own (a wall clock stepped back
        # by NTP would have hidden a silence for as long).
        self._pings = Pings(env.send_ping, env.pings_answered, time.monotonic if clock is time.time else clock, every)
        # The query actors the last check found not alive (``check_actors``): their silence counts again
        # from a ping sent once they run, never across a restart.
        self._down_seen: set[str] = set()
        # ``riqr down`` is under way: nothing is re-created or promoted any more.
        self._retired = False
        # How ingest of each store goes, as its feeders last reported (not part of the routing view: it
        # changes with every batch, and no request routes by it).
        self._ingest_path = self._ingest_file()
        self.feeds = FeedBook(stale_after)
        self._saved_at = clock()
        self._sleep = sleep
        # The stores' members (``runtime.membership``): the record last saved; set once ``riqr down`` deleted
        # it (nothing is saved until a ``resume``); and the entries of a record read at a restart that could
        # not be parsed, carried into every save.
        self._members_saved: dict[str, Any] | None = None
        self._members_off = False
        self._members_failing = False  # the last save failed (logged once until one succeeds)
        self._members_carried: dict[str, Any] = {}
        # Query actors of dropped stores not yet destroyed (saved in the members; ``_finish_drops``), and
        # of those a move replaced, when their grace for reads already sent to them ends.
        self._dropping: set[str] = set()
        self._leaving: dict[str, float] = {}
        # A move's new actor -> the actor it replaces, while the move is under way (``admit``); before that,
        # while it starts (``join``), -> (the actor it replaces, when it was asked for).
        self._moving: dict[str, str] = {}
        self._starting: dict[str, tuple[str, float]] = {}
        # A new actor that adds a standby copy (``add_standby``) -> the partitions it copies, until ``keep``.
        self._copying: dict[str, tuple[int, ...]] = {}
        # Stores whose spec ``_rebuild`` raised to the standbys their table had (a move's new actor admitted
        # before the restart counts as one, and its switch takes the spec back), until when a move of theirs
        # may still be under way unseen (a mover gives up after its timeout, 900 s by default): no standby
        # copy of such a store is removed before then, since the one kept could be the move's old actor.
        self._raised: dict[str, float] = {}
        self._drops_failing = False
        # Nodes that join get a facade and a REST API (``follow_nodes``): the nodes seen with them, those
        # whose verticles are starting, the failed attempts by node, and no look before this time.
        self._follow = False
        self._served_nodes: set[str] = set()
        self._nodes_starting: dict[str, tuple[Any, float]] = {}  # node -> its start, and when it began
        self._node_failures: dict[str, _Failures] = {}
        self._follow_after = 0.0
        self._follow_idle = False  # said once that no REST API runs to take settings from
        if env.restarted():
            self._rebuild(first_epoch)
            self._restore_feeds(stale_after)
        else:
            self._save_feeds()  # a new deployment: records left by an earlier one in this namespace go
        # Saved now: a new deployment's empty membership replaces an earlier one's; a rebuilt one is kept as
        # rebuilt, remembered actors included.
        self._save_members()
        self.state.listeners.append(self._epoch_moved)
        self.state.listeners.append(lambda _epoch: self._save_members())
        env.watch_nodes()

    def _ingest_file(self) -> Path | None:
        """Where the ingest records are kept: under this node's data directory, if it has one."""
        data = self._env.data_dir()
        return data / INGEST_FILE if data is not None else None

    def _rebuild(self, epoch: int) -> None:
        """The tables of a restarted registry: the query actors that answer, and the members it saved for
        the ones that do not (``runtime.membership.merge_members``). Those stay members, as any dead actor
        would: ``check_nodes`` creates them again (on their node, or elsewhere if it is gone), and until
        then their partitions fail over to a standby or answer 503. A record that says ``riqr down`` was
        under way leaves this registry retired too (``resume`` undoes it)."""
        saved = self._load_members()
        # At or past every epoch handed out before, whatever this node's clock says: epochs are wall-clock
        # based, and a registry restarted on a node whose clock is behind would start below them. Facades and
        # the sink keep the newest view they saw, so every view of the restarted one would be ignored, and a
        # read replica it no longer lists would go on answering from a state nothing feeds.
        self._epochs_below = epochs_below(saved)
        if self._epochs_below > epoch:
            log.info("epochs go on from %d, the bound saved before the restart (this node's clock says %d)",
                     self._epochs_below, epoch)  # fmt: skip
            epoch = self._epochs_below
        self.state = RegistryState(epoch=epoch)
        self._members_saved = saved  # written again only where the rebuilt tables differ from it
        merged = merge_members(saved, self._env.query_actor_infos())
        self._members_carried = merged.carried
        self._dropping = set(merged.dropping)  # destroyed at the first check (``_finish_drops``)
        self._follow = merged.follow
        if merged.retired:
            self._retired = True
            log.warning("the saved members say riqr down was under way: query actors are not re-created until "
                        "riqr up")  # fmt: skip
        for name, (spec, actors) in sorted(merged.stores.items()):
            try:
                table = table_from_holdings(spec, {a.uuid: a.partitions for a in actors}, merged.actives.get(name, ()))
                table = replace(table, moved_from=merged.moved_from.get(name, frozenset()))
            except KeyError:
                log.error("store %s lost actors; it will be unavailable until recreated", name, extra={"store": name})
                continue
            self.state.install(table, actors)
            if table.fewest_standbys() > (spec.standbys or 0):
                # Copies ``riqr standbys`` admitted before the restart, not kept yet (this registry keeps no
                # moves, so they are copies like any other): the store says so, and its actors rebuild
                # from peers. Or a move's new actor: its switch takes the spec back (``switch``).
                self._raised[name] = self._clock() + RESTARTED_MOVE_SECONDS
                self._store_standbys(table)
        # The give-backs owed when it stopped: a partition a failover moved goes back to its first active
        # once that serves again, as if the registry had not restarted (``_give_back`` drops any no longer
        # a holder).
        tables = self.state.view().tables
        self._first_active = {key: u for key, u in merged.first_actives.items() if key[0] in tables}
        for endpoint in self._env.http_endpoints():
            self.state.register_endpoint(endpoint)
        if merged.dropping:
            log.warning("query actors of a drop or of riqr down were not destroyed before the restart: "
                        "destroying %s", ", ".join(merged.dropping))  # fmt: skip
        missing = f" and its saved members (not answering: {', '.join(sorted(merged.remembered))})"
        log.warning("registry restarted; rebuilt %d stores from their query actors%s", len(merged.stores),
                    missing if merged.remembered else "")  # fmt: skip

    def _load_members(self) -> dict[str, Any] | None:
        """The saved members (None if there are none). Waits, trying again, while Ray's GCS cannot be read:
        a registry that went on without them would forget the actors that do not answer, then write that
        over the record. One that cannot be decoded is logged, and the registry goes on from the live query
        actors (its next save replaces it)."""
        wait, tries = MEMBERS_READ_WAIT, 0
        while True:
            try:
                return self._env.load_membership()
            except UndecodableRecord as err:
                log.error("the saved members cannot be decoded (%s); rebuilding from the live query actors alone", err)
                return None
            except Exception as err:
                tries += 1
                # Every try while it may be a blip; then once a minute, louder: this is no blip.
                if tries <= 5 or tries % 12 == 0:
                    level = logging.WARNING if tries <= 5 else logging.ERROR
                    log.log(level, "cannot read the saved members yet (%d tries: %s); the registry waits for them, "
                            "trying again in %.1fs", tries, err, wait)  # fmt: skip
                self._sleep(wait)
                wait = min(wait * 2, MEMBERS_READ_WAIT_MAX)

    def _save_members(self, *, without: str | None = None, strict: bool = False, dropping: Sequence[str] = ()) -> None:
        """Save the stores' members (``without`` that store) if they changed since the last save: on every
        epoch move (creation, drop, an actor re-created elsewhere), ``retire`` and ``resume``. Failing is
        logged, not raised (the change itself is made, and only a restart before the next save would miss
        it), unless ``strict``: then ``Unavailable``, for a change that must not be made unsaved
        (``drop_store``)."""
        if self._members_off:
            return
        view = self.state.view()
        # The bound on the epochs handed out, moved far ahead only when the epoch reaches it: a write per
        # EPOCH_RESERVE epoch moves, not per move (an endpoint or a promotion alone writes nothing).
        bound = self._epochs_below if view.epoch < self._epochs_below else view.epoch + EPOCH_RESERVE
        record = membership_record(view, retired=self._retired, carried=self._members_carried, without=without,
                                   dropping=self._dropping.union(dropping), follow=self._follow,
                                   first_actives=self._first_active, epochs_below=bound)  # fmt: skip
        if record == self._members_saved:
            return
        try:
            self._env.save_membership(record)
        except Exception as err:
            if strict:
                raise Unavailable(
                    f"the registry could not save the stores' members ({err}); nothing was changed, try again",
                    retry_after=5,
                ) from err
            if not self._members_failing:  # once, not at every check while the GCS does not answer
                log.warning("could not save the stores' members; trying again at every check", exc_info=True)
            self._members_failing = True
            return
        if self._members_failing:
            log.info("saved the stores' members again")
        self._members_saved, self._members_failing, self._epochs_below = record, False, bound

    def _restore_feeds(self, stale_after: float) -> None:
        if self._ingest_path is None:
            return
        self.feeds = load_book(self._ingest_path, self._clock(), stale_after)
        self.feeds.keep_only(self.state.view().tables)
        log.info("restored the ingest records of %d stores", len(self.feeds.status(self._clock())))

    def _save_feeds(self, *, now: bool = True) -> None:
        """Write the ingest records: at once (``now``), or if they changed and the last write is older
        than ``FEED_SAVE_INTERVAL`` (batch progress, heartbeats). Failing to write is logged, not raised:
        a feeder's report must not fail because a disk is full."""
        due = self.feeds.dirty and self._clock() - self._saved_at >= FEED_SAVE_INTERVAL
        if self._ingest_path is None or not (now or due):
            return
        try:
            save_book(self.feeds, self._ingest_path)
            self._saved_at = self._clock()
        except OSError:
            log.warning("could not write the ingest records to %s", self._ingest_path, exc_info=True)

    def secrets(self) -> DeploymentSecrets:
        """The deployment's cursor key and token secret (in-cluster callers are trusted: docs/security.md)."""
        return self._secrets

    def epoch(self) -> int:
        return self.state.epoch

    def feed_epoch(
        self, store: str, feeder: str, checkpoint: str | None, owners: Sequence[str] = (), source: str | None = None
    ) -> tuple[int, str | None]:
        """``epoch``, and why another feed holds ``store`` now if it does (``FeedBook.unclaimed`` of a live
        report of ``feeder`` from ``checkpoint``: another live feed, or another checkpoint's batches in the
        store while ``feeder`` holds no claim), else None: asked before each batch is delivered
        (``topologies.delivery``), in the call that looks at the epoch anyway, so a topology that another
        one replaced while it was silent delivers no further batch. None too when ``owners`` say the
        caller fed a store of that name dropped since: the caller's own view says so, in its own words.

        ``source`` (the batch's source, Spark's query id), when the caller may feed the store, is the one
        whose batch 0 may reset its partitions from then on (``reset_refused``)."""
        table = self.state.view().table(store)
        report = FeedReport(store, feeder, RUNNING, checkpoint=checkpoint, owners=tuple(owners))
        if table is None or self.feeds.about_an_older_store(report, table.lineage()):
            return self.state.epoch, None
        why = self.feeds.unclaimed(report, self._clock())
        if why is None and source is not None and self.feeds.name_source(store, source):
            self._save_feeds()  # before any batch 0 of it reaches a query actor, which asks reset_refused
        return self.state.epoch, why

    def reset_refused(self, store: str, source: str) -> str | None:
        """Why batch 0 of ``source`` may not reset ``store``'s partitions (a query actor asks before it
        does), or None. The source is not the one the store's feed named in its last batch's check
        (``feed_epoch``): a late batch 0 of a topology another one displaced, which would replace what the
        new feed delivered and serve it (later batches of it are gaps, which never serve). None when no
        check named a source (a sink of an earlier riqr). Kept in the ingest records, so a restarted
        registry still refuses."""
        feeding = self.feeds.feeding_source(store)
        if feeding is None or feeding == source:
            return None
        return f"store {store!r} is fed from source {feeding} now (another topology, or a rebuild, took it)"

    def _epoch_moved(self, _epoch: int) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait_epoch(self, known: int, timeout: float) -> int:
        """The epoch, as soon as it is not ``known``, or after ``timeout`` seconds (at most
        ``EPOCH_WAIT_MAX``) if it does not move: a facade's long poll for changes.

        Called in the actor's "watch" concurrency group (``verticles.deploy``), so waiting callers
        occupy their own threads and never hold up the registry's other calls; it only reads the epoch.
        """
        with self._changed:
            self._changed.wait_for(lambda: self.state.epoch != known, min(max(timeout, 0.0), EPOCH_WAIT_MAX))
            return self.state.epoch

    def view(self) -> ClusterView:
        return self.state.view()

    def create_store(self, spec: StoreSpec) -> ClusterView:
        """Create ``spec``'s query actors and publish its table; idempotent for an identical spec.

        Standbys left to "auto" (None) are decided here, where the alive nodes are known: one per
        partition when there is more than one node (``StoreSpec.with_standbys_for``).
        """
        return self.create_stores([spec])

    def create_stores(self, specs: Sequence[StoreSpec]) -> ClusterView:
        """``create_store`` for several stores, with the query actors of all of them started in one round
        (a topology that feeds several stores waits once for its actors, not once per store). Nothing is
        created when one of them conflicts with an existing store. A store declared again with its read
        replicas turned on or off changes in place, without new actors."""
        new: list[StoreSpec] = []
        for spec in specs:
            existing = self.state.existing(spec)
            if existing is None:
                if all(s.name != spec.name for s in new):
                    new.append(spec)
            elif existing.spec.read_replicas != spec.read_replicas:
                wanted = replace(existing.spec, read_replicas=spec.read_replicas)
                self.state.replace_table(replace(existing, spec=wanted))
                log.info("store %s: read replicas %s", spec.name, "on" if spec.read_replicas else "off",
                         extra={"store": spec.name})  # fmt: skip
        if not new:
            return self.state.view()
        nodes = self._env.alive_nodes()
        planned = []
        for spec in new:
            spec = spec.with_standbys_for(len(nodes))
            plans = plan_placement(spec, nodes)
            uuids = [self._new_uuid() for _ in plans]
            table = table_from_placement(spec, uuids, plans)
            holdings = table.all_owners()
            planned.append((spec, table, [(uuid, holdings[uuid], plan.node_id) for uuid, plan in zip(uuids, plans)]))
        started = self._env.start_query_actors([(spec, members) for spec, _, members in planned])
        for (spec, table, _), actors in zip(planned, started):
            self.state.install(table, actors)
            log.info("created store %s: %d partitions on %d actors, %d standby copies each, %d nodes alive",
                     spec.name, spec.partitions, len(actors), spec.standbys or 0, len(nodes),
                     extra={"store": spec.name})  # fmt: skip
        return self.state.view()

    def drop_store(self, name: str, *, refuse_if_fed: bool = False) -> list[str]:
        """Forget a store, stop its actors and delete their data. The saved members lose it first: a drop
        that cannot be saved is refused (``Unavailable``), so a restart never brings a dropped store back.
        ``refuse_if_fed`` (``riqr drop`` without ``--force``): refused (``StoreInUse``) while the store's
        last ingest report is a live one, even a stale one, since that topology's next batch would fail."""
        view = self.state.view()
        if view.table(name) is None:
            raise StoreNotFound(f"store {name!r} is not known", store=name)
        feeder = self.feeds.live_feeder(name) if refuse_if_fed else None
        if feeder is not None:
            verdict = self.feeds.verdict(name, self._clock())
            assert verdict is not None  # the feed live_feeder found; its state: running, rebuilding or stale
            state, reason = verdict
            if state == "stale":  # no heartbeat: killed, or hung, or cut off; the registry cannot tell which
                raise StoreInUse(
                    f"store {name!r} is fed by a topology that has gone silent ({feeder}: {reason}): if its process"
                    " is gone, drop with --force; if it only hangs, stop it first (with --force it fails once it"
                    " runs again)",
                    store=name,
                )
            raise StoreInUse(
                f"store {name!r} is fed by a running topology ({feeder}, {state}):"
                " stop it first, or drop with --force (the topology then fails, within seconds under riqr's runner;"
                " started again, it creates the store again and rebuilds it)",
                store=name,
            )
        members = sorted(u for u, info in view.actors.items() if info.store == name)
        self._members_carried.pop(name, None)
        # Saved with its actors marked as being dropped: a registry that stops before they are destroyed
        # destroys them when it restarts, rather than take them back from their answers.
        self._save_members(without=name, strict=True, dropping=members)
        self._dropping.update(members)
        # A move or a standby copy of its actors admitted and under way ends with the store (its driver's
        # next call finds no such actor): forgotten, or each stayed for the registry's life. One asked for
        # and not admitted yet (``_starting``) is stopped at its start timeout, as any.
        for new in [n for n in self._moving if n in members]:
            del self._moving[new]
            self._copying.pop(new, None)
        self._raised.pop(name, None)
        uuids = self.state.drop(name)
        self._first_active = {k: v for k, v in self._first_active.items() if k[0] != name}
        if self.feeds.forget(name):
            self._save_feeds()
        # The drop is made (saved, and out of the tables) whether or not destroying its actors works now.
        self._finish_drops()
        return uuids

    def _finish_drops(self) -> None:
        """Destroy the query actors of dropped stores (stop them, delete their data), and those a move
        replaced once their grace has passed, then save the members without them. Actors already gone are
        no error: their data stays for the sweeper. A failure is logged (once until one succeeds) and tried
        again at the next check."""
        now = self._clock()
        pending = sorted(u for u in self._dropping if self._leaving.get(u, now) <= now)
        if not pending:
            return
        try:
            self._env.destroy(pending)
        except Exception:
            if not self._drops_failing:
                log.warning("could not destroy the query actors of a dropped store (%s); trying again at every "
                            "check", ", ".join(pending), exc_info=True)  # fmt: skip
            self._drops_failing = True
            return
        self._drops_failing = False
        self._dropping.difference_update(pending)
        for uuid in pending:
            self._leaving.pop(uuid, None)
        self._save_members()

    # -- moving copies between nodes (runtime.moves; driven by riqr.moves) ---------------------------

    def join(self, uuid: str, node_id: str) -> dict[str, Any]:
        """A move's first step: ask for a new query actor on ``node_id`` for the partitions query actor
        ``uuid`` holds, and return at once ``{"uuid", "node_id"}`` of the new actor. Its mover waits until it
        answers, then calls ``admit``: the registry does not wait for an actor's start (a second or two),
        since its calls run one at a time and the sink's epoch check before each batch is one of them. A new
        actor not admitted within ``MOVE_START_SECONDS`` is stopped at the next check (``abandon_move``)."""
        return self._start_copy(uuid, node_id, None)

    def add_standby(self, uuid: str, node_id: str, partitions: Sequence[int]) -> dict[str, Any]:
        """``riqr standbys``' first step: ask for a new query actor on ``node_id`` with a copy of
        ``partitions`` (query actor ``uuid`` holds them: it is the copy the new one is compared with), and
        return at once, as ``join`` does. Then ``admit`` lists it as their last standby and starts its copy,
        and ``keep``, once it holds what ``uuid`` holds, makes it a standby for good: nothing is switched
        and ``uuid`` stays. ``node_id`` may be ``uuid``'s own (a one-node cluster: a copy in another
        process, which outlives that process's death but not the node's)."""
        wanted = tuple(sorted({int(p) for p in partitions}))
        return self._start_copy(uuid, node_id, wanted)

    def _known_actor(self, uuid: str, done: str) -> tuple[ActorInfo, OwnershipTable]:
        """Query actor ``uuid`` and its store's table, for a change of its copies: ``NotFound`` if no table
        has it, ``Unavailable`` while ``riqr down`` is under way (then nothing is ``done``)."""
        view = self.state.view()
        info = view.actors.get(uuid)
        table = None if info is None else view.table(info.store)
        if info is None or table is None or uuid not in table.all_owners():
            raise NotFound(f"query actor {uuid} is not known", actor=uuid)
        if self._retired:
            raise Unavailable(f"the runtime is going down (riqr down): nothing is {done}", retry_after=5)
        return info, table

    def _start_copy(self, uuid: str, node_id: str, partitions: tuple[int, ...] | None) -> dict[str, Any]:
        """``join`` (``partitions`` None: all of ``uuid``'s, on another node) and ``add_standby``."""
        info, table = self._known_actor(uuid, "moved")
        if partitions is None and node_id == info.node_id:
            raise InvalidParameter(f"query actor {uuid} already runs on node {node_id}", actor=uuid)
        held = table.all_owners()[uuid]
        if partitions is not None and (not partitions or not set(partitions) <= set(held)):
            raise InvalidParameter(f"query actor {uuid} holds partitions {held} of {info.store}, not all of "
                                   f"{list(partitions)}", actor=uuid)  # fmt: skip
        if node_id not in self._env.alive_nodes():
            raise InvalidParameter(f"node {node_id} is not a live node of the cluster", node=node_id)
        if uuid in self._moving or uuid in self._starting:
            raise Conflict(f"query actor {uuid} is a move's new actor, not in place yet", actor=uuid)
        moves = [new for new, old in self._moving.items() if old == uuid and new not in self._copying]
        moves += [new for new, (old, _) in self._starting.items() if old == uuid and new not in self._copying]
        copies = [new for new, old in self._moving.items() if old == uuid and new in self._copying]
        unadmitted = [new for new, (old, _) in self._starting.items() if old == uuid and new in self._copying]
        if partitions is not None and moves:
            raise Conflict(f"query actor {uuid} is being moved (to {moves[0]}): add standby copies once the move "
                           "is made", actor=uuid)  # fmt: skip
        if copies or (partitions is None and unadmitted):
            # In the table and catching up (or, for a move, starting): its driver may still run. One whose
            # driver was stopped is settled by the next `riqr standbys` of the store once caught up.
            adding = (copies + unadmitted)[0]
            raise Conflict(f"a standby copy of query actor {uuid}'s partitions is being added ({adding}): move or "
                           f"copy it once that is done (`riqr standbys {info.store} N` settles one whose "
                           "command was stopped)", actor=uuid)  # fmt: skip
        for new in moves + unadmitted:
            # Its mover stopped without giving it up (killed), or another one runs: this one replaces it.
            log.warning("query actor %s: an earlier %s, %s, is given up for this one", uuid,
                        "move of it" if new in moves else "standby copy of its partitions", new,
                        extra={"store": info.store, "actor": uuid})  # fmt: skip
            self.abandon_move(uuid, new)
        new = self._new_uuid()
        spec = table.spec if partitions is None else replace(table.spec, standbys=max(1, table.spec.standbys or 0))
        self._env.start_joining_actor(spec, new, partitions or info.partitions, node_id)
        self._starting[new] = (uuid, self._clock())
        if partitions is None:
            log.info("moving query actor %s of %s from node %s to node %s: new actor %s starts", uuid,
                     info.store, info.node_id, node_id, new, extra={"store": info.store, "actor": uuid})  # fmt: skip
        else:
            self._copying[new] = partitions
            log.info("adding a standby copy of partitions %s of %s on node %s: new actor %s starts",
                     list(partitions), info.store, node_id, new,
                     extra={"store": info.store, "actor": uuid})  # fmt: skip
        return {"uuid": new, "node_id": node_id}

    def admit(self, old: str, new: str) -> dict[str, Any]:
        """A move's second step, once the new actor ``join`` asked for answers: list it as the last standby of
        each partition ``old`` holds, in one epoch (the sink delivers to it from its next batch), and start its
        copy from live peers. Returns ``{"uuid", "node_id", "epoch"}``. ``NotFound`` if the move was given
        up meanwhile; a move whose old actor left the table, or now runs on the new actor's node (a node
        loss re-created it there), is given up (``NotFound``, ``Conflict``)."""
        starting = self._starting.get(new)
        if starting is None or starting[0] != old:
            raise NotFound(f"no move of query actor {old} to {new} is starting (given up?)", actor=old)
        view = self.state.view()
        info = view.actors.get(old)
        table = None if info is None else view.table(info.store)
        if info is None or table is None or old not in table.all_owners() or self._retired:
            self.abandon_move(old, new)
            if self._retired:
                raise Unavailable("the runtime is going down (riqr down): nothing is moved", retry_after=5)
            raise NotFound(f"query actor {old} left its store's table: its move is given up", actor=old)
        where = self._env.query_actor_call(new, "ready")
        copying = self._copying.get(new)
        if copying is None and where["node_id"] == info.node_id:
            self.abandon_move(old, new)
            raise Conflict(f"query actor {old} runs on node {info.node_id} now, as its new actor would: its move "
                           "is given up; plan again", actor=old)  # fmt: skip
        parts = copying or tuple(info.partitions)
        if not set(parts) <= set(table.all_owners()[old]):
            self.abandon_move(old, new)
            raise Conflict(f"query actor {old} no longer holds partitions {list(parts)}: the copy is given up; plan "
                           "again", actor=old)  # fmt: skip
        del self._starting[new]
        joined = ActorInfo(new, info.store, where["node_id"], where["node_ip"], parts)
        self.state.add_copy(table.with_joining(old, new, parts), joined)  # saved with the members
        self._moving[new] = old
        try:  # after the table: a registry that dies in between restarts with it listed, so it is kept
            self._env.query_actor_call(new, "admit")
        except RiqrError as err:  # it says joining until then: a restarted registry keeps it all the same
            log.warning("the new actor %s did not take its admission: %s", new, err.message,
                        extra={"store": info.store, "actor": new})  # fmt: skip
        if copying is None:
            log.info("moving query actor %s of %s from node %s to node %s: new actor %s copies partitions %s",
                     old, info.store, info.node_id, joined.node_id, new, list(parts),
                     extra={"store": info.store, "actor": old})  # fmt: skip
        else:
            log.info("adding a standby copy of partitions %s of %s on node %s: new actor %s copies them",
                     list(parts), info.store, joined.node_id, new,
                     extra={"store": info.store, "actor": new})  # fmt: skip
        if copying is None and table.spec.standbys:  # its spec may predate the store's standbys
            self._env.query_actor_tell(new, "peers_joined")
        try:
            self._env.query_actor_call(new, "catch_up", list(parts))
        except RiqrError as err:  # its mover asks again
            log.warning("the new actor %s did not start its copy yet: %s", new, err.message,
                        extra={"store": info.store, "actor": new})  # fmt: skip
        return {"uuid": new, "node_id": joined.node_id, "epoch": self.state.epoch}

    def switch(self, old: str, new: str) -> dict[str, Any]:
        """A move's switch: seal ``old`` (it refuses batches, so its positions stop), and if ``new`` holds
        every batch ``old`` holds, put ``new`` in ``old``'s place in one epoch and destroy ``old`` after
        ``MOVE_LEAVE_GRACE`` (``{"switched": True, "epoch"}``); otherwise lift the seal and say which
        partitions are behind (``{"switched": False, "behind", "old", "new"}``: positions)."""
        view = self.state.view()
        info, joined = view.actors.get(old), view.actors.get(new)
        table = None if info is None else view.table(info.store)
        if info is None or joined is None or table is None or joined.store != info.store:
            raise NotFound(f"no move of query actor {old} to {new} is under way", actor=old)
        replaced = table.with_replaced(old, new)  # ValueError: new does not hold old's copies (a bug)
        sealed = self._env.query_actor_call(old, "seal", MOVE_SEAL_SECONDS)
        try:
            positions = self._env.query_actor_call(new, "positions")
        except RiqrError:
            self._env.query_actor_call(old, "unseal")
            raise
        late = behind(sealed, positions)
        if late:
            self._env.query_actor_call(old, "unseal")
            return {"switched": False, "behind": late, "old": sealed, "new": positions}
        # Saved as leaving before it is sealed for good: a registry restarted from here destroys it, and
        # rebuilds the table from the copies that stay.
        self._dropping.add(old)
        self._leaving[old] = self._clock() + MOVE_LEAVE_GRACE
        self._first_active = {k: (new if v == old else v) for k, v in self._first_active.items()}
        epoch = self.state.remove_actor(replaced, old)
        self._moving.pop(new, None)
        if replaced.fewest_standbys() < (replaced.spec.standbys or 0):
            # The move was under way when a registry restarted, which took its new actor for a standby copy
            # and raised the spec (maybe a restart before this one): the store has the standbys it had
            # before the move again. (A switch changes no partition's count of copies.)
            self._raised.pop(info.store, None)
            self._store_standbys(replaced)
            epoch = self.state.epoch
        try:
            self._env.query_actor_call(old, "seal", None)
        except RiqrError as err:  # sealed for MOVE_SEAL_SECONDS, destroyed before that
            log.warning("could not seal query actor %s for good: %s", old, err.message, extra={"actor": old})
        log.info("query actor %s of %s took the place of %s (epoch %d); the old one is destroyed in %.0fs", new,
                 info.store, old, epoch, MOVE_LEAVE_GRACE, extra={"store": info.store, "actor": new})  # fmt: skip
        return {"switched": True, "epoch": epoch}

    def keep(self, old: str, new: str) -> dict[str, Any]:
        """``riqr standbys``' last step: once the copy ``new`` (``add_standby``, ``admit``) serves every
        partition it holds at or past ``old``'s position there (``runtime.moves.behind``; no seal: from its
        admission on the sink delivers every batch to it, so a copy found caught up once stays so), it stays
        a standby for good, and the store's ``standbys`` becomes what its table now has (the fewest of any
        partition). ``{"kept": True, "epoch", "standbys"}``, or ``{"kept": False, "behind", "old", "new"}``
        (positions). Asking again once kept answers the same: a caller whose answer was lost asks again."""
        view = self.state.view()
        joined = view.actors.get(new)
        table = None if joined is None else view.table(joined.store)
        if joined is None or table is None or new not in table.all_owners():
            raise NotFound(f"no standby copy {new} is being added (given up?)", actor=new)
        held = set(table.all_owners()[new])
        theirs = self._env.query_actor_call(old, "positions")
        theirs = {p: pos for p, pos in theirs.items() if int(p) in held}
        mine = self._env.query_actor_call(new, "positions")
        late = behind(theirs, mine)
        if late:
            return {"kept": False, "behind": late, "old": theirs, "new": mine}
        standbys = self._settle_copy(new)
        log.info("query actor %s of %s keeps its standby copy of partitions %s; the store's partitions have %d "
                 "standby copies at the fewest", new, joined.store, sorted(held), standbys,
                 extra={"store": joined.store, "actor": new})  # fmt: skip
        return {"kept": True, "epoch": self.state.epoch, "standbys": standbys}

    def settle_standbys(self, store: str) -> dict[str, Any]:
        """The standby copies of ``store`` being added whose driver stopped after their admission: each
        that holds what the actor it was copied from holds (``keep``'s check) is kept; the others are
        left to catch up (``{"pending"}``). ``riqr standbys`` calls this first. Returns
        ``{"standbys", "pending", "kept"}``."""
        pending: list[str] = []
        kept_now: list[str] = []
        for new in [u for u, old in self._moving.items() if u in self._copying]:
            info = self.state.view().actors.get(new)
            if info is None or info.store != store:
                continue
            try:
                kept = self.keep(self._moving[new], new)["kept"]
            except RiqrError:
                kept = False
            (kept_now if kept else pending).append(new)
        table = self.state.view().table(store)
        if table is None:
            raise StoreNotFound(f"store {store!r} is not known", store=store)
        standbys = (table.spec.standbys or 0) if pending else self._store_standbys(table)
        return {"standbys": standbys, "pending": sorted(pending), "kept": sorted(kept_now)}

    def remove_standby(self, uuid: str, wanted: int) -> dict[str, Any]:
        """``riqr standbys`` with fewer copies: query actor ``uuid``, which answers for no partition, leaves
        its store's table so that each of its partitions keeps ``wanted`` standby copies, and is destroyed
        with its data after ``MOVE_LEAVE_GRACE`` (reads already sent to it are answered). The store's spec
        then says the standbys its table has, and actors whose partitions have no other copy any more are
        told so (``QueryVerticle.peers_left``). Refused (``Conflict``, nothing changed) when it answers for a
        partition, or did before a failover and gets it back (``_first_active``: one of the store's own
        actors), would leave one with fewer than ``wanted``, while a move or copy of the store's actors is
        under way (its new actor would count as a standby it may never be), or when its partitions would
        not keep ``wanted + 1`` copies that serve now: in doubt, no copy is removed. Saved as leaving before
        the table changes (``Unavailable`` if that cannot be saved). Returns ``{"epoch", "standbys",
        "partitions"}``."""
        info, table = self._known_actor(uuid, "removed")
        store = info.store
        actors = self.state.view().actors

        def of_store(actor: str) -> bool:
            return actor in actors and actors[actor].store == store

        under_way = [n for n, old in self._moving.items() if of_store(old)]
        under_way += [n for n, (old, _) in self._starting.items() if of_store(old)]
        if under_way:
            # A move's new actor, or a copy not kept yet, would count as a standby it may never be.
            raise Conflict(f"a move or a copy of store {store}'s query actors is under way ({under_way[0]}): remove "
                           "standby copies once it is done", actor=uuid)  # fmt: skip
        if self._raised.get(store, 0.0) > self._clock():
            raise Conflict(f"the registry restarted with more copies of store {store} than its standbys, as a move "
                           "under way leaves it: remove standby copies once that move is done (its switch says the "
                           f"store's standbys again), or after {RESTARTED_MOVE_SECONDS:.0f}s from the restart, when "
                           "its mover has given up", actor=uuid)  # fmt: skip
        if any(name == store and first == uuid for (name, _), first in self._first_active.items()):
            raise Conflict(f"query actor {uuid} answered for partitions of {store} before a failover and gets them "
                           "back once it serves again: one of the store's own actors, it stays",
                           actor=uuid)  # fmt: skip
        why = removable_standby(table, uuid, wanted)
        if why is not None:
            raise Conflict(f"{why}: it stays; plan again", actor=uuid)
        held = table.all_owners()[uuid]
        serving: dict[int, int] = {}
        for other in {o for p in held for o in (table.partitions[p].active, *table.partitions[p].standbys)}:
            if other is not None and other != uuid:
                for p in self._env.serving_partitions(other) & set(held):
                    serving[p] = serving.get(p, 0) + 1
        short = [p for p in held if serving.get(p, 0) < wanted + 1]
        if short:
            raise Conflict(f"partitions {short} of {store} would not keep {wanted + 1} copies that serve now "
                           f"(an active and {wanted} standbys): query actor {uuid} stays (try again once they "
                           "serve)", actor=uuid)  # fmt: skip
        # Saved as leaving before the table changes: a registry restarted from here destroys it rather than
        # take it back as a copy (its command said its data was deleted).
        self._dropping.add(uuid)
        try:
            self._save_members(strict=True)
        except RiqrError:
            self._dropping.discard(uuid)
            raise
        self._leaving[uuid] = self._clock() + MOVE_LEAVE_GRACE
        epoch = self.state.remove_actor(table.without_standby(uuid), uuid)
        after = self.state.view().table(info.store)
        assert after is not None
        standbys = self._store_standbys(after)
        log.info("query actor %s of %s leaves with its standby copies of partitions %s (epoch %d); the store has "
                 "%d standby copies of each partition; it is destroyed in %.0fs", uuid, info.store, held, epoch,
                 standbys, MOVE_LEAVE_GRACE, extra={"store": info.store, "actor": uuid})  # fmt: skip
        return {"epoch": self.state.epoch, "standbys": standbys, "partitions": held}

    def _settle_copy(self, new: str) -> int:
        """Standby copy ``new`` stays for good: no longer one being added (``abandon_move`` keeps it), the
        store's ``standbys`` as its table now has it, and every actor of the store told that its copies have
        peers (``QueryVerticle.peers_joined``: those created without standbys did not catch up from peers
        by themselves). Returns the store's standbys."""
        self._moving.pop(new, None)
        self._copying.pop(new, None)
        view = self.state.view()
        info = view.actors.get(new)
        table = None if info is None else view.table(info.store)
        return 0 if table is None else self._store_standbys(table)

    def _store_standbys(self, table: OwnershipTable) -> int:
        """``table``'s store says the standbys its table has (the fewest of any partition), and each actor of
        it is told whether its copies have peers (``_tell_peers``)."""
        standbys = table.fewest_standbys()
        if table.spec.standbys != standbys:
            self.state.replace_table(replace(table, spec=replace(table.spec, standbys=standbys)))
        for uuid in table.all_owners():
            self._tell_peers(table, uuid)
        return standbys

    def _tell_peers(self, table: OwnershipTable, uuid: str) -> None:
        """Tell query actor ``uuid`` whether a partition of it has another copy in ``table`` (``peers_joined``:
        a copy that cannot serve catches up from them) or none does (``peers_left``: it waits for the rebuild
        path, as in a store created without standbys). Not waited for: an actor on a node that went away
        would hold the registry's calls (the sink's epoch check among them); one that misses it is told
        again when it restarts (``actor_moved``)."""
        moving = {new for new in self._moving if new not in self._copying}  # a move's new actor is no peer
        held = table.all_owners().get(uuid, [])
        peers = any(
            other not in (None, uuid) and other not in moving
            for p in held
            for other in (table.partitions[p].active, *table.partitions[p].standbys)
        )
        self._env.query_actor_tell(uuid, "peers_joined" if peers else "peers_left")

    def abandon_move(self, old: str, new: str) -> dict[str, Any]:
        """Give a move up (its mover timed out or was stopped): ``new`` leaves the table and is destroyed
        with its data, and ``old`` takes batches again; ``{"outcome": "given-up", "epoch"}``. Nothing is
        undone when the switch was made already (``"switched"``: a mover that gave up while its switch
        call was under way), or when ``new`` answers for a partition (a restarted registry dealt it one)
        or serves one that no other copy serves now (its source lost meanwhile), or is no move this
        registry has under way (a standby copy kept already, whose driver's answer was lost; or one admitted
        before the registry restarted, which keeps no moves: in doubt, no copy is destroyed): then it stays,
        a copy like any other (``"kept"``). ``"none"``: no such move."""
        starting = self._starting.get(new)
        if starting is not None and starting[0] == old:  # not in a table yet: it holds nothing
            del self._starting[new]
            self._copying.pop(new, None)
            # Killed, not destroyed: a destroy call would wait behind its constructor (the registry's calls,
            # the sink's among them, with it). What it wrote is left to its node's sweeper (no table has it).
            self._env.kill([new])
            log.warning("gave up moving query actor %s: its new actor %s, not admitted yet, is stopped", old, new,
                        extra={"actor": old})  # fmt: skip
            return {"outcome": "given-up", "epoch": self.state.epoch, "why": None}
        view = self.state.view()
        joined = view.actors.get(new)
        table = None if joined is None else view.table(joined.store)
        under_way = self._moving.pop(new, None) == old
        self._copying.pop(new, None)
        if joined is None or table is None or new not in table.all_owners():
            return {"outcome": "none", "epoch": self.state.epoch}
        fields = {"store": joined.store, "actor": new}
        if old not in table.all_owners():
            log.info("the move of query actor %s to %s was made already: nothing to give up", old, new, extra=fields)
            return {"outcome": "switched", "epoch": self.state.epoch}
        if not under_way:
            why: str | None = (
                "no move of it is under way here: kept as a standby copy already, or admitted before the registry "
                "restarted"
            )
        elif any(o.active == new for o in table.partitions):
            why = "it answers for partitions"
        else:
            why = self._only_serving_copy(table, new)
        if why is not None:
            log.warning("gave up moving query actor %s of %s: its new actor %s stays, a copy like any other (%s)",
                        old, joined.store, new, why, extra=fields)  # fmt: skip
            outcome = "kept"
        else:
            self._dropping.add(new)
            self.state.remove_actor(table.without_standby(new), new)
            log.warning("gave up moving query actor %s of %s: its new actor %s is destroyed", old, joined.store,
                        new, extra=fields)  # fmt: skip
            outcome, why = "given-up", None
        if old in view.actors:
            try:
                self._env.query_actor_call(old, "unseal")
            except RiqrError as err:
                log.warning("could not unseal query actor %s: %s", old, err.message, extra={"actor": old})
        self._finish_drops()
        return {"outcome": outcome, "epoch": self.state.epoch, "why": why}

    def _only_serving_copy(self, table: OwnershipTable, uuid: str) -> str | None:
        """Why ``uuid`` must stay rather than be destroyed (None: every partition it serves, another copy
        in ``table`` is known to serve now). Each copy is asked for its positions with a call's full timeout
        (a give-up is rare); a copy that does not answer counts as serving nothing, and ``uuid`` not
        answering keeps it: in doubt, no copy is destroyed."""

        def serving(actor: str) -> set[int] | None:
            try:
                positions = self._env.query_actor_call(actor, "positions")
            except RiqrError:
                return None
            return {int(p) for p, pos in positions.items() if pos.get("state") == "serving"}

        mine = serving(uuid)
        if mine is None:
            return "it did not say which partitions it serves"
        others: set[int] = set()
        for other in table.all_owners():
            if other != uuid:
                others |= serving(other) or set()
        alone = sorted(p for p in table.all_owners().get(uuid, ()) if p in mine and p not in others)
        return f"no other copy is known to serve partitions {alone}" if alone else None

    def forget_records(self) -> None:
        """The runtime is going away (``riqr down``, after its stores' data): delete the saved members and
        the ingest records, and the registry's and the namespace's directories on this node if that
        empties them. Nothing is saved from now on."""
        self._members_off, self._members_saved = True, None
        try:
            self._env.forget_membership()
        except Exception:
            log.warning("could not delete the saved members", exc_info=True)
        path, self._ingest_path = self._ingest_path, None
        if path is None:
            return
        try:
            delete_book(path)
        except OSError:
            log.warning("could not delete the ingest records at %s", path, exc_info=True)
            return
        prune_empty_dirs(path.parent, path.parent.parent)

    def report_feeds(self, reports: Sequence[FeedReport]) -> dict[str, str]:
        """A topology process says how ingest of the stores it feeds goes: a batch, a failure, a stop, or
        its heartbeat (``runtime.feeds``). Reports for stores that are not registered are ignored, and so
        are those about a store dropped and declared again since its feeder declared it
        (``FeedBook.report``). Returns the stores another feed holds now, or that hold another checkpoint's
        batches while this feeder holds no claim on them (``FeedBook.unclaimed``), each with why: their live
        reports are refused, and the feeder stops feeding them (``topologies.feeder``)."""
        now, known = self._clock(), self.state.view().tables
        significant, refused = False, {}
        for report in reports:
            table = known.get(report.store)
            owners = table.lineage() if table is not None else frozenset()
            if table is None or self.feeds.about_an_older_store(report, owners):
                continue
            why = self.feeds.unclaimed(report, now) if report.live else None
            if why is not None:
                if report.store not in refused:
                    log.warning("store %s: refusing the feed of %s: %s", report.store, report.feeder, why,
                                extra={"store": report.store})  # fmt: skip
                refused[report.store] = why
                continue
            significant = self.feeds.report(report, now, owners) or significant
        self._save_feeds(now=significant)
        return refused

    def claim_feed(
        self, report: FeedReport, displace: str | None = None, take_over: bool = False
    ) -> dict[str, Any] | None:
        """A topology is about to start feeding ``report.store`` (``topologies.sink.materialize``, before it
        touches its checkpoint or the store's copies): it takes the store's feed (None), or is told why
        not: ``{"why", "feeder", "same_checkpoint", "final"}``. Either another feed holds it (``final``
        false): the run that holds it and whether that run feeds from the claimant's own checkpoint, which
        the claimant may ``displace`` once it saw that run's process gone (``FeedBook.refusal``). Or the
        store holds what another checkpoint fed it, or the claimant's checkpoint is empty where the store's
        was not, and the claim is no ``take_over`` (``final``: waiting changes nothing;
        ``FeedBook.replacing``). The claim is the registry's one call, so of two topologies starting at
        once on one store, one takes it. A store that is not registered (dropped meanwhile) is
        ``StoreNotFound``."""
        return self.claim_feeds([(report, displace, take_over)])[0]

    def claim_feeds(self, claims: list[tuple[FeedReport, str | None, bool]]) -> list[dict[str, Any] | None]:
        """``claim_feed`` for each ``(report, displace, take_over)`` of one topology's start, all or none:
        every store's feed is taken (a list of None), or none is and each refused claim's entry says why
        (as ``claim_feed``'s answer; None for the claims that alone would be granted). A topology refused
        on one of its stores then holds none of the others either: a claim it let go again would leave
        the store's feed record naming a run that never fed it."""
        now, view = self._clock(), self.state.view()
        tables = []
        for report, _, _ in claims:
            table = view.table(report.store)
            if table is None:
                raise StoreNotFound(f"store {report.store!r} is not known", store=report.store)
            tables.append(table)
        whys = [self.feeds.why_not(report, now, displace, take_over) for report, displace, take_over in claims]
        if any(why is not None for why in whys):
            return [
                None if why is None else self._refused(report, why, now) for (report, _, _), why in zip(claims, whys)
            ]
        for (report, displace, take_over), table in zip(claims, tables):
            replacing, contents = self.feeds.replacing(report, now), self.feeds.contents(report.store)
            held = self.feeds.holder(report.store)
            again = held is not None and held.live and held.feeder == report.feeder  # its own feed, claimed again
            why = self.feeds.claim(report, now, table.lineage(), displace, take_over)
            assert why is None, why  # checked above, in this one call
            if replacing is not None:
                emptied = contents == report.checkpoint
                old = "that checkpoint before it was emptied" if emptied else f"checkpoint {contents}"
                log.warning("store %s: taken over on purpose by %s from checkpoint %s: its first batch replaces "
                            "what %s fed the store", report.store, report.feeder, report.checkpoint, old,
                            extra={"store": report.store})  # fmt: skip
            elif not again:
                log.info("store %s: fed by %s (%s)", report.store, report.feeder, report.checkpoint,
                         extra={"store": report.store})  # fmt: skip
        self._save_feeds(now=True)
        return [None] * len(claims)

    def _refused(self, report: FeedReport, why: str, now: float) -> dict[str, Any]:
        """``claim_feed``'s answer to a refused claim: the reason, the run the store's record names, whether
        that run feeds from the claimant's checkpoint, and whether the refusal is final."""
        holder = self.feeds.holder(report.store)
        assert holder is not None  # refused: a feed holds it, or fed it
        return {"why": why, "feeder": holder.feeder, "same_checkpoint": holder.checkpoint == report.checkpoint,
                "final": why == self.feeds.replacing(report, now)}  # fmt: skip

    def status(self) -> dict[str, Any]:
        """What is not routing: each store's ingest state, with the registry's verdict on its liveness."""
        return {"ingest": self.feeds.status(self._clock())}

    def register_endpoint(self, node_id: str, host: str, port: int) -> int:
        return self.state.register_endpoint(Endpoint(node_id, host, port))

    def unregister_endpoint(self, node_id: str) -> int:
        return self.state.unregister_endpoint(node_id)

    def actor_moved(self, uuid: str, node_id: str, node_ip: str) -> int:
        """A query actor restarted (by Ray, or created again here) tells where it runs, and is told whether
        its copies have peers (``_tell_peers``): Ray restarts an actor with its first arguments, and its
        store may have been given standbys since, or had them removed (``riqr standbys``)."""
        epoch = self.state.actor_moved(uuid, node_id, node_ip)
        view = self.state.view()
        info = view.actors.get(uuid)
        table = None if info is None else view.table(info.store)
        if table is not None:
            self._tell_peers(table, uuid)
        return epoch

    def add_reader(self, reader: ReaderCopy) -> int:
        """An HTTP verticle publishes a read replica of a store (``runtime.readreplica``); the sink feeds it
        from its next batch on. Returns the epoch."""
        epoch = self.state.add_reader(reader)
        log.info("read replica %s of %s in %s", reader.uuid, reader.store, reader.actor,
                 extra={"store": reader.store, "actor": reader.uuid})  # fmt: skip
        return epoch

    def drop_reader(self, uuid: str, reason: str) -> int:
        """Unpublish a read replica: the sink could not deliver a batch to it (its verticle then serves
        through the query actors and makes a new one), or its verticle is stopping. Returns the epoch."""
        reader = self.state.view().readers.get(uuid)
        if self.state.drop_reader(uuid) and reader is not None:
            log.warning("read replica %s of %s dropped: %s", uuid, reader.store, reason,
                        extra={"store": reader.store, "actor": uuid})  # fmt: skip
        return self.state.epoch

    def suspect(self, uuid: str) -> None:
        """A facade could not reach query actor ``uuid``: check the actors now rather than at the next
        tick (at most once per ``SUSPECT_CHECK_GAP``: a burst of failed requests costs one check)."""
        if self._clock() - self._actors_checked_at >= SUSPECT_CHECK_GAP:
            log.info("a facade could not reach query actor %s; checking now", uuid, extra={"actor": uuid})
            self.check_actors()

    def check_actors(self) -> dict[str, list[int]]:
        """Promote a standby wherever an active copy's actor is not alive; give partitions back to the
        actives promotions replaced once their copies serve again. Returns store -> partitions whose active
        changed.

        A promotion needs no knowledge of positions: every copy applies every batch before Spark commits
        it, a copy that is catching up refuses to answer, and facades refuse a copy older than what they
        served, so the active is only the copy asked first. Giving back restores the placement's spread of
        reads over actors; it waits until that copy says it serves the partition.
        """
        self._actors_checked_at = self._clock()
        view = self.state.view()
        if not view.actors or self._retired:
            return {}
        down = self._env.unavailable_actors(sorted(view.actors))
        self._down_seen = down
        if len(down) == len(view.actors):  # Ray could not say, or nothing is up: moving helps nobody
            return {}
        changed: dict[str, list[int]] = {}
        serving: dict[str, set[int]] = {}
        for name, table in view.tables.items():
            new = table.promote(down)
            for p, (before, after) in enumerate(zip(table.partitions, new.partitions)):
                if before.active != after.active and before.active is not None:
                    self._first_active.setdefault((name, p), before.active)
                    log.warning("query actor %s is down: %s now answers for partition %d of %s", before.active,
                                after.active, p, name, extra={"store": name, "actor": before.active})  # fmt: skip
            new = self._give_back(name, new, down, serving)
            if new != table:
                self.state.replace_table(new)
                changed[name] = [p for p, (a, b) in enumerate(zip(table.partitions, new.partitions)) if a != b]
        return changed

    def _give_back(
        self, store: str, table: OwnershipTable, down: set[str], serving: dict[str, set[int]]
    ) -> OwnershipTable:
        for (name, p), first in list(self._first_active.items()):
            if name != store:
                continue
            owners = table.partitions[p]
            if owners.active == first or first not in owners.standbys:
                del self._first_active[(name, p)]  # already back, or no longer a holder
                continue
            if first in down:
                continue
            if first not in serving:
                serving[first] = self._env.serving_partitions(first)
            if p in serving[first]:
                table = table.with_active(p, first)
                del self._first_active[(name, p)]
                log.info("query actor %s serves partition %d of %s again and answers for it", first, p, store,
                         extra={"store": store, "actor": first})  # fmt: skip
        return table

    def retire(self) -> None:
        """The runtime is going down (``riqr down``, before it kills anything): from now on no check
        re-creates a query actor or promotes a standby. Calls are taken one at a time, so a re-creation
        under way has finished when this returns."""
        self._retired = True
        # Starts of joined nodes' verticles under way are forgotten: a `riqr up` after a `down` that
        # stopped partway starts them afresh, with its own settings, not ones asked before the down.
        self._nodes_starting.clear()
        self._save_members()  # a registry restarted while `down` runs stays retired
        log.info("the runtime is going down: query actors are no longer re-created")

    def resume(self) -> None:
        """``riqr up``: undo a ``retire`` whose ``riqr down`` did not finish (the registry kept running)."""
        if self._members_off:  # a `down` got as far as deleting the records: keep them again
            self._members_off = False
            self._ingest_path = self._ingest_file()
            self._save_feeds()
        if self._retired:
            self._retired = False
            log.warning("a riqr down did not finish; the registry re-creates actors and promotes standbys again")
        self._save_members()

    def follow_nodes(self) -> None:
        """``riqr up`` for every node: from now on each node that joins gets a facade and an HTTP verticle
        too, started by the checks with the settings the running HTTP verticles serve with (saved with the
        members: a restarted registry goes on; ``riqr down`` ends it)."""
        if not self._follow:
            log.info("nodes that join will get a facade and a REST API")
        self._follow = True
        self._save_members()

    def _serve_joined_nodes(self, alive: Sequence[str]) -> None:
        """Start a facade and an HTTP verticle on each live node that has none, with the settings of the
        running ones; never waits (the checks run among the registry's other calls): one check begins a
        node's start, later ones follow it. A node whose start failed (its port taken) is tried again
        after a wait that doubles up to ``RECREATE_BACKOFF_MAX``. Only nodes never seen with them: a
        verticle stopped for good on a node that had one is not started again."""
        now, live = self._clock(), set(alive)
        self._served_nodes &= live
        self._node_failures = {n: f for n, f in self._node_failures.items() if n in live}
        for node in [n for n in self._nodes_starting if n not in live]:
            del self._nodes_starting[node]
        for node, (starting, began) in list(self._nodes_starting.items()):
            try:
                outcome = self._env.verticles_started(starting, give_up=now - began > FOLLOW_START_SECONDS)
            except Exception as err:  # this node's attempt failed; the other nodes go on
                outcome = False, f"{type(err).__name__}: {err}"
            if outcome is None:
                continue
            del self._nodes_starting[node]
            served, said = outcome
            if served:
                self._served_nodes.add(node)
                self._node_failures.pop(node, None)
                log.info("node %s joined: its REST API serves at %s", node, said)
                continue
            failed = self._node_failures[node] = _Failures.after(self._node_failures.get(node), FOLLOW_RETRY, now)
            log.warning("could not start the REST API on node %s, which joined (attempt %d): %s; next try in "
                        "%.0fs", node, failed.attempts, said, failed.next_try - now)  # fmt: skip
        waiting = {n for n, f in self._node_failures.items() if now < f.next_try}
        new = [n for n in alive if n not in self._served_nodes and n not in self._nodes_starting and n not in waiting]
        if not new or now < self._follow_after:
            return
        have = self._env.nodes_with_verticles()
        if have is None:
            return
        # Verticles found by name count only on nodes never tried: one of a failed attempt was stopped,
        # and its name may linger a moment after.
        self._served_nodes |= (have & live) - set(self._node_failures)
        for node in [n for n in new if n not in self._served_nodes]:
            starting = self._env.start_verticles(node, self._secrets.cursor_key, have)
            if starting is None:  # no REST API runs to take the settings from: look again in a while
                if not self._follow_idle:
                    log.warning("no running REST API says its settings (none runs, or they are of an earlier "
                                "riqr): nodes that join get none until one does; riqr up starts them")  # fmt: skip
                self._follow_after, self._follow_idle = now + FOLLOW_RETRY, True
                return
            self._follow_idle = False
            log.info("node %s joined: starting its facade and REST API", node)
            self._nodes_starting[node] = starting, now

    def check_nodes(self) -> list[str]:
        """Re-create the query actors of nodes Ray reports dead on live nodes, and those gone for good on
        live nodes (``_recreate_gone``); returns their uuids.

        Each of a dead node goes to the node ``replacement_node`` picks (no other copy of its partitions
        there while another node is left), keeps its uuid, so tables and handles by name stay valid, and its
        move bumps the epoch so facades learn where it runs. The standbys of a dead node's actors are
        promoted before anything is created, and its actors are created together, started side by side
        (``replace_query_actors``), not one after another. HTTP endpoints of dead nodes are unlisted.
        Nothing happens while every node is alive, and an actor already moved is not moved again; one that
        could not be re-created is tried again at the next check. Nodes that joined get their verticles
        (``_serve_joined_nodes``) when the registry follows them. A move's new actor not admitted within
        ``MOVE_START_SECONDS`` (its mover died) is given up. Last, it destroys the actors of drops
        not finished (a drop saved before a restart, or whose destroy failed: ``_finish_drops``), unless Ray
        could not list the nodes.
        """
        if self._members_failing:
            self._save_members()  # a save that failed is made at the next check
        for joining, (old, asked) in list(self._starting.items()):
            if self._clock() - asked > MOVE_START_SECONDS:  # its mover is gone (killed): nobody admits it
                log.warning("the move of query actor %s to %s was not admitted within %.0fs: given up", old,
                            joining, MOVE_START_SECONDS, extra={"actor": old})  # fmt: skip
                self.abandon_move(old, joining)
        if self._retired:
            self._finish_drops()
            return []
        alive = sorted(self._env.alive_nodes())
        if not alive:  # Ray could not say: never move everything on a blip
            self._gone.clear()  # nor count this check as one that saw an actor gone
            return []
        for node_id in [n for n in self.state.view().endpoints if n not in alive]:
            self.state.unregister_endpoint(node_id)
        if self._follow:
            try:
                self._serve_joined_nodes(alive)
            except Exception:
                log.warning("starting the verticles of nodes that joined failed; trying again at the next check",
                            exc_info=True)  # fmt: skip
        moved: list[str] = []
        lost = sorted(u for u, info in self.state.view().actors.items() if info.node_id not in alive)
        if lost:
            # Standbys take over first: re-creating the lost actors takes seconds, and this call holds the
            # registry (a facade's ``suspect`` waits behind it) until they run.
            try:
                self.check_actors()
            except Exception:
                log.warning("promoting the standbys of a lost node's actors failed", exc_info=True)
        view = self.state.view()
        placed = dict(view.actors)  # the placements chosen so far count in the next ones
        asks: list[tuple[StoreSpec, str, Sequence[int], str]] = []
        for uuid in lost:
            info = view.actors[uuid]
            table = view.table(info.store)
            node = None if table is None else replacement_node(table, placed, uuid, alive)
            if table is None or node is None:
                continue
            placed[uuid] = replace(info, node_id=node)
            log.warning("node %s is gone: re-creating query actor %s of %s on node %s", info.node_id, uuid,
                        info.store, node, extra={"store": info.store, "actor": uuid})  # fmt: skip
            asks.append((table.spec, uuid, info.partitions, node))
        for (spec, uuid, _, _), new in zip(asks, self._env.replace_query_actors(asks) if asks else [], strict=True):
            if isinstance(new, Exception):
                log.error("could not re-create query actor %s; trying again at the next check", uuid, exc_info=new,
                          extra={"store": spec.name, "actor": uuid})  # fmt: skip
                continue
            self.state.actor_moved(uuid, new.node_id, new.node_ip)
            moved.append(uuid)
        try:
            moved.extend(self._recreate_gone(alive, lost))
        except Exception:
            self._gone.clear()
            log.warning("checking for query actors gone for good failed", exc_info=True)
        try:
            self.check_actors()
        except Exception:
            log.warning("checking the query actors failed", exc_info=True)
        try:
            self._restart_silent()
        except Exception:
            log.warning("pinging the query actors failed", exc_info=True)
        # Last: destroying the actors of a drop that was saved before a restart, or whose destroy failed,
        # may wait on actors that do not answer; re-creations and promotions come first.
        self._finish_drops()
        return moved

    def _restart_silent(self) -> list[str]:
        """Restart each query actor that Ray lists alive and that has left a ping unanswered for
        ``restart_silent_after`` seconds (``runtime.liveness``); returns their uuids. One restarting or
        being created is not silent: its pings start again once it runs."""
        after = self._restart_silent_after
        if after is None or self._retired:
            return []
        view = self.state.view()
        # One the last check found restarting or being created is not pinged (a ping would wait for its
        # constructor) and its pings are forgotten (``silences`` drops what it is not asked about).
        skipped = self._dropping | self._down_seen
        silences = self._pings.silences(sorted(u for u in view.actors if u not in skipped))
        over = sorted(u for u, seconds in silences.items() if seconds >= after)
        if not over:
            return []
        down = self._env.unavailable_actors(over)
        restarted: list[str] = []
        for uuid in over:
            self._pings.forget(uuid)
            if uuid in down:
                continue
            info = view.actors[uuid]
            log.warning("query actor %s of %s on node %s has answered no ping for %.0fs though Ray lists it alive "
                        "(its process stopped or hung): restarting it; it reopens its partitions from disk", uuid,
                        info.store, info.node_id, silences[uuid], extra={"actor": uuid})  # fmt: skip
            try:
                self._env.restart_actor(uuid)
            except Exception:
                log.warning("could not restart query actor %s; trying again after another %.0fs of silence", uuid,
                            after, exc_info=True, extra={"store": info.store, "actor": uuid})  # fmt: skip
                continue
            restarted.append(uuid)
        return restarted

    def _recreate_gone(self, alive: Sequence[str], lost: Sequence[str]) -> list[str]:
        """Create again, on its own node, each query actor of a live node that Ray holds no actor for and
        that every check has seen so, at least twice and for ``recreate_after`` seconds; returns their uuids.

        Ray restarts an actor that crashed (``max_restarts=-1``) and keeps its name meanwhile, so a missing
        name is an actor Ray will not bring back: killed without a restart, or whose constructor raised.
        Its data is on its node, so it goes back there and opens its partitions as a restarted actor does.
        One seen back, or a check that could not list (Ray's answer untrustworthy, no live node, an
        error), starts every count over. A failed attempt waits twice as long as the one before it (up to
        ``RECREATE_BACKOFF_MAX``), counted across the actor showing up in between, and forgotten once an
        attempt succeeds: an actor whose constructor keeps failing costs a registry call now and then, not
        a loop.
        """
        after = self._recreate_after
        view = self.state.view()
        candidates = sorted(u for u, info in view.actors.items() if info.node_id in alive and u not in lost)
        if after is None or not candidates:
            self._gone.clear()
            return []
        # None: Ray could not say. Every count starts again rather than act on that.
        gone = self._env.vanished_actors(candidates) or set()
        self._gone = {u: g for u, g in self._gone.items() if u in gone}
        self._failures = {u: f for u, f in self._failures.items() if u in view.actors}
        now = self._clock()
        created: list[str] = []
        asks: list[tuple[StoreSpec, str, Sequence[int], str]] = []
        for uuid in sorted(gone):
            seen = self._gone.setdefault(uuid, _Gone(since=now))
            seen.sightings += 1
            failures = self._failures.get(uuid)
            if seen.sightings < 2 or now - seen.since < after or (failures is not None and now < failures.next_try):
                continue
            info = view.actors[uuid]
            table = view.table(info.store)
            if table is None:
                continue
            log.warning("query actor %s of %s has been gone for %.1fs: creating it again on node %s", uuid, info.store,
                        now - seen.since, info.node_id, extra={"store": info.store, "actor": uuid})  # fmt: skip
            asks.append((table.spec, uuid, info.partitions, info.node_id))
        for (spec, uuid, _, _), new in zip(asks, self._env.replace_query_actors(asks) if asks else [], strict=True):
            if isinstance(new, Exception):
                # The first wait is twice the time gone that started the attempt (at least 2 s).
                failed_at = self._clock()  # after the attempt, which took a while
                failed = self._failures[uuid] = _Failures.after(
                    self._failures.get(uuid), 2 * max(after, 1.0), failed_at
                )
                log.error("could not create query actor %s again (attempt %d); next try in %.0fs", uuid,
                          failed.attempts, failed.next_try - failed_at, exc_info=new,
                          extra={"store": spec.name, "actor": uuid})  # fmt: skip
                continue
            del self._gone[uuid]
            self._failures.pop(uuid, None)
            self.state.actor_moved(uuid, new.node_id, new.node_ip)
            created.append(uuid)
        return created
