"""Benchmark: the Python driver API's key lookup against a raw Ray actor call, in one run.

    .venv/bin/python -m bench.driver_api [--keys 100000] [--concurrency 32] [--duration 5] [--rounds 3]

Deploys riqr on a local Ray, loads N keys into a store of 4 partitions on 2 query actors (the sink's
delivery path), and starts a trivial actor holding the same keys in a dict: the baseline, one raw Ray
actor call per lookup. Then it measures, for the same random keys:

* ``raw``: ``actor.get.remote(key)`` on the dict actor (the baseline, 1.00);
* ``facade``: the two-hop path (caller, facade verticle, query actor), ``Client.call("get", KeyQuery)``,
  which was ``Store.get`` before the driver API went direct;
* ``driver``: ``Store.get`` / ``Store.get_async`` as the client does it now.

Each in three shapes: sequential sync calls from one thread; ``--concurrency`` concurrent async calls
(tasks on one event loop, ``get_async``; for ``raw``, awaiting the object refs); and ``--concurrency``
threads making sync calls (as Spark driver code or a thread pool would). Rounds alternate the targets
so the machine's drift hits all of them; figures are medians over rounds, and each is printed as a ratio
to ``raw`` in the same shape, then as the median of each round's own ratio (paired: robust to drift
between rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from bench.loadgen import key_name
from bench.rest_get import load_store

SHAPES = ("sequential", "async", "threads")
TARGETS = ("raw", "facade", "driver")


class DictActor:
    """The baseline: a plain actor answering lookups from a dict."""

    def __init__(self, keys: int) -> None:
        self._values = {key_name(i): i for i in range(keys)}

    def get(self, key: str) -> int | None:
        return self._values.get(key)


def _sequential(call: Callable[[str], Any], keys: int, duration: float) -> float:
    rng = random.Random(1)
    done = 0
    end = time.perf_counter() + duration
    start = time.perf_counter()
    while time.perf_counter() < end:
        for _ in range(50):
            call(key_name(rng.randrange(keys)))
        done += 50
    return done / (time.perf_counter() - start)


def _threads(call: Callable[[str], Any], keys: int, duration: float, concurrency: int) -> float:
    counts = [0] * concurrency
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            while not stop.is_set():
                call(key_name(rng.randrange(keys)))
                counts[i] += 1
        except BaseException as exc:  # reported below: a benchmark that fails must say so
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(duration)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - start)


def _async(call: Callable[[str], Awaitable[Any]], keys: int, duration: float, concurrency: int) -> float:
    async def run() -> float:
        counts = [0] * concurrency
        end = time.perf_counter() + duration

        async def worker(i: int) -> None:
            rng = random.Random(i)
            while time.perf_counter() < end:
                await call(key_name(rng.randrange(keys)))
                counts[i] += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return sum(counts) / (time.perf_counter() - start)

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]

    import ray

    import runtime
    from runtime.client import close_in_process_facades
    from runtime.config import RuntimeConfig
    from runtime.queries import KeyQuery
    from verticles import deploy

    namespace = f"riqr-bench-{uuid.uuid4().hex[:8]}"
    ray.init(address="local", namespace=namespace, log_to_driver=False, include_dashboard=False)
    try:
        t0 = time.monotonic()
        deploy.up(RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1"))
        store_name = load_store(namespace, args.keys, standbys=1)  # failover on, as measured for REST
        baseline = ray.remote(DictActor).options(num_cpus=0).remote(args.keys)
        ray.get(baseline.get.remote(key_name(0)))
        client = runtime.connect(namespace)
        store = client.store(store_name)
        assert store.get(key_name(7)) == 7 and ray.get(baseline.get.remote(key_name(7))) == 7
        print(f"  riqr up and {args.keys:,} keys loaded in {time.monotonic() - t0:.1f}s", file=sys.stderr)

        def raw(key: str) -> Any:
            return ray.get(baseline.get.remote(key))

        async def raw_async(key: str) -> Any:
            return await baseline.get.remote(key)

        def facade(key: str) -> Any:
            return client.call("get", KeyQuery(store_name, key))

        async def facade_async(key: str) -> Any:
            return await client.call_async("get", KeyQuery(store_name, key))

        sync_calls: dict[str, Callable[[str], Any]] = {"raw": raw, "facade": facade, "driver": store.get}
        async_calls: dict[str, Callable[[str], Awaitable[Any]]] = {
            "raw": raw_async,
            "facade": facade_async,
            "driver": store.get_async,
        }

        def measure(target: str, shape: str) -> float:
            if shape == "sequential":
                return _sequential(sync_calls[target], args.keys, args.duration)
            if shape == "threads":
                return _threads(sync_calls[target], args.keys, args.duration, args.concurrency)
            return _async(async_calls[target], args.keys, args.duration, args.concurrency)

        for target in TARGETS:  # warm every path once (connections, the view)
            sync_calls[target](key_name(1))
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for shape in shapes:
                for target in TARGETS:
                    rate = measure(target, shape)
                    results.setdefault((target, shape), []).append(rate)
                    print(f"  round {r + 1}/{args.rounds} {shape:<10} {target:<7} {rate:>9.0f}/s", file=sys.stderr)
        print(
            f"\nDriver API get by key: {args.keys:,} keys, concurrency {args.concurrency}, "
            f"{args.duration:g}s x {args.rounds} rounds (medians, calls/s; ratio to raw in the same shape)"
        )
        print(f"{'target':<8}" + "".join(f"{s:>14}{'ratio':>7}" for s in shapes))
        for target in TARGETS:
            row = f"{target:<8}"
            for shape in shapes:
                rate = statistics.median(results[(target, shape)])
                base = statistics.median(results[("raw", shape)])
                row += f"{rate:>14,.0f}{rate / base:>7.2f}"
            print(row)
        # Each round measures every target back to back, so a round's own ratio cancels the machine's drift
        # between rounds, which the ratio of the medians above does not.
        print("paired: the median over rounds of each round's target/raw")
        for target in TARGETS[1:]:
            paired = [
                statistics.median(t / b for t, b in zip(results[(target, shape)], results[("raw", shape)]))
                for shape in shapes
            ]
            print(f"{target:<8}" + "".join(f"{'':>14}{ratio:>7.2f}" for ratio in paired))
    finally:
        close_in_process_facades()  # before the registry goes: its long poll would warn it died
        deploy.down(namespace)
        ray.shutdown()


if __name__ == "__main__":
    main()
