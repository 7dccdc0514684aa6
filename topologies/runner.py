"""Running a topology as a program (a Ray job, or by hand): common flags, Ray, Spark, clean stop.

Each topology's ``main`` builds an ``argparse`` parser with its own flags and calls ``run_topology``
with a function that starts its streaming queries.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["run_topology"]

log = logging.getLogger(__name__)

StartFn = Callable[..., list[Any]]


def run_topology(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    start: StartFn,
    extra: Callable[[argparse.Namespace], dict[str, Any]] | None = None,
) -> int:
    """Parse the common flags, join Ray, start Spark and the queries, and run until stopped.

    ``start(spark, home, options, **extra(args))`` starts the topology's queries: ``options`` is the
    ``TopologyOptions`` from the common flags, ``extra`` turns the topology's own flags into arguments.

    SIGTERM (``ray job stop``) and SIGINT stop the queries cleanly; a query that fails stops the others
    and makes the exit status 1.
    """
    from runtime.config import DEFAULT_ACTORS, DEFAULT_NAMESPACE, DEFAULT_PARTITIONS, DEFAULT_TRIGGER, riqr_home

    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="Ray namespace of the riqr runtime")
    parser.add_argument("--home", default=None, help="landing dirs and checkpoints; default $RIQR_HOME or ~/.riqr")
    parser.add_argument("--address", default=None, help="Ray address; default $RAY_ADDRESS or a local cluster")
    parser.add_argument("--master", default=None, help="Spark master; default $RIQR_SPARK_MASTER or local[*]")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS, help="partitions of each store")
    parser.add_argument("--actors", type=int, default=DEFAULT_ACTORS, help="query actors of each store")
    parser.add_argument("--trigger", default=None, help=f"micro-batch interval; default {DEFAULT_TRIGGER!r}")
    parser.add_argument(
        "--source",
        default="files",
        choices=["files", "kafka", "spark-kafka"],
        help="files: landing dirs (riqr produce); kafka: riqr's Python Kafka source; spark-kafka: Spark's connector",
    )
    parser.add_argument("--kafka-bootstrap", default=None, help="Kafka bootstrap servers, for the Kafka sources")
    parser.add_argument("--starting-offsets", default="earliest", choices=["earliest", "latest"])
    args = parser.parse_args(argv)
    from topologies.sources import SourceConfig

    try:
        source = SourceConfig(args.source, args.kafka_bootstrap, args.starting_offsets)
    except ValueError as err:
        parser.error(str(err))
    from topologies.options import TopologyOptions

    args.topology = TopologyOptions(args.namespace, args.partitions, args.actors, args.trigger, source)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import ray

    from topologies.spark import spark_session

    ray.init(address=args.address or "auto", namespace=args.namespace, log_to_driver=False)
    spark = spark_session(args.master, app_name=parser.prog)
    queries = start(spark, riqr_home(args.home), args.topology, **(extra(args) if extra else {}))
    log.info("topology running: %s", ", ".join(q.name for q in queries))

    def stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping the queries", signum)
        for q in queries:
            q.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed: Exception | None = None
    for q in queries:
        try:
            q.awaitTermination()
        except Exception as err:  # one query failed: stop the others and report
            failed = err
            for other in queries:
                if other.isActive:
                    other.stop()
    spark.stop()
    if failed is not None:
        log.error("the topology failed: %s", failed)
        return 1
    return 0
