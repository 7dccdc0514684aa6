"""The README's cluster path, end to end with the real command-line tools:

riqr up -> ray job submit (the topology as a Ray job) -> riqr produce -> REST -> owners hung, an order landing ->
ray job stop (the batch waiting on them given up, quietly) -> riqr down
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
from ray.job_submission import JobSubmissionClient

from bench.faults import worker_pid
from riqr.demo import SEED_CUSTOMERS, SEED_ORDERS
from tests.integration.conftest import REPO, RayCluster, produce
from tests.integration.conftest import SEED_CUSTOMERS as CUSTOMERS
from tests.integration.helpers import http_get, wait_for
from topologies.checkpoint import last_committed, last_planned
from topologies.options import checkpoint_for

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


class JobDied(AssertionError):
    pass


def run(*args: str, stdin: str | None = None, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
    )
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _running(dashboard: str, job_id: str) -> bool:
    try:
        return not JobSubmissionClient(dashboard).get_job_status(job_id).is_terminal()
    except RuntimeError:  # never submitted
        return False


def _waiting_on_owners(checkpoint: Path) -> Callable[[], int | None]:
    """The batch Spark planned and has not committed for 2 s: a batch of a few records takes well under a
    second of Spark here, so it is in the sink, waiting on the owners. (One seen as the owners stopped may
    have been delivered already and be committed a moment later: the next one is then the one.)"""
    first_seen: dict[int, float] = {}

    def check() -> int | None:
        planned, committed = last_planned(str(checkpoint)), last_committed(str(checkpoint))
        if planned is None or (committed is not None and committed >= planned):
            return None
        return planned if time.monotonic() - first_seen.setdefault(planned, time.monotonic()) >= 2.0 else None

    return check


def test_topology_as_a_ray_job(ray_cluster: RayCluster, tmp_path: Path) -> None:
    namespace = f"riqr-job-{uuid.uuid4().hex[:8]}"
    job_id = f"riqr-food-orders-{uuid.uuid4().hex[:8]}"
    dashboard = ray_cluster.dashboard_url
    out = run(
        BIN / "riqr",
        "up",
        "--address",
        ray_cluster.address,
        "--namespace",
        namespace,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--advertise-host",
        "127.0.0.1",
    )
    urls = re.findall(r"REST API at (http://\S+)", out)
    assert len(urls) == 2, out
    # riqr up serves with auth on and prints a token for every store (a JWT: three base64url parts).
    [token] = re.findall(r"\beyJ[\w-]+\.[\w-]+\.[\w-]+", out)
    bearer = {"Authorization": f"Bearer {token}"}
    try:
        run(
            BIN / "ray",
            "job",
            "submit",
            "--address",
            dashboard,
            "--submission-id",
            job_id,
            "--no-wait",
            "--working-dir",
            ".",
            # Both test nodes share this machine's session directory: an eager install of the job's
            # working_dir on the second node would unpack over the directory the driver runs in. On
            # a real cluster each node has its own disk and the README's plain command is enough.
            "--runtime-env-json",
            '{"config": {"eager_install": false}}',
            "--",
            "python",
            "-m",
            "topologies.food_orders",
            "--namespace",
            namespace,
            "--home",
            str(tmp_path),
            "--partitions",
            "2",
            "--actors",
            "2",
            "--trigger",
            "200 milliseconds",
        )
        run(BIN / "riqr", "produce", "customer", "--home", str(tmp_path), stdin=SEED_CUSTOMERS)
        run(BIN / "riqr", "produce", "order", "--home", str(tmp_path), stdin=SEED_ORDERS)

        def seeded() -> bool:
            all_customers = http_get(f"{urls[1]}/stores/customer-v1-changelog/all", bearer)[2]
            orders = http_get(f"{urls[0]}/stores/order-count/approximate-num-entries", bearer)[2]
            return all_customers == {
                "result": [{"key": k, "value": v} for k, v in sorted(CUSTOMERS.items())]
            } and orders == {"result": 3}

        jobs = JobSubmissionClient(dashboard)

        def seeded_or_job_died() -> bool:
            status = jobs.get_job_status(job_id)
            if status.is_terminal():
                raise JobDied(f"job {job_id} ended {status}:\n{jobs.get_job_logs(job_id)[-4000:]}")
            return seeded()

        wait_for(seeded_or_job_died, timeout=240, what="the Ray job's topology serving the seed data", fatal=(JobDied,))
        assert http_get(f"{urls[1]}/stores/order-count/get/1", bearer)[2] == {"response": 1}
        assert http_get(f"{urls[0]}/stores/order-count/get/", bearer)[2] == {"response": 1}

        # Stopped while a batch waits on owners that do not answer: every owner of order-count hung (SIGSTOP,
        # alive to Ray), an order landing, its batch in the sink. ray job stop sends SIGTERM to the job's
        # whole process tree, Spark's JVM too, and SIGKILLs it 3 s later: the topology stops its queries and
        # Spark itself (the JVM ignores SIGTERM, topologies.spark.ignore_sigterm_in_jvm) and says so, rather
        # than its JVM's shutdown hooks stopping Spark under the queries; and it gives up on the batch rather
        # than wait out the owners' call timeout (30 s) or the delivery's minute of retries, quietly.
        checkpoint = checkpoint_for(tmp_path, namespace, "order-count")
        pids = [
            worker_pid(ray.get_actor(i["actor"], namespace=namespace))
            for i in http_get(f"{urls[0]}/metadata/stores/order-count", bearer)[2]["result"]
        ]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            produce(tmp_path, "order", "3--soup")
            batch = wait_for(_waiting_on_owners(checkpoint), timeout=60, interval=0.05,
                             what="a batch waiting on the hung owners for 2 s")  # fmt: skip
            asked = time.monotonic()
            stopped = subprocess.run(
                [BIN / "ray", "job", "stop", "--address", dashboard, job_id], capture_output=True, timeout=120, cwd=REPO
            )  # fmt: skip
            took = time.monotonic() - asked
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert stopped.returncode == 0, stopped.stderr
        logs = wait_for(
            lambda: jobs.get_job_status(job_id).is_terminal() and jobs.get_job_logs(job_id), timeout=60,
            what="the stopped job's logs",
        )  # fmt: skip
        print(f"ray job stop returned after {took:.1f}s, batch {batch} given up")
        assert "topology stopped" in logs, logs[-4000:]
        assert f"delivering batch {batch} of order-count: the topology is stopping and gave up" in logs, logs[-4000:]
        assert "ended as the stop's interruption" in logs, logs[-4000:]
        # The stop's one warning names the query; nothing else is an error or a warning (py4j's and Spark's
        # tracebacks of a batch that failed, or of a query stopped under its job, are gone).
        noise_re = re.compile(r"Traceback|py4j|CANCELLED|Exception|ERROR|level=(error|warning)")
        noise = [line for line in logs.splitlines() if noise_re.search(line)]
        assert [line for line in noise if "did not end within 1.5s; the stop cancels it" not in line] == [], noise
        assert len(noise) == 1, logs[-4000:]
        # The batch given up is not committed: the next start runs it again (test_topology_kill has Spark play a
        # half-delivered batch again and counts every order), and its feed's last word is the stop, not a failure.
        assert last_committed(str(checkpoint)) == batch - 1
        feed = {s["name"]: s for s in http_get(f"{urls[0]}/stores", bearer)[2]["result"]}["order-count"]["ingest"]
        assert feed["state"] == "stopped", feed
    finally:
        if _running(dashboard, job_id):  # a failed test's job (the stop above ended a passing one's)
            subprocess.run(
                [BIN / "ray", "job", "stop", "--address", dashboard, job_id], capture_output=True, timeout=120, cwd=REPO
            )
        said = run(BIN / "riqr", "down", "--address", ray_cluster.address, "--namespace", namespace)
    # It says which cluster it acted on (without --address, Ray's "auto" picks whichever this machine runs).
    port = ray_cluster.address.rsplit(":", 1)[1]
    assert f"riqr actors in namespace {namespace} of the Ray cluster at " in said and f":{port}" in said, said
    # The verticles are gone: nothing of the namespace is left behind.
    left = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]
    assert left == []
    # Nor on disk: the stores' partitions, their directories and the registry's ingest records are deleted
    # (both nodes keep their state under the RIQR_DATA the ray_cluster fixture set).
    data = Path(os.environ["RIQR_DATA"]) / namespace
    assert not data.exists(), sorted(str(p.relative_to(data)) for p in data.rglob("*"))
    assert os.path.isdir(tmp_path / "checkpoints" / namespace)
