"""What ``riqr status`` prints, from the catalog, the metadata and the REST endpoints (pure: no Ray).

The inputs are the answers of ``GET /stores`` and ``GET /metadata`` (the Python client's ``stores()`` and
``metadata()`` give the same) and the registry's endpoints, so the table shows what the console shows.
A copy's lag is how many batches it is behind the last batch its store's sink reported delivering, and
for how many seconds it has lacked an acknowledged batch (``runtime.lag``, computed by the facade; the
catalog carries it per copy in ``replicas``). The sink delivers every batch id to every partition (an
empty slice when it has no rows), so the two count the same batches. The lag column shows the most any
copy of the store (standbys included) is behind, and how many copies have no known lag (their actor did
not answer, or the copy has no position yet).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from runtime.config import http_url

__all__ = [
    "STORE_COLUMNS",
    "lag",
    "replicas_per_node",
    "store_rows",
    "endpoint_rows",
    "render_status",
]

STORE_COLUMNS = ("store", "kind", "partitions", "replicas per node", "positions", "lag", "ingest", "dead letters")


def _short(node: str) -> str:
    return node[:12]


def lag(position: Mapping[str, Any], ingest: Mapping[str, Any] | None) -> int | None:
    """Batches ``position`` is behind the last batch the sink delivered, or None when either is unknown."""
    if not ingest or not isinstance(ingest.get("batch_id"), int) or not isinstance(position.get("batch_id"), int):
        return None
    return max(0, int(ingest["batch_id"]) - int(position["batch_id"]))


def _silent(instance: Mapping[str, Any]) -> set[int]:
    """The partitions of ``instance`` whose actor did not answer (``unavailable``: dead, on a lost node, or
    too slow), from the positions ``/metadata`` gives with it. Not ``unknown``: the actor answered without
    that partition (a copy being added to it), which is no silence."""
    return {
        p["partition"]
        for p in instance.get("positions") or ()
        if isinstance(p.get("partition"), int) and p.get("state") == "unavailable"
    }


def replicas_per_node(instances: Iterable[Mapping[str, Any]], store: str) -> dict[str, tuple[int, int, int]]:
    """Node -> (active partitions, standby partitions, copies whose actor did not answer) of ``store``
    held there. A copy that did not answer is counted in neither role: after a failover the registry lists
    a dead actor's copies as standbys until they are replaced, and counting them so read as a store with
    every standby in place."""
    out: dict[str, tuple[int, int, int]] = {}
    for instance in instances:
        if store not in instance.get("state-store-names", ()):
            continue
        silent = _silent(instance)
        active, standby, down = out.get(instance["node"], (0, 0, 0))
        roles = [instance.get("partitions", ()), instance.get("standby-partitions", ())]
        out[instance["node"]] = (
            active + sum(p not in silent for p in roles[0]),
            standby + sum(p not in silent for p in roles[1]),
            down + sum(p in silent for role in roles for p in role),
        )
    return dict(sorted(out.items()))


def _replicas(instances: Iterable[Mapping[str, Any]], store: str) -> str:
    parts = []
    for node, (active, standby, down) in replicas_per_node(instances, store).items():
        parts.append(
            f"{_short(node)}: {active} active"
            + (f", {standby} standby" if standby else "")
            + (f", {down} not answering" if down else "")
        )
    return "\n".join(parts) or "-"


def _positions(positions: Sequence[Mapping[str, Any]]) -> str:
    states: dict[str, int] = {}
    for p in positions:
        states[str(p.get("state"))] = states.get(str(p.get("state")), 0) + 1
    text = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    batches = [p["batch_id"] for p in positions if isinstance(p.get("batch_id"), int)]
    if batches:
        low, high = min(batches), max(batches)
        text += f", batch {low}" + (f"-{high}" if high != low else "")
    return text or "-"


def _copies(positions: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [c for p in positions for c in (p.get("replicas") or [p])]


def _lag(positions: Sequence[Mapping[str, Any]], ingest: Mapping[str, Any] | None) -> str:
    copies = _copies(positions)
    lags = [c["lag_batches"] if isinstance(c.get("lag_batches"), int) else lag(c, ingest) for c in copies]
    known = [x for x in lags if x is not None]
    # A copy whose actor did not answer has no position: its lag is unknown, not 0, and the column says
    # so (a store half of whose copies are on a lost node must not read as caught up).
    unknown = len(lags) - len(known)
    silent = f"{unknown} of {len(lags)} copies unknown" if unknown else ""
    if not known:  # no lag is known for any copy: unknown for all when no batch was reported yet
        return silent if ingest and isinstance(ingest.get("batch_id"), int) and unknown else "-"
    text = f"{max(known)} batches"
    seconds = [float(c["lag_seconds"]) for c in copies if isinstance(c.get("lag_seconds"), (int, float))]
    if max(known) > 0 and seconds and max(seconds) > 0:
        text += f", {max(seconds):.1f} s"
    return text + (f"; {silent}" if silent else "")


def _ingest(ingest: Mapping[str, Any] | None, now: float) -> str:
    if not ingest or not ingest.get("state"):
        return "no sink reported"
    text = str(ingest["state"])
    if isinstance(ingest.get("batch_id"), int):
        text += f", batch {ingest['batch_id']}"
    if isinstance(ingest.get("at"), (int, float)):
        text += f", {max(0, round(now - ingest['at']))} s ago"
    if isinstance(ingest.get("late_rows"), int) and ingest["late_rows"] > 0:
        text += f", {ingest['late_rows']} late rows dropped"
    if ingest.get("error"):
        text += f": {_first_line(str(ingest['error']))}"
    return text


def _first_line(error: str, limit: int = 200) -> str:
    """An error as one line of the table: a query's failure carries Spark's whole traceback (``--json`` and
    ``GET /stores`` keep it), which made a two-store table some 25 lines long."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    more = len(lines) > 1 or len(first) > limit
    return (first[:limit] + " ... (riqr status --json has it all)") if more else first


def _dead_letters(ingest: Mapping[str, Any] | None) -> str:
    """Per topic, the records its dead-letter query set aside (``order: 0`` once it has run); ``-`` for a
    store whose topology reports none (no dead-letter query: Spark's own readers, no sink yet), which
    ``0`` made look like one that had found nothing bad."""
    letters = (ingest or {}).get("dead_letters") or {}
    return ", ".join(f"{topic}: {n}" for topic, n in sorted(letters.items())) or "-"


def store_rows(
    catalog: Iterable[Mapping[str, Any]], instances: Sequence[Mapping[str, Any]], now: float | None = None
) -> list[tuple[str, ...]]:
    """One row per store, in ``STORE_COLUMNS`` order."""
    now = time.time() if now is None else now
    rows: list[tuple[str, ...]] = []
    for store in sorted(catalog, key=lambda s: str(s["name"])):
        positions = store.get("positions") or []
        ingest = store.get("ingest")
        partitions = str(store["partitions"]) + (f" (+{store['standbys']} standby)" if store.get("standbys") else "")
        rows.append((
            str(store["name"]),
            str(store["kind"]),
            partitions,
            _replicas(instances, str(store["name"])),
            _positions(positions),
            _lag(positions, ingest),
            _ingest(ingest, now),
            _dead_letters(ingest),
        ))  # fmt: skip
    return rows


def endpoint_rows(endpoints: Mapping[str, tuple[str, int]]) -> list[tuple[str, str]]:
    """(node, URL) of each node's REST API, by node id."""
    return [(_short(node), f"{http_url(host, port)}/") for node, (host, port) in sorted(endpoints.items())]


def render_status(
    console: Console,
    catalog: Iterable[Mapping[str, Any]],
    instances: Sequence[Mapping[str, Any]],
    endpoints: Mapping[str, tuple[str, int]],
    now: float | None = None,
) -> None:
    """Print the stores table and the REST endpoints table on ``console``."""
    stores = Table(title="stores", title_justify="left", show_lines=True)
    for column in STORE_COLUMNS:
        stores.add_column(column, overflow="fold")
    rows = store_rows(catalog, instances, now)
    for row in rows:
        stores.add_row(*(Text(cell) for cell in row))  # as written: an error's "[/data/x]" is not markup
    if rows:
        console.print(stores)
    else:
        console.print("no stores yet (a topology creates them)")
    rest = Table(title="REST API (the web console is at each URL)", title_justify="left")
    rest.add_column("node")
    rest.add_column("url")
    for node, url in endpoint_rows(endpoints):
        rest.add_row(node, url)
    console.print(rest)
