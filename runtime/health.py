"""Readiness and the cluster's metrics, from one cheap, shared look at the cluster.

``/ready`` must answer whether every partition of every store has a copy that serves and whether every
store's ingest runs (the registry judges a feed's liveness by its heartbeats: ``runtime.feeds``). The
cached ``ClusterView`` says who owns what, but not whether an owner is alive or its copy complete: only
the query actor knows. So a ``ClusterProbe`` takes a ``ClusterSnapshot``: the cached view (no registry
call), the registry's ingest status (one call) and each query actor's ``stats()`` (one call per actor,
in parallel, each with a short deadline, ``PROBE_DEADLINE``). Snapshots are reused for ``PROBE_MAX_AGE``
seconds and concurrent callers share one in flight, so however often load balancers probe and Prometheus
scrapes, a node asks each actor at most about once a second.

``readiness`` and ``cluster_families`` are pure functions of a snapshot; unit tests feed them values.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric

from runtime.bus import Bus
from runtime.errors import RiqrError
from runtime.feeds import UNREADY_STATES
from runtime.metrics import BY_NAME, CLUSTER_METRICS, QUERY_METRICS, MetricDef
from runtime.ownership import ClusterView
from runtime.partition import SERVING

__all__ = [
    "ClusterSnapshot",
    "ClusterProbe",
    "Readiness",
    "readiness",
    "cluster_families",
    "PROBE_MAX_AGE",
    "PROBE_DEADLINE",
]

# How long a snapshot is reused, and how long each actor has to answer for one.
PROBE_MAX_AGE = 1.0
PROBE_DEADLINE = 1.0

# An actor's stats: {"partitions": {p: {"source", "batch_id", "state"[, "reason"]}}, "samples": [...]},
# or the reason it gave none.
ActorStats = dict[str, Any]


@dataclass(frozen=True)
class ClusterSnapshot:
    """The cluster as one node saw it at ``taken_at`` (monotonic seconds)."""

    view: ClusterView
    ingest: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    stats: Mapping[str, ActorStats] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)  # actor uuid -> why it gave no stats
    registry_error: str | None = None
    taken_at: float = 0.0
    # The query actors' samples for /metrics (``Totals``): None, each actor's own from ``stats``.
    totals: Mapping[str, ActorStats] | None = None

    def partition_of(self, uuid: str, partition: int) -> dict[str, Any]:
        """What ``uuid`` said about its copy of ``partition`` (``unavailable`` if it did not answer)."""
        if uuid in self.failures:
            return {"state": "unavailable", "reason": self.failures[uuid]}
        known = self.stats.get(uuid, {}).get("partitions", {})
        return dict(known.get(partition, {"state": "unknown", "reason": "the actor does not report it"}))


_CUMULATIVE = ("_total", "_bucket", "_sum", "_count")
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class Totals:
    """Each query actor's cumulative samples (counters, histogram series) as this node exposes them: they
    never go back. An actor that misses a look (slower than the deadline) keeps its last samples rather
    than dropping out of the sums, and one that restarted from zero continues from its last values: either
    had made the sums fall, which ``rate()`` reads as a reset and shows as a spike of the whole total."""

    def __init__(self) -> None:
        self._raw: dict[str, dict[SampleKey, float]] = {}  # the actor's own last values
        self._offset: dict[str, dict[SampleKey, float]] = {}  # added for its restarts
        self._shown: dict[str, list[tuple[str, Any, float]]] = {}  # what was exposed for it last
        self._incarnation: dict[str, Any] = {}  # its core's, as its stats say (a restart makes a new one)

    def look(self, stats: Mapping[str, ActorStats], failed: Iterable[str], alive: Iterable[str]) -> dict[str, Any]:
        """``stats`` with each answering actor's cumulative samples carried over its restarts, plus
        ``{uuid: {"samples": ...}}`` for each actor of ``failed`` seen before; forgets actors not in
        ``alive`` (the view's)."""
        out: dict[str, Any] = {}
        for uuid, answer in stats.items():
            raw = self._raw.setdefault(uuid, {})
            offset = self._offset.setdefault(uuid, {})
            samples = [
                (name, labels, float(value), (name, tuple(sorted(dict(labels).items()))))
                for name, labels, value in answer.get("samples", ())
            ]
            # Restarted (a new incarnation; or, from a core that does not say, any total fell): every
            # series starts from zero again, so every one goes on from its last value (a histogram's
            # buckets stay in order), even one that has climbed back past it since.
            incarnation = answer.get("incarnation")
            known = self._incarnation.get(uuid)
            fell = any(name.endswith(_CUMULATIVE) and value < raw.get(key, 0.0) for name, _, value, key in samples)
            if raw and ((incarnation is not None and known is not None and incarnation != known) or fell):
                for key, last in raw.items():
                    offset[key] = offset.get(key, 0.0) + last
                raw.clear()
            self._incarnation[uuid] = incarnation
            shown = []
            for name, labels, value, key in samples:
                if name.endswith(_CUMULATIVE):
                    raw[key] = value
                    value += offset.get(key, 0.0)
                shown.append((name, labels, value))
            # A restarted core records a series again only when it next moves (a partition's next batch):
            # until then it goes on at what it had reached.
            answered = {key for _, _, _, key in samples}
            shown += [(key[0], key[1], total) for key, total in offset.items() if key not in answered]
            self._shown[uuid] = shown
            out[uuid] = {**answer, "samples": shown}
        for uuid in failed:
            if uuid in self._shown:
                out[uuid] = {"samples": self._shown[uuid]}
        keep = set(alive)
        for table in (self._raw, self._offset, self._shown, self._incarnation):
            for uuid in [u for u in table if u not in keep]:
                del table[uuid]
        return out


class ClusterProbe:
    """Takes ``ClusterSnapshot``s, at most one per ``max_age`` seconds, one at a time."""

    def __init__(
        self,
        bus: Bus,
        view: Callable[[], ClusterView],
        *,
        max_age: float = PROBE_MAX_AGE,
        deadline: float = PROBE_DEADLINE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._view = view
        self.max_age = max_age
        self.deadline = deadline
        self._clock = clock
        self._last: ClusterSnapshot | None = None
        self._pending: asyncio.Task[ClusterSnapshot] | None = None
        self._totals = Totals()
        self.taken = 0  # snapshots taken (tests read it)

    async def snapshot(self) -> ClusterSnapshot:
        """A snapshot no older than ``max_age``; callers arriving while one is taken share it."""
        last = self._last
        if last is not None and self._clock() - last.taken_at < self.max_age:
            return last
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_task(self._take(), name="riqr-cluster-probe")
        # Shielded: one caller going away (a probe that timed out) does not cancel the others' snapshot.
        return await asyncio.shield(self._pending)

    async def _bounded(self, awaitable: Any) -> Any:
        async with asyncio.timeout(self.deadline):
            return await awaitable

    async def _take(self) -> ClusterSnapshot:
        view = self._view()
        uuids = sorted(view.actors)
        answers = await asyncio.gather(
            self._bounded(self._bus.fetch_status()),
            *(self._bounded(self._bus.owner(u).stats()) for u in uuids),
            return_exceptions=True,
        )
        status, per_actor = answers[0], answers[1:]
        stats: dict[str, ActorStats] = {}
        failures: dict[str, str] = {}
        for uuid, answer in zip(uuids, per_actor):
            if isinstance(answer, BaseException):
                failures[uuid] = _reason(answer, self.deadline)
            else:
                stats[uuid] = answer
        registry_error = None
        ingest: dict[str, Any] = {}
        if isinstance(status, BaseException):
            registry_error = _reason(status, self.deadline)
        else:
            ingest = dict(status.get("ingest", {}))
        self.taken += 1
        totals = self._totals.look(stats, failures, uuids)
        snapshot = ClusterSnapshot(view, ingest, stats, failures, registry_error, self._clock(), totals)
        self._last = snapshot
        return snapshot


def _reason(err: BaseException, deadline: float) -> str:
    if isinstance(err, RiqrError):
        return err.message
    if isinstance(err, TimeoutError):
        return f"it did not answer within {deadline:g}s"
    return f"{type(err).__name__}: {err}"


@dataclass(frozen=True)
class Readiness:
    """The verdict of ``/ready``: ready, or what is missing (one entry per partition or store)."""

    ready: bool
    missing: tuple[dict[str, Any], ...] = ()
    stores: int = 0
    partitions: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ready" if self.ready else "not-ready", "stores": self.stores,
                               "partitions": self.partitions}  # fmt: skip
        if not self.ready:
            out["missing"] = list(self.missing)
        return out


# ``/ready`` needs no token, so it says why in fixed words: the copies' own reasons and a failed feed's
# error (exception text that may quote paths, keys or values) are for ``GET /stores`` and ``riqr status``.
_SEE_STATUS = "GET /metadata with a token, or riqr status, says why"
_PARTITION_REASONS = {
    "unavailable": "its actor is dead or did not answer in time",
    "unassigned": "no actor holds it",
    "loading": "its copy has no batch yet",
    "incomplete": "its copy missed batches or lost its data; it is being rebuilt",
    "catching-up": "its copy is catching up from a peer",
    "rebuilding": "it is rebuilt from its input and waits for a batch with a watermark",
    "lost": "its copy's data is lost; it is being rebuilt",
}
_FEED_FAILED = "its topology's query failed; GET /stores with a token, or riqr status, says why"


def readiness(snapshot: ClusterSnapshot) -> Readiness:
    """Ready when every partition of every store has a serving copy (active or standby) and no store's
    feed failed or went silent (``runtime.feeds.UNREADY_STATES``: ``failed``, ``stale``).

    A store that nothing ever fed, or whose feed stopped on purpose, is ready: its partitions serve what
    they hold, and a store is created a moment before its query starts, so counting "no feeder yet" as
    unready would flap readiness on every topology start. A registry that cannot be asked now does not
    make a node that saw the cluster before unready either: its partitions still serve."""
    view = snapshot.view
    missing: list[dict[str, Any]] = []
    if view.epoch == 0 and snapshot.registry_error is not None:
        # Never saw the cluster: an empty view here means "unknown", not "no stores".
        missing.append({"registry": "unreachable", "reason": "the registry did not answer"})
    partitions = 0
    for spec in view.stores():
        table = view.tables[spec.name]
        for p, owners in enumerate(table.partitions):
            partitions += 1
            holders = ((owners.active,) if owners.active else ()) + owners.standbys
            copies = [snapshot.partition_of(u, p) for u in holders]
            if any(c.get("state") == SERVING for c in copies):
                continue
            state = (copies[0] if copies else {"state": "unassigned"}).get("state", "unknown")
            reason = _PARTITION_REASONS.get(state, _SEE_STATUS)
            missing.append({"store": spec.name, "partition": p, "state": state, "reason": reason})
        ingest = snapshot.ingest.get(spec.name) or {}
        if ingest.get("state") in UNREADY_STATES:
            # A stale feed's reason is the registry's own words (the query's name, the silence); a failed
            # one's is its error's text, which may quote paths or data: only a token's holder sees it.
            said = ingest.get("reason") if ingest["state"] == "stale" else None
            missing.append({"store": spec.name, "ingest": ingest["state"], "reason": said or _FEED_FAILED})
    return Readiness(not missing, tuple(missing), len(view.tables), partitions)


def _family(d: MetricDef) -> Metric:
    return Metric(d.base, d.help, d.kind)


def _role(view: ClusterView, store: str, partition: int, uuid: str) -> str:
    table = view.tables.get(store)
    if table is None or not 0 <= partition < len(table.partitions):
        return "none"
    return "active" if table.partitions[partition].active == uuid else "standby"


def _query_families(snapshot: ClusterSnapshot) -> list[Metric]:
    """The query actors' own metrics, summed over actors; per-partition ones get a ``role`` label."""
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for uuid, stats in (snapshot.stats if snapshot.totals is None else snapshot.totals).items():
        for name, labels, value in stats.get("samples", ()):
            labels = dict(labels)
            if "partition" in labels:
                labels["role"] = _role(snapshot.view, labels.get("store", ""), int(labels["partition"]), uuid)
            key = (name, tuple(sorted(labels.items())))
            sums[key] = sums.get(key, 0.0) + float(value)
    families = []
    for d in QUERY_METRICS:
        family = _family(d)
        prefix = d.base
        for (name, labels), value in sorted(sums.items(), key=_exposition_order):
            if name == prefix or (name.startswith(prefix + "_") and name[len(prefix) + 1 :] in _SUFFIXES):
                family.add_sample(name, dict(labels), value)
        families.append(family)
    return families


_SUFFIXES = ("total", "bucket", "sum", "count")


def _exposition_order(item: tuple[tuple[str, tuple[tuple[str, str], ...]], float]) -> tuple[Any, ...]:
    """Samples by name and labels, a histogram's buckets by increasing ``le`` (as a number: ``+Inf``
    last, ``2.5`` before ``10.0``), as the text format asks; sorting the text put ``+Inf`` first."""
    (name, labels), _ = item
    le = dict(labels).get("le")
    return name, tuple(pair for pair in labels if pair[0] != "le"), float(le) if le is not None else 0.0


def cluster_families(snapshot: ClusterSnapshot, verdict: Readiness | None = None) -> list[Metric]:
    """The metric families ``/metrics`` adds to the node's own: partitions, ingest, dead letters,
    readiness, and the query actors' apply metrics summed over actors."""
    verdict = verdict or readiness(snapshot)
    view = snapshot.view
    fam = {d.name: _family(d) for d in CLUSTER_METRICS}
    for spec in view.stores():
        name = spec.name
        table = view.tables[name]
        ingest = snapshot.ingest.get(name) or {}
        delivered = ingest.get("batch_id")
        unavailable = 0
        for p, owners in enumerate(table.partitions):
            labels = {"store": name, "partition": str(p)}
            counts: dict[tuple[str, str], int] = {}
            serving = False
            for role, uuid in [("active", owners.active)] + [("standby", u) for u in owners.standbys]:
                if uuid is None:
                    continue
                state = str(snapshot.partition_of(uuid, p).get("state", "unknown"))
                serving = serving or state == SERVING
                counts[(role, state)] = counts.get((role, state), 0) + 1
            for (role, state), n in sorted(counts.items()):
                fam["riqr_partition_replicas"].add_sample(
                    "riqr_partition_replicas", {**labels, "role": role, "state": state}, n
                )
            unavailable += 0 if serving else 1
            active = snapshot.partition_of(owners.active, p) if owners.active else {}
            if isinstance(active.get("batch_id"), int):
                fam["riqr_partition_position"].add_sample("riqr_partition_position", labels, active["batch_id"])
                if isinstance(delivered, int):
                    lag = max(0, delivered - active["batch_id"])
                    fam["riqr_partition_lag_batches"].add_sample("riqr_partition_lag_batches", labels, lag)
        fam["riqr_partitions_unavailable"].add_sample("riqr_partitions_unavailable", {"store": name}, unavailable)
        if ingest.get("state"):
            fam["riqr_ingest_state"].add_sample("riqr_ingest_state", {"store": name, "state": str(ingest["state"])}, 1)
        if isinstance(ingest.get("at"), (int, float)):
            fam["riqr_ingest_last_report_timestamp_seconds"].add_sample(
                "riqr_ingest_last_report_timestamp_seconds", {"store": name}, float(ingest["at"])
            )
        for topic, count in sorted((ingest.get("dead_letters") or {}).items()):
            fam["riqr_dead_letters_total"].add_sample(
                "riqr_dead_letters_total", {"store": name, "topic": str(topic)}, float(count)
            )
        if isinstance(ingest.get("late_rows"), int):
            fam["riqr_late_rows_dropped_total"].add_sample(
                "riqr_late_rows_dropped_total", {"store": name}, float(ingest["late_rows"])
            )
        for reason, count in sorted((ingest.get("dropped_rows") or {}).items()):
            fam["riqr_rows_dropped_total"].add_sample(
                "riqr_rows_dropped_total", {"store": name, "reason": str(reason)}, float(count)
            )
    fam["riqr_ready"].add_sample("riqr_ready", {}, 1.0 if verdict.ready else 0.0)
    assert set(fam) <= set(BY_NAME)
    return [*fam.values(), *_query_families(snapshot)]
