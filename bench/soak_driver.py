"""The soak's driver-API load (bench/soak.py), in a process of its own as an in-cluster caller's would be:

    python -m bench.soak_driver --address 127.0.0.1:6379 --until 1796000000 --rate 5 [--windowed]

``runtime.connect`` joins the cluster and calls, one at a time at about ``--rate`` calls a second, a mix of
gets (one hop to the owner), lookups, ranges, pages, iterations (some abandoned part-way), counts, owners,
replicas, the catalog and metadata, batches of async gets, an unknown store, and window and session
queries. It stops at ``--until`` (Unix time: the soak's load ends then, whenever this process got
going) or on SIGTERM, and prints ``RESULT {json}``: the outcome counts so far per call kind (``ok``,
``KeyNotFound``, or the exception's class name), every 30 s and at the end (the last one is the total).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["Calls", "main"]


def hot_key(rng: random.Random) -> str:
    """A key as the producer writes them: mostly its hot keys, some of its new ``n<i>`` keys."""
    return str(rng.randint(1, 2000)) if rng.random() < 0.85 else f"n{rng.randint(1, 20000)}"


class Calls:
    """The call mix against one client (``runtime.Client``), drawn with ``rng``."""

    def __init__(self, client: Any, rng: random.Random, windowed: bool) -> None:
        self.client, self.rng, self.windowed = client, rng, windowed
        self.orders = client.store("order-count")
        self.customers = client.store("customer-v1-changelog")

    def pick(self) -> tuple[str, Callable[[], Any]]:
        rng, oc, cu = self.rng, self.orders, self.customers
        r = rng.random()
        if self.windowed and r >= 0.88:
            now = dt.datetime.now(dt.UTC)
            win, ses = self.client.store("orders-per-minute"), self.client.store("order-sessions")
            if r < 0.94:
                return "windows", lambda: win.windows(hot_key(rng), now - dt.timedelta(minutes=10), now)
            if r < 0.97:
                return "sessions", lambda: ses.sessions(hot_key(rng))
            return "find_sessions", lambda: ses.find_sessions(hot_key(rng), now - dt.timedelta(minutes=15), now)
        r = r / 0.88 if self.windowed else r
        if r < 0.35:
            return "get", lambda: oc.get(hot_key(rng))
        if r < 0.45:
            return "lookup", lambda: cu.lookup(str(rng.randint(1, 10000)))
        if r < 0.50:
            lo = rng.randint(1, 9000)
            return "range", lambda: cu.range(str(lo), str(lo + 50))
        if r < 0.55:
            return "page", lambda: oc.page(200)
        if r < 0.60:
            return "iterate", self._iterate
        if r < 0.64:
            return "count", oc.approximate_num_entries
        if r < 0.68:
            return "stores", self.client.stores
        if r < 0.71:
            return "metadata", self.client.metadata
        if r < 0.76:
            return "owner", lambda: oc.owner(hot_key(rng))
        if r < 0.79:
            return "replicas", oc.replicas
        if r < 0.92:
            return "get_async", self._many
        if r < 0.96:
            return "all-customers", cu.all
        return "unknown-store", lambda: self.client.store(f"nostore-{rng.randint(0, 10**9)}").get("1")

    def _iterate(self) -> None:
        stop_after = self.rng.randint(10, 3000)  # most are abandoned part-way, as a caller's loop breaks
        for n, _ in enumerate(self.orders.iterate(page_size=500)):
            if n >= stop_after:
                break

    def _many(self) -> None:
        async def gather() -> list[Any]:
            keys = [hot_key(self.rng) for _ in range(20)]
            return await asyncio.gather(*(self.orders.get_async(k) for k in keys), return_exceptions=True)

        # The batch counts as its first failure, honest (an owner killed) or not: counted as ok, an honest
        # one went unseen.
        for outcome in asyncio.run(gather()):
            if isinstance(outcome, Exception) and type(outcome).__name__ != "KeyNotFound":
                raise outcome


def run(address: str, until: float, rate: float, windowed: bool) -> Counter[str]:
    """Call until ``until`` (Unix time) or SIGTERM; the outcome counts as ``kind:outcome``."""
    import runtime
    from runtime.errors import KeyNotFound

    client = runtime.connect(address=address)
    # After joining Ray, whose driver installs a SIGTERM handler of its own (one that exits at once).
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    calls = Calls(client, random.Random(5), windowed)
    counts: Counter[str] = Counter()
    due = said = time.monotonic()
    while not stop.is_set() and time.time() < until:
        kind, call = calls.pick()
        try:
            call()
            outcome = "ok"
        except KeyNotFound:
            outcome = "KeyNotFound"
        except Exception as err:  # counted by class: the soak judges them
            outcome = type(err).__name__
        counts[f"{kind}:{outcome}"] += 1
        if time.monotonic() - said >= 30:
            said = time.monotonic()
            print("RESULT " + json.dumps(dict(counts)), flush=True)
        due += 1.0 / rate
        stop.wait(max(0.0, due - time.monotonic()))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the Ray cluster (GCS address)")
    parser.add_argument("--until", type=float, required=True, help="when to stop (Unix time)")
    parser.add_argument("--rate", type=float, default=5.0, help="calls a second")
    parser.add_argument("--windowed", action="store_true", help="the windowed stores exist: query them too")
    args = parser.parse_args()
    counts = run(args.address, args.until, args.rate, args.windowed)
    print("RESULT " + json.dumps(dict(counts)), flush=True)


if __name__ == "__main__":
    main()
