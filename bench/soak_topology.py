"""The soak's topology (bench/soak.py): the food-orders stores and, unless ``--no-windowed``, the windowed
food-orders stores, in one Spark driver, as the 70-minute soak of 2026-11-29 ran them. A topology of riqr's
public form (docs: README, "Writing a topology"), submitted as a Ray job:

    ray job submit --working-dir . -- python -m bench.soak_topology --home /srv/soak [--no-windowed]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.options import TopologyOptions

__all__ = ["start", "main"]


def start(spark: Any, home: Path, options: TopologyOptions, *, windowed: bool = True) -> list[Any]:
    """Both topologies' queries (food-orders first), then their dead-letter queries."""
    from topologies import food_orders, food_orders_windowed

    queries = food_orders.start(spark, home, options)
    return [*queries, *food_orders_windowed.start(spark, home, options)] if windowed else queries


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from topologies.runner import run_topology

    parser = argparse.ArgumentParser(prog=prog or "python -m bench.soak_topology", description=__doc__.splitlines()[0])
    parser.add_argument("--no-windowed", action="store_true", help="only the food-orders stores")
    return run_topology(parser, argv, start, lambda args: {"windowed": not args.no_windowed})


if __name__ == "__main__":
    sys.exit(main())
