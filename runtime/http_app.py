"""The REST API as an aiohttp application built by a factory.

``build_app(facade)`` wires the seed-000 paths to a facade (a ``FacadeCore`` in production, a fake in
unit tests). The HttpVerticle only starts and stops it. One middleware renders every error: riqr errors
with their own status (and Retry-After for 503s), aiohttp's routing errors as JSON, anything else as a
logged 500, which no client input should ever reach.

Responses are JSON unless the request's ``Accept`` prefers ``application/msgpack``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from runtime.codec import to_jsonable
from runtime.errors import RiqrError
from runtime.facade import FacadeCore

__all__ = ["build_app", "FACADE"]

log = logging.getLogger(__name__)

FACADE: web.AppKey[FacadeCore] = web.AppKey("riqr.facade", FacadeCore)
MSGPACK = "application/msgpack"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return MSGPACK in accept and "application/json" not in accept.split(MSGPACK)[0]


def _reply(request: web.Request, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    if _wants_msgpack(request):
        return web.Response(
            body=msgpack.packb(body, use_bin_type=True), status=status, content_type=MSGPACK, headers=headers
        )
    return web.Response(
        text=json.dumps(to_jsonable(body), ensure_ascii=False, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place errors become HTTP responses."""
    try:
        return await handler(request)
    except RiqrError as err:
        if err.status >= 500:
            log.info("%s %s -> %d %s", request.method, request.path, err.status, err.message)
        return _reply(request, err.to_json(), status=err.status, headers=err.headers())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "not-found" if exc.status == 404 else "method-not-allowed" if exc.status == 405 else "http-error"
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        body = {"error": {"code": code, "message": exc.reason, "path": request.path}}
        return _reply(request, body, status=exc.status, headers=headers)
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        body = {"error": {"code": "internal", "message": "internal error; see the server log"}}
        return _reply(request, body, status=500)


def _entries(pairs: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    return [{"key": key, "value": value} for key, value in pairs]


async def metadata(request: web.Request) -> web.Response:
    return _reply(request, {"result": await request.app[FACADE].metadata()})


async def metadata_for_store(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    return _reply(request, {"result": await request.app[FACADE].metadata_for_store(store)})


async def metadata_for_key(request: web.Request) -> web.Response:
    store, key = request.match_info["store"], request.match_info["key"]
    return _reply(request, {"result": await request.app[FACADE].metadata_for_key(store, key)})


async def catalog(request: web.Request) -> web.Response:
    return _reply(request, {"result": await request.app[FACADE].catalog()})


async def get_key(request: web.Request) -> web.Response:
    store, key = request.match_info["store"], request.match_info["key"]
    return _reply(request, {"response": await request.app[FACADE].get(store, key)})


async def all_entries(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    return _reply(request, {"result": _entries(await request.app[FACADE].all(store))})


async def range_entries(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    lo = request.query.get("from")
    hi = request.query.get("to")
    return _reply(request, {"result": _entries(await request.app[FACADE].range(store, lo, hi))})


async def approximate_num_entries(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    return _reply(request, {"result": await request.app[FACADE].approximate_num_entries(store)})


def build_app(facade: FacadeCore) -> web.Application:
    """The REST application over ``facade``. Keys in paths may be empty and may contain ``/``."""
    app = web.Application(middlewares=[error_middleware])
    app[FACADE] = facade
    app.router.add_get("/metadata", metadata)
    app.router.add_get("/metadata/stores/{store}", metadata_for_store)
    app.router.add_get("/metadata/stores/{store}/key/{key:.*}", metadata_for_key)
    app.router.add_get("/stores", catalog)
    app.router.add_get("/stores/{store}/all", all_entries)
    app.router.add_get("/stores/{store}/get/{key:.*}", get_key)
    app.router.add_get("/stores/{store}/range", range_entries)
    app.router.add_get("/stores/{store}/approximate-num-entries", approximate_num_entries)
    return app
