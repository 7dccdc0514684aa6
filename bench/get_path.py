"""Benchmark: the CPU cost of pieces of a REST GET's path, in-process (no Ray, no HTTP).

    .venv/bin/python -m bench.get_path [--n 20000]

Prints microseconds per call for what a GET pays per request in the HTTP verticle: verifying a bearer
token against finding it in ``TokenCache``; waiting under an ``asyncio.timeout`` against the coalescer's
shared deadline timer; encoding the answer with the standard library's JSON against orjson (when it is
installed: riqr does not depend on it). Single calls in a loop, so the figures hold on a noisy machine
better than request rates do; docs/design.md ("Where a GET's time goes") says which changes they led to.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit

from runtime.auth import AuthConfig, TokenCache, authenticate, generate_secret, mint_token
from runtime.coalesce import Coalescer
from runtime.rest.render import encode_json


def _per_call(fn: object, n: int) -> float:
    return timeit.timeit(fn, number=n) / n * 1e6  # type: ignore[arg-type]


async def _waits(n: int) -> tuple[float, float]:
    """Microseconds per lookup through a coalescer whose owner answers at once: every waiter under its
    own ``asyncio.timeout`` (before), or with a deadline the coalescer's one timer watches (now)."""

    async def send(items: list[int]) -> list[int]:
        return items

    batcher: Coalescer[int, int] = Coalescer(send, max_in_flight=1)

    async def with_timeout() -> None:
        async with asyncio.timeout(10):
            await batcher.submit(1)

    async def with_deadline() -> None:
        await batcher.submit(1, time.monotonic() + 10)

    results = []
    for one in (with_timeout, with_deadline):
        started = time.perf_counter()
        for _ in range(n // 32):
            await asyncio.gather(*(one() for _ in range(32)))
        results.append((time.perf_counter() - started) / (n // 32 * 32) * 1e6)
    return results[0], results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    n = args.n

    secret = generate_secret()
    config = AuthConfig(enabled=True, secret=secret)
    header = "Bearer " + mint_token(secret, stores=("bench",))
    cache = TokenCache(config)
    print(f"verify a bearer token (pyjwt, HS256)   {_per_call(lambda: authenticate(config, header), n):8.2f} us")
    print(f"the same token from TokenCache         {_per_call(lambda: cache.authenticate(header), n):8.2f} us")

    timed, shared = asyncio.run(_waits(n))
    print(f"coalesced lookup, asyncio.timeout each {timed:8.2f} us")
    print(f"coalesced lookup, shared deadline timer{shared:8.2f} us")

    body = {"response": 12345}
    print(f"encode the answer, json (render.py)    {_per_call(lambda: encode_json(body), n):8.2f} us")
    try:
        import orjson
    except ImportError:
        print("encode the answer, orjson              (not installed)")
    else:
        print(f"encode the answer, orjson              {_per_call(lambda: orjson.dumps(body), n):8.2f} us")


if __name__ == "__main__":
    main()
