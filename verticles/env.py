"""What a verticle needs from Ray, as protocols, so verticle logic is plain code that unit tests drive
with fakes. ``verticles.deploy.RayEnv`` is the Ray implementation, and the only one the actors get.

* ``NodeFacts``: where this actor runs and whether Ray restarted it;
* ``RegistryLink``: the calls a verticle makes to the registry (reporting a move, its endpoint);
* ``PeerLink``: how a query actor reaches the other copies of its partitions (rebuilding from a peer);
* ``ClusterOps``: what the registry does to the cluster (nodes, creating, finding and re-creating query
  actors, watching for dead nodes).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from runtime.catalog import StoreSpec
from runtime.metrics import Metrics
from runtime.ownership import ActorInfo, Endpoint, ReaderCopy
from runtime.snapshots import SnapshotPeer

__all__ = ["NodeFacts", "RegistryLink", "PeerLink", "ClusterOps", "VerticleEnv", "RegistryEnv", "prune_empty_dirs"]


def prune_empty_dirs(*directories: Path) -> None:
    """Remove each of ``directories`` in turn while it is empty (a store's or a namespace's directory once
    its last actor's data is deleted); stop at the first that is not, or is gone: another actor of the
    node still keeps its data there, or removed it first."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return


class NodeFacts(Protocol):
    """Facts about the actor the caller runs in (read inside the actor process)."""

    def node_id(self) -> str: ...

    def node_ip(self) -> str: ...

    def restarted(self) -> bool:
        """Whether Ray reconstructed this actor after it died (its memory is gone)."""
        ...

    def data_dir(self) -> Path | None:
        """Where this node keeps the stores' partitions (None: nowhere, state is in memory only)."""
        ...

    def export_metrics(self, metrics: Metrics) -> None:
        """Copy this actor's ``metrics`` into Ray's metrics system from now on (``verticles.metrics``)."""
        ...

    def known_actors(self) -> set[str]:
        """The actor names that are taken in the namespace: every named actor that exists (alive, being
        created or restarting: Ray frees a name only once its actor is dead for good) and every query actor
        the registry lists (one whose constructor failed is dead to Ray, not to its store). Raises when the
        registry cannot be asked."""
        ...


class RegistryLink(Protocol):
    """A verticle's calls to the registry of its namespace."""

    def report_moved(self, uuid: str, node_id: str, node_ip: str) -> None:
        """Tell the registry where a restarted query actor now runs (fire and forget)."""
        ...

    def report_restart(self, uuid: str, node_id: str, node_ip: str) -> None:
        """``report_moved``, waited for: returns once the registry has the restart (another incarnation of
        the actor in its view); a ``RiqrError`` if it could not be told. Blocking: a catch-up's thread."""
        ...

    async def endpoint_of(self, node_id: str) -> Endpoint | None:
        """The HTTP endpoint the registry lists for ``node_id``, if any."""
        ...

    async def register_endpoint(self, endpoint: Endpoint) -> None: ...

    async def unregister_endpoint(self, node_id: str) -> None: ...

    async def add_reader(self, reader: ReaderCopy) -> int:
        """Publish an HTTP verticle's read replica (``runtime.readreplica``); returns the epoch listing it."""
        ...

    async def drop_reader(self, uuid: str, reason: str) -> None:
        """Unpublish a read replica (best effort: the registry may be gone already)."""
        ...


class PeerLink(Protocol):
    """A query actor's calls to its peers (blocking: a catch-up runs in a thread of the actor)."""

    def holders(self, store: str, partition: int) -> list[str]:
        """The actors holding a copy of ``partition`` of ``store``, active first (the registry's table)."""
        ...

    def snapshot_peer(self, uuid: str) -> SnapshotPeer:
        """The query actor ``uuid``, as a source of partition snapshots (``runtime.snapshots``)."""
        ...

    def reset_refused(self, store: str, source: str) -> str | None:
        """Why batch 0 of ``source`` may not reset ``store``'s partitions, or None (``Registry.reset_refused``;
        None from a registry of an earlier riqr, which cannot say)."""
        ...


class ClusterOps(Protocol):
    """What the registry does to the cluster."""

    def alive_nodes(self) -> list[str]: ...

    def start_query_actors(
        self, stores: Sequence[tuple[StoreSpec, Sequence[tuple[str, Sequence[int], str | None]]]]
    ) -> list[list[ActorInfo]]:
        """Create a query actor per ``(uuid, partitions, node id or None)`` of every store, all at once,
        and wait until each runs; returns where each one runs, store by store."""
        ...

    def replace_query_actors(
        self, asks: Sequence[tuple[StoreSpec, str, Sequence[int], str]]
    ) -> list[ActorInfo | Exception]:
        """For each ``(spec, uuid, partitions, node id)``: stop query actor ``uuid`` for good wherever it is
        (its node is gone, or it is gone already) and create it again, same name, on that node, as a
        replacement (it opens its partitions as a restarted actor would and rebuilds them from peers). All
        are created first and waited for together (each is a new process: seconds to start); returns,
        in order, where each runs, or why it could not be created or did not start in time."""
        ...

    def start_joining_actor(self, spec: StoreSpec, uuid: str, partitions: Sequence[int], node_id: str) -> None:
        """Ask for query actor ``uuid`` on ``node_id`` as a move's new copy of ``partitions`` (they open
        incomplete and wait for ``catch_up``) and return at once: the mover waits for it to start, not the
        registry, whose calls run one at a time (the sink's epoch check before each batch among them)."""
        ...

    def query_actor_call(self, uuid: str, method: str, *args: Any) -> Any:
        """Call ``method`` of query actor ``uuid`` and wait for its answer (a move's steps: ``seal``,
        ``unseal``, ``positions``, ``catch_up``); ``OwnerUnavailable`` if it cannot be reached."""
        ...

    def query_actor_tell(self, uuid: str, method: str) -> None:
        """Call ``method`` of query actor ``uuid`` without waiting for it (a message that an actor which
        does not get it learns otherwise); an actor Ray does not know is skipped."""
        ...

    def watch_nodes(self) -> None:
        """Call the registry's ``check_nodes`` about every second from now on (in the background)."""
        ...

    def unavailable_actors(self, uuids: Sequence[str]) -> set[str]:
        """Those of the named query actors that Ray does not list alive (dead, restarting, being
        created): one look at Ray's actor table, not a call to each actor."""
        ...

    def vanished_actors(self, uuids: Sequence[str]) -> set[str] | None:
        """Those of the named query actors Ray holds no actor of that name for: killed without a restart,
        or failed in their constructor, so Ray will not bring them back (one restarting keeps its name).
        None when Ray's answer cannot be trusted (it does not list the registry asking)."""
        ...

    def serving_partitions(self, uuid: str) -> set[int]:
        """The partitions query actor ``uuid`` says it serves (complete, in sync); empty if it does not
        answer promptly."""
        ...

    def send_ping(self, uuid: str) -> Any:
        """Start a ``ping`` of query actor ``uuid`` and return what ``pings_answered`` looks at; raises if
        Ray has no such actor (``runtime.liveness``)."""
        ...

    def pings_answered(self, pings: Sequence[Any]) -> list[bool]:
        """Which of ``pings`` are done (answered, or failed), without waiting."""
        ...

    def restart_actor(self, uuid: str) -> None:
        """Kill query actor ``uuid``'s process and let Ray start it again (it reopens its partitions)."""
        ...

    def query_actor_infos(self) -> list[dict[str, Any]]:
        """``info()`` of every live query actor of the namespace (a restarted registry rebuilds from them)."""
        ...

    def load_membership(self) -> dict[str, Any] | None:
        """The stores' members the registry last saved (``runtime.membership``), None if it saved none;
        ``runtime.membership.UndecodableRecord`` when they are there but cannot be decoded, any other
        exception when they cannot be read now."""
        ...

    def save_membership(self, record: dict[str, Any]) -> None:
        """Keep ``record`` where a restarted registry finds it, whichever node it restarts on."""
        ...

    def forget_membership(self) -> None:
        """Delete the saved members (``riqr down``)."""
        ...

    def http_endpoints(self) -> list[Endpoint]:
        """Where every serving HTTP verticle of the namespace listens."""
        ...

    def nodes_with_verticles(self) -> set[str] | None:
        """The nodes that have an HTTP verticle of the namespace (serving or starting); None when Ray
        cannot list them now."""
        ...

    def start_verticles(self, node_id: str, cursor_key: bytes, among: Collection[str]) -> Any | None:
        """Begin starting a facade and an HTTP verticle on ``node_id`` with the settings the HTTP verticles
        of the nodes ``among`` (``nodes_with_verticles``) serve with, without waiting for anything; returns
        what ``verticles_started`` follows, or None when none of them can be asked."""
        ...

    def verticles_started(self, starting: Any, *, give_up: bool = False) -> tuple[bool, str] | None:
        """How ``start_verticles``' start goes, without waiting: None while under way; ``(True, url)`` once
        the node's REST API serves at ``url``; ``(False, why)`` when it failed. An HTTP verticle that did
        not start serving is stopped, so the next attempt starts a new one; ``give_up``: one still under
        way is stopped too, and that is a failure."""
        ...

    def kill(self, names: Sequence[str]) -> None:
        """Stop the named actors for good."""
        ...

    def destroy(self, uuids: Sequence[str]) -> None:
        """Stop query actors for good and delete their partitions' data."""
        ...


class VerticleEnv(NodeFacts, RegistryLink, PeerLink, Protocol):
    """What a query or HTTP verticle gets: its node facts, its link to the registry and to its peers."""


class RegistryEnv(NodeFacts, ClusterOps, Protocol):
    """What the registry gets: its node facts and its operations on the cluster."""
