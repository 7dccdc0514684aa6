"""In-process fakes of the bus: the registry and query actors as plain objects (unit tests only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from runtime.catalog import StoreSpec, ValueField
from runtime.engines import Position
from runtime.errors import OwnerUnavailable
from runtime.ingest import PARTITION_COLUMN, WINDOW_END_COLUMN, slices_for_owners, split_by_partition
from runtime.keys import KeySchema
from runtime.monotonic import Spans
from runtime.ownership import ActorInfo, ClusterView, Endpoint, plan_placement, table_from_placement
from runtime.pages import PackedPage
from runtime.partitioner import partition_of_bytes
from runtime.query import QueryCore
from runtime.registry import RegistryState
from runtime.scan import Scan
from runtime.snapshots import SnapshotOffer


def kv_spec(
    name: str = "s",
    key_type: str = "string",
    partitions: int = 4,
    actors: int = 2,
    rest: tuple[tuple[str, str], ...] = (),
    standbys: int | None = 0,
) -> StoreSpec:
    return StoreSpec(
        name,
        KeySchema("key", key_type, rest),
        (ValueField("value", "string"),),
        partitions=partitions,
        actors=actors,
        standbys=standbys,
    )


class FakeOwner:
    """A query actor in-process, with switches to fail or stall."""

    def __init__(self, core: QueryCore) -> None:
        self.core = core
        self.calls: list[str] = []
        self.down = False
        self.stall = 0.0
        self.hung = False  # pings get no answer either (a stall alone is a busy owner, which answers them)
        self.down_after: int | None = None  # goes down once it has answered this many calls

    async def _enter(self, name: str) -> None:
        self.calls.append(name)
        await asyncio.sleep(self.stall)
        if self.down_after is not None and len(self.calls) > self.down_after:
            self.down = True
        if self.down:
            raise OwnerUnavailable("fake owner is down", retry_after=1)

    async def get_many(self, items: list[tuple[int, Any]]) -> tuple[Sequence[bytes | None], Spans]:
        await self._enter("get_many")
        return self.core.get_many(items)

    async def scan(
        self, partitions: Sequence[int], scan: Scan, limit: int | None
    ) -> tuple[Sequence[tuple[Any, bytes]], Spans]:
        await self._enter("scan")
        return self.core.scan(partitions, scan, limit)

    async def scan_packed(
        self, partitions: Sequence[int], scan: Scan, limit: int | None, max_bytes: int, fmt: str
    ) -> tuple[PackedPage, Spans]:
        await self._enter("scan")
        return self.core.scan_packed(partitions, scan, limit, max_bytes, fmt)

    async def count(self, partitions: Sequence[int]) -> tuple[int, Spans]:
        await self._enter("count")
        return self.core.count(partitions)

    async def positions(self) -> dict[int, dict[str, Any]]:
        await self._enter("positions")
        return self.core.positions()

    async def stats(self) -> dict[str, Any]:
        await self._enter("stats")
        return self.core.stats()

    async def ping(self) -> bool:
        """Answers at once unless the owner is ``down`` or ``hung`` (a stall alone is a busy owner)."""
        self.calls.append("ping")
        if self.hung:
            await asyncio.sleep(3600)
        if self.down:
            raise OwnerUnavailable("fake owner is down", retry_after=1)
        return True


class FakeBus:
    """A registry and its query actors, in-process. ``load`` feeds a store like the sink does."""

    def __init__(self) -> None:
        self.state = RegistryState()
        self.owners: dict[str, FakeOwner] = {}
        self.view_fetches = 0
        self.suspected: list[str] = []
        self.ingest: dict[str, dict[str, Any]] = {}
        self._next = 0
        # HTTP verticles' read replicas by actor name (``runtime.readreplica.ReadReplicas``), fed by ``load``.
        self.reader_hosts: dict[str, Any] = {}
        self.state.register_endpoint(Endpoint("node-a", "host-a", 7400))

    def create_store(self, spec: StoreSpec) -> None:
        nodes = ["node-a", "node-b"]
        spec = spec.with_standbys_for(len(nodes))  # as the registry does
        plans = plan_placement(spec, nodes)
        uuids = []
        for _ in plans:
            self._next += 1
            uuids.append(f"00000000-0000-4000-8000-{self._next:012d}")
        table = table_from_placement(spec, uuids, plans)
        holdings = table.all_owners()
        infos = []
        for uuid, plan in zip(uuids, plans):
            core = QueryCore(spec, holdings[uuid])
            core.begin("q")  # as the sink does when its query starts from an empty checkpoint
            self.owners[uuid] = FakeOwner(core)
            infos.append(ActorInfo(uuid, spec.name, plan.node_id or "node-a", "10.0.0.1", tuple(holdings[uuid])))
        self.state.install(table, infos)

    def load(
        self, store: str, rows: dict[Any, Any], batch_id: int = 0, source: str = "q", role: str | None = None
    ) -> None:
        """Feed ``rows`` (external keys: tuples for composite keys) as one batch, like the sink would; to
        the copies in one ``role`` only when given (``"standby"``: a delivery caught halfway). Read
        replicas get it with the standbys."""
        view = self.state.view()
        table = view.tables[store]
        spec = table.spec
        keys = list(rows)
        columns: dict[str, Any] = {}
        for i, (name, key_type) in enumerate(spec.key.columns):
            values = [k[i] if spec.key.composite else k for k in keys]
            columns[name] = pa.array(values, pa.timestamp("us", tz="UTC")) if key_type.kind == "timestamp" else values
        internal = [spec.key.coerce(k) for k in keys]
        arrow = pa.table(
            {
                **columns,
                spec.value_fields[0].name: [rows[k] for k in keys],
                PARTITION_COLUMN: pa.array(
                    [partition_of_bytes(spec.key.canonical_bytes(k), spec.partitions) for k in internal], pa.int32()
                ),
            }
        )
        split = split_by_partition(arrow, spec.partitions)
        if role in (None, "standby"):
            for reader in view.readers_of(store):
                host = self.reader_hosts.get(reader.actor)  # none: it misses the batch (a test's gap)
                if host is not None:
                    host.apply(reader.uuid, source, batch_id, {p: split.get(p) for p in range(spec.partitions)})
        for uuid, slices in slices_for_owners(table, split, role).items():
            self.owners[uuid].core.apply(source, batch_id, slices)

    async def fetch_view(self) -> ClusterView:
        self.view_fetches += 1
        return self.state.view()

    async def fetch_epoch(self) -> int:
        return self.state.epoch

    async def wait_epoch(self, known: int, timeout: float) -> int:
        """The registry's long poll: yields to the loop until the epoch moves or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while self.state.epoch == known and loop.time() < until:
            await asyncio.sleep(0.001)
        return self.state.epoch

    def suspect(self, uuid: str) -> None:
        self.suspected.append(uuid)

    async def fetch_status(self) -> dict[str, Any]:
        return {"ingest": dict(self.ingest)}

    def owner(self, uuid: str) -> FakeOwner:
        return self.owners[uuid]


async def eventually(condition: Any, timeout: float = 5.0, what: str = "condition") -> None:
    """Yield to the event loop until ``condition()`` holds, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.001)


def windowed_spec(name: str, kind: str = "window") -> StoreSpec:
    """A window or session store keyed by a string user key, as ``materialize(kind=...)`` makes it."""
    return StoreSpec(
        name,
        KeySchema("user", "string", (("window_start", "timestamp"),)),
        (ValueField("count", "bigint"),),
        kind=kind,
    )


def load_windowed(bus: FakeBus, store: str, entries: list[tuple[str, Any, Any, Any]], batch_id: int = 0) -> None:
    """Feed ``(user, start, end, value)`` windows (datetimes) to a windowed store, like the sink would;
    ``user`` is a tuple for a store whose key has several user columns."""
    spec = bus.state.view().tables[store].spec
    users = [e[0] if isinstance(e[0], tuple) else (e[0],) for e in entries]
    columns = spec.key.columns[: spec.user_key_columns]
    arrow = pa.table(
        {
            **{name: [u[i] for u in users] for i, (name, _) in enumerate(columns)},
            "window_start": pa.array([e[1] for e in entries], pa.timestamp("us", tz="UTC")),
            "count": pa.array([e[3] for e in entries], pa.int64()),
            WINDOW_END_COLUMN: pa.array([e[2] for e in entries], pa.timestamp("us", tz="UTC")),
            PARTITION_COLUMN: pa.array(
                [partition_of_bytes(spec.key.type.canonical_bytes(u[0]), spec.partitions) for u in users], pa.int32()
            ),
        }
    )
    table = bus.state.view().tables[store]
    for uuid, slices in slices_for_owners(table, split_by_partition(arrow, spec.partitions)).items():
        bus.owners[uuid].core.apply("q", batch_id, slices)


class Peer:
    """A ``SnapshotPeer`` over a core; ``during_copy`` runs before the first chunk of each copy."""

    def __init__(self, core: QueryCore) -> None:
        self.core = core
        self.opens = 0
        self.during_copy: Callable[[], None] = lambda: None
        self._reads = 0

    def open_snapshot(self, partition: int, at_least: Position | None = None) -> SnapshotOffer:
        self.opens += 1
        self._reads = 0
        return self.core.open_snapshot(partition, at_least)

    def read_snapshot(self, token: str, path: str, offset: int, length: int) -> bytes:
        self._reads += 1
        if self._reads == 1:
            self.during_copy()
        return self.core.read_snapshot(token, path, offset, length)

    def close_snapshot(self, token: str) -> None:
        self.core.close_snapshot(token)
