"""Ray's side of riqr's metrics: a process's ``Metrics`` copied into ``ray.util.metrics`` every few seconds.

The copy runs in a daemon thread (``RayMetricsExporter``), so a request or an apply only pays for the
local increment (``runtime.metrics``). Ray exports them with its ``ray_`` prefix through each node's
metrics agent, where the Ray dashboard's Prometheus and Grafana find them (docs/operations.md).

A histogram goes into Ray as the three series Prometheus itself exposes for one, as gauges holding this
process's cumulative values: ``<name>_bucket`` (with the ``le`` tag), ``<name>_sum`` and ``<name>_count``.
PromQL's ``rate`` and ``histogram_quantile`` read them as they read a histogram's series (a restarted
process starts again from zero, which ``rate`` takes as a counter reset). Ray's own ``Histogram`` takes one
``observe`` call per observation (about 20 us each): re-observing every request every flush cost 8% of
the HTTP verticle's CPU at a few thousand requests a second and held the GIL for bursts of 0.1-0.4 s.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from runtime.metrics import HistogramState, MetricDef, Metrics, Mirror

__all__ = ["RayTarget", "RayMetricsExporter", "EXPORT_INTERVAL"]

log = logging.getLogger(__name__)

# How often a process copies its metrics into Ray (Ray's agent itself reports every few seconds).
EXPORT_INTERVAL = 5.0


class RayTarget:
    """``runtime.metrics.MirrorTarget`` over ``ray.util.metrics``: one Ray metric per riqr metric."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}

    def _metric(self, d: MetricDef, tags: dict[str, str], series: str = "") -> Any:
        name = d.base + series
        found = self._made.get(name)
        if found is None:
            from ray.util import metrics as ray_metrics

            keys = tuple(tags)
            if d.kind == "counter":
                found = ray_metrics.Counter(name, d.help, tag_keys=keys)  # Ray adds "_total" itself
            else:
                found = ray_metrics.Gauge(name, d.help, tag_keys=keys)
            self._made[name] = found
        return found

    def counter_inc(self, d: MetricDef, tags: dict[str, str], amount: float) -> None:
        self._metric(d, tags).inc(amount, tags)

    def gauge_set(self, d: MetricDef, tags: dict[str, str], value: float) -> None:
        self._metric(d, tags).set(value, tags)

    def histogram_set(self, d: MetricDef, tags: dict[str, str], value: HistogramState) -> None:
        buckets = self._metric(d, {**tags, "le": ""}, "_bucket")
        for bound, cumulative in value.buckets:
            buckets.set(cumulative, {**tags, "le": "+Inf" if bound == float("inf") else repr(bound)})
        self._metric(d, tags, "_sum").set(value.sum, tags)
        self._metric(d, tags, "_count").set(value.count, tags)


class RayMetricsExporter:
    """Copies ``metrics`` into Ray every ``interval`` seconds from a daemon thread, until ``stop``."""

    def __init__(self, metrics: Metrics, *, interval: float = EXPORT_INTERVAL) -> None:
        self.mirror = Mirror(metrics, RayTarget())
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="riqr-metrics-export", daemon=True)

    def start(self) -> RayMetricsExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.mirror.flush()
            except Exception:  # metrics must never take a verticle down
                log.warning("could not export metrics to Ray", exc_info=True)
