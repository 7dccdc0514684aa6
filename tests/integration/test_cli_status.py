"""`riqr status` and `riqr query` as separate Ray drivers against a deployed riqr holding the seed-000
stores, and `riqr up` reporting its steps as plain lines when its stderr is not a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.integration.conftest import REPO, SEED_CUSTOMERS, RayCluster, Runtime

pytestmark = pytest.mark.integration


def _riqr(*args: str) -> subprocess.CompletedProcess[str]:
    return _riqr_at_once(args)[0]


def _riqr_at_once(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Each command a separate `riqr` process (a Ray driver of its own), all running at once: most of a
    CLI's time is its start, which they then share the two cores for."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250"}
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "riqr", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )  # fmt: skip
        for args in commands
    ]
    done = []
    try:
        for args, proc in zip(commands, started):
            out, err = proc.communicate(timeout=300)
            done.append(subprocess.CompletedProcess([sys.executable, "-m", "riqr", *args], proc.returncode, out, err))
    finally:
        for proc in started:  # none left running by a failed wait
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def test_status_shows_stores_partitions_replicas_positions_ingest_and_endpoints(
    seeded: Runtime, ray_cluster: RayCluster
) -> None:
    where = ("--address", ray_cluster.address, "--namespace", seeded.namespace)
    done, json_done = _riqr_at_once(("status", *where), ("status", "--json", *where))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 8}
    assert {"customer-v1-changelog", "order-count"} <= set(rows)
    for name in ("customer-v1-changelog", "order-count"):
        cells = [c.strip() for c in rows[name].split("│")[1:-1]]
        assert cells[1:3] == ["kv", "4 (+1 standby)"]  # two nodes: one standby per partition by default
        assert cells[4].startswith("4 serving, batch ")
        assert cells[5] == "0 batches"
        # The seeded topology was stopped after its batches: its feeder says so within a heartbeat.
        assert cells[6].startswith(("running, batch ", "stopped, batch "))
    for node in seeded.endpoints:  # every node holds one actor of each store, two partitions each
        assert out.count(f"{node[:12]}: 2 active") == 2
    for url in seeded.endpoints.values():
        assert f"{url}/" in out
    as_json = json.loads(json_done.stdout)
    assert sorted(s["name"] for s in as_json["stores"]) == ["customer-v1-changelog", "order-count"]
    assert sorted(as_json["endpoints"].values()) == sorted(f"{u}/" for u in seeded.endpoints.values())


def test_query_prints_values_and_entries_as_json_lines(seeded: Runtime, ray_cluster: RayCluster) -> None:
    where = ("--address", ray_cluster.address, "--namespace", seeded.namespace)
    store = ("query", "customer-v1-changelog", *where)
    get, scan, first, missing, unknown = _riqr_at_once(
        (*store, "get", "2"), (*store, "range", "2", "4"), (*store, "all", "--limit", "2", "--reverse"),
        (*store, "get", "99"), ("query", "no-such-store", *where, "get", "1"),
    )  # fmt: skip
    assert get.returncode == 0 and get.stdout == '"adam"\n', get.stderr
    assert [json.loads(line) for line in scan.stdout.splitlines()] == [
        {"key": k, "value": SEED_CUSTOMERS[k]} for k in "234"
    ]
    assert [json.loads(line)["key"] for line in first.stdout.splitlines()] == ["7", "6"]
    # an absent key is an answer (exit 1, as grep's), an unknown store the command's error (exit 2)
    assert missing.returncode == 1 and missing.stdout == "" and "riqr:" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
    assert unknown.returncode == 2 and "no-such-store" in unknown.stderr and "Traceback" not in unknown.stderr


def test_up_reports_its_steps_as_plain_lines_off_a_terminal(ray_cluster: RayCluster) -> None:
    from verticles import deploy

    namespace = f"riqr-status-{uuid.uuid4().hex[:8]}"
    try:
        done = _riqr("up", "--address", ray_cluster.address, "--namespace", namespace, "--port", "0", "--no-auth")
        assert done.returncode == 0, done.stderr
        steps = [line for line in done.stderr.splitlines() if line.startswith("[riqr up]")]
        assert steps[0] == "[riqr up] joining the Ray cluster ..."
        assert steps[1].startswith("[riqr up] joining the Ray cluster: done in ")
        assert steps[-1].startswith("[riqr up] starting the registry, facades and HTTP verticles: done in ")
        assert not any("\x1b" in line for line in steps)  # Ray's own banner may be coloured; ours is not
        assert "web console: http://127.0.0.1:" in done.stdout
        empty = _riqr("status", "--address", ray_cluster.address, "--namespace", namespace)
        assert empty.returncode == 0 and "no stores yet" in empty.stdout, empty.stderr
    finally:
        deploy.down(namespace)
    gone = _riqr("status", "--address", ray_cluster.address, "--namespace", namespace)
    assert gone.returncode == 2 and "not up" in gone.stderr


def test_drop_refuses_a_store_a_running_topology_feeds_then_drops_it_with_force(ray_cluster: RayCluster) -> None:
    import ray

    from runtime.catalog import StoreSpec, ValueField
    from runtime.feeds import FeedReport
    from runtime.keys import KeySchema
    from tests.integration.conftest import deploy_runtime
    from tests.integration.helpers import http_get, wait_for
    from verticles import deploy

    runtime = deploy_runtime("riqr-drop")
    where = ("--address", ray_cluster.address, "--namespace", runtime.namespace)
    try:
        registry = runtime.registry()
        spec = StoreSpec("doomed", KeySchema("k", "string"), (ValueField("v", "string"),), partitions=2, actors=1)
        view = ray.get(registry.create_store.remote(spec))
        members = sorted(view.table("doomed").all_owners())
        ray.get(registry.report_feeds.remote([FeedReport("doomed", "run-1", "running", batch_id=3)]))

        refused = _riqr("drop", "doomed", *where)
        assert refused.returncode == 2 and "fed by a running topology" in refused.stderr, refused.stderr
        assert ray.get(registry.view.remote()).table("doomed") is not None  # nothing changed

        done = _riqr("drop", "doomed", "--force", *where)
        assert done.returncode == 0, done.stderr
        assert f"dropped store doomed: {len(members)} query actors stopped" in done.stderr, done.stderr
        assert ray.get(registry.view.remote()).table("doomed") is None
        for uuid in members:
            with pytest.raises(ValueError):
                ray.get_actor(uuid, namespace=runtime.namespace)
        wait_for(lambda: http_get(f"{runtime.url}/stores/doomed/all")[0] == 404, what="REST seeing the drop")

        again = _riqr("drop", "doomed", *where)
        assert again.returncode == 2 and "riqr: store 'doomed' is not known" in again.stderr, again.stderr
        assert "Traceback" not in again.stderr
    finally:
        deploy.down(runtime.namespace)
    gone = _riqr("drop", "doomed", *where)  # riqr is down in that namespace now
    assert gone.returncode == 2 and "is not up in namespace" in gone.stderr, gone.stderr
