"""One real local Ray cluster (two nodes on this machine) and one SparkSession for the whole session.

Each group of tests deploys riqr in a namespace of its own and removes it afterwards, so tests do not
see each other's stores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime.config import RuntimeConfig
from tests.integration.helpers import http_get, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SEED_CUSTOMERS = {"1": "john", "2": "adam", "3": "daniel", "4": "james", "5": "jack", "6": "mathew", "7": "will"}
SEED_ORDER_COUNTS = {"": 1, "1": 1, "2": 1}


@dataclass
class RayCluster:
    cluster: Any
    address: str
    dashboard_url: str
    node_ids: list[str]


class _SparkBesideRay:
    """The session's SparkSession, its JVM started in a thread while Ray's processes start (as ``riqr demo``
    does): the two starts overlap instead of following each other. Stopped by the ``spark`` fixture, or
    at the end of the session if no test asked for it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="riqr-tests-spark")
        self._session: Future[Any] | None = None

    def start(self) -> None:
        from topologies.spark import shared_archive_options, spark_session

        self._session = self._pool.submit(
            spark_session,
            "local[2]",
            app_name="riqr-tests",
            conf={"spark.sql.shuffle.partitions": "2"},
            java_options=shared_archive_options(),  # a class archive a demo left, if any
        )

    def get(self) -> Any:
        assert self._session is not None, "started by the ray_cluster fixture, which the spark fixture uses"
        return self._session.result()

    def stop(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):  # one that failed to start has nothing to stop
                self._session.result().stop()
            self._session = None
            # py4j closes its gateway connections from __del__ at interpreter exit and logs that at INFO,
            # after pytest has closed the streams the handlers write to: a "Logging error" traceback under
            # a green run.
            logging.getLogger("py4j").setLevel(logging.WARNING)
        self._pool.shutdown()


_SPARK = _SparkBesideRay()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    # Ray jobs run their entrypoint with this PATH: make `python` the interpreter running the tests.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    # The stores' partitions go to a scratch data directory (the nodes inherit this environment).
    os.environ["RIQR_DATA"] = str(tmp_path_factory.mktemp("riqr-data"))
    # What spark_session sets for a local master, set here before its thread starts: the Ray processes
    # started meanwhile inherit one environment, not one that depends on which thread came first.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _SPARK.start()
    import ray
    from ray.cluster_utils import Cluster

    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "include_dashboard": True, "dashboard_port": 0},
        )
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    except BaseException:
        _SPARK.stop()  # no JVM left behind by a cluster that did not start
        raise
    ctx = ray.init(address=cluster.address, log_to_driver=False)
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2
    yield RayCluster(cluster, cluster.address, "http://" + ctx.dashboard_url, nodes)
    from runtime.client import close_in_process_facades

    close_in_process_facades()  # their background threads call Ray; stop them before leaving it
    _SPARK.stop()
    ray.shutdown()
    cluster.shutdown()


@dataclass
class Runtime:
    namespace: str
    endpoints: dict[str, str]  # node id -> base URL

    @property
    def url(self) -> str:
        return next(iter(self.endpoints.values()))

    def registry(self) -> Any:
        import ray

        from runtime.config import REGISTRY_NAME

        return ray.get_actor(REGISTRY_NAME, namespace=self.namespace)


def deploy_runtime(prefix: str, namespace: str | None = None) -> Runtime:
    """riqr deployed in a fresh namespace (or in ``namespace``, again), REST on free ports of 127.0.0.1, on
    the nodes alive now only: a node a test adds later gets no verticles of this namespace (a deployment
    for every node would start them there, ``Registry.follow_nodes``)."""
    from verticles import deploy

    namespace = namespace or f"{prefix}-{uuid.uuid4().hex[:8]}"
    deployment = deploy.up(
        RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1"),
        nodes=deploy.alive_nodes(),
    )
    return Runtime(namespace, {ep.node_id: ep.url for ep in deployment.endpoints})


@pytest.fixture(scope="session")
def spark(ray_cluster: RayCluster) -> Iterator[Any]:
    yield _SPARK.get()
    _SPARK.stop()


# The dead-letter trigger of the tests' food-orders topologies that land no malformed record.
SLOW_DEAD_LETTERS = "10 seconds"


@dataclass
class Topology:
    runtime: Runtime
    home: Path
    queries: list[Any]

    def stop(self) -> None:
        for q in self.queries:
            q.stop()


def start_food_orders(spark: Any, runtime: Runtime, home: Path) -> Topology:
    from topologies import food_orders
    from topologies.options import TopologyOptions

    # Dead letters every 10 s rather than 2 (as the tests' topology processes): fewer micro-batches beside
    # the stores' on two cores; the seed has no malformed record.
    options = TopologyOptions(
        namespace=runtime.namespace, trigger="200 milliseconds", dead_letter_trigger=SLOW_DEAD_LETTERS
    )
    queries = food_orders.start(spark, home, options)
    return Topology(runtime, home, queries)


def produce(home: Path, topic: str, lines: str) -> None:
    from runtime.landing import parse_console_lines, write_records

    write_records(home, topic, parse_console_lines(lines.splitlines()))


def load_seed(topology: Topology) -> None:
    from riqr.demo import SEED_CUSTOMERS as customers
    from riqr.demo import SEED_ORDERS as orders

    produce(topology.home, "customer", customers)
    produce(topology.home, "order", orders)
    url = topology.runtime.url
    wait_for(
        lambda: (
            http_get(f"{url}/stores/customer-v1-changelog/approximate-num-entries")[2] == {"result": 7}
            and http_get(f"{url}/stores/order-count/approximate-num-entries")[2] == {"result": 3}
        ),
        what="the seed data in both stores",
    )


@contextlib.contextmanager
def seeded_food_orders(spark: Any, prefix: str, home: Path, *, keep_running: bool) -> Iterator[Topology]:
    """riqr in a fresh namespace, the food-orders topology on it, the seed data loaded and visible.

    With ``keep_running`` false the streaming queries stop once the data is in (the stores keep it), so
    read-only tests do not share the two cores with idle micro-batches. Everything is removed on exit.
    """
    from verticles import deploy

    runtime = deploy_runtime(prefix)
    topology = start_food_orders(spark, runtime, home)
    try:
        load_seed(topology)
        if not keep_running:
            topology.stop()
        yield topology
    finally:
        topology.stop()
        deploy.down(runtime.namespace)


@pytest.fixture(scope="session")
def seeded(ray_cluster: RayCluster, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """The seed-000 scenario, loaded by the real topology (stopped once loaded), for read-only tests."""
    with seeded_food_orders(spark, "riqr-seed", tmp_path_factory.mktemp("seed-home"), keep_running=False) as topology:
        yield topology.runtime
