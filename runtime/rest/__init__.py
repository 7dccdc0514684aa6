"""The REST API as an aiohttp application built by a factory, from one route table.

``build_app(facade, auth=...)`` wires the seed-000 paths (and riqr's additions) to a ``Facade``; the
HttpVerticle only starts and stops it. ``ROUTES`` (``runtime.rest.routes``) is the route table as data:
the app is built from it, and so is its OpenAPI document (``GET /openapi.json``, browsable at ``/docs``),
so they cannot drift apart.

Middlewares, outermost first: every request counted and timed (``probes.metrics_middleware``); errors
become JSON (``render.error_middleware``); the request limits of
``runtime.config`` (``limits.limits_middleware``); bearer-token authentication and per-store
authorization (``runtime.auth``). Every response says ``Server: riqr``, without a version.
"""

from __future__ import annotations

from aiohttp import web

from runtime.auth import AuthConfig, auth_middleware
from runtime.config import MAX_BODY_BYTES, MAX_HEADER_FIELD_BYTES, MAX_HEADERS, MAX_URL_CHARS
from runtime.facade import Facade
from runtime.rest import handlers as h
from runtime.rest.limits import limits_middleware
from runtime.rest.openapi import SPEC, openapi_document
from runtime.rest.probes import metrics_middleware
from runtime.rest.render import SERVER_NAME, error_middleware
from runtime.rest.routes import PUBLIC_PATHS, ROUTES, Param, Route

__all__ = ["build_app", "FACADE", "ROUTES", "Route", "Param", "PUBLIC_PATHS", "PARSER_LIMITS"]

FACADE = h.FACADE

# aiohttp's parser limits (Application handler_args), so the test server and the verticle's agree.
PARSER_LIMITS = {"max_line_size": MAX_URL_CHARS, "max_field_size": MAX_HEADER_FIELD_BYTES, "max_headers": MAX_HEADERS}


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp would announce "Python/3.x aiohttp/x.y"; a version only helps whoever scans for old ones.
    response.headers["Server"] = SERVER_NAME


def build_app(facade: Facade, *, auth: AuthConfig | None = None) -> web.Application:
    """The REST application over ``facade``; ``auth`` (default: off) says who may read what.

    Keys in paths may be empty and may contain ``/``. Cursors are checked with the facade's cursor key
    (``Facade(cursor_key=...)``), so every node of a deployment accepts every other's.
    """
    auth = auth if auth is not None else AuthConfig()
    app = web.Application(
        middlewares=[
            metrics_middleware(facade.metrics),
            error_middleware,
            limits_middleware,
            auth_middleware(auth, public_paths=PUBLIC_PATHS),
        ],
        client_max_size=MAX_BODY_BYTES,
        handler_args=PARSER_LIMITS,
    )
    app[FACADE] = facade
    app[h.AUTH] = auth
    app[SPEC] = openapi_document(ROUTES, auth_enabled=auth.enabled)
    app.on_response_prepare.append(_server_header)
    for route in ROUTES:
        app.router.add_get(route.path, route.handler, allow_head=False)
    return app
