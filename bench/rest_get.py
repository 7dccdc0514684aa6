"""Benchmark: GET /stores/{store}/get/{key} over HTTP, against two baselines measured in the same run.

    .venv/bin/python -m bench.rest_get [--keys 100000] [--concurrency 32,1] [--duration 10] [--rounds 2]

Loads N keys into a riqr store of 4 partitions on 2 query actors with a standby copy of each partition
(through the sink's delivery path, on a local Ray), with REST auth on (every request carries a bearer
token), then drives random-key GETs at fixed concurrencies for a fixed time. In the same run it measures:

* the ceiling: an aiohttp handler that answers a constant from inside a Ray actor (no routing, no hop);
* the minimal one-hop: an aiohttp handler in a Ray actor that looks the key up in another Ray actor
  holding a dict, through one coalesced call per batch (``runtime.coalesce``, one call in flight): the
  least any design that keeps state in other actors pays.

Two riqr targets: ``riqr``, the store read through its query actors (one Ray hop), and ``replica``, the
same keys in a store declared with ``read_replicas``, answered from the HTTP verticle's own copy (no hop;
``runtime.readreplica``), same auth, same standbys, fed by the same sink.

The load generator is wrk (Debian's package; ``apt-get install wrk``) when it is on PATH, with
``bench/wrk_get.lua`` picking keys and sending the token; else the Python client of ``bench/loadgen.py``,
which competes with the servers for the CPU (the output says which one ran). Rounds alternate the
targets so drift on a shared machine hits all of them; the figures are per-target medians over rounds.
The ratios riqr/ceiling and riqr/minimal-hop are the numbers to compare between runs and machines.

``--profile DIR`` also records the HTTP verticle and a query actor with py-spy during the first round of
the first concurrency of ``--profile-target`` (riqr or replica) (py-spy must be installed; it is not a riqr dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.loadgen import key_name

WRK_SCRIPT = Path(__file__).with_name("wrk_get.lua")
STAT_KEYS = ("rps", "p50_ms", "p99_ms", "errors", "cpu_us")
# The processes serving each target, by the title Ray gives an actor's worker: their CPU time over a run,
# per request, is less sensitive to the other load on a shared machine than the request rate.
PROCESSES = {
    "riqr": ("ray::HttpVerticle", "ray::QueryVerticle"),
    "replica": ("ray::HttpVerticle", "ray::QueryVerticle"),
    "minimal": ("ray::MinimalHop", "ray::DictHolder"),
    "ceiling": ("ray::BareHttp",),
}


async def serve_get(handler: Any) -> tuple[Any, int]:
    """An aiohttp server on a free port of 127.0.0.1 answering the GET-by-key route with ``handler`` (no
    access log, as the HTTP verticle); returns its runner (keep it, or the server stops) and port."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/stores/{store}/get/{key}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # noqa: SLF001


class BareHttp:
    """The ceiling: aiohttp in a Ray actor answering a constant, as riqr's HttpVerticle would."""

    async def start(self) -> int:
        from aiohttp import web

        async def handler(_request: web.Request) -> web.Response:
            return web.json_response({"response": 1})

        self._runner, port = await serve_get(handler)
        return int(port)


class DictHolder:
    """The minimal hop's state: a plain dict in a plain Ray actor."""

    def __init__(self, keys: int) -> None:
        self._values = {key_name(i): i for i in range(keys)}

    def get_many(self, keys: list[str]) -> list[int | None]:
        return [self._values.get(k) for k in keys]


class MinimalHop:
    """The minimal one-hop: aiohttp in a Ray actor, one coalesced Ray call to a ``DictHolder`` per batch."""

    def __init__(self, holder: Any) -> None:
        self._holder = holder

    async def start(self) -> int:
        from aiohttp import web

        from runtime.coalesce import Coalescer

        holder = self._holder

        async def send(keys: list[str]) -> list[int | None]:
            result: list[int | None] = await holder.get_many.remote(keys)
            return result

        batcher: Coalescer[str, int | None] = Coalescer(send, max_in_flight=1)

        async def handler(request: web.Request) -> web.Response:
            value = await batcher.submit(request.match_info["key"])
            if value is None:
                raise web.HTTPNotFound()
            return web.json_response({"response": value})

        self._runner, port = await serve_get(handler)
        return int(port)


def load_store(namespace: str, keys: int, standbys: int, name: str = "bench", read_replicas: bool = False) -> str:
    """Create store ``name`` and load ``keys`` keys through the sink's delivery path; with
    ``read_replicas``, wait until the HTTP verticle's replica answers (a batch must reach it after it was
    published, so empty batches follow until it does)."""
    import ray

    from runtime import raycalls
    from runtime.catalog import StoreSpec, ValueField
    from runtime.config import REGISTRY_NAME
    from runtime.ingest import PARTITION_COLUMN
    from runtime.keys import KeySchema
    from runtime.partitioner import partition_of
    from topologies.sink import BatchDelivery

    spec = StoreSpec(
        name,
        KeySchema("key", "string"),
        (ValueField("value", "bigint"),),
        partitions=4,
        actors=2,
        standbys=standbys,
        read_replicas=read_replicas,
    )
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
        print(f"  {name}: loaded {start + len(names):,}/{keys:,} keys", file=sys.stderr, flush=True)
    if read_replicas:
        from runtime.config import http_name
        from runtime.ingest import PARTITION_COLUMN as PART

        http = ray.get_actor(http_name(ray.get_runtime_context().get_node_id()), namespace=namespace)
        empty = pa.table({"key": pa.array([], pa.string()), "value": pa.array([], pa.int64()),
                          PART: pa.array([], pa.int32())})  # fmt: skip
        deadline = time.monotonic() + 120
        batch_id = keys // chunk + 1
        while not any(r["store"] == name and r["answers"] for r in ray.get(http.read_replicas.remote())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the read replica of {name} did not catch up in 120 s")
            delivery.deliver("bench", batch_id, empty)
            batch_id += 1
            time.sleep(0.2)
        print(f"  {name}: the HTTP verticle's read replica answers", file=sys.stderr, flush=True)
    return spec.name


def _split(url: str) -> tuple[str, str]:
    """``http://host:port/path/`` as (``http://host:port``, ``/path/``)."""
    scheme, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    return f"{scheme}://{host}", "/" + path


def drive_wrk(url: str, keys: int, concurrency: int, duration: float, token: str | None) -> dict[str, float]:
    base, prefix = _split(url)
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration:g}s", "--timeout", "15s", "-s", str(WRK_SCRIPT), base]
    out = subprocess.run([*command, "--", prefix, str(keys), token or ""], capture_output=True, text=True, check=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"wrk printed no result: {out.stdout}\n{out.stderr}")
    result: dict[str, float] = json.loads(lines[-1])
    return result


def drive_python(url: str, keys: int, concurrency: int, duration: float, token: str | None) -> dict[str, float]:
    command = [sys.executable, "-m", "bench.loadgen", "--url", url, "--keys", str(keys)]
    command += ["--concurrency", str(concurrency), "--duration", str(duration)]
    if token:
        command += ["--token", token]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def warm(url: str, keys: int, token: str | None, use_wrk: bool) -> None:
    """A short unmeasured run, so the first measured round does not pay for imports and first calls."""
    (drive_wrk if use_wrk else drive_python)(url, keys, 8, 1.0, token)


def cpu_seconds(titles: tuple[str, ...]) -> float:
    """User plus system CPU seconds used so far by the processes with these titles."""
    total = 0
    for title in titles:
        for pid in _pids(title):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def summarize(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in STAT_KEYS}


def _pids(title: str) -> list[int]:
    """Processes whose title starts with ``title`` (Ray names a worker after its actor class)."""
    out = subprocess.run(["pgrep", "-f", f"^{title}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def start_profiles(directory: Path, duration: float, target: str) -> list[subprocess.Popen[bytes]]:
    """py-spy records of the HTTP verticle and a query actor for ``duration`` seconds (speedscope JSON)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        print("  --profile: py-spy is not installed; not profiling", file=sys.stderr)
        return []
    directory.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, title in (("http", "ray::HttpVerticle"), ("query", "ray::QueryVerticle")):
        pids = _pids(title)
        if not pids:
            print(f"  --profile: no {title} process found", file=sys.stderr)
            continue
        out = directory / f"{target}-{name}.txt"
        command = [
            spy,
            "record",
            "-p",
            str(pids[-1]),
            "-d",
            str(int(duration)),
            "-r",
            "200",
            "-f",
            "raw",
            "--nonblocking",
        ]
        command += ["-o", str(out)]
        procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        print(f"  --profile: recording {title} (pid {pids[-1]}) into {out}", file=sys.stderr)
    return procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--concurrency", default="32,1", help="comma-separated connection counts")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--standbys", type=int, default=1, help="standby copies of each partition (failover)")
    parser.add_argument("--no-auth", action="store_true", help="measure riqr without bearer tokens")
    parser.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--targets", default="riqr,replica,minimal,ceiling")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy records into this directory")
    parser.add_argument(
        "--profile-target", default="riqr", choices=("riqr", "replica"), help="which one --profile records"
    )
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    chosen = args.targets.split(",")

    use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk") is not None)
    if args.loadgen == "wrk" and shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk)")
    drive = drive_wrk if use_wrk else drive_python
    loadgen = "wrk (1 thread)" if use_wrk else "bench/loadgen.py (a Python client: install wrk for better figures)"
    print(f"  load generator: {loadgen}", file=sys.stderr)

    import ray

    from runtime.auth import AuthConfig, generate_secret, mint_token
    from runtime.config import RuntimeConfig
    from verticles import deploy

    secret = generate_secret()
    auth = None if args.no_auth else AuthConfig(enabled=True, secret=secret)
    token = None if args.no_auth else mint_token(secret, stores=("bench", "bench-rr"))
    namespace = f"riqr-bench-{uuid.uuid4().hex[:8]}"
    # address="local": a cluster of its own, even if a stale /tmp/ray/ray_current_cluster names another
    ray.init(address="local", namespace=namespace, log_to_driver=False, include_dashboard=False)
    try:
        t0 = time.monotonic()
        deployment = deploy.up(
            RuntimeConfig(
                namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1", auth=auth
            )
        )
        store = load_store(namespace, args.keys, args.standbys)
        if "replica" in chosen:
            load_store(namespace, args.keys, args.standbys, "bench-rr", read_replicas=True)
        print(f"  riqr up and {args.keys:,} keys loaded in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        targets: dict[str, str] = {}
        if "riqr" in chosen:
            targets["riqr"] = f"{deployment.endpoints[0].url}/stores/{store}/get/"
        if "replica" in chosen:
            targets["replica"] = f"{deployment.endpoints[0].url}/stores/bench-rr/get/"
        if "minimal" in chosen:
            holder = ray.remote(DictHolder).options(num_cpus=0).remote(args.keys)
            hop = ray.remote(MinimalHop).options(num_cpus=0).remote(holder)
            targets["minimal"] = f"http://127.0.0.1:{ray.get(hop.start.remote())}/stores/bench/get/"
        if "ceiling" in chosen:
            bare = ray.remote(BareHttp).options(num_cpus=0).remote()
            targets["ceiling"] = f"http://127.0.0.1:{ray.get(bare.start.remote())}/stores/bench/get/"
        for url in targets.values():
            warm(url, args.keys, token, use_wrk)
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for c in concurrencies:
                for name, url in targets.items():
                    spies = []
                    if args.profile is not None and r == 0 and c == concurrencies[0] and name == args.profile_target:
                        spies = start_profiles(args.profile, args.duration, name)
                    cpu_before = cpu_seconds(PROCESSES[name])
                    result = drive(url, args.keys, c, args.duration, token)  # baselines ignore it
                    result["cpu_us"] = (cpu_seconds(PROCESSES[name]) - cpu_before) / max(1, result["requests"]) * 1e6
                    for spy in spies:
                        spy.wait()
                    results.setdefault((name, c), []).append(result)
                    shown = {k: round(v, 2) for k, v in result.items()}
                    print(f"  round {r + 1}/{args.rounds} c{c} {name}: {shown}", file=sys.stderr, flush=True)
        auth_text = "auth off" if args.no_auth else "auth on"
        print(
            f"\nGET by key over HTTP: {args.keys:,} keys, {args.standbys} standby per partition, {auth_text}, "
            f"{args.duration:g}s x {args.rounds} rounds (medians), load generator: {loadgen.split(' (')[0]}"
        )
        print(f"{'target':<10}{'conns':>6}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}{'CPU us/req':>12}")
        for c in concurrencies:
            summary = {name: summarize(results[(name, c)]) for name in targets}
            for name, s in summary.items():
                line = (
                    f"{name:<10}{c:>6}{s['rps']:>10.0f}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{s['errors']:>8.0f}"
                    f"{s['cpu_us']:>12.0f}"
                )
                print(line)
            for mine in ("riqr", "replica"):
                ours = summary.get(mine)
                for base in ("ceiling", "minimal"):
                    if ours is not None and base in summary:
                        b = summary[base]
                        print(
                            f"  c{c} {mine}/{base}: throughput {ours['rps'] / b['rps']:.2f}, "
                            f"p50 {ours['p50_ms'] / b['p50_ms']:.2f}x, p99 {ours['p99_ms'] / b['p99_ms']:.2f}x, "
                            f"CPU per request {ours['cpu_us'] / b['cpu_us']:.2f}x"
                        )
    finally:
        deploy.down(namespace)
        ray.shutdown()


if __name__ == "__main__":
    main()
