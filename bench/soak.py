"""Benchmark: a soak. riqr on a Ray cluster under steady, mixed load for ``--minutes``, with query actors
killed every few minutes; then every answer checked against the landing files, and what grew.

    flock /tmp/riqr-ray-spark.lock .venv/bin/python -m bench.soak --minutes 10
        [--orders-per-s 100] [--rest-rate 30] [--driver-rate 5] [--kill-every 120] [--no-windowed] [--work DIR]

It starts everything itself, as an operator would (bench/soak_cluster.py), in a fresh work directory
(``/tmp/soakbench-*``, or ``--work``) that holds Ray's temp dir and logs, riqr's home (landing files,
checkpoints, dead letters) and data dir: ``ray start --head`` with Ray's token auth, ``riqr up`` (REST auth
on), one ``ray job submit`` of ``bench.soak_topology`` (the food-orders stores and, unless
``--no-windowed``, the windowed ones, in one Spark driver). At the end it stops the job, runs ``riqr
down``, and stops Ray's processes by pid; any process of its own left after that is ended and named.

The load, all from this process but the driver-API calls (bench/soak_load.py): order records into
landing files (a file a second; customers every 5 s; a few late orders; a malformed line every
``--malformed-every`` seconds), REST requests over the main routes with aiohttp (lookups, ranges, pages
with cursors, NDJSON streams, some cut mid-way, raw cut connections, counts, the catalog, metadata,
metrics, probes, requests with no token or a bad one, unknown stores, bad parameters), driver-API calls
from a process of its own (bench/soak_driver.py), and churn: a query actor killed every
``--kill-every`` seconds after the warm-up, alternately by SIGKILL of its worker and by ``ray.kill``, and
a token minted with ``riqr token`` every ``--token-every`` seconds. Every ``--sample-every`` seconds the
RSS, threads and descriptors of each process of the cluster, by role, go to ``samples.csv``.

Then the producer stops, writes one key per partition last, and the bench waits (with a deadline) until
the stores show those keys and the dead letters are counted; it recounts from the landing files what
``order-count`` and ``customer-v1-changelog`` must hold and compares: both counts, a sample of lookups,
and a full NDJSON scan of each store.

How to read what it prints:

* **wrong answers**: answers that are not what the data says: a verification answer that differs from
  the recount, an ``order-count`` lookup during the load above the orders written (or going back for the
  same client), a refused request answered 2xx. **lost records**: orders the final scan counts short, and
  customers whose latest name is missing. Either makes the exit status 1.
* **statuses per request kind**: ok (what the kind answers), honest (503/504: no copy could answer, as
  after a kill), unexpected (anything else: a 500, a timeout), wrong; then each outcome's count. The
  driver-API calls likewise, by exception class.
* **growth per role**: RSS summed over the role's processes at each look (query actors are several, and
  come back as other pids after a kill): at the first look, at the end of the warm-up (``--warmup``, a
  fraction of the run) and at the end; MB per hour is the least-squares slope after the warm-up, and
  end/start the ratio to the warm-up's end. A slope from a 10-minute run is a hint, not a verdict: the
  70-minute soak of 2026-11-29 is ``--minutes 70`` at its rates (docs/benchmarks.md, "Soak").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.soak_cluster import REPO, Head, become_subreaper, disk_usage, say, started
from bench.soak_figures import (
    RoleGrowth,
    compare_store,
    growth_by_role,
    judge_driver_call,
    recount_home,
    summarise_statuses,
)
from bench.soak_load import Churn, Produced, Producer, RestLoad, Sampler, check_fraction

__all__ = ["Verdict", "main"]

ORDER_CONSUMERS = ("order-count", "orders-per-minute", "order-sessions")


def http_json(url: str, headers: dict[str, str], timeout: float = 60) -> tuple[int, Any]:
    """Status and decoded body of a GET (errors included)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def scan(head: Head, store: str) -> dict[str, Any]:
    """Every entry of ``store``, from one NDJSON stream."""
    request = urllib.request.Request(
        f"{head.url}/stores/{store}/all", headers={**head.headers(), "Accept": "application/x-ndjson"}
    )
    entries: dict[str, Any] = {}
    with urllib.request.urlopen(request, timeout=300) as resp:
        for line in resp:
            item = json.loads(line)
            if "error" in item:
                raise RuntimeError(f"the scan of {store} ended in an error: {item}")
            entries[item["key"]] = item["value"]
    return entries


def wait_until(condition: Any, timeout: float, what: str, interval: float = 2.0) -> bool:
    """Poll ``condition`` (exceptions count as not yet) until true or ``timeout``; whether it came true.
    (Not ``riqr.demo.wait_until``, which raises: stores that never catch up are a finding to print, and the
    answers are still checked.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return True
        except Exception:  # not yet (a 503 while a copy restores, the job starting)
            pass
        time.sleep(interval)
    say(f"gave up waiting after {timeout:g}s: {what}")
    return False


def ingest(head: Head) -> dict[str, dict[str, Any]]:
    """Each store's ``ingest`` (feed state, dead letters) from ``GET /stores``."""
    status, body = http_json(f"{head.url}/stores", head.headers())
    if status != 200:
        raise RuntimeError(f"GET /stores answered {status}")
    return {s["name"]: s.get("ingest") or {} for s in body["result"]}


def wait_serving(head: Head, timeout: float) -> None:
    """Until every store of the topology exists and its feed runs; the job's log if it ended first."""
    began = time.monotonic()
    while True:
        status = head.job_status()
        if status.split(".")[-1] in ("FAILED", "STOPPED", "SUCCEEDED"):
            raise RuntimeError(f"the topology job ended ({status}):\n{head.job_logs()[-4000:]}")
        try:
            feeds = ingest(head)
        except (OSError, RuntimeError, ValueError):  # riqr's REST not answering yet
            feeds = {}
        if all(feeds.get(s, {}).get("state") == "running" for s in head.stores):
            break
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"the topology's stores did not all run within {timeout:g}s")
        time.sleep(2)
    say(f"the topology's {len(head.stores)} stores serve ({time.monotonic() - began:.0f}s after the submit)")


@dataclass
class Verdict:
    """What the verification found."""

    caught_up: bool = False
    caught_up_s: float = 0.0
    orders: int = 0
    order_keys: int = 0
    customers: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    ledger_differs: int = 0  # keys whose recount differs from what the producer counted (the bench's own check)
    wrong: Counter[str] = field(default_factory=Counter)  # per check
    lost: Counter[str] = field(default_factory=Counter)
    checked: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # asdict() would rebuild each Counter from its items, counting the pairs.
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}


def verify(head: Head, produced: Produced, args: argparse.Namespace) -> Verdict:
    """Wait until the stores caught up with the landing files, then compare them with a recount."""
    verdict = Verdict()
    sentinels = produced.sentinels
    consumers = [s for s in ORDER_CONSUMERS if s in head.stores]
    malformed = produced.malformed["order"]

    def caught_up() -> bool:
        for key in sentinels:
            quoted = urllib.parse.quote(key, safe="")
            if http_json(f"{head.url}/stores/order-count/get/{quoted}", head.headers())[1] != {"response": 1}:
                return False
            got = http_json(f"{head.url}/stores/customer-v1-changelog/get/{quoted}", head.headers())[1]
            if got != {"response": "last"}:
                return False
        feeds = ingest(head)
        return all((feeds[s].get("dead_letters") or {}).get("order", 0) >= malformed for s in consumers)

    waited = time.monotonic()
    verdict.caught_up = wait_until(caught_up, args.catch_up, "the stores to show the last files and dead letters")
    verdict.caught_up_s = time.monotonic() - waited
    say(f"caught up in {verdict.caught_up_s:.0f}s; recounting the landing files")
    recount = recount_home(head.home)
    verdict.orders, verdict.order_keys = recount.order_records, len(recount.orders)
    verdict.customers, verdict.malformed = len(recount.customers), dict(recount.malformed)
    verdict.ledger_differs = sum(1 for k in set(recount.orders) | set(produced.orders)
                                 if recount.orders[k] != produced.orders[k])  # fmt: skip
    want: dict[str, dict[str, Any]] = {
        "order-count": dict(recount.orders),
        "customer-v1-changelog": dict(recount.customers),
    }

    def wrong(check: str, what: str) -> None:
        verdict.wrong[check] += 1
        if len(verdict.examples) < 10:
            verdict.examples.append(f"{check}: {what}")

    for store, expected in want.items():
        status, body = http_json(f"{head.url}/stores/{store}/approximate-num-entries", head.headers())
        verdict.checked["count"] += 1
        if status != 200 or body != {"result": len(expected)}:
            wrong("count", f"{store}: {status} {body}, want {len(expected)}")
    rng = random.Random(17)
    for store, expected, n in (("order-count", want["order-count"], 400),
                               ("customer-v1-changelog", want["customer-v1-changelog"], 300)):  # fmt: skip
        for key in rng.sample(sorted(expected), min(n, len(expected))):
            status, body = http_json(f"{head.url}/stores/{store}/get/{urllib.parse.quote(key, safe='')}",
                                     head.headers())  # fmt: skip
            verdict.checked["get"] += 1
            if status != 200 or body != {"response": expected[key]}:
                wrong("get", f"{store}/{key}: {status} {body}, want {expected[key]!r}")
    for store, expected in want.items():
        got = scan(head, store)
        comparison = compare_store(expected, got, counts=store == "order-count")
        verdict.checked["scan entries"] += len(got)
        verdict.wrong["scan"] += comparison.wrong
        verdict.lost[store] += comparison.lost
        verdict.examples.extend(f"scan of {store}: {e}" for e in comparison.examples[:3])
    feeds = ingest(head)
    verdict.dead_letters = {s: (feeds[s].get("dead_letters") or {}).get("order", 0) for s in consumers}
    return verdict


def _mb_h(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def print_figures(
    args: argparse.Namespace, head: Head, produced: Produced, rest: RestLoad, driver: Counter[str], churn: Churn,
    growth: list[RoleGrowth], verdict: Verdict, load_s: float, disk: dict[str, tuple[int, int]],
) -> tuple[int, int]:  # fmt: skip
    """Print the soak's figures; returns (wrong answers, lost records)."""
    rest_summary = summarise_statuses(rest.outcomes)
    split = Counter({tuple(k.rsplit(":", 1)): n for k, n in driver.items()})
    driver_summary = summarise_statuses(split, judge_driver_call)  # type: ignore[arg-type]
    requests = sum(rest.outcomes.values())
    calls = sum(driver.values())
    wrong = len(rest.wrong) + sum(verdict.wrong.values())
    lost = sum(verdict.lost.values())
    print(f"\nsoak: {load_s / 60:.1f} min of load, {'4' if head.windowed else '2'} stores of {args.partitions} "
          f"partitions on {args.actors} actors; work dir {head.work}")  # fmt: skip
    print(f"load: {sum(produced.orders.values()):,} orders ({len(produced.orders):,} keys, {produced.late} late), "
          f"{produced.customers:,} customer records, {produced.files:,} files, {produced.malformed['order']} "
          f"malformed lines; {requests:,} REST requests ({requests / load_s:.1f}/s); {calls:,} driver-API calls "
          f"({calls / load_s:.1f}/s); kills {dict(churn.kills)}; {sum(1 for e in churn.events if 'token' in e.what)} "
          f"tokens minted")  # fmt: skip
    problems = produced.errors + churn.errors
    if problems:
        print(f"load errors ({len(problems)}): " + "; ".join(problems[:5]))
    print(f"\nWRONG ANSWERS {wrong}  (during the load {len(rest.wrong)}, verification {dict(verdict.wrong)})")
    print(f"LOST RECORDS {lost}  ({dict(verdict.lost)})")
    for example in rest.wrong[:5] + verdict.examples[:10]:
        print(f"    {example}")
    print(f"verification: {'caught up' if verdict.caught_up else 'NOT caught up'} {verdict.caught_up_s:.0f}s after "
          f"the producer stopped; recount {verdict.orders:,} orders on {verdict.order_keys:,} keys, "
          f"{verdict.customers:,} customers, malformed lines {verdict.malformed}; checked {dict(verdict.checked)}; "
          f"the producer's own ledger differs from the files on {verdict.ledger_differs} keys")  # fmt: skip
    print(f"dead letters of the order topic per consumer: {verdict.dead_letters} for {produced.malformed['order']} "
          "malformed lines written")  # fmt: skip

    print("disk at the end: " + ", ".join(f"{name} {size / 2**20:.0f} MB ({files:,} files)"
                                          for name, (size, files) in disk.items()))  # fmt: skip

    for title, summary in (("REST", rest_summary), ("driver API", driver_summary)):
        print(f"\n{title}: outcomes per request kind")
        print(f"{'kind':<16}{'total':>8}{'ok':>8}{'honest':>8}{'unexp.':>8}{'wrong':>7}  outcomes")
        for kind, row in summary.items():
            by = " ".join(f"{o}:{n}" for o, n in row["by"].items())
            print(f"{kind:<16}{row['total']:>8}{row['ok']:>8}{row['honest']:>8}{row['unexpected']:>8}"
                  f"{row['wrong']:>7}  {by}")  # fmt: skip
    if rest.unexpected:
        print("unexpected REST outcomes, first few:")
        for line in rest.unexpected[:8]:
            print(f"    {line}")

    print(f"\nRSS per role (summed over its processes), warm-up the first {args.warmup:.0%} of the load; "
          f"looks every {args.sample_every:g}s")  # fmt: skip
    print(f"{'role':<14}{'procs':>6}{'first MB':>10}{'start MB':>10}{'end MB':>9}{'MB/h':>9}{'late MB/h':>10}"
          f"{'end/start':>10}"
          f"{'threads':>12}{'fds':>12}")  # fmt: skip
    for g in growth:
        ratio = "-" if g.ratio is None else f"{g.ratio:.3f}"
        print(f"{g.role:<14}{g.processes:>6}{g.first_mb:>10.0f}{g.start_mb:>10.0f}{g.end_mb:>9.0f}"
              f"{_mb_h(g.mb_per_hour):>9}{_mb_h(g.late_mb_per_hour):>10}{ratio:>10}"
              f"{f'{g.threads[0]}->{g.threads[1]}':>12}"
              f"{f'{g.fds[0]}->{g.fds[1]}':>12}")  # fmt: skip
    print("\nchurn: " + "; ".join(f"{e.t:.0f}s {e.what}" for e in churn.events if "token" not in e.what))
    return wrong, lost


def _driver_counts(output: str) -> Counter[str]:
    """The driver-API load's last whole ``RESULT`` line (one cut short by its end is skipped)."""
    for line in reversed(output.splitlines()):
        if line.startswith("RESULT "):
            with contextlib.suppress(ValueError):
                return Counter(json.loads(line[len("RESULT ") :]))
    return Counter({"process:died": 1})


def _fraction(text: str) -> float:
    value = float(text)  # its ValueError is argparse's "invalid value"
    try:
        return check_fraction(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="soakbench-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    if not become_subreaper():
        say("cannot become a child subreaper: processes Ray orphans may escape the final sweep")
    head = Head(work, partitions=args.partitions, actors=args.actors, windowed=not args.no_windowed)
    say(f"work dir {work}")
    load_s = args.minutes * 60
    with started(head):
        wait_serving(head, timeout=args.start_timeout)
        from runtime.raycalls import no_auto_connect

        no_auto_connect()
        import ray

        ray.init(address=head.address, namespace="riqr", log_to_driver=False, configure_logging=False)
        try:
            stop = threading.Event()
            t0 = time.monotonic()
            produced = Produced()
            tokens = [head.token]
            sampler = Sampler(work / "samples.csv", stop, t0, args.sample_every)
            producer = Producer(head.home, produced, stop, orders_per_s=args.orders_per_s,
                                customers_per_s=args.customers_per_s, malformed_every=args.malformed_every,
                                new_keys=args.new_keys)  # fmt: skip
            churn = Churn(head, tokens, stop, t0, kill_every=args.kill_every, first_kill=args.warmup * load_s,
                          token_every=args.token_every)  # fmt: skip
            driver_argv = [sys.executable, "-m", "bench.soak_driver", "--address", head.address,
                           "--until", str(time.time() + load_s), "--rate", str(args.driver_rate)]  # fmt: skip
            driver_out = work / "logs" / "driver-load.out"  # a file, not a pipe: nothing reads it until the end
            with open(work / "logs" / "driver-load.log", "wb") as driver_log, open(driver_out, "wb") as out_file:
                driver_proc = subprocess.Popen(
                    driver_argv + ([] if args.no_windowed else ["--windowed"]), cwd=REPO, env=head.environment(),
                    stdout=out_file, stderr=driver_log,
                )  # fmt: skip
            for thread in (sampler, producer, churn):
                thread.start()
            say(f"load for {args.minutes:g} min: {args.orders_per_s} orders/s, ~{args.rest_rate:g} REST req/s, "
                f"~{args.driver_rate:g} driver calls/s (pid {driver_proc.pid}), a kill every {args.kill_every:g}s "
                f"from {args.warmup * load_s:.0f}s")  # fmt: skip
            rest = RestLoad(head.url, tokens, produced, args.rest_rate, args.rest_concurrency, not args.no_windowed)
            try:
                asyncio.run(rest.run(load_s, stop))
            finally:
                stop.set()
                for thread in (producer, churn, sampler):
                    thread.join(timeout=120)
                try:  # it stops by itself at the load's end: its last call may still be under way
                    driver_proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    driver_proc.send_signal(signal.SIGTERM)
                    driver_proc.wait(timeout=60)
            loaded_s = time.monotonic() - t0
            driver = _driver_counts(driver_out.read_text())
            say("load stopped; the producer writes one key per partition last")
            producer.finish(args.partitions)
            try:
                verdict = verify(head, produced, args)
            except Exception as err:  # noqa: BLE001 - the load's figures still print, and the run fails
                verdict = Verdict()
                verdict.wrong["verification failed"] += 1
                verdict.examples.append(f"verification failed: {type(err).__name__}: {err}"[:300])
            disk = {name: disk_usage(path) for name, path in (
                ("landing", head.home / "data"), ("checkpoints", head.home / "checkpoints"),
                ("dead letters", head.home / "deadletter"), ("stores' state", work / "data"),
                ("Ray's temp dir", work / "ray"),
            )}  # fmt: skip
        finally:
            ray.shutdown()
    growth = growth_by_role(sampler.samples, args.warmup)
    wrong, lost = print_figures(args, head, produced, rest, driver, churn, growth, verdict, loaded_s, disk)
    (work / "summary.json").write_text(json.dumps({
        "args": vars(args), "wrong": wrong, "lost": lost, "verdict": verdict.to_json(),
        "rest": {f"{k}:{o}": n for (k, o), n in rest.outcomes.items()}, "driver": dict(driver),
        "growth": [asdict(g) for g in growth], "disk": disk, "churn": [asdict(e) for e in churn.events],
    }, indent=1, default=str))  # fmt: skip
    print(f"\nsamples: {work / 'samples.csv'}; logs: {work / 'logs'}; Ray's: {work / 'ray'}")
    return 1 if wrong or lost else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of load (70: the manual soak's)")
    parser.add_argument("--orders-per-s", type=int, default=100, help="order records a second (one file a second)")
    parser.add_argument("--customers-per-s", type=int, default=10, help="customer records a second (a file every 5 s)")
    parser.add_argument(
        "--new-keys", type=_fraction, default=0.08,
        help="fraction of the orders for keys never seen before (0: at most 10,000 keys, levelling off)",
    )  # fmt: skip
    parser.add_argument("--malformed-every", type=float, default=60.0, help="seconds between malformed lines")
    parser.add_argument("--rest-rate", type=float, default=30.0, help="REST requests a second, in all")
    parser.add_argument("--rest-concurrency", type=int, default=4, help="concurrent REST loops")
    parser.add_argument("--driver-rate", type=float, default=5.0, help="driver-API calls a second")
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds between query actor kills (0: none)")
    parser.add_argument("--token-every", type=float, default=60.0, help="seconds between tokens minted (0: none)")
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds between looks at the processes")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run before slopes and kills")
    parser.add_argument("--catch-up", type=float, default=300.0, help="seconds to wait for the stores at the end")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds for the topology to serve")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--no-windowed", action="store_true", help="only the food-orders stores (2 instead of 4)")
    parser.add_argument("--work", default=None, help="work directory (default: a new /tmp/soakbench-*)")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the cluster is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(run(args))


if __name__ == "__main__":
    main()
