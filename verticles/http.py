"""HttpVerticle: the REST API of one node, an aiohttp server inside an async Ray actor.

It carries its own ``FacadeCore`` (the co-located facade): a REST request is routed inside this process
and only the call to the owning query actor crosses Ray. The app itself comes from
``runtime.http_app.build_app``; this actor owns start and stop, and registers its endpoint with the
registry so metadata can point clients at it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from aiohttp import web

from runtime.config import REGISTRY_NAME
from runtime.facade import FacadeCore
from runtime.http_app import build_app
from verticles.bus import RayBus

__all__ = ["HttpVerticle"]

log = logging.getLogger(__name__)


class HttpVerticle:
    """Serves the REST API on ``host:port`` (port 0 picks a free port)."""

    def __init__(
        self, namespace: str, host: str, port: int, advertise_host: str | None = None, timeout: float = 10.0
    ) -> None:
        self.namespace = namespace
        self.host = host
        self.port = port
        # Advertise what clients can reach: the bound address, unless it is a wildcard.
        wildcard = host in ("", "0.0.0.0", "::")
        self.advertise_host = advertise_host or (ray.util.get_node_ip_address() if wildcard else host)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.core = FacadeCore(RayBus(namespace), timeout=timeout)
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        if ray.get_runtime_context().was_current_actor_reconstructed:
            # Ray restarted this actor: nobody will call start(), so serve again by ourselves, on the port
            # this node had (the registry still lists it), so clients' URLs keep working.
            self._restarting = asyncio.get_event_loop().create_task(self._restart())

    async def _restart(self) -> None:
        for attempt in range(30):
            try:
                if self.port == 0:
                    registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)
                    view = await registry.view.remote()
                    previous = view.endpoints.get(self.node_id)
                    if previous is not None:
                        self.port = previous.port
                await self.start()
                log.warning("HTTP verticle restarted on port %s", self.bound_port)
                return
            except Exception:
                log.warning("HTTP verticle restart attempt %d failed", attempt + 1, exc_info=True)
                await asyncio.sleep(1)

    async def start(self) -> dict[str, object]:
        """Start serving (idempotent) and register the endpoint; returns where it listens."""
        if self._runner is None:
            await self.core.start()
            runner = web.AppRunner(build_app(self.core), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            try:
                await site.start()
            except OSError as err:
                await runner.cleanup()
                raise RuntimeError(f"cannot listen on {self.host}:{self.port}: {err.strerror}") from err
            self._runner = runner
            server: Any = site._server  # the bound port is only on the server's sockets
            sockets = server.sockets if server is not None else []
            self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
            registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)
            await registry.register_endpoint.remote(self.node_id, self.advertise_host, self.bound_port)
            log.info("riqr REST API on http://%s:%s", self.advertise_host, self.bound_port)
        return {"node_id": self.node_id, "host": self.advertise_host, "port": self.bound_port}

    async def where(self) -> dict[str, object] | None:
        """Where this verticle serves, or None if it is not serving (a restarted registry asks)."""
        if self._runner is None:
            return None
        return {"node_id": self.node_id, "host": self.advertise_host, "port": self.bound_port}

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.core.stop()
        try:
            registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)
            await registry.unregister_endpoint.remote(self.node_id)
        except ValueError:
            pass
