"""The registry's state as a plain class: catalog, ownership tables, actors, endpoints, and the epoch.

Every change bumps the epoch; facades compare epochs to know when to refresh. The Registry verticle is a
thin shell over this class that also creates the query actors a new store needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from runtime.catalog import StoreSpec
from runtime.errors import StoreConflict, StoreNotFound
from runtime.ownership import ActorInfo, ClusterView, Endpoint, OwnershipTable, ReaderCopy

__all__ = ["RegistryState"]


class RegistryState:
    """Mutable holder of the cluster's routing facts, handing out immutable ``ClusterView`` snapshots."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        # Called with the new epoch after every change (the registry wakes facades waiting for one).
        self.listeners: list[Callable[[int], None]] = []
        self._tables: dict[str, OwnershipTable] = {}
        self._actors: dict[str, ActorInfo] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._readers: dict[str, ReaderCopy] = {}

    def view(self) -> ClusterView:
        return ClusterView(
            self.epoch, dict(self._tables), dict(self._actors), dict(self._endpoints), dict(self._readers)
        )

    def existing(self, spec: StoreSpec) -> OwnershipTable | None:
        """The table of a store declared again; ``StoreConflict`` if the new declaration differs."""
        table = self._tables.get(spec.name)
        if table is None:
            return None
        differences = table.spec.layout_differences(spec)
        if differences:
            raise StoreConflict(
                f"store {spec.name!r} already exists with another definition ({'; '.join(differences)}): its "
                f"data cannot be kept; `riqr drop {spec.name}` first, which deletes it, or use another name",
                store=spec.name,
            )
        return table

    def install(self, table: OwnershipTable, actors: list[ActorInfo]) -> int:
        """Register a new store with its actors (or, in a restarted registry, a store it found again: its
        actors' incarnations are then past every one an earlier registry handed out, see ``ActorInfo``)."""
        self._tables[table.spec.name] = table
        for info in actors:
            self._actors[info.uuid] = self._stamped(info)
        return self._bump()

    def replace_table(self, table: OwnershipTable) -> int:
        """A store's owners changed (a standby promoted, an active given back); same store, same actors."""
        current = self._tables.get(table.spec.name)
        if current is None:
            raise StoreNotFound(f"store {table.spec.name!r} is not known", store=table.spec.name)
        if current != table:
            self._tables[table.spec.name] = table
            self._bump()
        return self.epoch

    def add_copy(self, table: OwnershipTable, actor: ActorInfo) -> int:
        """A move's new actor joins its store (``table`` lists it as a standby): one epoch."""
        if table.spec.name not in self._tables:
            raise StoreNotFound(f"store {table.spec.name!r} is not known", store=table.spec.name)
        self._tables[table.spec.name] = table
        self._actors[actor.uuid] = self._stamped(actor)
        return self._bump()

    def remove_actor(self, table: OwnershipTable, uuid: str) -> int:
        """A move switched over (``table`` no longer lists ``uuid``), was given up, or a copy left (``riqr
        standbys``): one epoch. ``uuid`` stays in the table's ``moved_from``: it was the store's, and a
        cursor it issued while it answered for partition 0 is the store's still (``runtime.cursor``)."""
        if table.spec.name not in self._tables:
            raise StoreNotFound(f"store {table.spec.name!r} is not known", store=table.spec.name)
        self._tables[table.spec.name] = replace(table, moved_from=table.moved_from | {uuid})
        self._actors.pop(uuid, None)
        return self._bump()

    def drop(self, store: str) -> list[str]:
        """Forget a store; returns the uuids of its actors (for the caller to stop)."""
        if store not in self._tables:
            raise StoreNotFound(f"store {store!r} is not known", store=store)
        del self._tables[store]
        uuids = [u for u, info in self._actors.items() if info.store == store]
        for uuid in uuids:
            del self._actors[uuid]
        for uuid in [u for u, r in self._readers.items() if r.store == store]:
            del self._readers[uuid]
        self._bump()
        return uuids

    def add_reader(self, reader: ReaderCopy) -> int:
        """Publish a read replica: from the next batch on the sink feeds it (``StoreNotFound`` if its store
        is gone). An HTTP verticle keeps at most one per store: one it had before on that store is dropped."""
        if reader.store not in self._tables:
            raise StoreNotFound(f"store {reader.store!r} is not known", store=reader.store)
        for uuid in [u for u, r in self._readers.items() if (r.actor, r.store) == (reader.actor, reader.store)]:
            del self._readers[uuid]
        self._readers[reader.uuid] = reader
        return self._bump()

    def drop_reader(self, uuid: str) -> bool:
        """Unpublish a read replica (it missed a batch, or its verticle stopped); whether it was listed."""
        if self._readers.pop(uuid, None) is None:
            return False
        self._bump()
        return True

    def register_endpoint(self, endpoint: Endpoint) -> int:
        if self._endpoints.get(endpoint.node_id) != endpoint:
            self._endpoints[endpoint.node_id] = endpoint
            self._bump()
        return self.epoch

    def unregister_endpoint(self, node_id: str) -> int:
        """A node's HTTP verticle stopped or its node is gone: its endpoint and read replicas go."""
        gone = [u for u, r in self._readers.items() if r.node_id == node_id]
        for uuid in gone:
            del self._readers[uuid]
        if self._endpoints.pop(node_id, None) is not None or gone:
            self._bump()
        return self.epoch

    def actor_moved(self, uuid: str, node_id: str, node_ip: str) -> int:
        """A restarted actor came back, possibly on another node: another incarnation of it, whichever node
        (a copy restarted without its data is rebuilt from a peer, which may not have the batch the copy
        acknowledged before; the delivery of that batch sees the incarnation change and sends it again)."""
        info = self._actors.get(uuid)
        if info is not None:
            self._actors[uuid] = self._stamped(info, node_id=node_id, node_ip=node_ip)
            self._bump()
        return self.epoch

    def _stamped(self, info: ActorInfo, **changes: Any) -> ActorInfo:
        """``info`` (with ``changes``) stamped with the epoch the ``_bump`` that follows it gives: its
        ``incarnation`` (``ActorInfo``)."""
        return replace(info, incarnation=self.epoch + 1, **changes)

    def _bump(self) -> int:
        self.epoch += 1
        for listener in self.listeners:
            listener(self.epoch)
        return self.epoch
