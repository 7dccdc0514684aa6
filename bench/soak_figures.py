"""The soak benchmark's pure parts (bench/soak.py): what a process is, how RSS grows, what the landing
files say the stores must hold, and how answers and statuses are judged and summed.

Nothing here starts Ray or Spark, opens a socket or reads the clock: the unit tests
(tests/unit/test_bench_soak.py) run every function on small values.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ROLES",
    "Sample",
    "RoleGrowth",
    "Recount",
    "Comparison",
    "classify",
    "descendants",
    "slope_per_hour",
    "after_warmup",
    "growth_by_role",
    "parse_landing_line",
    "recount_lines",
    "recount_home",
    "compare_store",
    "sentinel_keys",
    "judge_status",
    "judge_count",
    "judge_driver_call",
    "summarise_statuses",
    "REFUSED_KINDS",
]

# The roles a process of the soak's cluster plays, in the order the figures print them. riqr's own first.
ROLES = (
    "http",  # HttpVerticle: the REST API, with its co-located facade core
    "facade",  # FacadeVerticle: the driver API's scans, pages and metadata
    "registry",
    "query",  # QueryVerticle: every store's owners, summed
    "topology",  # the topology's Python driver (the Ray job's entrypoint)
    "spark-jvm",  # the topology's Spark driver JVM
    "driver-client",  # the driver-API load's process (runtime.connect: the facade core in a client)
    "gcs_server",
    "raylet",
    "ray-other",  # dashboard, its agents, the job supervisor, idle workers, the monitors
)

_ACTOR_ROLES = {
    "ray::HttpVerticle": "http",
    "ray::FacadeVerticle": "facade",
    "ray::Registry": "registry",
    "ray::QueryVerticle": "query",
}
_RAY_SCRIPTS = (
    "dashboard/dashboard.py",
    "dashboard/agent.py",
    "runtime_env/agent/main.py",
    "log_monitor.py",
    "autoscaler/_private/monitor.py",
    "ray.util.client.server",
)


def classify(argv: Sequence[str]) -> str | None:
    """The role of a process from its command line (``/proc/<pid>/cmdline`` split at NULs), or None for a
    process the soak does not follow (the bench itself, ``ray job submit``, a short-lived ``riqr token``).

    Ray renames a worker after the actor it runs (``ray::QueryVerticle``, ``ray::QueryVerticle.get_many``
    while it runs a method), so an actor's class is its first word up to a dot."""
    if not argv:
        return None
    first = argv[0]
    if first.startswith("ray::"):
        actor = first.split()[0].split(".")[0]
        return _ACTOR_ROLES.get(actor, "ray-other")
    if first.startswith("ray-dashboard-"):  # the dashboard's head modules, each a process of its own
        return "ray-other"
    name = os.path.basename(first)
    if name in ("gcs_server", "raylet"):
        return name
    if name == "java" and any("org.apache.spark.deploy.SparkSubmit" in a for a in argv):
        return "spark-jvm"
    if "bench.soak_topology" in argv or any(a.endswith("bench/soak_topology.py") for a in argv):
        return "topology"
    if "bench.soak_driver" in argv:
        return "driver-client"
    if any(script in a for a in argv[1:] for script in _RAY_SCRIPTS):
        return "ray-other"
    return None


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """Every process under ``root`` (children, their children, ...) given each pid's parent, sorted; never
    ``root`` itself. What the soak stops at its end: processes it started, and only those."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child != root:
                found.add(child)
                todo.append(child)
    return sorted(found)


@dataclass(frozen=True)
class Sample:
    """One process at one look: seconds since the load began, its pid and role, RSS (KiB), threads and
    open descriptors."""

    t: float
    pid: int
    role: str
    rss_kb: int
    threads: int
    fds: int


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per hour; None with fewer than 3 points or no
    spread in time (a slope of two points is one noise pair)."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    sxx = sum((t - mean_t) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / sxx * 3600


def after_warmup(points: Sequence[tuple[float, float]], fraction: float) -> list[tuple[float, float]]:
    """The points from ``fraction`` of the way between the first and the last point's time on."""
    if not points:
        return []
    ordered = sorted(points)
    first, last = ordered[0][0], ordered[-1][0]
    cut = first + fraction * (last - first)
    return [p for p in ordered if p[0] >= cut]


@dataclass(frozen=True)
class RoleGrowth:
    """How one role's processes grew: RSS summed over its processes at each look (MB), at the first look,
    at the first look after the warm-up ("start") and at the last ("end"); the least-squares slope after
    the warm-up in MB per hour, and over the last half of that span alone (``late_mb_per_hour``: a mark
    that levels off has it near 0, a leak keeps it near the whole slope); threads and descriptors summed
    likewise (start, end); processes at the end."""

    role: str
    processes: int
    first_mb: float
    start_mb: float
    end_mb: float
    mb_per_hour: float | None
    late_mb_per_hour: float | None
    threads: tuple[int, int]
    fds: tuple[int, int]

    @property
    def ratio(self) -> float | None:
        """End over start (after the warm-up); None when the role had no memory at the start."""
        return self.end_mb / self.start_mb if self.start_mb > 0 else None


def growth_by_role(samples: Iterable[Sample], warmup: float = 0.2) -> list[RoleGrowth]:
    """Per role (in ``ROLES`` order, then any other), the growth of its processes over the samples.

    A role's RSS at a look is the sum over its processes then: query actors killed and restarted by the
    churn come back as other pids, and only their sum is a series. ``warmup`` is the fraction of the run
    left out of the slope and before "start"."""
    by_role: dict[str, dict[float, list[Sample]]] = {}
    for s in samples:
        by_role.setdefault(s.role, {}).setdefault(s.t, []).append(s)
    out = []
    for role in sorted(by_role, key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r)):
        looks = sorted(by_role[role].items())
        rss = [(t, sum(s.rss_kb for s in group) / 1024) for t, group in looks]
        warm = after_warmup(rss, warmup)
        start_t = warm[0][0]
        totals = {t: (sum(s.threads for s in g), sum(s.fds for s in g)) for t, g in looks}
        end_t = looks[-1][0]
        out.append(
            RoleGrowth(
                role=role,
                processes=len(looks[-1][1]),
                first_mb=rss[0][1],
                start_mb=warm[0][1],
                end_mb=rss[-1][1],
                mb_per_hour=slope_per_hour(warm),
                late_mb_per_hour=slope_per_hour(after_warmup(warm, 0.5)),
                threads=(totals[start_t][0], totals[end_t][0]),
                fds=(totals[start_t][1], totals[end_t][1]),
            )
        )
    return out


# -- what the stores must hold --------------------------------------------------------------------------


def parse_landing_line(line: str) -> dict[str, Any] | None:
    """A landing line as a record (``key``, ``value``, ``ts``, ``seq``), or None for one a topology
    dead-letters: not JSON, not an object, a field missing, or a field of the wrong type. (riqr's check is
    Spark SQL, docs/design.md "Landing lines are parsed PERMISSIVE"; the soak writes only well-formed lines
    and lines that are not JSON at all, which both judge alike.)"""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not {"key", "value", "ts", "seq"} <= record.keys():
        return None
    if not all(record[f] is None or isinstance(record[f], str) for f in ("key", "value")):
        return None
    if not all(isinstance(record[f], int) and not isinstance(record[f], bool) for f in ("ts", "seq")):
        return None
    return record


@dataclass
class Recount:
    """What the landing files say: orders per key (``order-count``), the latest name per customer
    (``customer-v1-changelog``; a null latest value deletes the key) and the lines a topology dead-letters,
    per topic."""

    orders: Counter[str] = field(default_factory=Counter)
    customers: dict[str, str] = field(default_factory=dict)
    malformed: Counter[str] = field(default_factory=Counter)
    _latest: dict[str, tuple[tuple[int, int], str | None]] = field(default_factory=dict, repr=False)

    @property
    def order_records(self) -> int:
        return sum(self.orders.values())


def recount_lines(recount: Recount, topic: str, lines: Iterable[str]) -> None:
    """Add one file's lines of ``topic`` (``order`` or ``customer``) to ``recount``, as the food-orders
    topology counts them: an order needs a key and a value (``order_counts``), a customer's latest value
    is the one with the greatest ``(ts, seq)`` (``latest_by_key``). Blank lines are not records."""
    for line in lines:
        if not line.strip():
            continue
        record = parse_landing_line(line)
        if record is None:
            recount.malformed[topic] += 1
            continue
        key, value = record["key"], record["value"]
        if key is None:
            continue
        if topic == "order":
            if value is not None:
                recount.orders[key] += 1
        elif topic == "customer":
            order = (record["ts"], record["seq"])
            if key not in recount._latest or order > recount._latest[key][0]:
                recount._latest[key] = (order, value)
                if value is None:
                    recount.customers.pop(key, None)
                else:
                    recount.customers[key] = value


def recount_home(home: Path, topics: Collection[str] = ("order", "customer")) -> Recount:
    """``recount_lines`` over every landing file of ``topics`` under ``home`` (hidden files, which Spark's
    file source skips, are skipped too)."""
    recount = Recount()
    for topic in topics:
        directory = home / "data" / topic
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.name.startswith((".", "_")) or not path.is_file():
                continue
            with open(path, encoding="utf-8", errors="replace") as lines:
                recount_lines(recount, topic, lines)
    return recount


@dataclass(frozen=True)
class Comparison:
    """A store's full scan against what it must hold: keys whose value differs (``wrong``: present with
    another value, or present though the recount has no such key), records the store does not reflect
    (``lost``: for counts, orders counted short; for latest values, keys missing or stale), and a few
    examples."""

    keys: int
    wrong: int
    lost: int
    examples: tuple[str, ...]


def compare_store(want: Mapping[str, Any], got: Mapping[str, Any], *, counts: bool, examples: int = 5) -> Comparison:
    """Compare a store's entries ``got`` with ``want``. With ``counts`` the values are order counts: a key
    short by n has lost n records, and one over is a wrong answer (an order counted twice). Otherwise each
    missing or differing key is one lost record (its latest value) and each key the recount does not
    have is wrong."""
    wrong = lost = 0
    said: list[str] = []
    for key in sorted(set(want) | set(got)):
        w, g = want.get(key), got.get(key)
        if w == g:
            continue
        if len(said) < examples:
            said.append(f"{key!r}: want {w!r}, got {g!r}")
        if w is None:
            wrong += 1
        elif counts:
            have = g if isinstance(g, int) and not isinstance(g, bool) else 0
            if have > w:
                wrong += 1
            else:
                lost += w - have
                if g is not None and not isinstance(g, int):
                    wrong += 1
        else:
            lost += 1
            if g is not None:
                wrong += 1
    return Comparison(len(got), wrong, lost, tuple(said))


def sentinel_keys(partitions: int, prefix: str = "soak-end-") -> list[str]:
    """One key per partition (the first ``<prefix><n>`` that lands there, by the partitioner both paths
    share): written last, a store shows them all only once every earlier landing file is in it."""
    from runtime.keys import STRING
    from runtime.partitioner import partition_of

    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        key = f"{prefix}{n}"
        found.setdefault(partition_of(STRING, key, partitions), key)
        n += 1
    return [found[p] for p in range(partitions)]


# -- answers and statuses -------------------------------------------------------------------------------

# Requests that must be refused: any 2xx to one of them is a wrong answer (a door left open).
REFUSED_KINDS = frozenset({"no-token", "bad-token"})
# What each request kind may honestly answer besides 503/504 (riqr's "no copy can answer now"). A cut
# stream's outcome is the client's own ("cut"), whatever the server counted.
EXPECTED: Mapping[str, frozenset[int | str]] = {
    "get": frozenset({200, 404}),
    "get-msgpack": frozenset({200, 404}),
    "get-customer": frozenset({200, 404}),
    "range": frozenset({200}),
    "prefix": frozenset({200}),
    "page": frozenset({200}),
    "ndjson": frozenset({200}),
    "ndjson-cut": frozenset({"cut", 200}),
    "raw-cut": frozenset({"cut"}),
    "count": frozenset({200}),
    "stores": frozenset({200}),
    "metadata": frozenset({200}),
    "meta-key": frozenset({200}),
    "metrics": frozenset({200}),
    "ready": frozenset({200}),
    "health": frozenset({200}),
    "windows": frozenset({200}),
    "sessions": frozenset({200}),
    "no-token": frozenset({401}),
    "bad-token": frozenset({401}),
    "no-store": frozenset({404}),
    "bad-param": frozenset({400}),
}
HONEST = frozenset({503, 504, "error:503", "error:504"})


def judge_status(kind: str, outcome: int | str) -> str:
    """``ok`` (what the kind answers), ``honest`` (503 or 504: no answer rather than a wrong one), ``wrong``
    (a refused kind let through), or ``unexpected`` (anything else: a 500, a client error, a timeout)."""
    if kind in REFUSED_KINDS and isinstance(outcome, int) and 200 <= outcome < 300:
        return "wrong"
    if outcome in EXPECTED.get(kind, ()):
        return "ok"
    if outcome in HONEST:
        return "honest"
    return "unexpected"


def stream_outcome(status: int, last_line: bytes | None) -> int | str:
    """An NDJSON stream's outcome: its HTTP status, unless its last line is the error it ended with (the 200
    was sent before the error came: a copy lost mid-scan, a deadline, a bug), then that error's status, as
    ``error:<status>`` (``error:503`` is as honest as a 503 answer; ``error:500`` is not)."""
    if last_line is None or not last_line.startswith(b'{"error"'):
        return status
    try:
        code = json.loads(last_line)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"error:{last_line[:40]!r}"
    return f"error:{_ERROR_STATUS.get(code, code)}"


def _statuses() -> dict[str, int]:
    """Each riqr error code's HTTP status."""
    from runtime.errors import RiqrError

    out: dict[str, int] = {}
    todo: list[type[RiqrError]] = [RiqrError]
    while todo:
        cls = todo.pop()
        out[cls.code] = cls.status
        todo.extend(cls.__subclasses__())
    return out


_ERROR_STATUS = _statuses()


def judge_count(got: Any, produced: int, last_seen: int | None) -> str | None:
    """An ``order-count`` lookup's 200 judged while orders land: None when right, else why it is wrong. A
    count above the orders written for the key counts one twice; one below what the same client saw
    before went back in time (riqr's reads are monotonic per facade, and a REST client's all go to one)."""
    if not isinstance(got, int) or isinstance(got, bool):
        return f"not a count: {got!r}"
    if got > produced:
        return f"{got} with {produced} written"
    if last_seen is not None and got < last_seen:
        return f"{got} after {last_seen}"
    return None


# A driver-API call's honest failures: riqr's exceptions for "no copy can answer now" (REST's 503 and 504).
DRIVER_HONEST = frozenset(
    {"OwnerUnavailable", "PartitionUnavailable", "PartitionIncomplete", "PartitionCatchingUp", "CopyBehind",
     "Unavailable", "CopyMoved", "NotConnected", "DeadlineExceeded"}
)  # fmt: skip


def judge_driver_call(kind: str, outcome: int | str) -> str:
    """A driver-API call's outcome (``ok`` or an exception's class name), judged as ``judge_status`` judges
    a REST answer: an absent key is an answer of ``get`` and ``lookup``, an unknown store's is
    ``StoreNotFound``."""
    if outcome == "ok" and kind != "unknown-store":
        return "ok"
    if outcome == "KeyNotFound" and kind in ("get", "lookup"):
        return "ok"
    if kind == "unknown-store":
        return "ok" if outcome == "StoreNotFound" else "honest" if outcome in DRIVER_HONEST else "unexpected"
    return "honest" if outcome in DRIVER_HONEST else "unexpected"


def summarise_statuses(
    outcomes: Mapping[tuple[str, int | str], int], judge: Callable[[str, int | str], str] = judge_status
) -> dict[str, dict[str, Any]]:
    """Per request kind: the count of each outcome, and how many ``judge`` found ok, honest, unexpected and
    wrong."""
    out: dict[str, dict[str, Any]] = {}
    for (kind, outcome), n in sorted(outcomes.items(), key=lambda item: (item[0][0], str(item[0][1]))):
        row = out.setdefault(kind, {"total": 0, "by": {}, "ok": 0, "honest": 0, "unexpected": 0, "wrong": 0})
        row["total"] += n
        row["by"][str(outcome)] = row["by"].get(str(outcome), 0) + n
        row[judge(kind, outcome)] += n
    return out
