"""Benchmark: time from `riqr demo` to ready, and freshness (record produced -> visible over REST).

    .venv/bin/python -m bench.demo_freshness [--records 12] [--port 7499]

Starts the real demo command in a scratch home, measures how long until the REST API serves all the
seed-000 data (with the bearer token the demo prints: auth is on), then produces one order at a time for a
new key (the way `riqr produce` does) and polls GET every 10 ms until its count shows up. Prints the time
to ready and the median, p90 and max freshness.
Freshness is bounded below by the micro-batch trigger (250 ms by default) plus Spark's batch time.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.startup import TOKEN_LINE, get, seed_answers
from runtime.landing import Record, write_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=12)
    parser.add_argument("--port", type=int, default=7499)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="riqr-bench-"))
    base = f"http://localhost:{args.port}"
    riqr = Path(sys.executable).parent / "riqr"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    started = time.monotonic()
    demo = subprocess.Popen(
        [str(riqr), "demo", "--port", str(args.port), "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    token: list[str] = []

    def read_token() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:  # read to the end, so the demo never blocks on a full pipe
            if (m := TOKEN_LINE.match(line)) is not None and not token:
                token.append(m["token"])

    threading.Thread(target=read_token, daemon=True).start()
    try:
        while not (token and seed_answers(base, token[0])):
            if demo.poll() is not None:
                raise SystemExit(f"riqr demo exited with {demo.returncode}")
            if time.monotonic() - started > 300:
                raise SystemExit("riqr demo not ready after 300 s")
            time.sleep(0.1)
        ready = time.monotonic() - started
        print(f"  demo ready after {ready:.1f}s", file=sys.stderr, flush=True)
        lags = []
        for i in range(args.records):
            key = f"fresh-{i}"
            produced = time.monotonic()
            write_records(home, "order", [Record(key, "soup")])
            while get(f"{base}/stores/order-count/get/{key}", token[0]) != (200, {"response": 1}):
                if time.monotonic() - produced > 60:
                    raise SystemExit(f"record {key} not visible after 60 s")
                time.sleep(0.01)
            lags.append(time.monotonic() - produced)
            print(
                f"  record {i + 1}/{args.records} visible after {lags[-1] * 1000:.0f} ms", file=sys.stderr, flush=True
            )
            time.sleep(0.3)  # let the next record start in a fresh trigger interval rather than in phase
        lags.sort()
        print(f"\ntime from `riqr demo` to ready: {ready:.1f} s")
        print(
            f"freshness over {len(lags)} records (produced -> visible over REST): "
            f"median {statistics.median(lags) * 1000:.0f} ms, p90 {lags[int(len(lags) * 0.9) - 1] * 1000:.0f} ms, "
            f"max {lags[-1] * 1000:.0f} ms"
        )
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            demo.kill()


if __name__ == "__main__":
    main()
