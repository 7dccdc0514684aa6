"""The session store of ``topologies.food_orders_windowed`` alone, run as a topology process by the real
``run_topology`` (its flags, Ray, Spark, ``supervise``), for tests/integration/test_topology_kill.py: a
JVM with a quarter of the queries starts and runs its first batches in less time on two cores.

    python -m tests.integration.session_topology --namespace NS --home HOME [--watermark "5 seconds"] ...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.options import TopologyOptions


def start(spark: Any, home: Path, options: TopologyOptions, *, watermark: str) -> list[Any]:
    """The session store's query alone: no dead-letter query, whose first batch would read every file
    beside the store's batch 0 on two cores (the test lands no malformed record)."""
    from topologies.food_orders_windowed import materialize_sessions

    records, _ = options.read(spark, home, "order")
    return [materialize_sessions(records, home, options, watermark=watermark)]


def main(argv: Sequence[str] | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog="python -m tests.integration.session_topology")
    parser.add_argument("--watermark", default="10 seconds", help="how late an order may arrive")
    return run_topology(parser, argv, start, lambda args: {"watermark": args.watermark})


if __name__ == "__main__":
    sys.exit(main())
