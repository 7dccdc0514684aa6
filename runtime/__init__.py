"""riqr's runtime: the pure core (partitioner, codecs, ownership, merges, engines, errors), the bus
adapters' protocols, the Python driver API (``connect``) and the CLI.

The names below are imported on first use (PEP 562), not with the package: every ``runtime.*`` import
runs this file first, and the client brings aiohttp and pyarrow, which ``riqr``'s command line, the
registry and the facades do not all need (docs/benchmarks.md, "Demo start-up")."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.client import Client, Lookup, Page, Store, connect
    from runtime.errors import (
        BadRequest,
        DeadlineExceeded,
        KeyNotFound,
        MalformedKey,
        NotConnected,
        PartitionUnavailable,
        RiqrError,
        StoreNotFound,
        Unavailable,
    )

__all__ = [
    "connect",
    "Client",
    "Store",
    "Page",
    "Lookup",
    "RiqrError",
    "BadRequest",
    "MalformedKey",
    "KeyNotFound",
    "StoreNotFound",
    "Unavailable",
    "PartitionUnavailable",
    "DeadlineExceeded",
    "NotConnected",
]

_HOMES = {name: "runtime.client" for name in ("connect", "Client", "Store", "Page", "Lookup")}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES.get(name, "runtime.errors")), name)
    globals()[name] = value
    return value
