"""riqr's metrics: one catalog of every metric, a per-process recorder, and the mirror into Ray's metrics.

Every metric riqr exports is declared once in ``CATALOG`` (name, type, labels, meaning, where it is
recorded). docs/operations.md's table lists the same names, and a test holds the two together.

A process records into its own ``Metrics`` (a private ``prometheus_client`` registry, so unit tests and
several cores in one process do not share counters). Recording is a dictionary lookup of the labelled
child plus ``prometheus_client``'s increment (a short lock, never held across an await): about a
microsecond, two for a histogram. What is recorded on every REST request goes through ``Metrics.record``
instead: an append to a list, folded into the registry (a call per series, not per record) at the next
collect or every ``FOLD_EVERY`` records (docs/design.md, "Where a GET's time goes").

The HTTP verticle serves its process's metrics at ``GET /metrics``; ``Mirror`` copies every process's
metrics into Ray's metrics system (``ray.util.metrics``, done by ``verticles.metrics``) from a background
thread every few seconds, so Ray's per-record cost (a few microseconds) stays off the request path:
counters as increments since the last copy, gauges as their value, histograms as their cumulative bucket
counts, sum and count (``HistogramState``), a few calls per flush however many requests came.

Labels are bounded: routes are patterns, never paths; stores, partitions, topics and states are few; no
key, value, token or actor id is ever a label.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector

__all__ = [
    "MetricDef",
    "CATALOG",
    "BY_NAME",
    "HTTP_METRICS",
    "QUERY_METRICS",
    "CLUSTER_METRICS",
    "Metrics",
    "Sample",
    "Mirror",
    "HistogramState",
    "MirrorTarget",
    "exposition",
    "CONTENT_TYPE",
    "FOLD_EVERY",
]

# Series named ``*_created`` double the output and no dashboard of ours reads them.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Where a metric is recorded (docs/operations.md, "Metrics", says what each means for the operator).
HTTP = "http"  # the HTTP verticle's process: at its /metrics and in Ray
QUERY = "query"  # each query actor's process: in Ray, and summed over actors at every /metrics
CLUSTER = "cluster"  # computed by the HTTP verticle from its cluster probe at scrape time: /metrics only

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
APPLY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
# ``Metrics.record`` folds its pending records into the registry at least this often (bounds their memory).
FOLD_EVERY = 1024


@dataclass(frozen=True)
class MetricDef:
    """One metric: its exposed name (with ``_total`` for counters), type, help text, labels, where it is
    recorded, and the bucket bounds of a histogram."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    help: str
    labels: tuple[str, ...] = ()
    where: str = HTTP
    buckets: tuple[float, ...] = ()

    @property
    def base(self) -> str:
        """The name without ``_total``: what ``prometheus_client`` and Ray take for a counter."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


CATALOG: tuple[MetricDef, ...] = (
    MetricDef("riqr_http_requests_total", "counter", "REST requests answered, by route pattern and status",
              ("route", "status")),
    MetricDef("riqr_http_request_duration_seconds", "histogram", "time to answer a REST request, by route pattern",
              ("route",), buckets=LATENCY_BUCKETS),
    MetricDef("riqr_coalesced_batch_size", "histogram", "keys per coalesced get_many call to a query actor",
              ("store",), buckets=BATCH_BUCKETS),
    MetricDef("riqr_local_reads_total", "counter", "key lookups answered from this HTTP node's read replica",
              ("store",)),
    MetricDef("riqr_scan_entries_total", "counter", "entries returned or streamed by scans, pages and streams",
              ("store",)),
    MetricDef("riqr_reclaimed_bytes_total", "counter",
              "bytes of partitions of query actors that no longer exist deleted from this node's disk"),
    MetricDef("riqr_batches_applied_total", "counter", "batches applied to a partition copy (not replays)",
              ("store", "partition", "role"), QUERY),
    MetricDef("riqr_rows_applied_total", "counter", "rows (upserts and deletes) applied to a partition copy",
              ("store", "partition", "role"), QUERY),
    MetricDef("riqr_batches_ingested_from_copy_total", "counter",
              "batches a partition copy took as the SST file another copy of it wrote",
              ("store", "partition", "role"), QUERY),
    MetricDef("riqr_apply_duration_seconds", "histogram", "time a query actor takes to apply one batch",
              ("store",), QUERY, APPLY_BUCKETS),
    MetricDef("riqr_partition_position", "gauge", "last batch id applied by the active copy (-1: none yet)",
              ("store", "partition"), CLUSTER),
    MetricDef("riqr_partition_lag_batches", "gauge", "batches the sink delivered that the active copy does not show",
              ("store", "partition"), CLUSTER),
    MetricDef("riqr_partition_replicas", "gauge", "copies of a partition, by role and state",
              ("store", "partition", "role", "state"), CLUSTER),
    MetricDef("riqr_partitions_unavailable", "gauge", "partitions of a store with no serving copy",
              ("store",), CLUSTER),
    MetricDef("riqr_ingest_state", "gauge", "1 for the state of the store's feed (running, rebuilding, stopped, "
              "failed, or stale: no heartbeat)", ("store", "state"), CLUSTER),
    MetricDef("riqr_ingest_last_report_timestamp_seconds", "gauge",
              "when the store's feeder last delivered a batch or changed state (Unix time)", ("store",), CLUSTER),
    MetricDef("riqr_dead_letters_total", "counter", "records of a topic dead-lettered by a store's topology",
              ("store", "topic"), CLUSTER),
    MetricDef("riqr_late_rows_dropped_total", "counter", "input rows a store's query dropped as later than its "
              "event-time watermark (Spark's numRowsDroppedByWatermark; kept in its checkpoint)", ("store",), CLUSTER),
    MetricDef("riqr_rows_dropped_total", "counter", "rows a store's sink could not store, by reason (null-key, "
              "time-out-of-range), since its topology's run began", ("store", "reason"), CLUSTER),
    MetricDef("riqr_ready", "gauge", "1 when GET /ready on this node answers 200", (), CLUSTER),
)  # fmt: skip

BY_NAME = {d.name: d for d in CATALOG}
HTTP_METRICS = tuple(d for d in CATALOG if d.where == HTTP)
# A query actor records these without the ``role`` label (it does not know its role; the HTTP verticle
# adds it from the ownership table when it sums them).
QUERY_METRICS = tuple(d for d in CATALOG if d.where == QUERY)
CLUSTER_METRICS = tuple(d for d in CATALOG if d.where == CLUSTER)


@dataclass(frozen=True)
class Sample:
    """One exposed sample: full name (``_total``, ``_bucket``...), labels, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _recorded_labels(d: MetricDef) -> tuple[str, ...]:
    return tuple(label for label in d.labels if not (d.where == QUERY and label == "role"))


class _Fold(Collector):
    """Registered first, so every collect of the registry folds ``Metrics.record``'s pending records in
    before any family is read: readers never see a record missing that was made before they asked."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        self._metrics.fold()
        return iter(())


class Metrics:
    """The metrics one process records, in a registry of its own."""

    def __init__(self, defs: Iterable[MetricDef] = HTTP_METRICS) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.defs = {d.name: d for d in defs}
        # ``record``'s pending records: appended without a lock (one C call under the GIL), taken out and
        # folded under ``_folding`` from whichever thread collects.
        self._pending: list[tuple[str, tuple[str, ...], float]] = []
        self._folding = threading.Lock()
        self.registry.register(_Fold(self))
        self._families: dict[str, Any] = {}
        for d in self.defs.values():
            labels = _recorded_labels(d)
            if d.kind == "counter":
                family: Any = Counter(d.base, d.help, labels, registry=self.registry)
            elif d.kind == "gauge":
                family = Gauge(d.base, d.help, labels, registry=self.registry)
            else:
                family = Histogram(d.base, d.help, labels, registry=self.registry, buckets=d.buckets)
            self._families[d.name] = family
        # The series ``retain_stores`` removed, until a ``Mirror`` takes them (``take_forgotten``); None while
        # no mirror copies this process's metrics, so that nothing is kept for nobody.
        self._forgotten: list[tuple[str, tuple[str, ...]]] | None = None
        # The position of the "store" label among each metric's recorded labels, for ``retain_stores``.
        self._store_label = {
            d.name: _recorded_labels(d).index("store") for d in self.defs.values() if "store" in _recorded_labels(d)
        }
        # (name, label values) -> prometheus_client child: its own ``labels()`` validates on every call.
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}

    def child(self, name: str, *labels: str) -> Any:
        """The series of ``name`` with these label values (in the catalog's order), created once."""
        key = (name, labels)
        found = self._children.get(key)
        if found is None:
            family = self._families[name]
            found = self._children[key] = family.labels(*labels) if labels else family
        return found

    def inc(self, name: str, *labels: str, amount: float = 1.0) -> None:
        self.child(name, *labels).inc(amount)

    def observe(self, name: str, value: float, *labels: str) -> None:
        self.child(name, *labels).observe(value)

    def set(self, name: str, value: float, *labels: str) -> None:
        self.child(name, *labels).set(value)

    def record(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to a counter, or observe it in a histogram, for the hot paths: no lock and no
        registry call now; the record is folded in at the next collect (or once ``FOLD_EVERY`` wait),
        so what any reader sees is the same as with ``inc``/``observe``."""
        pending = self._pending
        pending.append((name, labels, amount))
        if len(pending) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Move ``record``'s pending records into the registry: one increment per counter series and one
        per histogram bucket hit, however many records."""
        with self._folding:
            taken = len(self._pending)
            if not taken:
                return
            records = self._pending[:taken]
            del self._pending[:taken]  # records appended meanwhile stay, after the ones taken
            sums: dict[tuple[str, tuple[str, ...]], float] = {}
            observed: dict[tuple[str, tuple[str, ...]], list[float]] = {}
            for name, labels, amount in records:
                if self.defs[name].kind == "histogram":
                    observed.setdefault((name, labels), []).append(amount)
                else:
                    sums[(name, labels)] = sums.get((name, labels), 0.0) + amount
            for (name, labels), amount in sums.items():
                self.child(name, *labels).inc(amount)
            for (name, labels), values in observed.items():
                _observe_all(self.child(name, *labels), values)

    def retain_stores(self, stores: Collection[str]) -> None:
        """Forget every series labelled with a store not among ``stores`` (one dropped since): ``/metrics``
        shows a token allowed to read every store that exists no name of one it never could, and a
        deployment that makes and drops stores does not grow its series for ever."""
        self.fold()
        with self._folding:
            for name, labels in list(self._children):
                index = self._store_label.get(name)
                if index is not None and labels[index] not in stores:
                    self._families[name].remove(*labels)
                    del self._children[(name, labels)]
                    if self._forgotten is not None:
                        self._forgotten.append((name, labels))
        # A record of a dropped store made meanwhile is folded in later as a new series: forgotten at the
        # next call (a request can still be on its way to a store being dropped).

    def take_forgotten(self) -> list[tuple[str, tuple[str, ...]]]:
        """The series ``retain_stores`` removed since the last call, as ``(name, label values)``; from the
        first call on, a mirror takes them, so they are kept until the next."""
        with self._folding:
            taken, self._forgotten = self._forgotten or [], []
        return taken

    def samples(self) -> list[Sample]:
        """Every sample this process holds (what a query actor hands the HTTP verticles)."""
        return [
            Sample(s.name, tuple(sorted(s.labels.items())), float(s.value))
            for family in self.registry.collect()
            for s in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The current value of one sample (tests; ``name`` as exposed, e.g. ``..._total``, ``..._count``)."""
        got = self.registry.get_sample_value(name, labels)
        return 0.0 if got is None else float(got)


def _observe_all(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for every value, with one increment per bucket hit rather than per value.
    It reaches into ``prometheus_client``'s histogram child (its bounds, buckets and sum; pinned in
    constraints.txt); tests/unit/test_metrics.py holds the result to what ``observe`` gives."""
    bounds = histogram._upper_bounds  # noqa: SLF001 - ascending, +Inf last
    hits = [0] * len(bounds)
    for value in values:
        hits[bisect_left(bounds, value)] += 1  # the first bound >= value, as observe's ``value <= bound``
    for bucket, count in zip(histogram._buckets, hits):  # noqa: SLF001
        if count:
            bucket.inc(count)
    histogram._sum.inc(sum(values))  # noqa: SLF001


class _Families(Collector):
    def __init__(self, families: Sequence[Any]) -> None:
        self._families = families

    def collect(self) -> Iterator[Any]:
        yield from self._families


def exposition(metrics: Metrics, extra: Sequence[Any] = ()) -> bytes:
    """Prometheus text (version 0.0.4) of ``metrics`` followed by the ``extra`` metric families."""
    out = prometheus_client.generate_latest(metrics.registry)
    if extra:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(extra))
        out += prometheus_client.generate_latest(registry)
    return out


@dataclass(frozen=True)
class HistogramState:
    """One labelled series of a histogram as Prometheus exposes it: cumulative counts per upper bound
    (``+Inf`` last), the sum of the observations and their count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


class MirrorTarget(Protocol):
    """Where ``Mirror`` copies samples to (Ray's metrics, ``verticles.metrics``; a list in tests)."""

    def counter_inc(self, d: MetricDef, tags: dict[str, str], amount: float) -> None: ...

    def gauge_set(self, d: MetricDef, tags: dict[str, str], value: float) -> None: ...

    def histogram_set(self, d: MetricDef, tags: dict[str, str], value: HistogramState) -> None: ...


class Mirror:
    """Copies a ``Metrics`` into another metrics system, a difference at a time (``flush``).

    A histogram goes across as its cumulative state, not as observations: re-observing every sample in
    the target costs a call per request (in Ray about 20 us, a burst of seconds of one core every
    flush at a few thousand requests a second, which held the GIL from the requests), while its state
    is a call per bucket, whatever the rate."""

    def __init__(self, metrics: Metrics, target: MirrorTarget, *, constant_tags: dict[str, str] | None = None) -> None:
        self.metrics = metrics
        self.target = target
        self.constant_tags = dict(constant_tags or {})
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def _tags(self, labels: tuple[tuple[str, str], ...]) -> dict[str, str]:
        return {**self.constant_tags, **dict(labels)}

    def _delta(self, key: tuple[str, tuple[tuple[str, str], ...]], value: float) -> float:
        """What ``key`` gained since the last flush. A value below the last is a series begun again (a
        store dropped and made anew under its name, ``Metrics.retain_stores``): all of it is new."""
        last = self._last.get(key, 0.0)
        self._last[key] = value
        return value if value < last else value - last

    def flush(self) -> None:
        """Send what changed since the last flush."""
        for name, values in self.metrics.take_forgotten():  # begun again from 0 if they come back
            forgotten = self.metrics.defs[name]
            labels = tuple(sorted(zip(_recorded_labels(forgotten), values)))
            self._last.pop((forgotten.name, labels), None)
            self._last.pop((forgotten.name + "_count", labels), None)
        by_base = {d.base: d for d in self.metrics.defs.values()}
        for family in self.metrics.registry.collect():
            d = by_base.get(family.name)
            if d is None:
                continue
            if d.kind == "histogram":
                self._flush_histogram(d, family.samples)
                continue
            for s in family.samples:
                labels = tuple(sorted(s.labels.items()))
                if d.kind == "gauge":
                    self.target.gauge_set(d, self._tags(labels), float(s.value))
                elif s.name.endswith("_total"):
                    delta = self._delta((s.name, labels), float(s.value))
                    if delta > 0:
                        self.target.counter_inc(d, self._tags(labels), delta)

    def _flush_histogram(self, d: MetricDef, samples: Iterable[Any]) -> None:
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for s in samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            one = series.setdefault(labels, {"buckets": [], "sum": 0.0, "count": 0.0})
            if s.name.endswith("_bucket"):
                one["buckets"].append((float(s.labels["le"]), float(s.value)))
            elif s.name.endswith("_sum"):
                one["sum"] = float(s.value)
            elif s.name.endswith("_count"):
                one["count"] = float(s.value)
        for labels, one in series.items():
            if self._delta((d.name + "_count", labels), one["count"]) == 0:
                continue  # nothing observed since the last flush: the target holds this state already
            value = HistogramState(tuple(sorted(one["buckets"])), one["sum"], one["count"])
            self.target.histogram_set(d, self._tags(labels), value)
