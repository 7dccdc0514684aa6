"""HTTP load generator for the benchmarks: a fixed number of concurrent GET loops for a fixed time.

Run as its own process so the client does not share an interpreter with the server it measures:

    python -m bench.loadgen --url http://127.0.0.1:7400/stores/s/get/ --keys 100000 --concurrency 32 --duration 10

``--token`` sends ``Authorization: Bearer <token>``. Prints one JSON line: requests, errors, req/s, p50 and
p99 latency in milliseconds. ``bench.rest_get`` uses it only when wrk is not installed: a Python client
competes with the server for the CPU, so its figures are lower than wrk's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import aiohttp


def key_name(i: int) -> str:
    """The keys the benchmarks load: k0000000 ... (fixed width, so key order is numeric order)."""
    return f"k{i:07d}"


async def _worker(
    session: aiohttp.ClientSession, url: str, keys: int, stop_at: float, out: list[float], errors: list[int], seed: int
) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        async with session.get(url + key_name(rng.randrange(keys))) as resp:
            await resp.read()
            if resp.status != 200:
                errors.append(resp.status)
        out.append(time.perf_counter() - started)


async def run(
    url: str, keys: int, concurrency: int, duration: float, warmup: float, token: str | None = None
) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        if warmup > 0:
            await asyncio.gather(
                *(_worker(session, url, keys, time.perf_counter() + warmup, [], [], -i) for i in range(concurrency))
            )
        latencies: list[float] = []
        errors: list[int] = []
        started = time.perf_counter()
        stop_at = started + duration
        await asyncio.gather(*(_worker(session, url, keys, stop_at, latencies, errors, i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "errors": len(errors),
        "rps": n / elapsed,
        "p50_ms": latencies[n // 2] * 1000 if n else float("nan"),
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="URL prefix; the key name is appended")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--token", default=None, help="a bearer token to send")
    args = parser.parse_args()
    result = asyncio.run(run(args.url, args.keys, args.concurrency, args.duration, args.warmup, args.token))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
