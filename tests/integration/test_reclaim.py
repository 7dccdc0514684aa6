"""Query actors killed for real while GETs run and batches keep arriving (one by ``ray.kill``, one by
SIGKILL of its worker process), restarted by Ray: no acknowledged batch is lost and no answer is wrong.
Meanwhile the data of query actors that no longer exist is reclaimed from the node's disk, and nothing
else is: not the data of the actors restarting under load, not another cluster's live actor's.

The sweeper runs in the real HTTP verticle, every half second with a one-second grace period (the
default is five minutes), so a restart of a few seconds spans several sweeps. (One test for both: the
same topology under the same load and kills, set up once.) The registry's re-creation of actors is off
here (an actor killed for good must stay dead for the last part); owners killed under load with it on,
as by default: test_durability.py (SIGKILL) and test_replicas.py (``ray.kill``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from bench.faults import Ledger, worker_pid
from runtime.config import riqr_data
from tests.integration.conftest import RayCluster, deploy_runtime, seeded_food_orders
from tests.integration.helpers import http_get, orders_under_load, wait_for, wait_for_every_order_counted
from verticles import deploy

pytestmark = pytest.mark.integration

HOLDER = """
import sys, time
from pathlib import Path
from runtime.orphans import OwnerLock
lock = OwnerLock.take(Path(sys.argv[1]))
print("held" if lock.held else "not held", flush=True)
time.sleep(600)
"""


def _leftovers(directory: Path) -> None:
    (directory / "p0").mkdir(parents=True)
    (directory / "p0" / "000042.sst").write_bytes(b"\0" * 4096)


def _reclaimed_bytes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        families = text_string_to_metric_families(answer.read().decode())
    return sum(s.value for f in families for s in f.samples if s.name == "riqr_reclaimed_bytes_total")


def _wait_for_restart(handle: Any, killed: int, ledger: Ledger) -> None:
    wait_for(lambda: worker_pid(handle) != killed, timeout=60, what="the actor running again")
    seen = ledger.answers[200]
    wait_for(lambda: ledger.answers[200] > seen + 50, timeout=60, what="answers after the restart")


def test_owners_killed_under_load_lose_nothing_and_only_the_data_of_actors_that_no_longer_exist_is_reclaimed(
    ray_cluster: RayCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIQR_RECLAIM_AFTER", "1")  # reaches the verticles that `up` deploys
    monkeypatch.setenv("RIQR_RECREATE_AFTER", "off")  # an actor killed for good stays dead (the last part)
    with seeded_food_orders(spark, "riqr-reclaim", tmp_path, keep_running=True) as topology:
        url, ns = topology.runtime.url, topology.runtime.namespace
        root = riqr_data(ns)
        owners = [i["actor"] for i in http_get(f"{url}/metadata/stores/order-count")[2]["result"]]
        mine = {u: root / "order-count" / u for u in owners}
        assert len(mine) == 2 and all(d.is_dir() for d in mine.values())
        for directory in mine.values():
            (directory / "keepsake").write_text(directory.name)  # gone if the directory was ever deleted
        crashed = root / "order-count" / str(uuid.uuid4())  # an actor of a run that crashed
        _leftovers(crashed)
        foreign = root / "customers" / str(uuid.uuid4())  # another cluster's live actor on this host
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(foreign)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            _leftovers(foreign)

            with orders_under_load(topology.home, url) as ledger:
                wait_for(lambda: not crashed.exists(), timeout=30, what="the crashed actor's data reclaimed")
                wait_for(lambda: ledger.answers[200] > 50, what="answers before the first kill")
                # Each restart takes seconds: several sweeps see its process gone.
                for victim, how in zip(owners, ("ray.kill", "SIGKILL")):
                    handle = ray.get_actor(victim, namespace=ns)
                    killed = worker_pid(handle)
                    if how == "ray.kill":
                        ray.kill(handle, no_restart=False)  # Ray restarts it
                    else:
                        os.kill(killed, signal.SIGKILL)  # its worker dies with no word to anyone
                    _wait_for_restart(handle, killed, ledger)
            wait_for_every_order_counted(url, ledger)
            assert ledger.wrong == []
            assert all(q.isActive for q in topology.queries), [q.exception() for q in topology.queries]
            assert ledger.answers[200] > 100, ledger.answers  # the load really ran (lower on a busy machine)
            print(f"the longest a key answered 503: {ledger.longest_gap:.1f}s")  # bench/faults.py's figure to judge
            for directory in mine.values():
                assert (directory / "keepsake").read_text() == directory.name
            assert (foreign / "p0" / "000042.sst").is_file()  # its lock is held: never touched
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
        wait_for(lambda: not foreign.exists(), timeout=30, what="the dead holder's data reclaimed")
        # Counted where it was deleted, once: on one of the nodes (here both sweep the one disk the test nodes
        # share, and the one that claims a directory counts it, just after it is gone from its place).
        wait_for(lambda: sum(_reclaimed_bytes(u) for u in topology.runtime.endpoints.values()) == 2 * 4096,
                 timeout=10, what="both reclaimed directories counted once")  # fmt: skip

        # An actor dead for good (killed without restart, or one whose constructor failed, which Ray does
        # not restart either, and which the registry does not create again while that is off) still owns
        # its partitions in the registry's table: its data stays.
        topology.stop()
        gone = owners[0]
        ray.kill(ray.get_actor(gone, namespace=ns), no_restart=True)
        wait_for(lambda: ns_actor_gone(ns, gone), timeout=30, what="the killed actor's name freed")
        # An orphan planted after the kill: once it is reclaimed, sweeps a grace period apart have run since
        # the kill, and would have taken the dead actor's data first had they taken it for an orphan.
        planted = root / "order-count" / str(uuid.uuid4())
        _leftovers(planted)
        wait_for(lambda: not planted.exists(), timeout=30, what="an orphan planted after the kill reclaimed")
        assert (mine[gone] / "keepsake").read_text() == gone
    # `riqr down` could not ask the dead actor to delete its data: it is what a crash leaves. The next
    # `riqr up` of the namespace reclaims it.
    assert (mine[gone] / "keepsake").is_file()
    assert [p.name for p in mine[owners[1]].iterdir()] == ["keepsake"]  # down deleted all it made there
    again = deploy_runtime("riqr-reclaim", namespace=ns)
    try:
        wait_for(lambda: not mine[gone].exists(), timeout=30, what="the data of the actor killed for good reclaimed")
        wait_for(lambda: not mine[owners[1]].exists(), timeout=30, what="what down left of the other reclaimed")
    finally:
        deploy.down(again.namespace)


def ns_actor_gone(namespace: str, name: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return True
    return False
