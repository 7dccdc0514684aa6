"""riqr's topologies: PySpark Structured Streaming jobs feeding stores through ``topologies.sink.materialize``.

Each runs as ``python -m topologies.<name>`` or ``riqr run <name>``, with the same options.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

__all__ = ["TOPOLOGIES", "run_by_name"]

# name -> module; every module has main(argv, prog).
TOPOLOGIES = {
    "food_orders": "topologies.food_orders",
    "food_orders_windowed": "topologies.food_orders_windowed",
    "railway": "topologies.railway",
    "events": "topologies.events",
}


def run_by_name(name: str, argv: Sequence[str], *, prog: str | None = None) -> int:
    """Run topology ``name`` with command-line options ``argv`` until it stops; its exit status."""
    module = importlib.import_module(TOPOLOGIES[name])
    return int(module.main(list(argv), prog=prog))
