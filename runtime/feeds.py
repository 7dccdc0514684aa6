"""Ingest liveness: what the registry knows about the topology processes that feed each store.

A topology process (a *feeder*) tells the registry how ingest of each store it feeds goes: at start, after
every batch, when a batch or a query fails, when it stops, and every ``FEED_HEARTBEAT_INTERVAL`` seconds
in between (``topologies.feeder``). Every report is the feed's whole current state, so the heartbeat
alone brings a restarted registry up to date. A feeder that is SIGKILLed, or whose node is lost, says
nothing more: the registry calls a feed it has not heard from for ``FEED_STALE_AFTER`` seconds
``stale``, by its own clock (no clock skew between hosts), and ``/ready`` answers 503 naming it.

``FeedBook`` is the registry's record, plain Python with the clock passed in, so the rules are unit-tested
with numbers. ``save_book`` / ``load_book`` keep it on disk (one small JSON file, replaced atomically) for
what a heartbeat cannot bring back after a registry restart: feeds that ended (stopped, failed) or died,
and dead-letter totals.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runtime.config import ACK_LOG_LENGTH, FEED_STALE_AFTER
from runtime.durable import make_directories, write_atomically

__all__ = [
    "RUNNING",
    "REBUILDING",
    "STOPPED",
    "FAILED",
    "STALE",
    "LIVE_STATES",
    "REPORTED_STATES",
    "UNREADY_STATES",
    "FeedReport",
    "FeedBook",
    "AckLog",
    "save_book",
    "delete_book",
    "load_book",
]

log = logging.getLogger(__name__)

RUNNING = "running"
# running, from a fresh checkpoint that re-emits the whole state (and while partitions reset by a new
# checkpoint's batch 0 wait for a batch with a watermark)
REBUILDING = "rebuilding"
STOPPED = "stopped"  # ended on purpose (SIGTERM, ray job stop, query.stop())
FAILED = "failed"  # a batch or a query failed; ``error`` says why
STALE = "stale"  # the registry's verdict: a live feed it has not heard from within the bound
LIVE_STATES = (RUNNING, REBUILDING)
REPORTED_STATES = (RUNNING, REBUILDING, STOPPED, FAILED)
# The ingest states that make /ready answer 503: the store was being fed and stopped without meaning to.
UNREADY_STATES = (FAILED, STALE)
_FORMAT = 1


@dataclass(frozen=True)
class FeedReport:
    """How one feeder's ingest into ``store`` goes, whole (not a delta).

    ``feeder`` names one run of one process (host, pid and a random part), so the registry can tell a
    new run from the old one's last words. ``at`` is the feeder's wall clock when the state last changed
    or a batch was delivered (heartbeats do not move it). ``dead_letters`` are totals per topic;
    ``late_rows`` the input rows the store's query dropped as later than its event-time watermark, in all
    (``topologies.lateness``; None: not told, for a query with no watermark or an older feeder).
    ``dropped_rows`` the rows the sink could not store, by reason (``null-key``: a key column is null;
    ``time-out-of-range``: a timestamp key or window outside years 1 to 9999), counted since this
    feeder's run began (a counter that starts again with each run, as a restarted process's counters do).
    ``owners`` are the query actors of the store as the feeder declared it (``BatchDelivery.declared``):
    the registry ignores a report about a store of that name that was dropped and declared again since
    (``FeedBook.report``). Empty: not known (an older feeder), never ignored for it. ``checkpoint`` is the
    feed's lineage, its streaming query's checkpoint location: a run started again on it (after a kill,
    or rebuilding in place) is the same feed, one from another checkpoint is another (``FeedBook.refusal``).
    ``delivered`` is the checkpoint of the last batch this run delivered to every copy (None: none yet):
    what the store's contents come from (``FeedBook.replacing``); a start, a heartbeat, a claim do not set it.
    """

    store: str
    feeder: str
    state: str
    query: str | None = None
    at: float | None = None
    batch_id: int | None = None
    source: str | None = None
    rows: int | None = None
    plan: str | None = None
    incomplete: tuple[int, ...] = ()
    catching_up: tuple[int, ...] = ()
    error: str | None = None
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    late_rows: int | None = None
    dropped_rows: Mapping[str, int] = field(default_factory=dict)
    owners: tuple[str, ...] = ()
    checkpoint: str | None = None
    delivered: str | None = None

    def __post_init__(self) -> None:
        if self.state not in REPORTED_STATES:
            raise ValueError(f"ingest state {self.state!r} is not one of {', '.join(REPORTED_STATES)}")

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def to_json(self) -> dict[str, Any]:
        """The JSON form (catalog, the registry's file); fields without a value are left out."""
        out: dict[str, Any] = {"state": self.state, "feeder": self.feeder}
        for name in ("query", "checkpoint", "at", "batch_id", "source", "rows", "plan", "error", "delivered"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.incomplete:
            out["incomplete"] = list(self.incomplete)
        if self.catching_up:
            out["catching_up"] = list(self.catching_up)
        if self.dead_letters:
            out["dead_letters"] = dict(self.dead_letters)
        if self.late_rows is not None:
            out["late_rows"] = self.late_rows
        if self.dropped_rows:
            out["dropped_rows"] = dict(self.dropped_rows)
        if self.owners:
            out["owners"] = list(self.owners)
        return out

    @classmethod
    def from_json(cls, store: str, data: Mapping[str, Any]) -> FeedReport:
        return cls(
            store=store,
            feeder=str(data["feeder"]),
            state=str(data["state"]),
            query=data.get("query"),
            checkpoint=data.get("checkpoint"),
            at=data.get("at"),
            batch_id=data.get("batch_id"),
            source=data.get("source"),
            rows=data.get("rows"),
            plan=data.get("plan"),
            incomplete=tuple(int(p) for p in data.get("incomplete", ())),
            catching_up=tuple(int(p) for p in data.get("catching_up", ())),
            error=data.get("error"),
            dead_letters={str(t): int(n) for t, n in (data.get("dead_letters") or {}).items()},
            late_rows=None if data.get("late_rows") is None else int(data["late_rows"]),
            dropped_rows={str(r): int(n) for r, n in (data.get("dropped_rows") or {}).items()},
            owners=tuple(str(u) for u in data.get("owners", ())),
            delivered=data.get("delivered"),
        )


# What changing makes a report worth saving at once; batch progress is saved at the registry's pace.
_SIGNIFICANT = ("feeder", "state", "query", "plan", "error", "dead_letters", "dropped_rows")


class AckLog:
    """When the registry heard of each of a store's newest acknowledged batches, by its own clock.

    The sink reports a batch right after every holder acknowledged it (``topologies.delivery``), so the
    time the registry hears of batch ``b`` is its acknowledgement time plus one report's latency. Only
    the last ``length`` batches of the current source are kept: ``lag_seconds`` (``runtime.lag``) needs
    the time of the first batch a lagging copy lacks, and a copy further behind than that is reported
    behind by at least the oldest kept time. Not saved with the book: after a registry restart the times
    start again with the next batch.
    """

    def __init__(self, length: int = ACK_LOG_LENGTH) -> None:
        self._length = length
        self.source: str | None = None
        self._acks: deque[tuple[int, float]] = deque(maxlen=length)

    def record(self, source: str | None, batch_id: int, now: float) -> None:
        """Batch ``batch_id`` of ``source`` was acknowledged (heard at ``now``); repeats are ignored, and a
        new source, or a batch id going back (a replay after a restart), starts the log over."""
        if source != self.source or (self._acks and batch_id < self._acks[-1][0]):
            self.source = source
            self._acks.clear()
        if self._acks and self._acks[-1][0] == batch_id:
            return
        self._acks.append((batch_id, now))

    def ages(self, now: float) -> list[list[float]]:
        """``[batch_id, seconds since it was acknowledged]`` of every kept batch, oldest first (the form the
        registry's status carries: ages, not times, so no other host's clock is involved)."""
        return [[b, max(0.0, now - at)] for b, at in self._acks]


@dataclass(frozen=True)
class _Feed:
    report: FeedReport
    heard_at: float  # the registry's clock
    # The lineage (checkpoint) whose batches the store holds: that of the last batch delivered
    # (``FeedReport.delivered``). A claim, a start or a heartbeat keeps it, so a take-over that never
    # delivered leaves it as it was.
    contents: str | None = None
    # The checkpoint a take-over was granted to, until a batch is delivered: the store is its by the
    # operator's word, so it comes back without the flag as the checkpoint of the contents does.
    taken: str | None = None
    # When the run holding the record last claimed the store (its own clock, ``FeedReport.at`` of the
    # claim): a last word of that run made before it was re-sent late, and does not end the feed.
    claimed_at: float | None = None


class FeedBook:
    """Every store's feed as the registry last heard it, and the verdict on each (``status``)."""

    def __init__(self, stale_after: float = FEED_STALE_AFTER) -> None:
        self.stale_after = stale_after
        self._feeds: dict[str, _Feed] = {}
        self._acks: dict[str, AckLog] = {}
        # store -> the source (Spark's query id) its feed named in its last batch check: only that source's
        # batch 0 may reset the store's partitions (``Registry.reset_refused``). Saved, so a registry that
        # restarts still refuses a displaced topology's late batch 0.
        self._sources: dict[str, str] = {}
        self.dirty = False  # changed since the last save

    def __contains__(self, store: object) -> bool:
        return store in self._feeds

    def report(self, report: FeedReport, now: float, owners: Collection[str] = ()) -> bool:
        """Record ``report``, heard at ``now``; returns whether it changed something worth saving at once.

        The last words of a run that is no longer the store's feeder (a ``stopped`` or ``failed`` from an
        old run, arriving after a new run started feeding) are ignored; a live report from any run takes
        the store over. Dead-letter totals are per topic: a report that does not mention a topic keeps
        its last total, and one without ``late_rows`` keeps the last one heard.

        ``owners`` are the store's query actors now. A report whose own ``owners`` are none of them is
        about another store of that name, dropped since (``riqr drop --force``) and declared again: its
        feeder's heartbeats and last words, until it sees so and ends, are ignored rather than taking
        over, or failing, the record of what feeds the store now. A store's actors keep their uuids for
        its life, and a new store gets new ones (``topologies.delivery.BatchDelivery.table``).
        """
        if self.about_an_older_store(report, owners):
            return False
        current = self._feeds.get(report.store)
        if current is not None and current.report.feeder != report.feeder and not report.live:
            log.info("store %s: ignoring %s from %s, which no longer feeds it", report.store, report.state,
                     report.feeder, extra={"store": report.store})  # fmt: skip
            return False
        if current is not None and _older_last_word(report, current):
            log.info("store %s: ignoring a %s of %s made before its claim since", report.store, report.state,
                     report.feeder, extra={"store": report.store})  # fmt: skip
            return False
        if current is not None:
            late = current.report.late_rows if report.late_rows is None else report.late_rows
            # Dropped rows are this run's: a new run's first reports (none dropped yet) start them again.
            same_run = current.report.feeder == report.feeder
            dropped = {**current.report.dropped_rows, **report.dropped_rows} if same_run else report.dropped_rows
            report = replace(
                report,
                dead_letters={**current.report.dead_letters, **report.dead_letters},
                late_rows=late,
                dropped_rows=dropped,
            )
        if report.batch_id is not None and report.live:
            self._acks.setdefault(report.store, AckLog()).record(report.source, report.batch_id, now)
        contents = None if current is None else current.contents
        taken = None if current is None else current.taken
        if report.live and report.delivered is not None:
            contents, taken = report.delivered, None  # a delivered batch: the store is that checkpoint's alone
        claimed_at = current.claimed_at if current is not None and current.report.feeder == report.feeder else None
        self._feeds[report.store] = _Feed(report, now, contents, taken, claimed_at)
        self.dirty = True
        if current is None or (contents, taken) != (current.contents, current.taken):  # whose it is: saved now
            return True
        return any(getattr(current.report, f) != getattr(report, f) for f in _SIGNIFICANT)

    @staticmethod
    def about_an_older_store(report: FeedReport, owners: Collection[str]) -> bool:
        """Whether ``report`` is about a store of its name that was dropped and declared again since its
        feeder declared it (none of ``report.owners`` among the store's ``owners`` now); logged if so."""
        if not (report.owners and owners and set(owners).isdisjoint(report.owners)):
            return False
        log.info("store %s: ignoring %s from %s, which fed a store of that name that was dropped since",
                 report.store, report.state, report.feeder, extra={"store": report.store})  # fmt: skip
        return True

    def refusal(self, report: FeedReport, now: float, displace: str | None = None) -> str | None:
        """Why ``report``'s feeder may not feed its store, or None if it may: one store, one feed.

        Another feed holds the store while its last report is a live one from another run, heard within
        the bound; a feed that stopped, failed or fell silent has let the store go. Two topologies feeding
        one store from two checkpoints would each take the other's batches for gaps and rebuild the store
        over the other's, so it would be dark (503) most of the time they both ran; two runs on one
        checkpoint would also fight over its offsets. A run on the holder's checkpoint may ``displace``
        the holder (its run id) once it has seen that run's process is gone (``topologies.sink.claim_feed``:
        a topology SIGKILLed and started again on its home takes its store back at once, not when the
        registry calls the old run stale).
        """
        feed = self._feeds.get(report.store)
        if feed is None or not feed.report.live or feed.report.feeder == report.feeder:
            return None
        current = feed.report
        same = current.checkpoint is not None and current.checkpoint == report.checkpoint
        if same and displace == current.feeder:
            return None
        silent = now - feed.heard_at
        if silent > self.stale_after:
            return None
        where = "from this same checkpoint" if same else f"from checkpoint {current.checkpoint}"
        return (
            f"store {report.store!r} is fed by another topology: {current.query or current.feeder} "
            f"(run {current.feeder} {where}), {current.state}, heard from {silent:.1f}s ago; one store has one feed: "
            "stop that topology first (ray job stop, Ctrl-C)"
        )

    def replacing(self, report: FeedReport, now: float, *, claim: bool = True) -> str | None:
        """Why ``report``'s feeder would replace what its store holds by starting, or None if it would not:
        a store's contents belong to the checkpoint that fed them, and only a take-over on purpose gives
        them to another (``claim``'s ``take_over``).

        The store holds batches of checkpoint A (``_Feed.contents``), and the claimant's checkpoint is
        another one, B: B's query computes its own state, and its first batch replaces A's (for a source
        that is not read again from its start, such as Kafka from the latest offsets, with the records
        from now on only). Or the claimant's checkpoint is A's location but empty (``plan == "fresh"``):
        the checkpoint was deleted since, or this is another host's disk with the same path. The run that
        holds the store's live feed from that checkpoint already took it; a store nothing has delivered a
        batch to, or one fed from its claimant's own checkpoint as it stands, is not replaced, nor the store
        a take-over was granted to the claimant's checkpoint and no batch has been delivered since (both
        checkpoints may come back without the flag then: the operator's word and the store's data). One
        process is one feeder, so a query of that run on another checkpoint is held to the rule like any other.
        Not a ``claim`` (a report of a feeder that holds no claim, ``unclaimed``): only another checkpoint
        counts, not an empty one.
        """
        feed = self._feeds.get(report.store)
        if feed is None or feed.contents is None or report.checkpoint is None:
            return None
        if feed.report.live and feed.report.feeder == report.feeder and feed.report.checkpoint == report.checkpoint:
            return None  # this run's own feed (a rebuild in place, materialize's claim after materialize_all's)
        if feed.taken is not None and feed.taken == report.checkpoint:
            return None  # taken over on purpose by this checkpoint, which has not delivered yet
        another = feed.contents != report.checkpoint
        if not another and not (claim and report.plan == "fresh"):
            return None  # its own checkpoint, as it stands (a restart on its home): the usual case
        state, _ = self.verdict(report.store, now) or (feed.report.state, None)
        ago = now - feed.heard_at
        who = feed.report.query or feed.report.feeder
        whence = "" if feed.report.checkpoint == feed.contents else f" from checkpoint {feed.report.checkpoint}"
        last = f"its feed last: {who} (run {feed.report.feeder}{whence}), {state}, heard from {ago:.0f}s ago"
        choices = (
            "start the topology where that checkpoint is, drop the store first (riqr drop), or take it over on "
            "purpose (riqr run ... --take-over; take_over=True for materialize)"
        )
        if another:
            return (
                f"store {report.store!r} holds what checkpoint {feed.contents} fed it ({last}); this topology's "
                f"checkpoint {report.checkpoint} is another, and its first batch would replace the store's "
                f"contents with what it computes: {choices}"
            )
        return (
            f"store {report.store!r} holds batches of checkpoint {feed.contents} ({last}), which is empty "
            "here (deleted since, or another host's disk under the same path): this topology's first batch "
            f"would replace the store's contents with what it computes from an empty checkpoint: {choices}"
        )

    def unclaimed(self, report: FeedReport, now: float) -> str | None:
        """Why a live report of ``report.feeder`` may not feed its store, or None if it may: another live
        feed holds the store (``refusal``), or, from a feeder that is not the one the record names (it holds
        no claim: it lost the store while silent, and another feed took it), the store holds another
        checkpoint's batches (``replacing``). Such a feeder takes the store back only by a claim: were its
        reports let through after the other feed stopped, its next batch would be a gap for the partitions
        and its rebuild in place would replace what the other fed, with no take-over asked for."""
        why = self.refusal(report, now)
        if why is not None:
            return why
        feed = self._feeds.get(report.store)
        if feed is None or feed.report.feeder == report.feeder:
            return None
        return self.replacing(report, now, claim=False)

    def contents(self, store: str) -> str | None:
        """The checkpoint whose batches ``store`` holds, if known."""
        feed = self._feeds.get(store)
        return None if feed is None else feed.contents

    def holder(self, store: str) -> FeedReport | None:
        """The last report recorded for ``store``'s feed, if any."""
        feed = self._feeds.get(store)
        return None if feed is None else feed.report

    def claim(
        self,
        report: FeedReport,
        now: float,
        owners: Collection[str] = (),
        displace: str | None = None,
        take_over: bool = False,
    ) -> str | None:
        """``report``'s feeder takes its store's feed, unless ``why_not`` says why not: that reason is
        returned and nothing changes. Taken, ``report`` is recorded as the store's feed; a feeder whose own
        live record it is only counts as heard (its reports keep the record's batch and partitions)."""
        replacing = self.replacing(report, now)
        why = self.refusal(report, now, displace) or (None if take_over else replacing)
        if why is not None:
            return why
        current = self._feeds.get(report.store)
        if current is not None and current.report.feeder == report.feeder and current.report.live:
            self._feeds[report.store] = replace(current, heard_at=now)
        else:
            self.report(report, now, owners)
        # A last word of this run made before the claim, and sent after it (held while the registry
        # restarted), must not end the feed the claim started.
        self._feeds[report.store] = replace(self._feeds[report.store], claimed_at=report.at)
        if replacing is not None:  # taken over on purpose: the store is this checkpoint's by the operator's word
            self._feeds[report.store] = replace(self._feeds[report.store], taken=report.checkpoint)
            self.dirty = True
        return None

    def why_not(
        self, report: FeedReport, now: float, displace: str | None = None, take_over: bool = False
    ) -> str | None:
        """Why ``claim`` would refuse ``report`` (another live feed holds the store: ``refusal``; or its
        contents are another checkpoint's and this is no ``take_over``: ``replacing``), changing nothing."""
        return self.refusal(report, now, displace) or (None if take_over else self.replacing(report, now))

    def live_feeder(self, store: str) -> str | None:
        """Who feeds ``store`` if its last report is a live one (running or rebuilding), silent or not: a
        stale feeder may be hung or cut off from the registry rather than dead. None otherwise."""
        feed = self._feeds.get(store)
        if feed is None or not feed.report.live:
            return None
        return feed.report.query or feed.report.feeder

    def forget(self, store: str) -> bool:
        """Drop a store's record (the store was dropped); whether there was one."""
        self._acks.pop(store, None)
        had_source = self._sources.pop(store, None) is not None  # declared again, it starts from any source
        if self._feeds.pop(store, None) is None and not had_source:
            return False
        self.dirty = True
        return True

    def keep_only(self, stores: Collection[str]) -> None:
        """Drop the records of stores not in ``stores`` (after a rebuild: stores that are gone)."""
        for store in [s for s in {*self._feeds, *self._sources} if s not in stores]:
            self.forget(store)

    def feeding_source(self, store: str) -> str | None:
        """The source ``store``'s feed named in its last batch check, if any did."""
        return self._sources.get(store)

    def name_source(self, store: str, source: str) -> bool:
        """``store`` is fed from ``source`` now; whether that changed it (then worth saving at once: a
        topology starts, or rebuilds, once)."""
        if self._sources.get(store) == source:
            return False
        self._sources[store] = source
        self.dirty = True
        return True

    def verdict(self, store: str, now: float) -> tuple[str, str | None] | None:
        """``(state, reason)`` of ``store``'s feed at ``now``, or None if nothing ever fed it."""
        feed = self._feeds.get(store)
        if feed is None:
            return None
        report = feed.report
        silent = now - feed.heard_at
        if report.live and silent > self.stale_after:
            who = report.query or report.feeder
            return STALE, (
                f"no heartbeat from {who} for {silent:.0f}s (bound {self.stale_after:g}s): "
                "its topology process died, hangs or cannot reach the registry"
            )
        return report.state, report.error

    def status(self, now: float) -> dict[str, dict[str, Any]]:
        """Every store's feed as JSON: the last report, ``heard_at``, and the verdict as ``state`` (a
        live feed gone silent is ``stale``, with ``reason`` and the ``reported`` state), plus ``acked``:
        ``[batch_id, age in seconds]`` of its newest acknowledged batches (``AckLog``), when known, and
        ``contents``: the checkpoint whose batches the store holds (``replacing``), when known."""
        out: dict[str, dict[str, Any]] = {}
        for store, feed in self._feeds.items():
            entry = {**feed.report.to_json(), "heard_at": feed.heard_at}
            entry.pop("delivered", None)  # the feeder's side of ``contents``, which says it for the store
            if feed.contents is not None:
                entry["contents"] = feed.contents
            acks = self._acks.get(store)
            if acks is not None and acks.source == feed.report.source:
                entry["acked"] = acks.ages(now)
            state, reason = self.verdict(store, now) or (feed.report.state, None)
            if state != feed.report.state:
                entry.update(state=state, reported=feed.report.state, reason=reason)
            out[store] = entry
        return out

    def to_json(self) -> dict[str, Any]:
        feeds: dict[str, Any] = {}
        for store, feed in self._feeds.items():
            # contents null when not known: a record without the key was saved before contents were kept
            feeds[store] = {"report": feed.report.to_json(), "heard_at": feed.heard_at, "contents": feed.contents}
            if feed.taken is not None:
                feeds[store]["taken"] = feed.taken
        return {"format": _FORMAT, "feeds": feeds, "sources": dict(self._sources)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], now: float, stale_after: float = FEED_STALE_AFTER) -> FeedBook:
        """A book restored at ``now``: every feed counts as heard at ``now``, since a registry that was
        down could not hear heartbeats; a feeder that is alive beats within an interval, one that died
        while the registry was down turns stale one bound later."""
        if data.get("format") != _FORMAT:
            raise ValueError(f"unknown ingest record format {data.get('format')!r}")
        book = cls(stale_after)
        for store, feed in data.get("feeds", {}).items():
            report = FeedReport.from_json(store, feed["report"])
            # Saved before contents were: the record's own checkpoint, if it had delivered a batch (a failed
            # record saved then named the batch that failed; one saved since keeps the last delivered).
            delivered = report.batch_id is not None and report.state != FAILED
            contents = feed.get("contents", report.checkpoint if delivered else None)
            book._feeds[store] = _Feed(report, now, contents, feed.get("taken"))
        # Missing from records saved before sources were: no source named, so any batch 0 resets (as before).
        book._sources = {str(k): str(v) for k, v in (data.get("sources") or {}).items()}
        return book


def _older_last_word(report: FeedReport, current: _Feed) -> bool:
    """Whether ``report`` is a last word (``stopped``, ``failed``) of the run that holds a live record, made
    before that run last claimed the store: a feeder re-sends a last word until the registry takes it
    (``topologies.feeder``), and one made before the claim must not end the feed the claim started. Both
    times are that process's feeder clock; only the claim's time is compared, so a clock stepped back
    after it loses no last word made later but before the claim's time."""
    if report.live or not current.report.live or report.feeder != current.report.feeder:
        return False
    return report.at is not None and current.claimed_at is not None and report.at < current.claimed_at


def save_book(book: FeedBook, path: Path) -> None:
    """Write ``book`` to ``path`` atomically (a temporary file beside it, fsynced, then renamed), so a
    registry killed at any instant (or a machine losing power) leaves the old file or the new one."""
    make_directories(path.parent)
    # Its temporary file is _temporary(path), the one delete_book removes when a kill left it.
    write_atomically(path, json.dumps(book.to_json(), sort_keys=True).encode("utf-8"))
    book.dirty = False


def delete_book(path: Path) -> None:
    """Delete the book saved at ``path``, and the temporary file a save cut short by a kill left beside it
    (OSError if either cannot be deleted)."""
    path.unlink(missing_ok=True)
    _temporary(path).unlink(missing_ok=True)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def load_book(path: Path, now: float, stale_after: float = FEED_STALE_AFTER) -> FeedBook:
    """The book saved at ``path`` (restored at ``now``); an empty one if there is none or it is unreadable
    (logged: losing ingest records must not keep the registry from starting)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return FeedBook.from_json(data, now, stale_after)
    except FileNotFoundError:
        return FeedBook(stale_after)
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ingest records at %s are unreadable (%s); starting without them", path, err)
        return FeedBook(stale_after)
