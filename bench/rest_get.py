"""Benchmark: GET /stores/{store}/get/{key} over HTTP, against a bare aiohttp handler in a Ray actor.

    .venv/bin/python -m bench.rest_get [--keys 100000] [--concurrency 32] [--duration 10] [--rounds 2]

Loads N keys into a riqr store (through the sink's delivery path, on a local Ray), then drives random
GETs from a separate load-generator process at a fixed concurrency for a fixed time. In the same run it
measures the ceiling: an aiohttp handler that answers a constant from inside a Ray actor, with no
routing and no actor hop. Rounds alternate riqr and ceiling so drift on a shared machine hits both;
the figures reported are the per-target medians over rounds. The ratio riqr/ceiling is the number to
compare between runs and machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid

import pyarrow as pa

from bench.loadgen import key_name


class BareHttp:
    """The ceiling: aiohttp in a Ray actor answering a constant, as riqr's HttpVerticle would."""

    async def start(self) -> int:
        from aiohttp import web

        async def handler(_request: web.Request) -> web.Response:
            return web.json_response({"response": 1})

        app = web.Application()
        app.router.add_get("/stores/{store}/get/{key}", handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # noqa: SLF001


def load_store(namespace: str, keys: int) -> str:
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from runtime.partitioner import partition_of
    from topologies.sink import BatchDelivery

    spec = StoreSpec("bench", KeySchema("key", "string"), (ValueField("value", "bigint"),), partitions=4, actors=2)
    raycalls.get(ray.get_actor(REGISTRY_NAME, namespace=namespace).create_store.remote(spec), "create_store")
    delivery = BatchDelivery(spec, namespace, checkpoint="unused")
    chunk = 20_000
    for batch_id, start in enumerate(range(0, keys, chunk)):
        names = [key_name(i) for i in range(start, min(keys, start + chunk))]
        table = pa.table(
            {
                "key": names,
                "value": list(range(start, start + len(names))),
                PARTITION_COLUMN: pa.array([partition_of(spec.key.type, k, 4) for k in names], pa.int32()),
            }
        )
        delivery.deliver("bench", batch_id, table)
        print(f"  loaded {start + len(names):,}/{keys:,} keys", file=sys.stderr, flush=True)
    return spec.name


def drive(url: str, args: argparse.Namespace) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.loadgen",
            "--url",
            url,
            "--keys",
            str(args.keys),
            "--concurrency",
            str(args.concurrency),
            "--duration",
            str(args.duration),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms", "errors")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import ray

    from runtime.config import RuntimeConfig
    from verticles import deploy

    namespace = f"riqr-bench-{uuid.uuid4().hex[:8]}"
    ray.init(namespace=namespace, log_to_driver=False, include_dashboard=False)
    try:
        t0 = time.monotonic()
        deployment = deploy.up(
            RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1")
        )
        store = load_store(namespace, args.keys)
        print(f"  riqr up and {args.keys:,} keys loaded in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        bare = ray.remote(BareHttp).options(num_cpus=0).remote()
        bare_port = ray.get(bare.start.remote())
        targets = {
            "riqr": f"{deployment.endpoints[0].url}/stores/{store}/get/",
            "ceiling": f"http://127.0.0.1:{bare_port}/stores/bench/get/",
        }
        results: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        for r in range(args.rounds):
            for name, url in targets.items():
                results[name].append(drive(url, args))
                print(f"  round {r + 1}/{args.rounds} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
        riqr, ceiling = summarize(results["riqr"]), summarize(results["ceiling"])
        print(
            f"\nGET by key over HTTP: {args.keys:,} keys, concurrency {args.concurrency}, "
            f"{args.duration:g}s x {args.rounds} rounds (medians)"
        )
        print(f"{'target':<10}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
        for name, s in (("riqr", riqr), ("ceiling", ceiling)):
            print(f"{name:<10}{s['rps']:>10.0f}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{s['errors']:>8.0f}")
        print(
            f"ratio riqr/ceiling: throughput {riqr['rps'] / ceiling['rps']:.2f}, "
            f"p99 {riqr['p99_ms'] / ceiling['p99_ms']:.2f}x"
        )
    finally:
        deploy.down(namespace)
        ray.shutdown()


if __name__ == "__main__":
    main()
