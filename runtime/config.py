"""Defaults and the few settings every part of riqr agrees on, each declared here once (a default only one
module uses stays beside its use)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotation: config stays free of aiohttp and jwt
    from runtime.auth import AuthConfig

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "DEFAULT_PARTITIONS",
    "DEFAULT_ACTORS",
    "DEFAULT_STANDBYS",
    "DEFAULT_ENGINE",
    "ENGINES",
    "ROCKSDB_CACHE_BYTES",
    "ROCKSDB_CACHE_ENV",
    "RECLAIM_ENV",
    "RECREATE_ENV",
    "DEFAULT_RECREATE_AFTER",
    "RESTART_SILENT_ENV",
    "DEFAULT_RESTART_SILENT_AFTER",
    "SILENCE_PING_EVERY",
    "seconds_setting",
    "riqr_data",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE",
    "WHOLE_JSON_BYTES",
    "MAX_WHOLE_MSGPACK_ENTRIES",
    "PAGE_BYTES",
    "DEFAULT_TRIGGER",
    "MAX_URL_CHARS",
    "MAX_HEADER_FIELD_BYTES",
    "MAX_HEADERS",
    "MAX_QUERY_PARAMS",
    "MAX_KEY_CHARS",
    "MAX_BODY_BYTES",
    "VIEW_REFRESH_INTERVAL",
    "EPOCH_WAIT",
    "EPOCH_WAIT_MAX",
    "SUSPECT_CHECK_GAP",
    "PROBE_GROUP",
    "FEED_HEARTBEAT_INTERVAL",
    "FEED_STALE_AFTER",
    "FEED_SAVE_INTERVAL",
    "ACK_LOG_LENGTH",
    "RuntimeConfig",
    "riqr_home",
    "REGISTRY_NAME",
    "facade_name",
    "http_name",
]

DEFAULT_NAMESPACE = "riqr"
DEFAULT_PORT = 7400


def check_port(port: int, what: str = "") -> int:
    """``port`` if a TCP port can be it (0: any free one); else ``ValueError``, naming ``what`` if given.
    Past bind()'s range each node's HTTP verticle failed inside Ray, and kept the setting for every later
    start."""
    if not 0 <= port <= 65535:
        raise ValueError(f"{_named(what)}must be a TCP port, 0 to 65535 (0: any free port), got {port}")
    return port


def check_seconds(seconds: float, what: str = "") -> float:
    """``seconds`` if a wait can last that long; else ``ValueError``, naming ``what`` if given (nan never
    times out, inf never gives up, 0 or less gives up at once)."""
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{_named(what)}must be a finite number of seconds more than 0, got {seconds}")
    return seconds


def check_count(count: int, least: int, what: str = "") -> int:
    """``count`` if it is at least ``least`` (partitions and actors 1, standby copies 0, a page's entries 1);
    else ``ValueError``, naming ``what`` if given."""
    if count < least:
        raise ValueError(f"{_named(what)}must be at least {least}, got {count}")
    return count


def _named(what: str) -> str:
    return f"{what} " if what else ""


def http_url(host: str, port: int) -> str:
    """``http://host:port``, an IPv6 address in brackets (RFC 3986): ``http://[::1]:7400``, not ``::1:7400``."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


# A store's layout: partitions are fixed for its life (the partitioner depends on them), actors share them.
DEFAULT_PARTITIONS = 4
DEFAULT_ACTORS = 2
# Standby copies of each partition. None is "auto", resolved where the store is created (the registry
# knows the nodes): 1 when more than one node is alive (and the store has more than one actor), else 0, so
# a multi-node cluster survives the loss of an actor or a node without a 503. Reads stay monotonic across
# copies (docs/design.md, "Replicas").
DEFAULT_STANDBYS: int | None = None
# Where a store keeps its partitions (docs/design.md, "Storage engines", says why rocksdb by default).
ENGINES = ("memory", "rocksdb")
DEFAULT_ENGINE = "rocksdb"
# The rocksdb engine's block cache, one per query actor process and shared by its partitions: it bounds
# what the actor holds of data, index and filter blocks, whatever the key count. RIQR_ROCKSDB_CACHE_MB
# (read where the actor starts) changes it.
ROCKSDB_CACHE_ENV = "RIQR_ROCKSDB_CACHE_MB"
DEFAULT_ROCKSDB_CACHE_MB = 256.0


def rocksdb_cache_bytes(environ: Mapping[str, str]) -> int:
    """``$RIQR_ROCKSDB_CACHE_MB`` in bytes (MiB, fractions allowed), 256 MiB when unset. A value that is
    not a positive number is logged and the default used: every riqr process reads it at import, and a
    typo must not stop the CLI and every query actor from starting."""
    raw = environ.get(ROCKSDB_CACHE_ENV, "").strip()
    mebibytes = DEFAULT_ROCKSDB_CACHE_MB
    if raw:
        read = _number_setting(ROCKSDB_CACHE_ENV, raw, mebibytes, lambda v: 0 < v < float("inf"),
                               "a positive number of MiB")  # fmt: skip
        mebibytes = mebibytes if read is None else read
    return max(1, int(mebibytes * (1 << 20)))


def _number_setting(
    name: str, raw: str, default: float, acceptable: Callable[[float], bool], what: str
) -> float | None:
    """The setting ``$name``'s text ``raw`` as a number, or None for one that is not a number ``acceptable``
    takes, logged (``what`` it should be, and that ``default`` is used): a typo must not stop a process or
    turn a safety off."""
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")  # acceptable to no range
    if not acceptable(value):
        log.warning("%s=%r is not %s; using %g", name, raw, what, default)
        return None
    return value


ROCKSDB_CACHE_BYTES = rocksdb_cache_bytes(os.environ)
# How long the data of a query actor that no longer exists stays on a node's disk before that node's
# HTTP verticle deletes it, in seconds or "off" (read where the verticle starts; ``runtime.orphans``).
RECLAIM_ENV = "RIQR_RECLAIM_AFTER"
# How long a query actor must have been gone for good (killed without a restart, or failed in its
# constructor) on a live node before the registry creates it again on that node, in seconds or "off"
# (read where the registry starts; docs/design.md, "An actor gone for good"). Ray restarts an actor that
# crashed by itself; this is for the ones it will not.
RECREATE_ENV = "RIQR_RECREATE_AFTER"
DEFAULT_RECREATE_AFTER = 2.0
# How long a query actor Ray lists alive may leave the registry's ping unanswered (its process stopped or
# hung) before the registry restarts it, in seconds or "off" (read where the registry starts;
# ``runtime.liveness``). Under the sink's minute for a batch with room for the restart, so a frozen copy
# costs the topology a wait, not its query; far above any pause of a process that still runs.
RESTART_SILENT_ENV = "RIQR_RESTART_SILENT_AFTER"
DEFAULT_RESTART_SILENT_AFTER = 20.0
# How often the registry pings each live query actor (a quarter of the bound above, when that is shorter).
SILENCE_PING_EVERY = 5.0
# How long one request may take end to end before it is a 504.
DEFAULT_REQUEST_TIMEOUT = 10.0
# Entries per page a facade asks an owner for, and per page a client gets when it names no limit.
DEFAULT_PAGE_SIZE = 1000
# The largest page a client may ask for; larger results are for NDJSON streams or cursors.
MAX_PAGE = 10_000
# A whole JSON answer of a scan (no limit, no cursor, not NDJSON) up to this many bytes of entries is
# answered whole, with its X-Riqr-Position; a larger one is streamed as the facade merges it, with memory
# flat (runtime.rest.render.json_result). A whole msgpack answer is built in memory (its array's length
# comes first), so it is refused past MAX_WHOLE_MSGPACK_ENTRIES: page it, or ask for JSON or NDJSON.
WHOLE_JSON_BYTES = 1 << 20
MAX_WHOLE_MSGPACK_ENTRIES = 100_000
# About how many bytes (stored keys and values) an owner puts in one page of a stream or of
# ``Store.iterate`` (runtime.pages): large enough that a page's Ray hop costs little per entry, small
# enough that a facade holds a few of them per owner with memory flat. A page of small entries costs the
# facade about 10x its stored size as Python objects; at 1 MiB the HTTP verticle's heap grew by about 60 MB
# during a stream, at 256 KiB by about 17 MB, and the streams ran faster (docs/benchmarks.md).
PAGE_BYTES = 1 << 18
# Limits on what a REST request may carry (docs/api.md, "Limits"). The request line (method, URL, version)
# and each header field are capped by aiohttp's parser; they differ by two bytes on purpose, so that a
# parser rejection can say which one was exceeded (414 or 431) from the limit it reports.
MAX_URL_CHARS = 8192
MAX_HEADER_FIELD_BYTES = 8190
MAX_HEADERS = 64
MAX_QUERY_PARAMS = 16
# A key, key bound or prefix as written in the URL (percent-encoded): longer is a 400 key-too-long.
MAX_KEY_CHARS = 1024
# No route reads a body; a small one is tolerated (some clients send an empty JSON object).
MAX_BODY_BYTES = 1024
# The micro-batch interval of riqr's topologies.
DEFAULT_TRIGGER = "250 milliseconds"
# How long a facade's long poll for a new epoch waits at the registry before asking again (a change
# answers it at once), and the most the registry lets one wait. When the long poll fails (the registry
# restarting), the facade falls back to comparing epochs every VIEW_REFRESH_INTERVAL.
EPOCH_WAIT = 10.0
# How long the sink waits for a read replica (``runtime.readreplica``) to acknowledge a batch before it
# drops the replica from the view: ingest never waits longer for a copy that only speeds up reads.
READ_REPLICA_APPLY_TIMEOUT = 5.0
EPOCH_WAIT_MAX = 30.0
VIEW_REFRESH_INTERVAL = 1.0
# The least time between two checks of the query actors that facades ask for (``Registry.suspect``).
SUSPECT_CHECK_GAP = 0.2
# A query actor's concurrency group of one thread for ``ping`` (a facade's question whether an actor whose
# scan call is long is there at all), so that threads busy with long calls do not hold the answer up.
PROBE_GROUP = "probe"
# A move's switch (``runtime.moves``): how long the old actor refuses batches while the registry compares
# positions (lifted at once if the new copy is behind; this bounds a stall if the registry dies meanwhile),
# and how long the old actor keeps answering reads already sent to it once the new one took its place.
MOVE_SEAL_SECONDS = 30.0
MOVE_LEAVE_GRACE = 5.0
# The longest a move (``riqr rebalance``/``drain``/``standbys``) goes on by default before its mover gives it
# up; ``--timeout`` changes it. A restarted registry that may have a move under way unseen waits this long.
DEFAULT_MOVE_TIMEOUT = 900.0
RESTARTED_MOVE_SECONDS = DEFAULT_MOVE_TIMEOUT
# How long a move's new actor may take from ``Registry.join`` (which starts it and returns) to
# ``Registry.admit`` (its mover saw it answer): past that, its mover is taken for dead and the registry's
# next check destroys it. Above the mover's own wait for the start (``riqr.moves``) and its admit call.
MOVE_START_SECONDS = 300.0
# How often a topology process tells the registry that the stores it feeds are still fed, and how long
# the registry waits without hearing it before it calls a feed stale (/ready 503): three missed beats, so
# one slow or lost call does not flip readiness (docs/operations.md, "Probes").
FEED_HEARTBEAT_INTERVAL = 2.0
FEED_STALE_AFTER = 3 * FEED_HEARTBEAT_INTERVAL
# The registry writes its ingest records to disk at once when a feed's state changes, and otherwise
# (batch progress) at most this often.
FEED_SAVE_INTERVAL = 5.0
# How many of a store's newest acknowledged batches the registry keeps the time of, for lag in seconds
# (runtime.feeds.AckLog): a copy further behind is shown behind by at least the oldest kept time.
ACK_LOG_LENGTH = 64
REGISTRY_NAME = "riqr-registry"


def facade_name(node_id: str) -> str:
    """The bus address of a node's facade verticle."""
    return f"riqr-facade-{node_id}"


def http_name(node_id: str) -> str:
    """The name of a node's HTTP verticle."""
    return f"riqr-http-{node_id}"


def seconds_setting(
    environ: Mapping[str, str], name: str, default: float, *, meant_for_tests_under: float = 0.0
) -> float | None:
    """A duration setting ``$name``: its seconds, None for ``off``, ``default`` when unset. A value that
    is not a finite, non-negative number of seconds is logged and ``default`` used (a typo must not turn
    a safety off); one under ``meant_for_tests_under`` is taken, with a warning."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() == "off":
        return None
    seconds = _number_setting(name, raw, default, lambda v: 0 <= v < float("inf"), "a number of seconds or 'off'")
    if seconds is None:
        return default
    if seconds < meant_for_tests_under:
        log.warning("%s=%g: under %g s is meant for tests", name, seconds, meant_for_tests_under)
    return seconds


def riqr_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where landing directories and checkpoints live: ``--home``, else ``$RIQR_HOME``, else ``~/.riqr``."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("RIQR_HOME")
    return Path(env).expanduser().resolve() if env else Path.home() / ".riqr"


def riqr_data(namespace: str, explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where this node keeps the stores' partitions of ``namespace``: ``$RIQR_DATA``, else
    ``<riqr home>/state``, on the node's local disk."""
    base = explicit or os.environ.get("RIQR_DATA")
    root = Path(base).expanduser().resolve() if base else riqr_home() / "state"
    return root / namespace


@dataclass(frozen=True)
class RuntimeConfig:
    """How the verticles are deployed: namespace, HTTP binding, request deadline, REST authentication.

    ``auth`` None means no authentication, for in-cluster callers and tests on loopback; ``riqr up`` and
    ``riqr demo`` always pass one (on unless ``--no-auth``). The default binding is loopback only.
    """

    namespace: str = DEFAULT_NAMESPACE
    http_host: str = "127.0.0.1"
    http_port: int = DEFAULT_PORT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    # Advertised host in metadata; None means the node's IP address.
    advertise_host: str | None = None
    auth: AuthConfig | None = None

    def __post_init__(self) -> None:
        # Refused here, in the caller's process, not inside each node's verticles.
        check_port(self.http_port, "http_port")
        check_seconds(self.request_timeout, "request_timeout")
