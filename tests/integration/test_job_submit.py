"""The README's cluster path, end to end with the real command-line tools:

riqr up -> ray job submit (the topology as a Ray job) -> riqr produce -> REST -> ray job stop -> riqr down
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from ray.job_submission import JobSubmissionClient

from riqr.demo import SEED_CUSTOMERS, SEED_ORDERS
from tests.integration.conftest import REPO, RayCluster
from tests.integration.conftest import SEED_CUSTOMERS as CUSTOMERS
from tests.integration.helpers import http_get, wait_for

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
        # ray job stop sends SIGTERM to the job's whole process tree, Spark's JVM too: the topology stops its
        # queries and Spark itself (the JVM ignores SIGTERM, topologies.spark.ignore_sigterm_in_jvm) and says so,
        # rather than its JVM's shutdown hooks stopping Spark under the queries.
        stopped = subprocess.run(
            [BIN / "ray", "job", "stop", "--address", dashboard, job_id], capture_output=True, timeout=120, cwd=REPO
        )
        assert stopped.returncode == 0, stopped.stderr
        logs = wait_for(
            lambda: jobs.get_job_status(job_id).is_terminal() and jobs.get_job_logs(job_id), timeout=60,
            what="the stopped job's logs",
        )  # fmt: skip
        assert "topology stopped" in logs, logs[-4000:]
        noise_re = re.compile(r"Traceback|py4j|CANCELLED|Exception|ERROR|level=(error|warning)")
        noise = [line for line in logs.splitlines() if noise_re.search(line)]
        assert noise == [], logs[-4000:]
    finally:
        if _running(dashboard, job_id):  # a failed test's job (the stop above ended a passing one's)
            subprocess.run(
                [BIN / "ray", "job", "stop", "--address", dashboard, job_id], capture_output=True, timeout=120, cwd=REPO
            )
        run(BIN / "riqr", "down", "--address", ray_cluster.address, "--namespace", namespace)
    # The verticles are gone: nothing of the namespace is left behind.
    import ray

    left = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]
    assert left == []
    # Nor on disk: the stores' partitions, their directories and the registry's ingest records are deleted
    # (both nodes keep their state under the RIQR_DATA the ray_cluster fixture set).
    data = Path(os.environ["RIQR_DATA"]) / namespace
    assert not data.exists(), sorted(str(p.relative_to(data)) for p in data.rglob("*"))
    assert os.path.isdir(tmp_path / "checkpoints" / namespace)
