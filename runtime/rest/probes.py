"""What operators and their tools ask a node: readiness (``/ready``), metrics (``/metrics``), and how
every request is counted and timed (``record_request``).

``/health`` (in ``handlers``) asks nothing of the cluster. ``/ready`` and the cluster part of
``/metrics`` come from the facade's ``ClusterProbe`` (``runtime.health``): one shared look at the
cluster per second at most, whatever the probe and scrape rates.
"""

from __future__ import annotations

from aiohttp import web

from runtime.auth import ANONYMOUS, PRINCIPAL, AuthConfig, visible
from runtime.errors import Forbidden
from runtime.facade import Facade
from runtime.health import cluster_families, readiness
from runtime.metrics import CONTENT_TYPE, Metrics, exposition
from runtime.rest.handlers import AUTH, FACADE
from runtime.rest.render import reply

__all__ = ["ready", "metrics", "record_request", "UNMATCHED"]

# The route label of requests no route matched (their paths are never labels: they are unbounded).
UNMATCHED = "unmatched"


def _facade(request: web.Request) -> Facade:
    return request.app[FACADE]


async def ready(request: web.Request) -> web.Response:
    """200 when every partition has a serving copy and no store's feed failed or went stale; else 503 with what is
    missing."""
    verdict = readiness(await _facade(request).probe.snapshot())
    return reply(request, verdict.to_json(), status=200 if verdict.ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """This node's metrics and the cluster's, as Prometheus text.

    With auth on, the caller's token must be allowed to read every store, since store names are labels.
    """
    facade = _facade(request)
    snapshot = await facade.probe.snapshot()
    auth: AuthConfig = request.app[AUTH]
    principal = request.get(PRINCIPAL, ANONYMOUS)
    # The snapshot's view may be a second or two older than the facade's own, which every request this node
    # served a store for went through: a store in either exists, and keeps its series.
    stores = set(snapshot.view.tables) | set(facade.views.current.tables)
    hidden = [s for s in stores if not visible(auth, principal, s)]
    if hidden:
        raise Forbidden("/metrics shows every store: it needs a token allowed to read all of them")
    facade.metrics.retain_stores(stores)  # no series of a store dropped since
    body = exposition(facade.metrics, cluster_families(snapshot))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def record_request(recorder: Metrics, route: str, status: int, seconds: float) -> None:
    """Count an answered request by route pattern (``UNMATCHED`` when no route took it) and status, and
    record how long it took (the request pipeline calls it for every request, errors included)."""
    recorder.record("riqr_http_requests_total", (route, str(status)))
    recorder.record("riqr_http_request_duration_seconds", (route,), seconds)
