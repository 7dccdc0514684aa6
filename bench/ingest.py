"""Benchmark: the sink's cost over Spark's ``noop`` sink, and freshness, in one run.

    .venv/bin/python -m bench.ingest [--records 1000000] [--rounds 2] [--probes 12] [--rate 10000]
        [--dead-letter-trigger '2 seconds'] [--spark-conf KEY=VALUE]

Everything runs on a local Ray (riqr deployed in a namespace of its own, REST on loopback, no auth) and a
local Spark, with the food-orders topology's queries on landing files (``riqr produce``'s format).

1. **Throughput.** ``--records`` records with distinct keys land as files of 100,000; the customer
   topology's query (``latest_by_key``) reads them in one go. Timed from ``start()`` to
   ``processAllAvailable()`` returning, once with Spark's ``noop`` sink and once with ``materialize`` (a
   store created beforehand, so actor start-up is not counted), for ``--rounds`` rounds, which of the
   two goes first alternating by round (``--order``), each run starting with the earlier runs' state
   stores unloaded from the driver JVM and its heap collected (``--no-gc`` leaves them), once the machine
   is quiet again (at least 85% idle, at most 15 s of waiting). Each run's driver GC time is printed.
   Printed: medians and the ratio riqr / noop (the sink's overhead is that ratio minus 1), and the
   sink's own stages after Spark's batch (split, registry view, standby and active rounds, report) as a
   fraction of noop's run: the part of the overhead that does not move with Spark's batch time, which
   varies by a second or more between runs on a shared machine.
2. **Freshness.** The order-count query (orders left-joined with customers, counted by key) at the
   default trigger. A probe order for a new key is written and its count is polled over REST every 5 ms
   until it shows: record written -> a GET answers with it. The baseline is the same query into the
   ``noop`` sink: record written -> the micro-batch holding it completed (Spark's progress event). Idle
   and under ``--rate`` records/s (files of ``rate/10`` records every 100 ms, other keys).

Per micro-batch, the sink's own log lines (``batch N delivered``) and ``--profile`` break down where the
time of a delivery goes (toArrow, split, rounds).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from runtime.landing import Record, write_records


def say(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def land(home: Path, topic: str, count: int, prefix: str, chunk: int = 100_000) -> None:
    for start in range(0, count, chunk):
        records = [Record(f"{prefix}{i}", f"v{i}") for i in range(start, min(count, start + chunk))]
        write_records(home, topic, records)


# -- 1. throughput --------------------------------------------------------------------------------------


def run_noop(spark: Any, df: Any, checkpoint: str, trigger: str) -> float:
    started = time.monotonic()
    query = (
        df.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger)
        .start()
    )
    query.processAllAvailable()
    took = time.monotonic() - started
    query.stop()
    return took


def jvm_gc_seconds(spark: Any) -> float:
    """The driver JVM's garbage collectors' total time so far (their MXBeans), in seconds."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return sum(beans.get(i).getCollectionTime() for i in range(beans.size())) / 1000


def fresh_heap(spark: Any) -> None:
    """Before a timed run: the state stores the earlier runs' queries left loaded in the driver JVM are
    unloaded (Spark keeps a stopped query's providers, 1,000,000 keys each here, until its maintenance
    task finds them unused), then a full collection, so that neither run pays for what the other left. In
    production a store's query does not run after another query of a million keys in the same JVM."""
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
    spark._jvm.java.lang.System.gc()


DELIVERIES: list[Any] = []


def capture_deliveries() -> None:
    """Keep every ``BatchDelivery`` the sink creates, to read its per-stage timings."""
    from topologies import sink

    class Captured(sink.BatchDelivery):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            DELIVERIES.append(self)

    sink.BatchDelivery = Captured  # type: ignore[misc]


def timings_line(deliveries: list[Any]) -> str:
    total: dict[str, float] = {}
    for d in deliveries:
        for k, v in getattr(d, "timings", {}).items():
            total[k] = total.get(k, 0.0) + v
    return ", ".join(f"{k} {v:.2f}s" for k, v in total.items())


def create_store(df: Any, store: str, namespace: str, standbys: int) -> None:
    import ray

    from runtime.config import REGISTRY_NAME
    from topologies.sink import store_spec_for

    spec = store_spec_for(df.schema, store, "key", "value", standbys=standbys)
    ray.get(ray.get_actor(REGISTRY_NAME, namespace=namespace).create_store.remote(spec))


def cpu_idle(window: float = 0.5) -> float:
    """The machine's idle fraction over ``window`` seconds (/proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    idle0, total0 = sample()
    time.sleep(window)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def settle(deadline: float = 15.0, idle: float = 0.85) -> float:
    """Wait until the machine is quiet (new query actors' processes, and the workers Ray starts after
    them, finish starting), at most ``deadline`` seconds; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < deadline and cpu_idle() < idle:
        pass
    return time.monotonic() - started


def run_riqr(df: Any, store: str, checkpoint: str, namespace: str, standbys: int, trigger: str) -> float:
    from topologies.sink import materialize

    started = time.monotonic()
    query = materialize(
        df, store=store, key="key", value="value", checkpoint=checkpoint, namespace=namespace,
        standbys=standbys, trigger=trigger,
    )  # fmt: skip
    query.processAllAvailable()
    took = time.monotonic() - started
    query.stop()
    return took


def apply_seconds(namespace: str, store: str) -> str:
    """Each query actor's own time applying the store's batches (its apply-duration histogram's sum):
    what of a round is the actors' work, and what is the call around it."""
    import ray

    from runtime.config import REGISTRY_NAME

    view: Any = ray.get(ray.get_actor(REGISTRY_NAME, namespace=namespace).view.remote())
    out = []
    for actor in sorted(view.table(store).all_owners()):
        stats = ray.get(ray.get_actor(actor, namespace=namespace).stats.remote())
        total = sum(v for name, labels, v in stats["samples"]
                    if name == "riqr_apply_duration_seconds_sum" and dict(labels).get("store") == store)  # fmt: skip
        out.append(f"{total:.2f}s")
    return "actors' apply " + " + ".join(out)


def throughput(
    spark: Any, work: Path, namespace: str, args: argparse.Namespace
) -> tuple[dict[str, float], list[float]]:
    """The medians of noop's runs, riqr's and the sink's own stages, and each round's ratio riqr/noop (its
    spread shows how much of a difference between two invocations is noise)."""
    import ray

    from runtime.config import REGISTRY_NAME
    from topologies.food_orders import latest_by_key
    from topologies.sources import read_topic

    home = work / "bulk"
    land(home, "customer", args.records, "k")
    say(f"landed {args.records:,} records")
    times: dict[str, list[float]] = {"noop": [], "riqr": [], "own": []}
    registry = ray.get_actor(REGISTRY_NAME, namespace=namespace)
    if args.warmup:  # the JVM's and Python's first run of each path is slower: not counted
        warm = work / "warm"
        land(warm, "customer", args.warmup, "w")
        run_noop(spark, latest_by_key(read_topic(spark, warm, "customer")), str(work / "cp-warm-noop"), args.trigger)
        df = latest_by_key(read_topic(spark, warm, "customer"))
        create_store(df, "warm", namespace, args.standbys)
        run_riqr(df, "warm", str(work / "cp-warm-riqr"), namespace, args.standbys, args.trigger)
        ray.get(registry.drop_store.remote("warm"))
        DELIVERIES.clear()
        say(f"warmed up on {args.warmup:,} records")
    for r in range(args.rounds):
        # The round's store is created first, and both runs start on a quiet machine: new query actors'
        # processes, and the idle workers Ray starts after them, take CPU for a second or two, which
        # landed in riqr's run when the store was created just before it.
        store = f"bulk-{r}"
        create_store(latest_by_key(read_topic(spark, home, "customer")), store, namespace, args.standbys)
        # Which run goes first alternates by round (--order alternate): the second of two runs in one JVM
        # and one machine is not the first's equal (the first's garbage, the page cache, JIT), and noop
        # always first put all of that on riqr's side.
        first = ("noop", "riqr") if args.order == "noop-first" or r % 2 == 0 else ("riqr", "noop")
        for side in first:
            if args.gc:
                fresh_heap(spark)
            waited = settle()
            df = latest_by_key(read_topic(spark, home, "customer"))
            gc_before = jvm_gc_seconds(spark)
            if side == "noop":
                times["noop"].append(run_noop(spark, df, str(work / f"cp-noop-{r}"), args.trigger))
                gc = jvm_gc_seconds(spark) - gc_before
                say(f"round {r + 1}: noop {times['noop'][-1]:.2f}s (after {waited:.1f}s settling; driver GC {gc:.2f}s)")
                continue
            times["riqr"].append(
                run_riqr(df, store, str(work / f"cp-riqr-{r}"), namespace, args.standbys, args.trigger)
            )
            gc = jvm_gc_seconds(spark) - gc_before
            # The sink's own stages (everything after Spark's batch and toArrow): the part of riqr's run
            # that does not move with Spark's batch time, which varies by a second or more between runs.
            times["own"].append(sum(v for k, v in getattr(DELIVERIES[-1], "timings", {}).items() if k != "batch"))
            say(
                f"round {r + 1}: riqr {times['riqr'][-1]:.2f}s (after {waited:.1f}s settling; driver GC {gc:.2f}s); "
                f"sink stages: {timings_line(DELIVERIES[-1:])}; "
                f"{apply_seconds(namespace, store)}"
            )
        ray.get(registry.drop_store.remote(store))
    ratios = [r / n for r, n in zip(times["riqr"], times["noop"])]
    return {k: statistics.median(v) for k, v in times.items()}, ratios


# -- 2. freshness -------------------------------------------------------------------------------------


def http_status(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


class Writer:
    """Background load: ``rate`` records/s as a file every 100 ms, keys that probes never use."""

    def __init__(self, home: Path, rate: int) -> None:
        self.home, self.rate = home, rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n, step = 0, max(1, self.rate // 10)
        next_at = time.monotonic()
        while not self.stop.is_set():
            write_records(self.home, "order", [Record(f"load{(n + i) % 5000}", "soup") for i in range(step)])
            n += step
            next_at += 0.1
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Writer:
        if self.rate:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.rate:
            self.thread.join()


def probe_riqr(home: Path, url: str, label: str, probes: int) -> list[float]:
    lags = []
    for i in range(probes):
        key = f"{label}-{i}-{uuid.uuid4().hex[:6]}"
        written = time.monotonic()
        write_records(home, "order", [Record(key, "soup")])
        while http_status(f"{url}/stores/order-count/get/{key}")[0] != 200:
            if time.monotonic() - written > 60:
                raise SystemExit(f"probe {key} not visible after 60 s")
            time.sleep(0.005)
        lags.append(time.monotonic() - written)
        time.sleep(0.13 + 0.05 * (i % 5))  # spread the probes over the trigger's phase
    return lags


def log_offset(progress: Any) -> int:
    """The file source's log entry a micro-batch read up to (its ``endOffset``); the batch id if unknown."""
    import json

    try:
        return int(json.loads(progress.sources[0].endOffset)["logOffset"])
    except Exception:
        return int(progress.batchId)


def probe_noop(home: Path, label: str, probes: int, listener: Any, sources_log: Path) -> list[float]:
    lags = []
    for i in range(probes):
        key = f"{label}-{i}-{uuid.uuid4().hex[:6]}"
        seen = listener.batches_after(0.0)
        written = time.monotonic()
        path = write_records(home, "order", [Record(key, "soup")])
        assert path is not None
        lags.append(listener.wait_batch_holding(path.name, seen, sources_log) - written)
        time.sleep(0.13 + 0.05 * (i % 5))
    return lags


def freshness(spark: Any, work: Path, namespace: str, url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    from pyspark.sql.streaming import StreamingQueryListener

    from topologies.food_orders import start_order_counts
    from topologies.options import TopologyOptions

    try:
        from topologies.food_orders import order_counts_frame
    except ImportError:  # the code before the snapshot was cached: the same frame, built as it was

        def order_counts_frame(spark: Any, home: Path, options: Any) -> tuple[Any, Any]:
            from topologies.food_orders import latest_by_key, order_counts
            from topologies.sources import read_topic_batch

            snapshot = latest_by_key(read_topic_batch(spark, home, "customer", options.source))
            orders, rejects = options.read(spark, home, "order")
            return order_counts(orders, snapshot), rejects

    out: dict[str, list[float]] = {}
    durations: dict[str, list[dict[str, int]]] = {"bench-noop-fresh": [], f"riqr-{namespace}-order-count": []}

    class Batches(StreamingQueryListener):  # type: ignore[misc]
        """When each micro-batch with input of the watched query ended (by this process's clock)."""

        def __init__(self) -> None:
            self.cond = threading.Condition()
            self.ends: list[tuple[float, int]] = []
            self.watch: str | None = None
            self.profile = f"riqr-{namespace}-order-count"

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            p = event.progress
            if p.numInputRows > 0 and p.name in (self.watch, self.profile):
                durations[p.name].append(dict(p.durationMs))
            if p.name == self.watch and p.numInputRows > 0:
                with self.cond:
                    self.ends.append((time.monotonic(), log_offset(p)))
                    self.cond.notify_all()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

        def batches_after(self, t: float) -> int:
            with self.cond:
                return len(self.ends)

        def wait_batch_holding(self, name: str, seen: int, sources_log: Path) -> float:
            # The first batch after ``seen`` whose file-source log entry lists the probe's file; its end
            # is when Spark's progress event arrived.
            deadline = time.monotonic() + 60
            with self.cond:
                i = seen
                while True:
                    while len(self.ends) <= i:
                        if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                            raise SystemExit("noop probe not processed after 60 s")
                    end, batch_id = self.ends[i]
                    for entry in (sources_log / str(batch_id), sources_log / f"{batch_id}.compact"):
                        if entry.exists() and name in entry.read_text(errors="replace"):
                            return end
                    i += 1

    listener = Batches()
    spark.streams.addListener(listener)
    try:
        for mode in ("noop", "riqr"):
            home = work / f"fresh-{mode}"
            write_records(home, "customer", [Record("1", "john")])
            write_records(home, "order", [Record("warm", "soup")])
            options = TopologyOptions(
                namespace=namespace, standbys=args.standbys, trigger=args.trigger,
                dead_letter_trigger=args.dead_letter_trigger,
            )  # fmt: skip
            if mode == "riqr":
                query = start_order_counts(spark, home, options)
            else:
                counts, rejects = order_counts_frame(spark, home, options)
                options.dead_letters(home, "order", "noop-order-count", rejects)  # as the topology runs it
                listener.watch = "bench-noop-fresh"
                query = (
                    counts.writeStream.format("noop")
                    .outputMode("update")
                    .queryName("bench-noop-fresh")
                    .option("checkpointLocation", str(work / "cp-fresh-noop"))
                    .trigger(processingTime=args.trigger)
                    .start()
                )
            query.processAllAvailable()
            for load in (0, args.rate):
                with Writer(home, load):
                    time.sleep(1.0 if load else 0.2)
                    label = f"{mode}-{'load' if load else 'idle'}"
                    try:
                        if mode == "riqr":
                            lags = probe_riqr(home, url, label, args.probes)
                        else:
                            sources_log = work / "cp-fresh-noop" / "sources" / "0"
                            lags = probe_noop(home, label, args.probes, listener, sources_log)
                    except (Exception, SystemExit):
                        traceback.print_exc()
                        continue
                out[label] = lags
                if mode == "riqr":
                    say(f"{label} sink stages (all batches so far): {timings_line(DELIVERIES[-1:])}")
                say(f"{label}: p50 {statistics.median(lags) * 1000:.0f} ms, p99 {pct(lags, 0.99) * 1000:.0f} ms")
            # Between batches, as a topology stops: a stop inside riqr's batch cancelled its Spark job, and
            # Spark's stream thread then logged a StackOverflowError from a regex over the failure.
            from topologies.inflight import stop_between_batches

            cut = stop_between_batches(list(spark.streams.active))
            if cut:
                say(f"stopped inside a batch (it did not end within the grace): {', '.join(cut)}")
    finally:
        spark.streams.removeListener(listener)
    for name, batches in durations.items():
        if batches:
            stages = sorted({k for b in batches for k in b})
            medians = ", ".join(f"{k} {statistics.median(b.get(k, 0) for b in batches):.0f}" for k in stages)
            say(f"{name}: {len(batches)} batches with input, median ms: {medians}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--standbys", type=int, default=1, help="standbys per partition (1: the two rounds)")
    parser.add_argument("--trigger", default="250 milliseconds")
    parser.add_argument(
        "--dead-letter-trigger", default=None, help="the dead-letter query's interval (default: the topologies' own)"
    )
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--warmup", type=int, default=100_000, help="records of an uncounted first round")
    parser.add_argument(
        "--order",
        choices=("alternate", "noop-first"),
        default="alternate",
        help="which run of a round goes first: alternating by round, or noop always (the bench before 2026-11-29)",
    )
    parser.add_argument(
        "--no-gc",
        dest="gc",
        action="store_false",
        help="leave earlier runs' state stores loaded and the driver's heap uncollected before each run",
    )
    parser.add_argument("--skip", default="", help="comma-separated: throughput, freshness")
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting to compare (repeatable)"
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if os.environ.get("RIQR_BENCH_SINK_LOG"):
        logging.getLogger("topologies.delivery").setLevel(logging.INFO)
    import ray

    from runtime.config import RuntimeConfig
    from topologies.spark import spark_session
    from verticles import deploy

    work = Path(tempfile.mkdtemp(prefix="riqr-bench-ingest-"))
    os.environ.setdefault("RIQR_DATA", str(work / "data"))
    namespace = f"riqr-bench-{uuid.uuid4().hex[:8]}"
    ray.init(namespace=namespace, log_to_driver=False, include_dashboard=False)
    try:
        deployment = deploy.up(
            RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1")
        )
        # Spark's default 1 GiB driver ran out of heap at 1,000,000 keys: the collected batch plus the
        # state of the earlier rounds' queries.
        settings = dict(item.split("=", 1) for item in args.spark_conf)
        spark = spark_session(conf={"spark.driver.memory": args.driver_memory, **settings})
        capture_deliveries()
        tp = fresh = None
        try:
            tp = None if "throughput" in skip else throughput(spark, work, namespace, args)
        except Exception:
            traceback.print_exc()
        try:
            if "freshness" not in skip:
                fresh = freshness(spark, work, namespace, deployment.endpoints[0].url, args)
        except Exception:
            traceback.print_exc()
        spark_settings = settings or "as riqr sets them"
        print(
            f"\ningest: standbys {args.standbys}, trigger {args.trigger}, dead-letter trigger "
            f"{args.dead_letter_trigger or 'default'}, Spark settings {spark_settings}"
        )
        if tp is not None:
            medians, ratios = tp
            print(
                f"{args.records:,} records, latest_by_key, medians of {args.rounds}: noop {medians['noop']:.2f} s, "
                f"riqr {medians['riqr']:.2f} s, ratio riqr/noop {medians['riqr'] / medians['noop']:.3f} (each "
                f"round's: {', '.join(f'{r:.3f}' for r in ratios)}); the sink's own stages (split, view, rounds, "
                f"report) {medians['own']:.2f} s = {medians['own'] / medians['noop']:.3f} of noop"
            )
        if fresh is not None:
            print(f"freshness over {args.probes} probes (order-count; written -> GET answers / -> noop batch done)")
            print(f"{'load':<10}{'riqr p50':>10}{'p99':>8}{'noop p50':>10}{'p99':>8}{'ratio p50':>11}")
            for load in ("idle", "load"):
                if f"riqr-{load}" not in fresh or f"noop-{load}" not in fresh:
                    print(f"{load}: missing ({', '.join(fresh)} measured)")
                    continue
                r, n = fresh[f"riqr-{load}"], fresh[f"noop-{load}"]
                rate = "idle" if load == "idle" else f"{args.rate}/s"
                print(
                    f"{rate:<10}{statistics.median(r) * 1000:>10.0f}{pct(r, 0.99) * 1000:>8.0f}"
                    f"{statistics.median(n) * 1000:>10.0f}{pct(n, 0.99) * 1000:>8.0f}"
                    f"{statistics.median(r) / statistics.median(n):>11.2f}"
                )
    finally:
        deploy.down(namespace)
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
