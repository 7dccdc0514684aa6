"""Registry verticle: one detached named actor holding the catalog and the ownership tables.

A thin shell over ``runtime.registry.RegistryState``. Creating a store also creates its query actors
(through ``verticles.deploy``, the one place actors are made). If the registry itself restarts, it
rebuilds its tables from the query actors, which each know their store and partitions, and its endpoints
from the HTTP verticles, and starts its
epoch past any value it handed out before (epochs are wall-clock based on a rebuild), so facades refresh.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib

import ray

from runtime.catalog import StoreSpec
from runtime.ownership import ActorInfo, ClusterView, Endpoint, Placement, plan_placement, table_from_placement
from runtime.registry import RegistryState

__all__ = ["Registry"]

log = logging.getLogger(__name__)


def _alive_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


class Registry:
    """The catalog and ownership table of one namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.state = RegistryState()
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self._rebuild()

    def _rebuild(self) -> None:
        from verticles import deploy

        self.state = RegistryState(epoch=int(time.time() * 1000))
        infos = deploy.query_actor_infos(self.namespace)
        by_store: dict[str, list[dict]] = {}
        for info in infos:
            by_store.setdefault(info["spec"].name, []).append(info)
        for name, members in by_store.items():
            spec: StoreSpec = members[0]["spec"]
            members.sort(key=lambda i: i["partitions"])
            plans = [Placement(i, m["node_id"], tuple(m["partitions"])) for i, m in enumerate(members)]
            try:
                table = table_from_placement(spec, [m["uuid"] for m in members], plans)
            except KeyError:
                log.error("store %s lost actors; it will be unavailable until recreated", name)
                continue
            actors = [ActorInfo(m["uuid"], name, m["node_id"], m["node_ip"], tuple(m["partitions"])) for m in members]
            self.state.install(table, actors)
        for where in deploy.http_endpoints(self.namespace):
            self.state.register_endpoint(Endpoint(str(where["node_id"]), str(where["host"]), int(where["port"])))
        log.warning("registry restarted; rebuilt %d stores from their query actors", len(by_store))

    def epoch(self) -> int:
        return self.state.epoch

    def view(self) -> ClusterView:
        return self.state.view()

    def create_store(self, spec: StoreSpec) -> ClusterView:
        """Create ``spec``'s query actors and publish its table; idempotent for an identical spec."""
        from verticles import deploy

        if self.state.existing(spec) is not None:
            return self.state.view()
        plans = plan_placement(spec, _alive_nodes())
        uuids = [str(uuidlib.uuid4()) for _ in plans]
        table = table_from_placement(spec, uuids, plans)
        holdings = table.all_owners()
        handles = [
            deploy.create_query_verticle(self.namespace, uuid, spec, holdings[uuid], plan.node_id)
            for uuid, plan in zip(uuids, plans)
        ]
        where = ray.get([h.ready.remote() for h in handles])
        actors = [
            ActorInfo(uuid, spec.name, w["node_id"], w["node_ip"], tuple(holdings[uuid]))
            for uuid, w in zip(uuids, where)
        ]
        self.state.install(table, actors)
        log.info("created store %s: %d partitions on %d actors", spec.name, spec.partitions, len(actors))
        return self.state.view()

    def drop_store(self, name: str) -> list[str]:
        """Forget a store and stop its actors."""
        from verticles import deploy

        uuids = self.state.drop(name)
        deploy.kill_actors(self.namespace, uuids)
        return uuids

    def register_endpoint(self, node_id: str, host: str, port: int) -> int:
        return self.state.register_endpoint(Endpoint(node_id, host, port))

    def unregister_endpoint(self, node_id: str) -> int:
        return self.state.unregister_endpoint(node_id)

    def actor_moved(self, uuid: str, node_id: str, node_ip: str) -> int:
        return self.state.actor_moved(uuid, node_id, node_ip)
