"""riqr's runtime: the pure core (partitioner, codecs, ownership, merges, engines, errors), the bus
adapters' protocols, the Python driver API (``connect``) and the CLI."""

# The engines first: ``runtime.catalog`` imports ``runtime.engines``, whose RocksDB engine imports the
# catalog back, which only works in this order (the client used to get it by importing ``runtime.pages``).
import runtime.engines  # noqa: F401  # isort: skip
from runtime.client import Client, Page, Store, connect
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
