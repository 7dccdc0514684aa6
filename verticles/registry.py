"""Registry verticle: one detached named actor holding the catalog and the ownership tables.

A thin shell over ``runtime.registry.RegistryState``. Creating a store also creates its query actors
(through ``ClusterOps``, which ``verticles.deploy`` implements over Ray). If the registry itself restarts,
it rebuilds its tables from the query actors, which each know their store and partitions, and its
endpoints from the HTTP verticles, and starts its epoch past any value it handed out before (epochs are
wall-clock based on a rebuild), so facades refresh.

About every second it checks which nodes Ray reports alive (``check_nodes``): the query actors of a node
that died are re-created, same name, on live nodes, and rebuild their copies from peers (docs/design.md,
"Node loss").
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from runtime import logs
from runtime.auth import DeploymentSecrets
from runtime.catalog import StoreSpec
from runtime.ownership import (
    ActorInfo,
    ClusterView,
    Endpoint,
    Placement,
    plan_placement,
    replacement_node,
    table_from_placement,
)
from runtime.registry import RegistryState
from verticles.env import RegistryEnv

__all__ = ["Registry"]

log = logging.getLogger(__name__)


def _new_uuid() -> str:
    return str(uuidlib.uuid4())


class Registry:
    """The catalog and ownership table of one namespace. ``env`` reaches the cluster; ``clock`` and
    ``new_uuid`` are injectable so the rebuild and creation logic is testable without Ray."""

    def __init__(
        self,
        namespace: str,
        env: RegistryEnv,
        *,
        clock: Callable[[], float] = time.time,
        new_uuid: Callable[[], str] = _new_uuid,
        secrets: DeploymentSecrets | None = None,
    ) -> None:
        logs.configure_from_env()
        self.namespace = namespace
        # verticles.deploy passes them, so a restart (same constructor arguments) keeps them; generating
        # here is for tests only, since a restarted registry would then hand out new ones.
        self._secrets = secrets if secrets is not None else DeploymentSecrets.generate()
        self._env = env
        self._new_uuid = new_uuid
        self.state = RegistryState()
        # How ingest of each store goes, as its sink last reported (not part of the routing view: it
        # changes with every batch, and no request routes by it).
        self.ingest: dict[str, dict[str, Any]] = {}
        if env.restarted():
            self._rebuild(int(clock() * 1000))
        env.watch_nodes()

    def _rebuild(self, epoch: int) -> None:
        self.state = RegistryState(epoch=epoch)
        by_store: dict[str, list[dict[str, Any]]] = {}
        for info in self._env.query_actor_infos():
            by_store.setdefault(info["spec"].name, []).append(info)
        for name, members in by_store.items():
            spec: StoreSpec = members[0]["spec"]
            members.sort(key=lambda i: i["partitions"])
            plans = [Placement(i, m["node_id"], tuple(m["partitions"])) for i, m in enumerate(members)]
            try:
                table = table_from_placement(spec, [m["uuid"] for m in members], plans)
            except KeyError:
                log.error("store %s lost actors; it will be unavailable until recreated", name, extra={"store": name})
                continue
            actors = [ActorInfo(m["uuid"], name, m["node_id"], m["node_ip"], tuple(m["partitions"])) for m in members]
            self.state.install(table, actors)
        for endpoint in self._env.http_endpoints():
            self.state.register_endpoint(endpoint)
        log.warning("registry restarted; rebuilt %d stores from their query actors", len(by_store))

    def secrets(self) -> DeploymentSecrets:
        """The deployment's cursor key and token secret (in-cluster callers are trusted: docs/security.md)."""
        return self._secrets

    def epoch(self) -> int:
        return self.state.epoch

    def view(self) -> ClusterView:
        return self.state.view()

    def create_store(self, spec: StoreSpec) -> ClusterView:
        """Create ``spec``'s query actors and publish its table; idempotent for an identical spec."""
        if self.state.existing(spec) is not None:
            return self.state.view()
        plans = plan_placement(spec, self._env.alive_nodes())
        uuids = [self._new_uuid() for _ in plans]
        table = table_from_placement(spec, uuids, plans)
        holdings = table.all_owners()
        members = [(uuid, holdings[uuid], plan.node_id) for uuid, plan in zip(uuids, plans)]
        actors = self._env.start_query_actors(spec, members)
        self.state.install(table, actors)
        log.info("created store %s: %d partitions on %d actors", spec.name, spec.partitions, len(actors),
                 extra={"store": spec.name})  # fmt: skip
        return self.state.view()

    def drop_store(self, name: str) -> list[str]:
        """Forget a store, stop its actors and delete their data."""
        uuids = self.state.drop(name)
        self.ingest.pop(name, None)
        self._env.destroy(uuids)
        return uuids

    def report_ingest(self, store: str, info: dict[str, Any]) -> None:
        """The sink of ``store`` says how ingest goes (running, the batch applied and when, or failed and why)."""
        self.ingest[store] = {**self.ingest.get(store, {}), **info}

    def status(self) -> dict[str, Any]:
        """What is not routing: ingest state per store."""
        return {"ingest": dict(self.ingest)}

    def register_endpoint(self, node_id: str, host: str, port: int) -> int:
        return self.state.register_endpoint(Endpoint(node_id, host, port))

    def unregister_endpoint(self, node_id: str) -> int:
        return self.state.unregister_endpoint(node_id)

    def actor_moved(self, uuid: str, node_id: str, node_ip: str) -> int:
        return self.state.actor_moved(uuid, node_id, node_ip)

    def check_nodes(self) -> list[str]:
        """Re-create the query actors of nodes Ray reports dead on live nodes; returns their uuids.

        Each goes to the node ``replacement_node`` picks (no other copy of its partitions there while
        another node is left), keeps its uuid, so tables and handles by name stay valid, and its move bumps
        the epoch so facades learn where it runs. HTTP endpoints of dead nodes are unlisted. Nothing
        happens while every node is alive, and an actor already moved is not moved again; one that could
        not be re-created is tried again at the next check.
        """
        alive = sorted(self._env.alive_nodes())
        if not alive:  # Ray could not say: never move everything on a blip
            return []
        for node_id in [n for n in self.state.view().endpoints if n not in alive]:
            self.state.unregister_endpoint(node_id)
        moved: list[str] = []
        lost = sorted(u for u, info in self.state.view().actors.items() if info.node_id not in alive)
        for uuid in lost:
            view = self.state.view()  # again for each: earlier moves count in the placement
            info = view.actors[uuid]
            table = view.table(info.store)
            node = None if table is None else replacement_node(table, view.actors, uuid, alive)
            if table is None or node is None:
                continue
            log.warning("node %s is gone: re-creating query actor %s of %s on node %s", info.node_id, uuid,
                        info.store, node, extra={"store": info.store, "actor": uuid})  # fmt: skip
            try:
                new = self._env.replace_query_actor(table.spec, uuid, info.partitions, node)
            except Exception:
                log.exception("could not re-create query actor %s; trying again at the next check", uuid,
                              extra={"store": info.store, "actor": uuid})  # fmt: skip
                continue
            self.state.actor_moved(uuid, new.node_id, new.node_ip)
            moved.append(uuid)
        return moved
