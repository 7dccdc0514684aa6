"""The REST API as an aiohttp application built by a factory, from one route table.

``build_app(facade, auth=...)`` wires the seed-000 paths (and riqr's additions) to a ``Facade``; the
HttpVerticle only starts and stops it. ``ROUTES`` (``runtime.rest.routes``) is the route table as data:
the app is built from it, and so is its OpenAPI document (``GET /openapi.json``, browsable at ``/docs``),
so they cannot drift apart.

Around every route's handler, ``runtime.rest.pipeline`` does what each request needs, in order: count and
time it; turn errors into JSON; check the request limits of ``runtime.config``; authenticate the bearer
token and authorize the store (``runtime.auth``). A catch-all route, added last, answers what no route
takes (404, or 405 with ``Allow``) through the same steps. Every response says ``Server: riqr``, without
a version.
"""

from __future__ import annotations

from aiohttp import web

from runtime.auth import AuthConfig
from runtime.config import MAX_BODY_BYTES, MAX_HEADER_FIELD_BYTES, MAX_HEADERS, MAX_URL_CHARS
from runtime.facade import Facade
from runtime.rest import handlers as h
from runtime.rest.openapi import SPEC, openapi_document
from runtime.rest.pipeline import CATCH_ALL, CATCH_ALL_NAME, Pipeline, Router
from runtime.rest.routes import PROBE_PATHS, PUBLIC_PATHS, ROUTES, Param, Route

__all__ = ["build_app", "FACADE", "ROUTES", "Route", "Param", "PUBLIC_PATHS", "PARSER_LIMITS"]

FACADE = h.FACADE

# aiohttp's parser limits (Application handler_args), so the test server and the verticle's agree.
PARSER_LIMITS = {"max_line_size": MAX_URL_CHARS, "max_field_size": MAX_HEADER_FIELD_BYTES, "max_headers": MAX_HEADERS}


def build_app(facade: Facade, *, auth: AuthConfig | None = None) -> web.Application:
    """The REST application over ``facade``; ``auth`` (default: off) says who may read what.

    Keys in paths may be empty and may contain ``/``. Cursors are checked with the facade's cursor key
    (``Facade(cursor_key=...)``), so every node of a deployment accepts every other's.
    """
    auth = auth if auth is not None else AuthConfig()
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        handler_args=PARSER_LIMITS,
    )
    Router.adopt(app.router)
    app[FACADE] = facade
    app[h.AUTH] = auth
    app[SPEC] = openapi_document(ROUTES, auth_enabled=auth.enabled)
    pipeline = Pipeline(facade.metrics, auth, public_paths=PUBLIC_PATHS)
    # aiohttp tries the routes under one path prefix in the order they were added: lookups by key first.
    for route in sorted(ROUTES, key=lambda r: r.handler is not h.get_key):
        resource = app.router.add_resource(route.path)
        handler = pipeline.wrap(route.handler, resource.canonical, route.query_params)
        resource.add_route("GET", handler, expect_handler=_no_expectations)
        if route.path in PROBE_PATHS:  # load balancers probe with HEAD too; aiohttp sends it no body
            resource.add_route("HEAD", handler, expect_handler=_no_expectations)
    app.router.add_route("*", CATCH_ALL, pipeline.unrouted(), name=CATCH_ALL_NAME, expect_handler=_no_expectations)
    return app


async def _no_expectations(request: web.Request) -> None:
    """An ``Expect`` header is left unanswered, and the request goes through the pipeline like any other.
    aiohttp's own handler sent ``100 Continue`` before the token was checked (inviting a body no route
    reads), and answered any other expectation with its text 417, outside riqr's errors and auth. A server
    may answer with the final status without a 100 (RFC 9110, 10.1.1): the client's body, if it sends one,
    is refused by the request limits or ignored."""
    return None
