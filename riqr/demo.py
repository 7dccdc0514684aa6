"""``riqr demo``: the seed-000 food orders on an embedded local Ray and local Spark, served over REST.

It starts a local Ray (without its dashboard unless asked: nothing the demo shows needs it, and it is a
dozen processes to start on a small machine), deploys the verticles, runs the food-orders topology, produces
exactly the seed's records, waits until the stores reflect them, prints the seed's curl commands, and
serves until Ctrl-C or SIGTERM. Spark's driver JVM starts in a thread beside Ray's start, compiles with
C1 only (``DEMO_JAVA_OPTIONS``) and maps its classes from an archive an earlier run left
(``topologies.spark.class_archive``; the first run writes it when it stops); the same thread then makes
the topology's frames (``food_orders.store_frames``: Spark analyses each as it is made) while the
verticles start, so only the stores' query actors and the queries' start are left for after them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runtime.config import DEFAULT_NAMESPACE, RuntimeConfig, riqr_home
from runtime.errors import RiqrError
from runtime.landing import parse_console_lines, write_records

__all__ = [
    "run_demo",
    "SEED_CUSTOMERS",
    "SEED_ORDERS",
    "DEMO_JAVA_OPTIONS",
    "seed_curls",
    "wait_until",
    "load_seed",
]

# Step 2 of seed 000, verbatim.
SEED_CUSTOMERS = "1--john\n2--adam\n3--daniel\n4--james\n5--jack\n6--mathew\n7--will"
SEED_ORDERS = "1--spagety\n2--pizza\n--pasta"

# The demo's driver JVM compiles with C1 only: C2 took 10 s of the JVM's 20-24 s of CPU before the demo
# was ready, and the demo's batches are a handful of records (docs/benchmarks.md, "Demo start-up").
DEMO_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def seed_curls(base: str, token: str | None = None) -> list[str]:
    """The curl commands of seed 000, pointed at ``base``, sending ``token`` when auth is on."""
    curl = "curl" if token is None else f'curl -H "Authorization: Bearer {token}"'
    return [
        f"{curl} {base}/metadata",
        f"{curl} {base}/metadata/stores/order-count",
        f"{curl} {base}/metadata/stores/order-count/key/1",
        f"{curl} {base}/stores/customer-v1-changelog/all",
        f"{curl} {base}/stores/customer-v1-changelog/get/2",
        f"{curl} '{base}/stores/customer-v1-changelog/range?from=1&to=5'",
        f"{curl} {base}/stores/customer-v1-changelog/approximate-num-entries",
        f"{curl} {base}/stores/order-count/get/1",
        f"{curl} {base}/stores",
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


def load_seed(home: Path) -> None:
    """Produce the records of seed 000's step 2 into the landing directories under ``home``."""
    write_records(home, "customer", parse_console_lines(SEED_CUSTOMERS.splitlines()))
    write_records(home, "order", parse_console_lines(SEED_ORDERS.splitlines()))


def demo_home(explicit: str | None) -> Path:
    """Where the demo writes, and what it resets at start: ``--home``, else ``<riqr home>/demo``. Not the riqr
    home itself: resetting that wiped the landing data and checkpoints of a deployment on the machine."""
    return riqr_home(explicit) if explicit else riqr_home() / "demo"


def run_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    home = demo_home(args.home)
    namespace = args.namespace
    # The demo's topics' dead letters too (an old run's would add to the new run's counts), not others'.
    resets = (
        home / "data" / "customer",
        home / "data" / "order",
        home / "deadletter" / "customer",
        home / "deadletter" / "order",
        home / "checkpoints" / namespace,
    )
    for sub in resets:
        if sub.exists():
            shutil.rmtree(sub)
    _say(f"[riqr demo] home {home} (landing dirs, dead letters and checkpoints reset)")
    # The stores' state follows the home too (unless $RIQR_DATA says where): the query actors read where it
    # goes from their environment, which the Ray cluster the demo starts takes from this process.
    if not os.environ.get("RIQR_DATA"):
        os.environ["RIQR_DATA"] = str(home / "state")

    # Only what starting Spark needs comes before its thread starts; Ray and the verticles' modules (about
    # half a second of CPU) are imported while Spark's JVM launches.
    from riqr.progress import Steps
    from runtime.client import connect
    from topologies import food_orders
    from topologies.options import TopologyOptions
    from topologies.spark import class_archive, spark_session, stop_jvm

    steps = Steps("[riqr demo]")
    # Ctrl-C or SIGTERM at any time stops the demo. The handler raises KeyboardInterrupt, as Python's own
    # does, to cut a step short, and also sets a flag that serving (``supervise``) starts from: a Ctrl-C
    # that came as the demo became ready was seen lost on its way (no KeyboardInterrupt reached the demo,
    # which then served until a second one; `bench.startup` hit it in every round), and with the flag it
    # stops all the same. SIGTERM before serving used to end the process with Ray's processes left behind.
    stop_requested = threading.Event()

    def on_stop_signal(signum: int, _frame: Any) -> None:
        stop_requested.set()
        raise KeyboardInterrupt(f"signal {signum}")

    previous_handlers = {sig: signal.signal(sig, on_stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    spark = None
    archive = None if args.no_class_archive else class_archive()
    java_options = (*DEMO_JAVA_OPTIONS, *(archive.options if archive else ()))
    queries: list[Any] = []
    # Spark's JVM starts in a thread beside Ray's start and the verticles' (docs/benchmarks.md, "Demo start-up":
    # with the class archive, C1 only and no Ray dashboard the two no longer fill both cores between them).
    starting_spark = ThreadPoolExecutor(max_workers=1, thread_name_prefix="riqr-demo-spark")
    spark_started: Future[Any] | None = None
    started_spark: list[Any] = []  # the session, once made (to stop its JVM if the frames fail or Ctrl-C)
    options = TopologyOptions(namespace=namespace)
    try:
        with steps:
            # The seed's records land before the topology's frames are made, so its very first micro-batch
            # brings them (and the customer snapshot, listed as its frame is made, holds them).
            load_seed(home)

            def start_spark() -> Any:
                with steps.step("starting Spark (beside Ray)"):
                    session = spark_session(app_name="riqr-demo", java_options=java_options)
                started_spark.append(session)
                # Spark analyses each frame as it is made (a second or two of the JVM's time), which does
                # not need Ray: done here, beside Ray's start and the verticles'.
                with steps.step("making the food-orders frames (beside the verticles)"):
                    return session, food_orders.store_frames(session, home, options)

            spark_started = starting_spark.submit(start_spark)
            import ray

            from riqr.access import rest_auth, token_for
            from verticles import deploy

            with steps.step("starting a local Ray cluster" + (" with its dashboard" if args.dashboard else "")):
                # address="local": a cluster of its own, always. Without it ray.init() joins whatever cluster
                # /tmp/ray/ray_current_cluster names (the last `ray start` on this machine, anyone's), and the
                # demo's Ctrl-C would then take riqr down there.
                ctx = ray.init(
                    address="local",
                    namespace=namespace,
                    include_dashboard=args.dashboard,
                    log_to_driver=False,
                    configure_logging=False,
                )
            if spark_started.done() and spark_started.exception() is not None:  # no Java: said now, not after
                spark_started.result()  # the verticles' start (the finally below stops Ray)
            # Auth on, as for riqr up: the deployment's own secret (or the operator's, from RIQR_JWT_*).
            try:
                with steps.step("starting the registry, facades and HTTP verticles"):
                    auth = rest_auth(namespace, disabled=False)
                    token = token_for(auth, subject="riqr-demo")
                    config = RuntimeConfig(
                        namespace=namespace, http_host=args.host, http_port=args.port, advertise_host="localhost",
                        auth=auth,
                    )  # fmt: skip
                    deployment = deploy.up(config)
            except (RiqrError, RuntimeError) as err:
                if stop_requested.is_set():
                    # A Ctrl-C in the middle of these calls may surface as their error rather than as a
                    # KeyboardInterrupt (it can land inside Ray's own code, and riqr translates what Ray
                    # raises); with the stop flag set it is the stop, not a failure to start (exit 0).
                    steps.say(f"stopped while starting the REST API ({type(err).__name__})")
                    return 0
                steps.say(f"could not start the REST API: {err}")
                return 2
            base = f"http://localhost:{deployment.endpoints[0].port}"
            dashboard = f"http://{ctx.dashboard_url}" if args.dashboard else "off (riqr demo --dashboard)"
            steps.say(f"REST API and web console at {base}/ ; Ray dashboard {dashboard}")
            if archive is not None:
                steps.say(
                    f"Spark's class archive: {archive.path}" if archive.warm
                    else f"Spark's class archive: none yet, written to {archive.path} when the demo stops"
                )  # fmt: skip
            spark, frames = spark_started.result()
            with steps.step("starting the food-orders topology (its stores' query actors, streaming queries)"):
                queries, start_dead_letters = food_orders.start_stores(spark, home, options, frames)
            with steps.step("waiting for the first batches to bring the seed-000 records into the stores"):
                client = connect(namespace)
                customers = client.store(food_orders.CUSTOMER_STORE)
                orders = client.store(food_orders.ORDER_COUNT_STORE)
                wait_until(
                    lambda: customers.approximate_num_entries() == 7 and orders.approximate_num_entries() == 3,
                    timeout=args.ready_timeout,
                    what="the seed data showing up in the stores",
                    interval=0.05,
                )
        _say(f"[riqr demo] steps: {steps.summary()}")
        _say(f"[riqr demo] ready in {time.monotonic() - started:.1f}s. Try:\n")
        if token is not None:
            _say("  REST authentication is on; a token for every store, valid 24 h:\n")
            print(f"  TOKEN={token}\n", flush=True)
        elif not auth.enabled:
            _say("  REST authentication is OFF (RIQR_AUTH=off): anyone who reaches the port reads every store\n")
        print("\n".join("  " + c for c in seed_curls(base, token)), flush=True)
        _say("\n  the web console: " + base + "/ (paste the token)")
        _say("  the API, browsable: " + base + "/docs (its OpenAPI document: " + base + "/openapi.json)")
        gcs = ray.get_runtime_context().gcs_address
        _say(
            f"\n  produce more while it runs, e.g.:  echo '3--tacos' | .venv/bin/riqr produce order --home {home}"
            + "\n  query it from another shell:  .venv/bin/riqr query order-count all"
            + ("" if namespace == DEFAULT_NAMESPACE else f" --namespace {namespace}")
            + f"\n  (its Ray, at {gcs}, runs with Ray's token auth: Ray sends this machine's token to a cluster it"
            + "\n  finds by itself, so naming it with --address or RAY_ADDRESS needs RAY_AUTH_MODE=token as well)"
            + "\n\n[riqr demo] serving until Ctrl-C"
        )

        # From here a stop signal only sets the flag, as in ``supervise``: a KeyboardInterrupt raised inside
        # a call into Spark's JVM (starting the dead-letter queries takes a second, and a user's Ctrl-C right
        # after the banner lands there) broke py4j's connection mid-call and printed pages of tracebacks from
        # py4j and from the JVM stopping under a query still starting. A second signal still interrupts.
        def on_stop_signal_while_serving(signum: int, frame: Any) -> None:
            if stop_requested.is_set():
                on_stop_signal(signum, frame)
            stop_requested.set()

        for sig in previous_handlers:
            signal.signal(sig, on_stop_signal_while_serving)
        # Not needed before a malformed record comes; started now, their first batches did not compete with
        # the stores' for the CPU. Records produced meanwhile are not missed: they read from their checkpoints.
        # Not started at all once a stop is asked for: a query stopped while it plans its first batch still
        # runs that batch's job, which Spark's stop has already cancelled (py4j's and Spark's tracebacks).
        if not stop_requested.is_set():
            queries += start_dead_letters()
        from topologies.runner import supervise

        return supervise(queries, stop=stop_requested)
    except KeyboardInterrupt:
        return 0
    finally:
        _say("[riqr demo] shutting down ...")
        # From here a signal only hurries the shutdown: raised inside it, it would skip the rest of it and
        # leave Spark's JVM or Ray's processes behind. (SIGKILL still ends everything at once.)
        hurry = threading.Event()
        for sig in previous_handlers:
            signal.signal(sig, lambda *_: hurry.set())
        # Stopped already if serving began; a stop during start-up (the seed's batches may be running)
        # lets their batches end first, as ``supervise`` does (``topologies.inflight``).
        active = []
        for q in queries:
            with contextlib.suppress(Exception):
                if q.isActive:
                    active.append(q)
        with contextlib.suppress(Exception):
            from topologies.inflight import stop_between_batches

            stop_between_batches(active, hurry=hurry)
        if spark is None and spark_started is not None:  # stopped or failed before the topology started
            with contextlib.suppress(Exception):
                spark_started.result()
            spark = started_spark[0] if started_spark else None
        starting_spark.shutdown()
        if spark is not None:
            stop_jvm(spark)
        if archive is not None and archive.publish():
            _say(f"[riqr demo] Spark's class archive written: {archive.path}")
        import ray  # again: a Ctrl-C may have come before the import above

        if ray.is_initialized():
            from verticles import deploy

            try:
                deploy.down(namespace)
            finally:
                ray.shutdown()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        _say("[riqr demo] stopped")
