"""Benchmark: the partition engines against the old ``SortedKV`` and against plain dict/list baselines.

    .venv/bin/python -m bench.engines [--store 1000000] [--new 50000] [--restore 100000,1000000]
                                      [--reads 200000] [--no-fsync] [--dir /tmp/x]

In one run, on keys like those of a real store (strings ``user-<9 digits>``, 24-byte values):

(a) ``--new`` random new keys applied in one batch into a store of ``--store`` keys: the old ``SortedKV``
    (``bench/baseline_sortedkv.py``), the memory engine without a directory and with one (changelog, fsync), and
    the rocksdb engine (synced write). Seconds, and the ratio to the old engine.
(b) restore: opening a durable partition of each size in ``--restore``, for both engines.
(c) point gets (one ``get`` per key, and one ``get_many``) and a full scan over the ``--store`` partition,
    per engine, as a rate and as a ratio to ``dict.get`` / iterating a sorted list in the same run.
(d) the cost of fsync (memory) / synced writes (rocksdb) for small applies, each engine with and without.

``--store 10000000 --restore 100000,1000000,10000000`` reproduces the 10M figures (several minutes);
``--parts b --restore 100000,1000000,10000000`` runs only the restore timings.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.baseline_sortedkv import SortedKV
from runtime.engines import PartitionEngine, Position, open_engine
from runtime.keys import KeySchema
from runtime.scan import Scan

SCHEMA = KeySchema("user", "string")
_CHUNK = 200_000


def key_of(i: int) -> str:
    return f"user-{i:09d}"


def rows_for(ids: list[int]) -> list[tuple[Any, bytes | None]]:
    return [(key_of(i), b"v" * 16 + i.to_bytes(8, "big")) for i in ids]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn`` took, and what it returned."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def load(engine: PartitionEngine, ids: list[int]) -> None:
    """Fill an engine in batches of _CHUNK rows, as a stream of micro-batches would."""
    for batch_id, at in enumerate(range(0, len(ids), _CHUNK)):
        engine.apply(Position("bench", batch_id), rows_for(ids[at : at + _CHUNK]))


def drain(entries: Iterator[Any]) -> int:
    n = 0
    for _ in entries:
        n += 1
    return n


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


def bench_inserts(store: int, new: int, workdir: Path, fsync: bool) -> tuple[dict[str, PartitionEngine], list[int]]:
    rng = random.Random(1)
    ids = rng.sample(range(10**9), store + new)
    existing, fresh = ids[:store], ids[store:]
    batch = rows_for(fresh)
    results: list[tuple[str, float]] = []

    old = SortedKV()
    old.write_many(rows_for(existing))
    results.append(("old SortedKV", timed(lambda: old.write_many(batch))[0]))
    old.clear()

    engines: dict[str, PartitionEngine] = {}
    candidates: list[tuple[str, str, Path | None, dict[str, Any]]] = [
        ("memory, no directory", "memory", None, {}),
        (f"memory, changelog{' + fsync' if fsync else ''}", "memory", workdir / "memory", {"fsync": fsync}),
        (f"rocksdb{', sync' if fsync else ''}", "rocksdb", workdir / "rocksdb", {"sync": fsync}),
    ]
    for label, kind, path, options in candidates:
        engine = open_engine(kind, SCHEMA, path, **options)
        load(engine, existing)
        results.append((label, timed(lambda e=engine: e.apply(Position("bench", 10**6), batch))[0]))  # type: ignore[misc]
        engines[label] = engine
    base = results[0][1]
    table(
        f"(a) {new:,} random new keys applied into {store:,} existing keys",
        ["engine", "seconds", "vs old"],
        [[label, f"{s:.3f}", f"{s / base:.3f}x"] for label, s in results],
    )
    return engines, existing


def bench_restore(sizes: list[int], workdir: Path) -> None:
    rows = []
    for size in sizes:
        ids = random.Random(size).sample(range(10**9), size)
        cells = [f"{size:,}"]
        for kind in ("memory", "rocksdb"):
            path = workdir / f"restore-{kind}-{size}"
            engine = open_engine(kind, SCHEMA, path)
            load(engine, ids)
            engine.close()
            seconds, reopened = timed(lambda k=kind, p=path: open_engine(k, SCHEMA, p))  # type: ignore[misc]
            cells.append(f"{seconds:.3f}")
            assert reopened.count() == size
            reopened.destroy()
        rows.append(cells)
    table("(b) restore: seconds to open a durable partition", ["keys", "memory", "rocksdb"], rows)


def bench_reads(engines: dict[str, PartitionEngine], existing: list[int], reads: int) -> None:
    rng = random.Random(2)
    probe = [key_of(rng.choice(existing)) for _ in range(reads)]
    baseline = dict(rows_for(existing))
    ordered = sorted(baseline.items())
    get_base, _ = timed(lambda: [baseline.get(k) for k in probe])
    scan_base, _ = timed(lambda: drain(iter(ordered)))
    base_rate = f"{len(ordered) / scan_base:,.0f}"
    rows = [["dict.get / sorted list", f"{reads / get_base:,.0f}", "1.000x", "-", base_rate, "1.000x"]]
    for label, engine in engines.items():
        single, _ = timed(lambda e=engine: [e.get(k) for k in probe])  # type: ignore[misc]
        many, _ = timed(lambda e=engine: e.get_many(probe))  # type: ignore[misc]
        scan, scanned = timed(lambda e=engine: drain(e.scan(Scan())))  # type: ignore[misc]
        rows.append(
            [
                label,
                f"{reads / single:,.0f}",
                f"{get_base / single:.3f}x",
                f"{reads / many:,.0f}",
                f"{scanned / scan:,.0f}",
                f"{scan_base / scan:.3f}x",
            ]
        )
    table(
        f"(c) reads of partitions of {len(existing):,}+ keys: rates per second, and relative to the baseline",
        ["engine", "get/s", "vs dict", "get_many keys/s", "scan entries/s", "vs list"],
        rows,
    )


def bench_sync_cost(workdir: Path, applies: int = 200, rows: int = 100) -> None:
    """What fsync (memory) and sync writes (rocksdb) cost per small apply, the common micro-batch case."""
    out = []
    for kind, flag in (("memory", "fsync"), ("rocksdb", "sync")):
        cells = [kind]
        for on in (True, False):
            engine = open_engine(kind, SCHEMA, workdir / f"sync-{kind}-{on}", **{flag: on})
            rng = random.Random(3)
            batches = [rows_for(rng.sample(range(10**9), rows)) for _ in range(applies)]
            seconds, _ = timed(lambda e=engine, b=batches: [e.apply(Position("s", i), x) for i, x in enumerate(b)])  # type: ignore[misc]
            cells.append(f"{seconds / applies * 1000:.2f}")
            engine.destroy()
        out.append(cells)
    table(f"(d) milliseconds per apply of {rows} rows ({applies} applies)", ["engine", "synced", "not synced"], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=int, default=1_000_000, help="existing keys for (a) and (c)")
    parser.add_argument("--new", type=int, default=50_000, help="new keys applied in (a)")
    parser.add_argument("--restore", default="100000,1000000", help="comma-separated partition sizes for (b)")
    parser.add_argument("--reads", type=int, default=200_000, help="point gets in (c)")
    parser.add_argument("--no-fsync", action="store_true", help="durable engines without fsync/sync writes")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--parts", default="a,b,c,d", help="which of (a) to (d) to run, e.g. b for restore only")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="riqr-bench-", dir=args.dir))
    parts = set(args.parts.split(","))
    try:
        if parts & {"a", "c"}:
            engines, existing = bench_inserts(args.store, args.new, workdir, not args.no_fsync)
            if "c" in parts:
                bench_reads(engines, existing, args.reads)
            for engine in engines.values():
                engine.destroy()
        if "b" in parts:
            bench_restore([int(s) for s in args.restore.split(",") if s], workdir)
        if "d" in parts:
            bench_sync_cost(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
