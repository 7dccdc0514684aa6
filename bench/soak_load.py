"""The soak's load (bench/soak.py), all in the bench's process: a producer of landing files, REST load over
aiohttp, churn (query actors killed, tokens minted) and a sampler of the cluster's processes. Each runs
until the soak's stop event; what it did is kept in its own object for the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import json
import os
import random
import subprocess
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.soak_cluster import BIN, NAMESPACE, Head, processes_under, sample_processes, say
from bench.soak_figures import Sample, judge_count, judge_status, sentinel_keys, stream_outcome

__all__ = ["Produced", "Producer", "RestLoad", "Churn", "Sampler"]

FOODS = ("pizza", "pasta", "sushi", "ramen", "tacos", "salad", "curry", "burger")
NAMES = ("john", "adam", "daniel", "james", "jack", "mathew", "will", "anna", "eve", "zoe")
HOT_KEYS = 2000  # most orders go to these keys; REST and driver reads too
COLD_KEYS = 10000  # the rest of the orders that are not for new keys, and the customers


@dataclass
class Produced:
    """What the producer wrote so far. ``orders`` is updated before each file lands, so a count above it
    is a wrong answer at any moment."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    orders: Counter[str] = field(default_factory=Counter)
    customers: int = 0
    late: int = 0
    files: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    sentinels: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def count(self, key: str) -> int:
        with self.lock:
            return self.orders[key]


def check_fraction(value: float, what: str = "") -> float:
    """``value`` if it is a fraction, 0 to 1 (nan fails both comparisons); else ``ValueError``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what + ' ' if what else ''}must be a fraction from 0 to 1, got {value}")
    return value


class Producer(threading.Thread):
    """Order records into ``home``'s landing files, one file a second at ``orders_per_s`` (a fraction
    ``new_keys`` of them, 8% by default, for new keys ``n<i>``, 90% of the rest among ``HOT_KEYS`` and the
    others among ``COLD_KEYS``; 0.2% of them a minute late), ``customers_per_s`` customer records as one file
    every 5 s, and every ``malformed_every`` seconds one line that is not JSON, as a
    file of its own in the order topic (a foreign writer's; both consumers of the topic dead-letter it).

    With ``new_keys`` 0 the stores' key counts are bounded by ``COLD_KEYS`` and level off as those are
    seen (at 250 orders/s, 25 cold draws a second: 82% of them seen in 10 minutes, 99% in 30; customers at
    10 a second slower, 83% in 30 minutes, 95% in 50): a run so tells a memory high-water mark that follows
    the stores' size from a leak, over its last half."""

    def __init__(
        self, home: Path, produced: Produced, stop: threading.Event, *, orders_per_s: int, customers_per_s: int,
        malformed_every: float, new_keys: float = 0.08, seed: int = 1,
    ) -> None:  # fmt: skip
        super().__init__(name="soak-producer", daemon=True)
        self.home, self.produced, self.stop = home, produced, stop
        self.orders_per_s, self.customers_per_s, self.malformed_every = orders_per_s, customers_per_s, malformed_every
        self.new_key_share = check_fraction(new_keys, "new_keys")
        self.rng = random.Random(seed)
        self.keys_made = 0  # new keys ``n<i>`` so far

    def run(self) -> None:
        started = time.monotonic()
        tick = 0
        while not self.stop.is_set():
            tick += 1
            try:
                self._orders()
                if tick % 5 == 0:
                    self._customers(self.customers_per_s * 5)
                if self.malformed_every > 0 and tick % max(1, round(self.malformed_every)) == 0:
                    self._malformed("order")
            except Exception as err:  # recorded; the producer goes on
                self.produced.errors.append(f"{type(err).__name__}: {err}"[:300])
            self.stop.wait(max(0.0, started + tick - time.monotonic()))

    def _orders(self) -> None:
        from runtime.landing import Record, write_records

        rng, now = self.rng, int(time.time() * 1000)
        records, late = [], 0
        for _ in range(self.orders_per_s):
            r = rng.random()
            if r < self.new_key_share:
                self.keys_made += 1
                key = f"n{self.keys_made}"
            else:
                hot = rng.random() < 0.9
                key = str(rng.randint(1, HOT_KEYS) if hot else rng.randint(1, COLD_KEYS))
            if rng.random() < 0.002:
                late += 1
                ts = now - 60_000
            else:
                ts = now - rng.randint(0, 500)
            records.append(Record(key, rng.choice(FOODS), ts))
        with self.produced.lock:  # counted before the file lands: no answer can be ahead of the ledger
            self.produced.orders.update(r.key for r in records if r.key is not None)
            self.produced.late += late
            self.produced.files += 1
        write_records(self.home, "order", records)

    def _customers(self, n: int) -> None:
        from runtime.landing import Record, write_records

        records = [Record(str(self.rng.randint(1, COLD_KEYS)), self.rng.choice(NAMES)) for _ in range(n)]
        write_records(self.home, "customer", records)
        with self.produced.lock:
            self.produced.customers += n
            self.produced.files += 1

    def _malformed(self, topic: str) -> None:
        """One line that is not JSON, landed as riqr's writer lands a file (hidden, then renamed)."""
        from runtime.landing import topic_dir

        directory = topic_dir(self.home, topic)
        name = f"{int(time.time() * 1000):015d}-{uuid.uuid4().hex[:12]}.json"
        (directory / f".{name}.tmp").write_text('{"key": "bad", "value": \n')
        os.replace(directory / f".{name}.tmp", directory / name)
        with self.produced.lock:
            self.produced.malformed[topic] += 1

    def finish(self, partitions: int) -> None:
        """After the producer stopped: one order and one customer for a key in each partition, the last
        files written: once a store shows them all it holds every file before them (a micro-batch takes
        every new file, oldest first)."""
        from runtime.landing import Record, write_records

        keys = sentinel_keys(partitions)
        with self.produced.lock:
            self.produced.orders.update(keys)
            self.produced.sentinels = keys
        write_records(self.home, "order", [Record(k, "last") for k in keys])
        write_records(self.home, "customer", [Record(k, "last") for k in keys])


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RestLoad:
    """REST requests over the main routes with aiohttp, ``concurrency`` loops at ``rate`` requests a second
    in all. Refused requests (no token, a bad token) and cut streams are part of the mix; each answer's
    outcome (a status, ``cut`` for a stream the client cut, or an exception's name) is counted per kind,
    and ``order-count`` lookups are judged against what was produced (``judge_count``)."""

    url: str
    tokens: list[str]
    produced: Produced
    rate: float
    concurrency: int
    windowed: bool
    outcomes: Counter[tuple[str, int | str]] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    async def run(self, seconds: float, stop: threading.Event) -> None:
        ends = time.monotonic() + seconds
        rng = random.Random(3)
        while time.monotonic() < ends and not stop.is_set():
            # A new session (new connections) every few minutes, as clients come and go.
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                segment = min(ends, time.monotonic() + rng.uniform(60, 240))
                await asyncio.gather(*(self._loop(session, i, segment, stop) for i in range(self.concurrency)))

    async def _loop(self, session: aiohttp.ClientSession, worker: int, ends: float, stop: threading.Event) -> None:
        rng = random.Random(100 + worker + int(time.monotonic()))
        seen: dict[str, int] = {}
        interval = self.concurrency / self.rate
        due = time.monotonic() + rng.uniform(0, interval)
        while time.monotonic() < ends and not stop.is_set():
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due += interval
            try:
                await self._one(session, rng, seen)
            except Exception as err:  # a bug of the load's own: said once, counted
                self.outcomes[("load-error", type(err).__name__)] += 1
                if self.outcomes[("load-error", type(err).__name__)] == 1:
                    say(f"REST load error: {err!r}")

    def _headers(self, rng: random.Random, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {rng.choice(self.tokens)}", **extra}

    def _count(self, kind: str, outcome: int | str, detail: str = "") -> None:
        self.outcomes[(kind, outcome)] += 1
        verdict = judge_status(kind, outcome)
        if verdict == "wrong":
            self.wrong.append(f"{kind}: {outcome} {detail}"[:300])
        elif verdict == "unexpected" and len(self.unexpected) < 50:
            self.unexpected.append(f"{kind}: {outcome} {detail}"[:300])

    async def _get(
        self, session: aiohttp.ClientSession, kind: str, path: str, headers: dict[str, str] | None,
        params: dict[str, str] | None = None,
    ) -> tuple[int | str, bytes]:  # fmt: skip
        try:
            async with session.get(self.url + path, headers=headers, params=params) as resp:
                body = await resp.read()
                self._count(kind, resp.status, f"{path} {body[:200]!r}")
                return resp.status, body
        except (TimeoutError, aiohttp.ClientError) as err:
            self._count(kind, type(err).__name__, path)
            return type(err).__name__, b""

    def _key(self, rng: random.Random) -> str:
        r = rng.random()
        if r < 0.8:
            return str(rng.randint(1, HOT_KEYS))
        return str(rng.randint(1, 12000)) if r < 0.9 else f"n{rng.randint(1, 20000)}"

    async def _one(self, session: aiohttp.ClientSession, rng: random.Random, seen: dict[str, int]) -> None:
        r, key, now = rng.random(), self._key(rng), time.time()
        h = self._headers(rng)
        if self.windowed and r >= 0.9:
            if r < 0.95:
                params = {"from": _iso(now - 600), "to": _iso(now)}
                await self._get(session, "windows", f"/stores/orders-per-minute/windows/{key}", h, params)
            else:
                await self._get(session, "sessions", f"/stores/order-sessions/sessions/{key}", h)
            return
        r = r / 0.9 if self.windowed else r
        if r < 0.40:
            await self._order_count(session, key, h, seen)
        elif r < 0.48:
            await self._get(session, "get-customer", f"/stores/customer-v1-changelog/get/{rng.randint(1, 10000)}", h)
        elif r < 0.52:
            lo = rng.randint(1, 9000)
            params = {"from": str(lo), "to": str(lo + 50)}
            await self._get(session, "range", "/stores/customer-v1-changelog/range", h, params)
        elif r < 0.54:
            await self._get(
                session, "prefix", f"/stores/order-count/prefix/n{rng.randint(1, 300)}", h, {"limit": "100"}
            )
        elif r < 0.58:
            await self._pages(session, rng, h)
        elif r < 0.61:
            await self._ndjson(
                session, "customer-v1-changelog", h, cut_at=rng.randint(5, 2000) if rng.random() < 0.5 else None
            )
        elif r < 0.62:
            await self._ndjson(session, "order-count", h, cut_at=rng.randint(5, 2000))
        elif r < 0.65:
            store = rng.choice(["order-count", "customer-v1-changelog"])
            await self._get(session, "count", f"/stores/{store}/approximate-num-entries", h)
        elif r < 0.67:
            await self._get(session, "stores", "/stores", h)
        elif r < 0.68:
            await self._get(session, "metadata", "/metadata", h)
        elif r < 0.71:
            await self._get(session, "meta-key", f"/metadata/stores/order-count/key/{key}", h)
        elif r < 0.72:
            await self._get(session, "metrics", "/metrics", h)
        elif r < 0.74:
            await self._get(session, "ready", "/ready", None)
        elif r < 0.75:
            await self._get(session, "health", "/health", None)
        elif r < 0.79:
            await self._get(session, "no-token", rng.choice(["/stores", f"/stores/order-count/get/{key}"]), None)
        elif r < 0.83:
            bad = {"Authorization": f"Bearer eyJhbGciOiJIUzI1NiJ9.e30.{rng.randint(0, 10**9)}"}
            await self._get(session, "bad-token", f"/stores/order-count/get/{key}", bad)
        elif r < 0.85:
            await self._get(session, "no-store", f"/stores/nostore-{rng.randint(0, 10**9)}/get/1", h)
        elif r < 0.87:
            params = rng.choice(
                [{"limit": "0"}, {"reverse": "maybe"}, {"limit": "abc"}, {"cursor": "x1", "limit": "5"}]
            )
            await self._get(session, "bad-param", "/stores/order-count/all", h, params)
        elif r < 0.89:
            await self._raw_cut(rng)
        else:
            path = f"/stores/order-count/get/{key}"
            await self._get(session, "get-msgpack", path, self._headers(rng, Accept="application/msgpack"))

    async def _order_count(
        self, session: aiohttp.ClientSession, key: str, headers: dict[str, str], seen: dict[str, int]
    ) -> None:
        status, body = await self._get(session, "get", f"/stores/order-count/get/{key}", headers)
        if status == 404 and seen.get(key):  # a count this client saw, gone: a restored copy missing data
            self.wrong.append(f"order-count/get/{key}: absent after {seen[key]}")
        if status != 200:
            return
        got = json.loads(body).get("response")
        why = judge_count(got, self.produced.count(key), seen.get(key))
        if why is not None:
            self.wrong.append(f"order-count/get/{key}: {why}")
        elif isinstance(got, int):
            seen[key] = got

    async def _pages(self, session: aiohttp.ClientSession, rng: random.Random, headers: dict[str, str]) -> None:
        store = rng.choice(["order-count", "customer-v1-changelog"])
        params = {"limit": "500"}
        for _ in range(rng.randint(1, 6)):
            status, body = await self._get(session, "page", f"/stores/{store}/all", headers, params)
            following = json.loads(body).get("next") if status == 200 else None
            if not following:
                return
            params = {"limit": "500", "cursor": following}

    async def _ndjson(
        self, session: aiohttp.ClientSession, store: str, headers: dict[str, str], cut_at: int | None
    ) -> None:
        kind = "ndjson" if cut_at is None else "ndjson-cut"
        try:
            async with session.get(
                f"{self.url}/stores/{store}/all", headers={**headers, "Accept": "application/x-ndjson"}
            ) as resp:
                lines, last = 0, None
                async for line in resp.content:
                    lines, last = lines + 1, line
                    if cut_at is not None and lines >= cut_at:
                        resp.close()  # the connection dropped mid-stream
                        self._count(kind, "cut")
                        return
                self._count(kind, stream_outcome(resp.status, last), f"{store}: {lines} lines")
        except (TimeoutError, aiohttp.ClientError) as err:
            self._count(kind, type(err).__name__, store)

    async def _raw_cut(self, rng: random.Random) -> None:
        """A connection cut by the client: after headers that never end, or after a whole request."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            if rng.random() < 0.5:
                writer.write(b"GET /stores/order-count/get/1 HTTP/1.1\r\nHost: x\r\n")
            else:
                token = rng.choice(self.tokens)
                writer.write(
                    f"GET /stores/order-count/all HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
                )
                await asyncio.wait_for(reader.read(100), 10)
            writer.close()
            self._count("raw-cut", "cut")
        except (TimeoutError, OSError) as err:
            self._count("raw-cut", type(err).__name__)


@dataclass
class Event:
    t: float
    what: str


class Churn(threading.Thread):
    """Every ``kill_every`` seconds from ``first_kill`` on, one query actor (from ``/metadata``, at random)
    killed, alternately by SIGKILL of its worker process (Ray restarts it) and ``ray.kill`` without
    restart (the registry creates it again); every ``token_every`` seconds a token minted with ``riqr
    token`` (a Ray driver each) and added to the REST load's tokens. Needs ``ray.init`` done."""

    def __init__(
        self, head: Head, tokens: list[str], stop: threading.Event, started: float, *, kill_every: float,
        first_kill: float, token_every: float,
    ) -> None:  # fmt: skip
        super().__init__(name="soak-churn", daemon=True)
        self.head, self.tokens, self.stop, self.started = head, tokens, stop, started
        self.kill_every, self.first_kill, self.token_every = kill_every, first_kill, token_every
        self.events: list[Event] = []
        self.kills: Counter[str] = Counter()
        self.errors: list[str] = []
        self.rng = random.Random(9)

    def run(self) -> None:
        next_kill = self.started + self.first_kill
        next_token = self.started + self.token_every
        while not self.stop.wait(1.0):
            now = time.monotonic()
            try:
                if self.kill_every > 0 and now >= next_kill:
                    next_kill += self.kill_every
                    self._kill()
                if self.token_every > 0 and now >= next_token:
                    next_token += self.token_every
                    self._mint()
            except Exception as err:  # recorded; churn goes on
                self.errors.append(f"{type(err).__name__}: {err}"[:300])

    def _kill(self) -> None:
        import signal

        import ray

        from bench.faults import worker_pid

        request = urllib.request.Request(f"{self.head.url}/metadata", headers=self.head.headers())
        with urllib.request.urlopen(request, timeout=30) as resp:
            actors = sorted({i["actor"] for i in json.loads(resp.read())["result"]})
        victim = self.rng.choice(actors)
        handle = ray.get_actor(victim, namespace=NAMESPACE)
        if sum(self.kills.values()) % 2 == 0:
            pid = worker_pid(handle)
            if pid not in processes_under(os.getpid()):  # the bench's own cluster's, or nothing
                raise RuntimeError(f"query actor {victim[:8]}'s pid {pid} is not this bench's: not killed")
            os.kill(pid, signal.SIGKILL)
            how = f"SIGKILL of query actor {victim[:8]} (pid {pid})"
            self.kills["SIGKILL"] += 1
        else:
            ray.kill(handle, no_restart=True)
            how = f"ray.kill(no_restart=True) of query actor {victim[:8]}"
            self.kills["ray.kill"] += 1
        self.events.append(Event(time.monotonic() - self.started, how))
        say(how)

    def _mint(self) -> None:
        n = len(self.events)
        done = subprocess.run(
            [str(BIN / "riqr"), "token", "--address", self.head.address, "--namespace", NAMESPACE, "--ttl", "7200",
             "--subject", f"soak-{n}"],
            capture_output=True, text=True, timeout=120, env=self.head.environment(), check=False,
        )  # fmt: skip
        token = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
        if not token:
            raise RuntimeError(f"riqr token exited {done.returncode}: {done.stderr[-300:]}")
        self.tokens.append(token)
        del self.tokens[1:-20]  # riqr up's token and the 20 newest
        self.events.append(Event(time.monotonic() - self.started, "token minted"))


class Sampler(threading.Thread):
    """Every ``every`` seconds, one look at every process of the cluster (``sample_processes``): kept, and
    appended to ``csv_path`` as ``t,pid,role,rss_kb,threads,fds``."""

    def __init__(self, csv_path: Path, stop: threading.Event, started: float, every: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.csv_path, self.stop, self.started, self.every = csv_path, stop, started, every
        self.samples: list[Sample] = []

    def run(self) -> None:
        with open(self.csv_path, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["t", "pid", "role", "rss_kb", "threads", "fds"])
            while True:
                self.look(writer)
                out.flush()
                if self.stop.wait(self.every):
                    self.look(writer)  # the last look, at the end of the load
                    return

    def look(self, writer: Any) -> None:
        t = round(time.monotonic() - self.started, 1)
        with contextlib.suppress(OSError):
            taken = sample_processes(t)
            self.samples.extend(taken)
            writer.writerows([s.t, s.pid, s.role, s.rss_kb, s.threads, s.fds] for s in taken)
