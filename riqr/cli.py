"""The ``riqr`` command: ``demo``, ``up``, ``down``, ``produce``.

riqr demo [--port 7400]          local Ray + Spark, the seed-000 food orders served over REST
riqr up [--address ADDR]         deploy the verticles on a running Ray cluster
riqr down [--address ADDR]       remove them
echo "1--john" | riqr produce customer    append records to a landing directory
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runtime.config import DEFAULT_NAMESPACE, DEFAULT_PORT, RuntimeConfig, riqr_home
from runtime.errors import RiqrError
from runtime.landing import parse_console_lines, write_records

__all__ = ["main", "SEED_CUSTOMERS", "SEED_ORDERS", "seed_curls"]

# Step 2 of seed 000, verbatim.
SEED_CUSTOMERS = "1--john\n2--adam\n3--daniel\n4--james\n5--jack\n6--mathew\n7--will"
SEED_ORDERS = "1--spagety\n2--pizza\n--pasta"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def seed_curls(base: str) -> list[str]:
    """The curl commands of seed 000, pointed at ``base``."""
    return [
        f"curl {base}/metadata",
        f"curl {base}/metadata/stores/order-count",
        f"curl {base}/metadata/stores/order-count/key/1",
        f"curl {base}/stores/customer-v1-changelog/all",
        f"curl {base}/stores/customer-v1-changelog/get/2",
        f"curl '{base}/stores/customer-v1-changelog/range?from=1&to=5'",
        f"curl {base}/stores/customer-v1-changelog/approximate-num-entries",
        f"curl {base}/stores/order-count/get/1",
        f"curl {base}/stores",
    ]


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> float:
    """Poll ``condition`` until true; returns the seconds waited, or raises ``TimeoutError``."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        try:
            if condition():
                return time.monotonic() - started
        except RiqrError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g}s")
        time.sleep(interval)


def _cmd_produce(args: argparse.Namespace) -> int:
    home = riqr_home(args.home)
    lines = sys.stdin.read().splitlines()
    records = parse_console_lines(lines, args.key_separator, split_escaped_newlines=not args.no_escapes)
    path = write_records(home, args.topic, records)
    _say(f"wrote {len(records)} records to topic {args.topic}" + (f" ({path})" if path else ""))
    return 0


def _connect_ray(address: str | None, namespace: str) -> None:
    import ray

    ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)


def _cmd_up(args: argparse.Namespace) -> int:
    from verticles import deploy

    _connect_ray(args.address, args.namespace)
    config = RuntimeConfig(
        namespace=args.namespace, http_host=args.host, http_port=args.port, advertise_host=args.advertise_host
    )
    deployment = deploy.up(config)
    for ep in deployment.endpoints:
        print(f"node {ep.node_id[:12]}  REST API at {ep.url}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from verticles import deploy

    _connect_ray(args.address, args.namespace)
    stopped = deploy.down(args.namespace)
    _say(f"stopped {len(stopped)} riqr actors in namespace {args.namespace}")
    return 0


def _load_seed(home: Path) -> None:
    write_records(home, "customer", parse_console_lines(SEED_CUSTOMERS.splitlines()))
    write_records(home, "order", parse_console_lines(SEED_ORDERS.splitlines()))


def _cmd_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    home = riqr_home(args.home)
    namespace = args.namespace
    for sub in (home / "data" / "customer", home / "data" / "order", home / "checkpoints" / namespace):
        if sub.exists():
            shutil.rmtree(sub)
    _say(f"[riqr demo] home {home} (landing dirs and checkpoints reset)")

    import ray

    from runtime.client import connect
    from topologies import food_orders
    from topologies.options import TopologyOptions
    from topologies.spark import spark_session
    from verticles import deploy

    _say("[riqr demo] starting a local Ray cluster with its dashboard ...")
    ctx = ray.init(namespace=namespace, include_dashboard=True, log_to_driver=False, configure_logging=False)
    queries: list[Any] = []
    spark = None
    try:
        config = RuntimeConfig(
            namespace=namespace, http_host=args.host, http_port=args.port, advertise_host="localhost"
        )
        try:
            deployment = deploy.up(config)
        except Exception as err:
            _say(f"[riqr demo] could not start the REST API: {err}")
            return 2
        base = f"http://localhost:{deployment.endpoints[0].port}"
        _say(f"[riqr demo] verticles up; REST API at {base}; Ray dashboard at http://{ctx.dashboard_url}")
        _say("[riqr demo] starting Spark and the food-orders topology ...")
        spark = spark_session(app_name="riqr-demo")
        queries = food_orders.start(spark, home, TopologyOptions(namespace=namespace))
        _load_seed(home)
        _say("[riqr demo] seed-000 records produced; waiting for the stores to reflect them ...")
        client = connect(namespace)
        customers, orders = client.store(food_orders.CUSTOMER_STORE), client.store(food_orders.ORDER_COUNT_STORE)
        wait_until(
            lambda: customers.approximate_num_entries() == 7 and orders.approximate_num_entries() == 3,
            timeout=args.ready_timeout,
            what="the seed data showing up in the stores",
        )
        _say(f"[riqr demo] ready in {time.monotonic() - started:.1f}s. Try:\n")
        print("\n".join("  " + c for c in seed_curls(base)), flush=True)
        _say(
            "\n  produce more while it runs, e.g.:  echo '3--tacos' | .venv/bin/riqr produce order"
            + ("" if args.home is None else f" --home {home}")
            + "\n\n[riqr demo] serving until Ctrl-C"
        )
        _serve_until_interrupted(queries)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        _say("[riqr demo] shutting down ...")
        for q in queries:
            with contextlib.suppress(Exception):
                q.stop()
        if spark is not None:
            spark.stop()
        try:
            deploy.down(namespace)
        finally:
            ray.shutdown()
        _say("[riqr demo] stopped")


def _serve_until_interrupted(queries: Sequence[Any]) -> None:
    """Block until Ctrl-C or SIGTERM; raise if a streaming query dies."""
    stop = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop["now"]:
        for q in queries:
            if not q.isActive:
                raise RuntimeError(f"streaming query {q.name} stopped: {q.exception()}")
        time.sleep(0.5)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="riqr", description="Ray Interactive Query Runtime")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the seed-000 food-orders example on a local Ray and Spark")
    demo.add_argument("--port", type=int, default=DEFAULT_PORT)
    demo.add_argument("--host", default="127.0.0.1", help="address to bind the REST API to")
    demo.add_argument("--home", default=None, help="landing dirs and checkpoints; default $RIQR_HOME or ~/.riqr")
    demo.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    demo.add_argument("--ready-timeout", type=float, default=180.0)
    demo.set_defaults(func=_cmd_demo)

    up = sub.add_parser("up", help="deploy the verticles on a running Ray cluster (idempotent)")
    up.add_argument("--address", default=None, help="Ray address; default $RAY_ADDRESS or the local cluster")
    up.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="REST port on every node (0: any free port)")
    up.add_argument("--host", default="0.0.0.0", help="address the REST API binds to")
    up.add_argument("--advertise-host", default=None, help="host named in metadata; default the node's IP")
    up.set_defaults(func=_cmd_up)

    down = sub.add_parser("down", help="remove the verticles (and the stores' state) from the Ray cluster")
    down.add_argument("--address", default=None)
    down.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    down.set_defaults(func=_cmd_down)

    produce = sub.add_parser("produce", help="append key--value lines from stdin to a topic's landing dir")
    produce.add_argument("topic")
    produce.add_argument("--home", default=None)
    produce.add_argument("--key-separator", default="--")
    produce.add_argument("--no-escapes", action="store_true", help="do not treat a literal \\n as a record break")
    produce.set_defaults(func=_cmd_produce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except RiqrError as err:
        _say(f"riqr: {err.message}")
        return 2
    except ConnectionError as err:
        _say(f"riqr: cannot reach the Ray cluster: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
