"""HttpVerticle: the REST API of one node, an aiohttp server inside an async Ray actor.

It carries its own ``Facade`` (the co-located facade): a REST request is routed inside this process and
only the call to the owning query actor crosses Ray. For stores declared with ``read_replicas`` it also
holds a read replica (``runtime.readreplica``), fed by the sink like a standby, and answers key lookups
from it without crossing Ray at all. The app itself comes from ``runtime.rest.build_app``;
this actor owns start and stop, and registers its endpoint with the registry so metadata can point
clients at it. If Ray restarts it, it serves again by itself on the port its node had.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from aiohttp import web

from runtime import logs
from runtime.auth import AuthConfig, authenticate
from runtime.bus import Bus
from runtime.config import DEFAULT_REQUEST_TIMEOUT, http_name, http_url
from runtime.errors import CannotListen, RiqrError
from runtime.facade import Facade
from runtime.metrics import Metrics
from runtime.orphans import Sweeper, reclaim_after
from runtime.ownership import ClusterView, Endpoint
from runtime.partition import ApplyResult, Hold
from runtime.readreplica import ReadReplica, ReadReplicas
from runtime.rest import build_app
from runtime.rest.server import start_runner
from verticles.env import VerticleEnv
from verticles.query import StorePeers

__all__ = ["HttpVerticle"]

log = logging.getLogger(__name__)

_WILDCARDS = ("", "0.0.0.0", "::")


def http_settings(host: str, port: int, advertise_host: str | None, auth: AuthConfig | None) -> dict[str, object]:
    """The settings an HTTP verticle is started with, as it reports them and as ``deploy.up`` asks for
    them (``deploy.kept_settings`` compares the two); the auth as its fingerprint, never a key."""
    return {"host": host, "port": port, "advertise_host": advertise_host,
            "auth": auth.fingerprint() if auth is not None else "off"}  # fmt: skip


# ``token_refusal``'s answer for a REST API that checks no tokens.
NO_AUTH = "checks no tokens (riqr up --no-auth): requests need none"


class HttpVerticle:
    """Serves the REST API on ``host:port`` (port 0 picks a free port)."""

    def __init__(
        self,
        bus: Bus,
        env: VerticleEnv,
        host: str,
        port: int,
        advertise_host: str | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        *,
        restart_attempts: int = 30,
        restart_backoff: float = 1.0,
        auth: AuthConfig | None = None,
        cursor_key: bytes | None = None,
    ) -> None:
        # ``auth`` and ``cursor_key`` are constructor arguments so that Ray's restart of this actor keeps
        # them: it serves the same tokens and accepts the cursors it issued before.
        logs.configure_from_env()
        self._env = env
        self.auth = auth if auth is not None else AuthConfig()
        self.host = host
        self.port = port
        # What it was started with, as `riqr up` asks: a later `up` with other settings finds this one
        # running (Ray's get_if_exists ignores the new arguments) and tells the operator.
        self._asked = http_settings(host, port, advertise_host, self.auth)
        self._timeout = timeout
        # Advertise what clients can reach: the bound address, unless it is a wildcard.
        self.advertise_host = advertise_host or (env.node_ip() if host in _WILDCARDS else host)
        self.node_id = env.node_id()
        self.replicas = ReadReplicas(http_name(self.node_id), self.node_id, lambda store: StorePeers(env, store))
        self.core = Facade(bus, timeout=timeout, cursor_key=cursor_key, local=self.replicas)
        self.core.views.listeners.append(self._follow)
        self._tasks: set[asyncio.Task[None]] = set()
        env.export_metrics(self.core.metrics)  # what /metrics shows of this process, into Ray's metrics too
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._registered = False  # the registry lists this verticle's endpoint
        self._restart_attempts = restart_attempts
        self._restart_backoff = restart_backoff
        self.restarting: asyncio.Task[None] | None = None
        self._sweeping = self._start_sweeper(env, self.core.metrics)
        if env.restarted():
            # Ray restarted this actor: nobody will call start(), so serve again by ourselves, on the port
            # this node had (the registry still lists it), so clients' URLs keep working.
            self.restarting = asyncio.get_event_loop().create_task(self._restart(), name="riqr-http-restart")

    @staticmethod
    def _start_sweeper(env: VerticleEnv, metrics: Metrics) -> threading.Event | None:
        """Delete, in the background, what actors that no longer exist left on this node's disk
        (``runtime.orphans``); returns the event that stops it, or None when there is nothing to sweep."""
        root, grace = env.data_dir(), reclaim_after()
        if root is None or grace is None:
            return None
        stop = threading.Event()
        sweeper = Sweeper(root, env.known_actors, grace, metrics=metrics)
        threading.Thread(target=sweeper.run, args=(stop,), name="riqr-sweeper", daemon=True).start()
        return stop

    async def _restart(self) -> None:
        for attempt in range(1, self._restart_attempts + 1):
            try:
                if self.port == 0:
                    previous = await self._env.endpoint_of(self.node_id)
                    if previous is not None:
                        self.port = previous.port
                await self.start()
                log.warning("HTTP verticle restarted on port %s", self.bound_port)
                return
            except Exception:
                log.warning("HTTP verticle restart attempt %d failed", attempt, exc_info=True)
                await asyncio.sleep(self._restart_backoff)

    # -- read replicas (runtime.readreplica) -----------------------------------------------------------

    def _follow(self, view: ClusterView) -> None:
        """Every new view: make the read replicas it calls for, and publish them."""
        for replica in self.replicas.follow(view):
            task = asyncio.get_running_loop().create_task(self._publish(replica), name="riqr-replica-publish")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _publish(self, replica: ReadReplica) -> None:
        try:
            epoch = await self._env.add_reader(replica.reader)
        except Exception as err:  # the registry restarting, or the store dropped meanwhile
            log.warning("could not publish read replica %s of %s (%s); trying again", replica.uuid,
                        replica.reader.store, err, extra={"store": replica.reader.store})  # fmt: skip
            self.replicas.forget(replica, "its publication failed")
            await asyncio.sleep(1.0)
            self._follow(self.core.view)
            return
        self.replicas.published(replica, epoch)

    async def apply_replica(
        self, uuid: str, source: str, batch_id: int, slices: Mapping[int, pa.Table | None], hold: Hold | None = None
    ) -> list[ApplyResult]:
        """The sink delivers a batch to read replica ``uuid`` (applied in a worker thread, so lookups go on)."""
        return await asyncio.to_thread(self.replicas.apply, uuid, source, batch_id, slices, hold)

    async def apply_replica_parts(
        self,
        uuid: str,
        source: str,
        batch_id: int,
        partitions: Sequence[int],
        *tables: pa.Table | None,
        hold: Hold | None = None,
    ) -> list[ApplyResult]:
        """``apply_replica`` with each partition's slice a top-level argument (see ``QueryVerticle.apply_parts``)."""
        return await self.apply_replica(uuid, source, batch_id, dict(zip(partitions, tables, strict=True)), hold)

    async def read_replicas(self) -> list[dict[str, Any]]:
        """This verticle's read replicas: store, whether they answer, each partition's position."""
        return self.replicas.describe()

    def _where(self) -> dict[str, object]:
        return {"node_id": self.node_id, "host": self.advertise_host, "port": self.bound_port, "settings": self._asked}

    async def start(self) -> dict[str, object]:
        """Start serving (idempotent) and register the endpoint; returns where it listens."""
        if self._runner is None:
            await self.core.start()
            runner = await start_runner(build_app(self.core, auth=self.auth))
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            try:
                await site.start()
            except (OSError, OverflowError) as err:  # OverflowError: a port past 65535 (bind()'s own check)
                await runner.cleanup()
                await self._unpublish("its REST API could not listen")  # up kills this verticle next
                # A riqr error, so its reason reaches the caller of ``riqr up`` (Ray's translation turns any
                # other exception into "failed inside the actor"). The errno's own words (aiohttp's text
                # repeats the address); a name that does not resolve (socket.gaierror, errno below 0) has its
                # resolver's.
                errno = (err.errno if isinstance(err, OSError) else None) or 0
                reason = os.strerror(errno) if errno > 0 else (getattr(err, "strerror", None) or str(err))
                raise CannotListen(f"cannot listen on {self.host}:{self.port}: {reason}") from err
            self._runner = runner
            addresses = runner.addresses
            self.bound_port = int(addresses[0][1]) if addresses else self.port
        if not self._registered:
            # Apart from the listening: a start whose registration failed (the registry restarting, or busy
            # past the call's deadline) is tried again (``_restart``, or the caller), and registers then.
            assert self.bound_port is not None
            await self._env.register_endpoint(Endpoint(self.node_id, self.advertise_host, self.bound_port))
            self._registered = True
            log.info("riqr REST API on %s (auth %s)", http_url(self.advertise_host, self.bound_port),
                     "on" if self.auth.enabled else "off")  # fmt: skip
            if not self.auth.enabled and self.host not in ("127.0.0.1", "::1", "localhost"):
                log.warning("the REST API on %s:%s has no authentication: anyone who reaches it reads every store",
                            self.host, self.bound_port)  # fmt: skip
        return self._where()

    async def _unpublish(self, why: str) -> None:
        """Stop following the cluster and withdraw this verticle's read replicas from the registry."""
        await self.core.stop()
        for task in list(self._tasks):
            task.cancel()
        for replica in self.replicas.close():
            await self._env.drop_reader(replica.uuid, why)

    async def token_refusal(self, token: str) -> str | None:
        """Why this node's REST API would refuse ``token`` (None: it takes it). ``riqr token`` asks before
        printing one: it mints with the deployment's generated key, which a REST API started with an
        operator's key, a public key or no auth at all does not use."""
        if not self.auth.enabled:
            return NO_AUTH
        try:
            authenticate(self.auth, f"Bearer {token}")
        except RiqrError as err:
            return err.message
        return None

    async def deployment(self) -> dict[str, Any]:
        """What it was started with, keys and all, for the registry to start a node that joins with the
        same (``Registry.follow_nodes``): the port asked for, not the one bound (0 stays "any free one")."""
        return {"host": self.host, "port": self._asked["port"], "advertise_host": self._asked["advertise_host"],
                "timeout": self._timeout, "auth": self.auth if self.auth.enabled else None}  # fmt: skip

    async def where(self) -> dict[str, object] | None:
        """Where this verticle serves, or None if it is not serving (a restarted registry asks)."""
        return None if self._runner is None else self._where()

    async def stop(self) -> None:
        if self._sweeping is not None:
            self._sweeping.set()
        if self.restarting is not None and not self.restarting.done():
            self.restarting.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._unpublish("its HTTP verticle stopped")
        await self._env.unregister_endpoint(self.node_id)
        self._registered = False
