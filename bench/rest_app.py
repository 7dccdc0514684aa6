"""Benchmark: the CPU of riqr's REST app per GET by key, in one process, against bare aiohttp (no Ray).

    .venv/bin/python -m bench.rest_app [--requests 2000] [--rounds 8]

Feeds raw HTTP/1.1 requests (random keys, a bearer token) to aiohttp's own connection handler through a
transport that discards what it is given, so the whole request path runs (parser, router, riqr's request
pipeline, the handler, the response writer) without sockets or a load generator: on a shared 2-core
machine this is steadier than a request rate, and it isolates what riqr's code costs from the syscalls
both targets pay. Targets, in the same run:

* ``ceiling``: an aiohttp handler answering a constant (``bench.rest_get``'s ceiling);
* ``pipeline``: the same constant handler on riqr's route table behind riqr's request pipeline (auth on);
* ``riqr``: riqr's app (``runtime.rest.build_app``, auth on), the key answered from a read replica's
  ``QueryCore`` in the process, as the HTTP verticle does for a store with ``read_replicas``.

Prints microseconds per request (the minimum over rounds) and each as a ratio to the ceiling. Over HTTP
with wrk, ``bench.rest_get`` is the figure of record; this one says where its gap goes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import time
from typing import Any

import pyarrow as pa
from aiohttp import web

from bench.loadgen import key_name
from runtime.auth import AuthConfig, generate_secret, mint_token
from runtime.catalog import StoreSpec, ValueField
from runtime.facade import Facade
from runtime.ingest import PARTITION_COLUMN, split_by_partition
from runtime.keys import KeySchema
from runtime.monotonic import Span
from runtime.ownership import ActorInfo, ClusterView, Endpoint, plan_placement, table_from_placement
from runtime.partitioner import partition_of_bytes
from runtime.query import QueryCore
from runtime.registry import RegistryState
from runtime.rest import build_app, routes
from runtime.rest import handlers as h
from runtime.rest.server import start_runner

STORE = "bench"


class _Discard(asyncio.Transport):
    """A connection's transport that counts writes and keeps nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes += 1

    def writelines(self, data: Any) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 7400)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _OneView:
    """The bus as the facade sees it, for one store whose keys every lookup finds in ``_Replica``: a fixed
    view, an epoch that never moves, and no query actor ever asked."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    async def fetch_view(self) -> ClusterView:
        return self._view

    async def fetch_epoch(self) -> int:
        return 1

    async def wait_epoch(self, known: int, timeout: float) -> int:
        await asyncio.sleep(timeout)
        return 1

    def suspect(self, uuid: str) -> None:
        raise AssertionError("no query actor is asked in this benchmark")

    async def fetch_status(self) -> dict[str, Any]:
        return {"ingest": {}}

    def owner(self, uuid: str) -> Any:
        raise AssertionError("no query actor is asked in this benchmark")


class _Replica:
    """Every partition of the store in one ``QueryCore``, as a read replica holds it."""

    def __init__(self, core: QueryCore) -> None:
        self.core = core

    def get(self, store: str, partition: int, key: Any) -> tuple[bytes | None, Span] | None:
        return self.core.get_one(partition, key)


def store_facade(keys: int) -> Facade:
    value = (ValueField("value", "long"),)
    spec = StoreSpec(STORE, KeySchema("key", "string"), value, partitions=4, actors=2, standbys=0)
    state = RegistryState()
    state.register_endpoint(Endpoint("node-a", "127.0.0.1", 7400))
    plans = plan_placement(spec, ["node-a"])
    uuids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(len(plans))]
    table = table_from_placement(spec, uuids, plans)
    state.install(table, [ActorInfo(u, STORE, "node-a", "127.0.0.1", tuple(table.all_owners()[u])) for u in uuids])
    names = [key_name(i) for i in range(keys)]
    rows = pa.table(
        {
            "key": names,
            "value": pa.array(range(keys), pa.int64()),
            PARTITION_COLUMN: pa.array([partition_of_bytes(spec.key.canonical_bytes(k), 4) for k in names], pa.int32()),
        }
    )
    core = QueryCore(spec, list(range(spec.partitions)))
    core.begin("bench")
    core.apply("bench", 0, split_by_partition(rows, spec.partitions))
    return Facade(_OneView(state.view()), timeout=5.0, local=_Replica(core))  # type: ignore[arg-type]


def app_of(target: str, facade: Facade, auth: AuthConfig) -> web.Application:
    async def constant(_request: web.Request) -> web.Response:
        return web.json_response({"response": 1})

    if target == "ceiling":
        app = web.Application()
        app.router.add_get("/stores/{store}/get/{key}", constant)
        return app
    if target == "pipeline":  # riqr's routes and pipeline; the key route's handler answers the constant
        saved = routes.ROUTES
        import runtime.rest as rest

        rest.ROUTES = tuple(dataclasses.replace(r, handler=constant) if r.handler is h.get_key else r for r in saved)
        try:
            return build_app(facade, auth=auth)
        finally:
            rest.ROUTES = saved
    return build_app(facade, auth=auth)


async def measure(app: web.Application, requests: list[bytes], rounds: int) -> float:
    """Microseconds per request, the minimum over ``rounds`` passes of ``requests`` on one connection."""
    runner = await start_runner(app)
    try:
        protocol = runner.server()  # type: ignore[misc]
        transport = _Discard()
        protocol.connection_made(transport)
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            for raw in requests:
                before = transport.writes
                protocol.data_received(raw)
                while transport.writes == before:  # the handler runs as a task of the connection
                    await asyncio.sleep(0)
            best = min(best, (time.perf_counter() - started) / len(requests) * 1e6)
        transport.close()
        return best
    finally:
        await runner.cleanup()


async def run(keys: int, count: int, rounds: int) -> None:
    secret = generate_secret()
    auth = AuthConfig(enabled=True, secret=secret)
    token = mint_token(secret)
    facade = store_facade(keys)
    await facade.start()
    try:
        requests = [
            f"GET /stores/{STORE}/get/{key_name(random.randrange(keys))} HTTP/1.1\r\nHost: 127.0.0.1:7400\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
            for _ in range(count)
        ]
        figures = {t: await measure(app_of(t, facade, auth), requests, rounds) for t in ("ceiling", "pipeline", "riqr")}
    finally:
        await facade.stop()
    print(f"GET by key in one process: {count:,} requests x {rounds} rounds (minimum), auth on, {keys:,} keys")
    for target, us in figures.items():
        print(f"  {target:9s} {us:7.1f} us/GET   {us / figures['ceiling']:.2f}x the ceiling")
    print(f"  riqr's pipeline adds {figures['pipeline'] - figures['ceiling']:.1f} us, "
          f"its handler {figures['riqr'] - figures['pipeline']:.1f} us")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    import uvloop  # the HTTP verticle's loop (Ray runs async actors on uvloop)

    uvloop.run(run(args.keys, args.requests, args.rounds))


if __name__ == "__main__":
    main()
