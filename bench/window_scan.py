"""Benchmark: a time-filtered window scan over many keys, walking with seeks against filtering every window.

    .venv/bin/python -m bench.window_scan [--keys 2000] [--windows 1440] [--rounds 3] [--dir /tmp/x]

A window store of ``--keys`` keys with ``--windows`` one-minute windows each (a day's worth by default),
in one partition of each engine. Each case reads the store's windows of all keys whose start lies in a
time range, both ways, in the same run, alternating, best of ``--rounds``:

* *filter*: the engine's plain scan of the key range, every window checked against the time filter (how
  ``QueryCore.scan`` read until 2026-11-28);
* *walk*: the engine's scan with a ``TimeWalk``, which seeks past a key's windows outside the range.

Cases: one hour of the day (60 of 1,440 windows a key), the whole day (every window kept: the walk's cost
where nothing can be skipped), and the adverse shape, a store of one window per key with a filter that
keeps none, so every key's run of refused windows is shorter than ``JUMP_AFTER``. Prints seconds and the
walk's time as a ratio to the filter's (below 1: faster).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runtime.codec import decode_value
from runtime.engines import PartitionEngine, Position, open_engine
from runtime.keys import KeySchema
from runtime.scan import Scan, TimeFilter, TimeWalk

SCHEMA = KeySchema("user", "string", (("window_start", "timestamp"),))
MINUTE = 60_000_000  # micros
T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
_CHUNK = 200_000


def fill(engine: PartitionEngine, keys: int, windows: int) -> None:
    rows = [((f"user-{k:06d}", T0 + w * MINUTE), b"\x93\x01\x02\x03") for k in range(keys) for w in range(windows)]
    for batch_id, at in enumerate(range(0, len(rows), _CHUNK)):
        engine.apply(Position("bench", batch_id), rows[at : at + _CHUNK])


def _window_filter(entries: Iterator[tuple[Any, bytes]], times: TimeFilter) -> Iterator[tuple[Any, bytes]]:
    for key, raw in entries:
        end = decode_value(raw)[0] if times.end_from is not None else 0
        if times.admits(key[-1], end):
            yield key, raw


def best(fn: Callable[[], int], rounds: int) -> tuple[float, int]:
    times, found = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        found = fn()
        times.append(time.perf_counter() - start)
    return min(times), found


def compare(engine: PartitionEngine, times: TimeFilter, rounds: int) -> tuple[float, float, int]:
    scan = Scan(times=times)

    def filtered() -> int:  # QueryCore's filter until 2026-11-28, as it was
        return sum(1 for _ in _window_filter(engine.scan(scan), times))

    def walked() -> int:
        return sum(1 for _ in engine.scan(scan, TimeWalk(times, 1)))

    f_s, w_s = [], []
    found = (0, 0)
    for _ in range(rounds):  # alternating, so both see the same machine
        f, nf = best(filtered, 1)
        w, nw = best(walked, 1)
        f_s.append(f)
        w_s.append(w)
        found = (nf, nw)
    if found[0] != found[1]:
        raise AssertionError(f"the walk found {found[1]} windows, the filter {found[0]}")
    return min(f_s), min(w_s), found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--windows", type=int, default=1440)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="riqr-bench-window-", dir=args.dir))
    hour = TimeFilter(T0 + 600 * MINUTE, T0 + 659 * MINUTE)
    day = TimeFilter(T0, T0 + (args.windows - 1) * MINUTE)
    none = TimeFilter(T0 + MINUTE, T0 + 2 * MINUTE)
    cases = [
        ("one hour of each key's day", args.keys, args.windows, hour),
        ("the whole day (nothing to skip)", args.keys, args.windows, day),
        ("one window a key, none kept", args.keys * args.windows // 10, 1, none),
    ]
    print(f"{'engine':8} {'case':36} {'windows':>10} {'kept':>9} {'filter s':>9} {'walk s':>8} {'walk/filter':>11}")
    try:
        for kind in ("memory", "rocksdb"):
            for i, (name, keys, windows, times) in enumerate(cases):
                path = root / f"{kind}-{i}"
                engine = open_engine(kind, SCHEMA, path)
                try:
                    fill(engine, keys, windows)
                    f, w, kept = compare(engine, times, args.rounds)
                finally:
                    engine.close()
                    shutil.rmtree(path, ignore_errors=True)
                print(f"{kind:8} {name:36} {keys * windows:>10,} {kept:>9,} {f:>9.3f} {w:>8.3f} {w / f:>11.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
