"""Running a topology as a program (a Ray job, or by hand): common flags, Ray, Spark, clean stop.

Each topology's ``main`` builds an ``argparse`` parser with its own flags and calls ``run_topology``
with a function that starts its streaming queries.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.errors import RiqrError, StoreInUse
from topologies import feeder
from topologies.inflight import STOP_GRACE, stop_between_batches

__all__ = ["run_topology"]

log = logging.getLogger(__name__)

StartFn = Callable[..., list[Any]]

# A store's query stopped to be rebuilt in place is started again at once, and if that fails (the
# registry or an owner briefly unreachable) after 2, 4, 8 and 16 s; then the topology fails.
START_AGAIN_ATTEMPTS = 5
START_AGAIN_WAIT = 2.0


@dataclass
class _Stopped:
    """A query ``supervise`` stopped to rebuild its store in place and has not started again yet."""

    attempts: int = 0
    next_try: float = 0.0


def run_topology(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    start: StartFn,
    extra: Callable[[argparse.Namespace], dict[str, Any]] | None = None,
) -> int:
    """Parse the common flags, join Ray, start Spark and the queries, and run until stopped.

    ``start(spark, home, options, **extra(args))`` starts the topology's queries: ``options`` is the
    ``TopologyOptions`` from the common flags, ``extra`` turns the topology's own flags into arguments.

    SIGTERM (``ray job stop``) and SIGINT stop every query cleanly and exit 0; a query that fails, any
    one of them, stops the others at once and makes the exit status 1 (see ``supervise``).
    """
    from runtime.raycalls import no_auto_connect

    no_auto_connect()  # before Ray is imported
    from runtime.config import (
        DEFAULT_ACTORS,
        DEFAULT_ENGINE,
        DEFAULT_NAMESPACE,
        DEFAULT_PARTITIONS,
        DEFAULT_STANDBYS,
        DEFAULT_TRIGGER,
        riqr_home,
    )
    from runtime.engines.base import ENGINES
    from topologies.deadletter import DEAD_LETTER_TRIGGER

    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="Ray namespace of the riqr runtime")
    parser.add_argument("--home", default=None, help="landing dirs and checkpoints; default $RIQR_HOME or ~/.riqr")
    parser.add_argument("--address", default=None, help="Ray address; default $RAY_ADDRESS or the running local one")
    parser.add_argument("--master", default=None, help="Spark master; default $RIQR_SPARK_MASTER or local[*]")
    parser.add_argument("--partitions", type=_count(1), default=DEFAULT_PARTITIONS, help="partitions of each store")
    parser.add_argument("--actors", type=_count(1), default=DEFAULT_ACTORS, help="query actors of each store")
    parser.add_argument(
        "--standbys",
        type=_count(0),
        default=DEFAULT_STANDBYS,
        help="standby copies of each partition (on other nodes); default 1 when the cluster has more than one node "
        "and the store more than one actor, else 0",
    )
    parser.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help="where each store's partitions live")
    parser.add_argument(
        "--read-replicas",
        action="store_true",
        help="keep a copy of each store in every HTTP verticle: key lookups answered there without a Ray hop",
    )
    parser.add_argument(
        "--trigger", default=None, type=_interval, help=f"micro-batch interval; default {DEFAULT_TRIGGER!r}"
    )
    parser.add_argument(
        "--dead-letter-trigger",
        default=None,
        type=_interval,
        help="micro-batch interval of each dead-letter query; default "
        f"{DEAD_LETTER_TRIGGER['processingTime']!r} (longer: less work beside the stores' queries, fresher "
        "answers at the median, but dead letters show later and in larger batches, which lengthen the stores' "
        "slowest micro-batches)",
    )
    parser.add_argument(
        "--source",
        default="files",
        choices=["files", "kafka", "spark-kafka"],
        help="files: landing dirs (riqr produce); kafka: riqr's Python Kafka source; spark-kafka: Spark's connector",
    )
    parser.add_argument("--kafka-bootstrap", default=None, help="Kafka bootstrap servers, for the Kafka sources")
    parser.add_argument("--starting-offsets", default="earliest", choices=["earliest", "latest"])
    parser.add_argument(
        "--skip-lost-offsets",
        action="store_true",
        help="Kafka: go on past offsets Kafka no longer has (retention, a topic made again) with a warning, "
        "instead of failing the batch (the sources' failOnDataLoss=false)",
    )
    parser.add_argument(
        "--take-over",
        action="store_true",
        help="feed stores that hold what another checkpoint fed them (another --home or host, or this checkpoint "
        "deleted): their contents are replaced by what this run computes; without it such a start is refused",
    )
    parser.add_argument(
        "--no-class-archive",
        action="store_true",
        help="load Spark's classes from its jars even if `riqr demo` left a class archive (~/.cache/riqr) that "
        "makes the driver JVM start faster",
    )
    from runtime import logs

    parser.add_argument(
        "--log-level", default=None, help="debug, info, warning, error, critical; default $RIQR_LOG_LEVEL, info"
    )
    parser.add_argument(
        "--log-format",
        default=None,
        choices=logs.FORMATS,
        help="key=value or JSON lines; default $RIQR_LOG_FORMAT or kv",
    )
    args = parser.parse_args(argv)
    try:
        logs.configure(args.log_level, args.log_format)
    except ValueError as err:
        parser.error(str(err))
    from topologies.sources import SourceConfig

    try:
        source = SourceConfig(
            args.source, args.kafka_bootstrap, args.starting_offsets, fail_on_data_loss=not args.skip_lost_offsets
        )
    except ValueError as err:
        parser.error(str(err))
    from topologies.options import TopologyOptions

    args.topology = TopologyOptions(
        args.namespace,
        args.partitions,
        args.actors,
        args.trigger,
        source,
        engine=args.engine,
        standbys=args.standbys,
        read_replicas=args.read_replicas,
        dead_letter_trigger=args.dead_letter_trigger,
        take_over=args.take_over,
    )

    # A Ray job runs in the environment Ray was started with, not the submitting shell's: a RIQR_HOME set
    # there never reaches it. Said at start, so a home other than the one ``riqr produce`` writes shows.
    home = riqr_home(args.home)
    whence = "--home" if args.home else "$RIQR_HOME" if os.environ.get("RIQR_HOME") else "the default"
    log.info("home %s (from %s): landing directories under %s, checkpoints under %s", home, whence,
             home / "data", home / "checkpoints")  # fmt: skip

    from runtime.client import JoinRefused, join_ray
    from topologies.spark import SparkNotStarted, shared_archive_options, spark_session

    try:
        join_ray(args.address, args.namespace)
    except JoinRefused as err:  # a cluster there, but it would not let this process join: said plainly
        log.error("not started: cannot join the Ray cluster (%s)", err)
        return 1
    except ConnectionError as err:  # no Ray cluster there: said plainly, no traceback
        log.error("not started: cannot reach the Ray cluster (%s); start one (`ray start --head`, then "
                  "`riqr up`) or give --address", err)  # fmt: skip
        return 1
    java_options = () if args.no_class_archive else shared_archive_options()
    try:
        spark = spark_session(args.master, app_name=parser.prog, java_options=java_options)
    except SparkNotStarted as err:  # no Java: said plainly, no traceback
        log.error("not started: %s", err)
        return 1
    try:
        try:
            queries = start(spark, home, args.topology, **(extra(args) if extra else {}))
        except StoreInUse as err:  # another topology feeds one of its stores: said plainly, no traceback
            log.error("not started: %s", err, extra={"store": err.details.get("store")})
            feeder.finish_all()  # the stores it had started feeding, if any, stop with it
            return 1
        except Exception as err:  # the stores it had started feeding fail with it, not go stale
            from topologies.sink import query_name

            store = err.details.get("store") if isinstance(err, RiqrError) else None
            feeder.finish_all(query_name(args.namespace, store) if store else "start", f"{type(err).__name__}: {err}")
            if isinstance(err, RiqrError):  # riqr's own words (not up in the namespace, an owner gone): no traceback
                log.error("not started: %s", err.message, extra={"store": store})
                return 1
            if _analysis_error(err):  # Spark refused the topology's query as written: its words and where
                log.error("not started: Spark refused the topology's query%s: %s", _topology_frame(err),
                          error_cause(err))  # fmt: skip
                if "PATH_NOT_FOUND" in str(err):
                    log.error("a file source reads a directory that must exist first (mkdir -p it)")
                return 1
            raise
        log.info("topology running: %s", ", ".join(q.name for q in queries), extra={"query": parser.prog})
        return supervise(queries)
    finally:
        spark.stop()


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number at least ``least``; refused before Ray and Spark start, where a store's
    spec refused it 10 to 20 s later."""

    from runtime.config import check_count

    def whole(text: str) -> int:
        value = int(text)  # its ValueError is argparse's "invalid whole number value"
        try:
            return check_count(value, least)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    whole.__name__ = "whole number"  # argparse's "invalid <name> value" message
    return whole


def _interval(value: str) -> str:
    """An interval flag's value (``topologies.options.check_interval``), or argparse's usage error."""
    from topologies.options import check_interval

    try:
        return check_interval(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def supervise(
    queries: list[Any], *, poll: float = 0.5, stop: threading.Event | None = None, grace: float = STOP_GRACE
) -> int:
    """Wait until a signal asks to stop (0) or any query ends by itself (1, naming it and why).

    ``stop``, when given, is a flag the caller's own signal handler set before this started (``riqr
    demo``): a stop asked for then is not missed.

    The signal handlers only set a flag: stopping a query is a call into the JVM, and making it from a
    handler that interrupted another such call fails with py4j's "reentrant call". So the main thread
    polls the queries (each poll a short JVM call) and stops them itself.

    Before stopping them it gives the registry the topology's last word on every store it feeds
    (``topologies.feeder.finish_all``): ``stopped`` on a signal, ``failed`` naming the query and its
    error otherwise, so ``/ready`` and the catalog tell a stopped topology from one still running. Then
    it stops each query between two of its batches (``topologies.inflight``), waiting at most ``grace``
    seconds in all for batches in progress to end; a second signal cancels them instead.

    Each poll also rebuilds in place a store whose partitions no copy serves any more
    (``topologies.sink.rebuild_due``, ``stop_for_rebuild``, ``start_again``): its query is stopped and
    started again on a fresh checkpoint, in the place of the old one in ``queries``. Starting it again is
    tried ``START_AGAIN_ATTEMPTS`` times over about half a minute; then the topology fails as for a failed
    query. A store the registry no longer has (``riqr drop --force``, ``riqr down``) fails it too, within
    a look at the copies (``topologies.sink.unregistered``), whether or not a batch comes.
    """
    stop = stop if stop is not None else threading.Event()

    hurry = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        # Only flags: raising here would break whichever call into the JVM or Ray the main thread is in.
        if stop.is_set():  # a second signal (``riqr demo``: the first Ctrl-C set ``stop``)
            log.info("signal %d again: cancelling the batches in progress", signum)
            hurry.set()
            return
        log.info("signal %d: stopping the queries", signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    stopped: dict[str, _Stopped] = {}
    try:
        failed: tuple[str, BaseException | None] | None = None
        while not stop.is_set() and failed is None:
            ended = next((q for q in queries if q.name not in stopped and not q.isActive), None)
            if ended is not None:
                failed = (ended.name, ended.exception())
            else:
                failed = _unregistered(queries, stopped) or _rebuild_in_place(queries, stopped)
            if failed is None:
                stop.wait(poll)
        error = None if failed is None else failed[1]
        # The cause, as the log line below gives it: Spark's wrapper of a foreachBatch error (py4j's
        # "Return Message: Traceback ...") left only frames within the feeds' 500 characters.
        why = error_cause(error) if error is not None else "it ended without an error"
        feeder.finish_all(None if failed is None else failed[0], why)
        # Each query stopped between two of its batches, all within one grace period
        # (``topologies.inflight``): a batch in progress ends rather than being cancelled.
        stop_between_batches([q for q in queries if q.isActive], grace, hurry=hurry)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # No look at the copies left inside a Ray call when the process ends (Ray's exit would end it with 1).
        from topologies import sink

        if not sink.stop_looking():
            log.warning("a look at the stores' copies is still waiting on Ray (a registry that does not "
                        "answer?); the process may end with exit status 1 when Ray shuts down")  # fmt: skip
    if failed is None:
        log.info("topology stopped")
        return 0
    if error is None:
        log.error("query %s stopped: it ended without an error", failed[0], extra={"query": failed[0]})
        return 1
    cause = error_cause(error)
    log.error("query %s stopped: %s", failed[0], cause, extra={"query": failed[0]})
    if cause != str(error):
        log.info("query %s: the whole error: %s", failed[0], error, extra={"query": failed[0]})
    return 1


def _analysis_error(err: BaseException) -> bool:
    """Whether ``err`` is Spark's analysis of a query refusing it (a missing path, an unknown column, a
    type mismatch): a fault of the topology as written, said in one line rather than a py4j traceback."""
    return any(cls.__name__ == "AnalysisException" for cls in type(err).__mro__)


def _topology_frame(err: BaseException) -> str:
    """`` (at file:line)``, the innermost frame of the traceback outside riqr's and PySpark's code: the
    topology's own line that built the refused query; empty when there is none."""
    import traceback
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    ours = tuple(str(root / package) + os.sep for package in ("runtime", "topologies", "riqr"))

    def theirs(filename: str) -> bool:
        return not filename.startswith(ours) and f"{os.sep}site-packages{os.sep}" not in filename

    frames = [f for f in traceback.extract_tb(err.__traceback__) if theirs(f.filename)]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def error_cause(error: BaseException) -> str:
    """The line that says why a query failed. A ``foreachBatch`` function's error reaches the runner as
    Spark's ``StreamingQueryException``, whose text opens "An exception was raised by the Python Proxy.
    Return Message: Traceback ..." and buries the Python exception (``NumberFormatException:
    [CAST_INVALID_INPUT] ...``) under the frames, followed by the query's plan: that exception's line
    (with the DataFrame call site Spark adds under it) leads, the rest goes to the log at info."""
    text = str(error)
    marker = "Traceback (most recent call last):"
    if marker in text:
        lines = text.split(marker, 1)[1].splitlines()
        start = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith(" ")), None)
        if start is not None:
            kept = []
            for line in lines[start:]:
                if not line.strip() or line.startswith("=== Streaming Query ==="):
                    break
                kept.append(line.strip())
            return " ".join(kept)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _unregistered(queries: list[Any], stopped: dict[str, _Stopped]) -> tuple[str, BaseException] | None:
    """The name of a query whose store a look found no longer registered, and why (``sink.unregistered``):
    its next batch would fail on that, and an idle source may bring none for a long time."""
    from topologies import sink

    for query in queries:
        if query.name not in stopped and (why := sink.unregistered(query.name)) is not None:
            return query.name, why
    return None


def _rebuild_in_place(queries: list[Any], stopped: dict[str, _Stopped]) -> tuple[str, BaseException] | None:
    """Stop each query whose store has partitions no copy serves (when ``rebuild_due`` says so) and start
    it again on a fresh checkpoint, in its place in ``queries``; one whose start fails stays in ``stopped``
    and is tried again later. Returns the name and error of one that could not be started at all."""
    from topologies import sink

    now = time.monotonic()
    for i, query in enumerate(queries):
        name = query.name
        if name not in stopped:
            unheld = sink.rebuild_due(name)
            if not unheld:
                continue
            log.warning("query %s: no copy serves partitions %s of its store; rebuilding the store in place (its "
                        "query starts again on a fresh checkpoint)", name, unheld, extra={"query": name})  # fmt: skip
            sink.stop_for_rebuild(name, query)
            stopped[name] = _Stopped()
        again = stopped[name]
        if now < again.next_try:
            continue
        try:
            queries[i] = sink.start_again(name)
        except (sink.StoreUnregistered, StoreInUse) as err:  # a verdict (dropped, another store now, or
            # another topology feeds it now): no point trying again
            log.error("query %s: not started again: %s", name, err, extra={"query": name})
            return name, err
        except Exception as err:
            again.attempts += 1
            if again.attempts >= START_AGAIN_ATTEMPTS:
                log.exception("query %s: could not be started again", name, extra={"query": name})
                return name, err
            wait = START_AGAIN_WAIT * 2 ** (again.attempts - 1)
            again.next_try = now + wait
            log.warning("query %s: could not be started again (%s: %s); next try in %.0fs", name,
                        type(err).__name__, err, wait, extra={"query": name})  # fmt: skip
            continue
        del stopped[name]
    return None
