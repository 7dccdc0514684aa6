"""Benchmark: how long `riqr demo` takes to be ready, step by step, against the floor of its two engines.

    .venv/bin/python -m bench.startup [--rounds 3] [--port 7480]

Each round runs, one after the other:

* the floor: a fresh Python that does a bare ``ray.init()`` and then a bare
  ``SparkSession.builder.master("local[*]").getOrCreate()``, nothing else (what any program that uses both
  pays, started in sequence);
* the real ``riqr demo`` (the command ``./scripts/demo`` runs), in a scratch home, until it is ready as a
  user sees it: ``GET /ready`` answers 200 and the seed-000 queries answer with the seed's data over REST,
  with the bearer token the demo prints.

It prints each step the demo reports (its own ``done in`` lines, with when each ended), the demo's time to
ready, the floor's, and their ratio; then the medians over rounds. A round whose demo had no class archive
for Spark's JVM yet (the first run on a machine writes it when it stops) is marked cold: "warm", the
figure issue 11 asks for, is every later round. The ratio is the figure to compare
between runs and machines (docs/benchmarks.md). Run it with nothing else starting Ray or Spark (the
integration tests take /tmp/riqr-ray-spark.lock for that: ``flock /tmp/riqr-ray-spark.lock python -m
bench.startup``). Every process a round starts is gone before the next one begins.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak_cluster import alive, processes_under

FLOOR = """
import json, time
t0 = time.monotonic()
import ray
ray.init(address="local", log_to_driver=False)  # its own cluster, as riqr demo
t1 = time.monotonic()
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[*]").getOrCreate()
t2 = time.monotonic()
print(json.dumps({"ray.init()": t1 - t0, "SparkSession": t2 - t1}), flush=True)
spark.stop()
ray.shutdown()
"""

STEP_LINE = re.compile(r"^\[riqr demo\] (?P<what>.+): done in (?P<seconds>[0-9.]+)s$")
TOKEN_LINE = re.compile(r"^\s*TOKEN=(?P<token>\S+)\s*$")


@dataclass
class Round:
    floor_parts: dict[str, float] = field(default_factory=dict)
    floor: float = 0.0
    steps: list[tuple[str, float, float]] = field(default_factory=list)  # what, seconds, ended at
    demo_says_ready: float = 0.0
    cold: bool = False  # the demo had no class archive for Spark's JVM yet
    ready: float = 0.0
    log: list[str] = field(default_factory=list)  # the demo's stderr, for when it fails


def stop(proc: subprocess.Popen[str], what: str) -> None:
    """SIGINT (Ctrl-C) ``proc``, wait, and make sure every process it started is gone."""
    tree = processes_under(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            print(f"  {what} did not stop within 90 s after SIGINT: killing it", file=sys.stderr)
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in tree if alive(p)]
    for pid in left:  # ours: started by the process this round started
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            print(f"  left behind by {what}, killed: {pid} {f.read()[:80]!r}", file=sys.stderr)
        os.kill(pid, signal.SIGKILL)


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


def seed_answers(base: str, token: str) -> bool:
    """The seed-000 queries answer with the seed's data."""
    customers = get(f"{base}/stores/customer-v1-changelog/all", token)
    return (
        customers[0] == 200
        and len(customers[1]["result"]) == 7
        and get(f"{base}/stores/customer-v1-changelog/get/2", token) == (200, {"response": "adam"})
        and get(f"{base}/stores/order-count/approximate-num-entries", token) == (200, {"result": 3})
        and get(f"{base}/stores/order-count/get/1", token) == (200, {"response": 1})
    )


def run_floor(env: dict[str, str]) -> tuple[float, dict[str, float]]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", FLOOR], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        took = time.monotonic() - started
        if not line:
            raise SystemExit(f"the floor's process exited with {proc.wait()}")
        return took, json.loads(line)
    finally:
        stop(proc, "the floor")


def run_demo(env: dict[str, str], port: int, timeout: float) -> Round:
    result = Round()
    home = tempfile.mkdtemp(prefix="riqr-bench-startup-")
    base = f"http://localhost:{port}"
    token: list[str] = []
    said_ready = threading.Event()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "riqr", "demo", "--port", str(port), "--home", home],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            now = time.monotonic() - started
            result.log.append(line.rstrip("\n"))
            if (m := STEP_LINE.match(line.rstrip("\n"))) is not None:
                result.steps.append((m["what"], float(m["seconds"]), now))
            if "Spark's class archive: none yet" in line:
                result.cold = True
            if "] ready in " in line and not said_ready.is_set():
                result.demo_says_ready = now
                said_ready.set()

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if (m := TOKEN_LINE.match(line)) is not None:
                token.append(m["token"])

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stderr, read_stdout)]
    for reader in readers:
        reader.start()
    try:
        while True:
            failed = None
            if proc.poll() is not None:
                failed = f"riqr demo exited with {proc.returncode}"
            elif time.monotonic() - started > timeout:
                failed = f"riqr demo not ready after {timeout:g} s (/ready: {get(f'{base}/ready')})"
            if failed is not None:
                print("\n".join(result.log[-30:]), file=sys.stderr)
                raise SystemExit(failed)
            if token and get(f"{base}/ready")[0] == 200 and seed_answers(base, token[0]):
                result.ready = time.monotonic() - started
                return result
            time.sleep(0.05)
    finally:
        stop(proc, "riqr demo")
        for reader in readers:
            reader.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=7480)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a demo may take to be ready")
    args = parser.parse_args()
    # A SIGTERM (timeout(1), a CI runner) unwinds like Ctrl-C, so the demo and its processes are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    rounds = []
    for n in range(1, args.rounds + 1):
        r = Round()
        r.floor, r.floor_parts = run_floor(env)
        demo = run_demo(env, args.port, args.timeout)
        demo.floor, demo.floor_parts = r.floor, r.floor_parts
        rounds.append(demo)
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in demo.floor_parts.items())
        print(f"round {n}: floor {demo.floor:.1f}s ({parts})", flush=True)
        for what, seconds, ended in demo.steps:
            print(f"  {what}: {seconds:.1f}s, done at {ended:.1f}s", flush=True)
        print(f"  riqr demo says ready at {demo.demo_says_ready:.1f}s; REST ready with the seed's data at "
              f"{demo.ready:.1f}s; ratio to the floor {demo.ready / demo.floor:.2f}"
              + (" (cold: Spark's class archive written at the end of this round)" if demo.cold else ""),
              flush=True)  # fmt: skip
    ready = statistics.median(r.ready for r in rounds)
    floor = statistics.median(r.floor for r in rounds)
    ratio = statistics.median(r.ready / r.floor for r in rounds)
    print(f"\nmedian of {len(rounds)}: riqr demo ready in {ready:.1f}s, floor (ray.init() then SparkSession) "
          f"{floor:.1f}s, ratio {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
