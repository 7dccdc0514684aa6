"""riqr's topologies: PySpark Structured Streaming jobs feeding stores through ``topologies.sink.materialize``.

Each runs as ``python -m topologies.<name>`` or ``riqr run <name>``, with the same options; ``riqr run``
also runs a user's own topology module (``run_by_name``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["TOPOLOGIES", "NotATopology", "run_by_name"]

# name -> module; every module has main(argv, prog).
TOPOLOGIES = {
    "food_orders": "topologies.food_orders",
    "food_orders_windowed": "topologies.food_orders_windowed",
    "railway": "topologies.railway",
    "events": "topologies.events",
}


class NotATopology(Exception):
    """``run_by_name`` was given something that is neither one of riqr's topologies nor a module of one."""


def run_by_name(name: str, argv: Sequence[str], *, prog: str | None = None) -> int:
    """Run topology ``name`` with command-line options ``argv`` until it stops; its exit status.

    ``name`` is one of ``TOPOLOGIES``, or a user's own topology: a module (``sensors``, ``jobs.sensors``,
    imported with the current directory first on the path, as ``python -m`` does; a ``.py`` file's path,
    relative or absolute, is its stem imported with its directory first) that defines ``main(argv, prog)``,
    as riqr's do (``topologies.runner``)."""
    module_name = TOPOLOGIES.get(name)
    if module_name is None:
        module_name, where = name, os.getcwd()
        if name.endswith(".py"):  # a file: its directory goes first on the path, its stem is the module
            path = os.path.abspath(name)
            if not os.path.isfile(path):
                raise NotATopology(f"no topology {name!r}: no file {path}")
            where, module_name = os.path.dirname(path), os.path.basename(path)[:-3]
        if where not in sys.path:
            sys.path.insert(0, where)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        parts = module_name.split(".")
        if err.name not in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise  # the topology's own import of something missing: its traceback says what
        known = ", ".join(sorted(TOPOLOGIES))
        raise NotATopology(
            f"no topology {name!r}: not one of riqr's ({known}), and no module {module_name!r} from {os.getcwd()}"
        ) from None
    main = getattr(module, "main", None)
    if not callable(main):
        raise NotATopology(f'module {module_name!r} has no main(argv, prog): see README, "Writing a topology"')
    return int(main(list(argv), prog=prog))
