"""What every REST request passes through around its route's handler, in order:

1. count and time it, by route pattern and status, whatever the outcome (``probes.record_request``;
   499 when the client went away first);
2. turn every error into a JSON (or msgpack) answer (``render.error_response``);
3. refuse what is over the request limits (``limits.check_limits``), before authentication;
4. authenticate the bearer token and authorize the store the route names (``runtime.auth.Authenticator``);
5. refuse query parameters a store or metadata route does not take, or takes once (``limits.check_params``);
6. run the handler, and say ``Server: riqr`` (no version) on what it answers.

``Pipeline.wrap`` puts these around each route's handler when the app is built, rather than as aiohttp
middlewares: aiohttp runs every middleware as a coroutine wrapped around the next, adds one of its own
whenever an app has any, and sends a signal per response for a header. Four middlewares and that signal
cost about 25 us of CPU per GET, a quarter of what the HTTP verticle spent on a lookup answered from its
read replica (docs/design.md, "Where a GET's time goes"). A request no route takes reaches ``unrouted``
through a catch-all route with the same steps, so it is counted, needs a token like any other, and is
answered 404, or 405 with ``Allow`` when another method would have been routed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from aiohttp import web
from aiohttp.web_urldispatcher import MatchInfoError, UrlMappingMatchInfo

from runtime.auth import PUBLIC_PATHS, AuthConfig, Authenticator
from runtime.metrics import Metrics
from runtime.rest.limits import check_limits, check_params
from runtime.rest.probes import UNMATCHED, record_request
from runtime.rest.render import BROKE_OFF, CLIENT_LEFT, COMMON_HEADERS, Handler, error_response

__all__ = ["Pipeline", "Router", "unrouted", "CATCH_ALL", "CATCH_ALL_NAME"]

# The pattern and name of the catch-all route, added last: it takes every path and method no other takes
# (``[\s\S]``, not ``.``: a decoded path may hold a newline, and aiohttp's own 404 is text, unaudited).
CATCH_ALL = "/{unrouted:[\\s\\S]*}"
CATCH_ALL_NAME = "unrouted"


class Router(web.UrlDispatcher):
    """aiohttp's router, which also sends a request whose target is not a path (``OPTIONS *``, ``CONNECT
    host:port``) to the catch-all route: no pattern starting with ``/`` matches it, and aiohttp answered it
    itself, as text with its version in ``Server``, asking for no token and counted nowhere.

    aiohttp deprecates giving an application a router of one's own, so ``adopt`` makes the application's
    own router this class (it adds no state); it checks the one thing it relies on, so an aiohttp upgrade
    that changes it fails at start rather than serving text again."""

    __slots__ = ()

    @classmethod
    def adopt(cls, router: web.UrlDispatcher) -> None:
        if type(router) is not web.UrlDispatcher:
            raise TypeError(f"expected aiohttp's UrlDispatcher, got {type(router).__name__}")
        router.__class__ = cls

    async def resolve(self, request: web.Request) -> UrlMappingMatchInfo:
        match = await super().resolve(request)
        if isinstance(match, MatchInfoError) and not request.rel_url.path.startswith("/"):
            route = next(iter(self[CATCH_ALL_NAME]))
            return UrlMappingMatchInfo({"unrouted": request.rel_url.path}, route)
        return match


class Pipeline:
    """The steps around every handler: metrics into ``recorder``, tokens checked against ``auth``
    (except on ``public_paths``)."""

    def __init__(self, recorder: Metrics, auth: AuthConfig, *, public_paths: Iterable[str] = PUBLIC_PATHS) -> None:
        self.recorder = recorder
        self.authenticator = Authenticator(auth, public_paths=public_paths)

    def wrap(self, handler: Handler, route: str, params: frozenset[str] | None = None) -> Handler:
        """``handler`` with the pipeline around it; ``route`` is its pattern, the metrics' route label;
        ``params``, when given, the only query parameters it takes, each at most once (``check_params``)."""
        recorder = self.recorder
        authenticate = self.authenticator.check

        async def pipeline(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            status = 500
            try:
                try:
                    check_limits(request)
                    authenticate(request)  # a 401 or 403 is rendered below, in the format asked for
                    if params is not None and request.rel_url.raw_query_string:
                        check_params(request, params)
                    response = await handler(request)
                except Exception as exc:  # noqa: BLE001 - error_response logs what it does not know
                    response = error_response(request, exc)
                if not response.prepared:  # a stream sets the headers itself before it starts
                    response.headers.update(COMMON_HEADERS)
                status = request.get(BROKE_OFF, response.status)  # a stream that broke off counts as its error
                return response
            except web.HTTPException as exc:  # below 400: aiohttp answers it (a redirect)
                exc.headers.update(COMMON_HEADERS)
                status = exc.status
                raise
            except asyncio.CancelledError:
                status = CLIENT_LEFT
                raise
            finally:
                record_request(recorder, route, status, time.perf_counter() - started)

        pipeline.__name__ = pipeline.__qualname__ = getattr(handler, "__name__", "handler")
        pipeline.__doc__ = handler.__doc__
        return pipeline

    def unrouted(self) -> Handler:
        """The catch-all route's handler, wrapped (counted under the route label ``unmatched``)."""
        return self.wrap(unrouted, UNMATCHED)


async def unrouted(request: web.Request) -> web.StreamResponse:
    """404 for a path no route takes; 405 (with the methods that would be) for a routed path asked with
    another method."""
    allowed: set[str] = set()
    if request.method != "GET":  # every route is a GET (the probes a HEAD too): another method may name one
        for resource in request.app.router.resources():
            if resource.name == CATCH_ALL_NAME:
                continue
            _, methods = await resource.resolve(request)
            allowed |= methods
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()
