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
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote, unquote_plus

import msgpack
from aiohttp import web

from runtime.codec import to_json
from runtime.errors import InvalidParameter, RiqrError
from runtime.facade import FacadeCore
from runtime.scan import Scan, decode_cursor
from runtime.windows import Windowed

__all__ = ["build_app", "FACADE"]

log = logging.getLogger(__name__)

FACADE: web.AppKey[FacadeCore] = web.AppKey("riqr.facade", FacadeCore)
MSGPACK = "application/msgpack"
NDJSON = "application/x-ndjson"

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
        text=to_json(body),
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


def _entry_json(entry: Any) -> dict[str, Any]:
    if isinstance(entry, Windowed):
        return entry.to_json()
    return {"key": entry[0], "value": entry[1]}


def _entries(entries: list[Any]) -> list[dict[str, Any]]:
    return [_entry_json(entry) for entry in entries]


async def metadata(request: web.Request) -> web.Response:
    return _reply(request, {"result": await request.app[FACADE].metadata()})


async def metadata_for_store(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    return _reply(request, {"result": await request.app[FACADE].metadata_for_store(store)})


async def _split_key(request: web.Request, store: str, raw: str, *, query: bool = False) -> Any:
    """A key as written in a URL, in the form the facade takes: text, or a tuple of texts.

    Keys of several columns (for a window or session store: without the window start) are written as
    their components joined by '/', each percent-encoded on its own, so a '/' inside a component is
    '%2F'. That is why this splits the *raw* (still encoded) text.
    """
    decode = unquote_plus if query else unquote
    spec = (await request.app[FACADE].table(store)).spec
    if spec.user_key_columns > 1:
        return tuple(decode(part) for part in raw.split("/"))
    return decode(raw)


async def _key_bounds(request: web.Request, store: str) -> tuple[Any, Any]:
    """``keyFrom`` and ``keyTo`` of a window or session query (None where absent)."""
    bounds = []
    for name in ("keyFrom", "keyTo"):
        raw = _raw_query(request, name)
        bounds.append(None if raw is None else await _split_key(request, store, raw, query=True))
    return bounds[0], bounds[1]


def _raw_path_tail(request: web.Request, skip: int) -> str:
    """The still-encoded path after its first ``skip`` segments (the key part of the URL)."""
    parts = request.rel_url.raw_path.split("/", skip + 1)
    return parts[skip + 1] if len(parts) > skip + 1 else ""


def _raw_query(request: web.Request, name: str) -> str | None:
    """A query parameter's still-encoded value (the last one if repeated), or None."""
    found = None
    for pair in request.rel_url.raw_query_string.split("&"):
        key, _, value = pair.partition("=")
        if unquote_plus(key) == name:
            found = value
    return found


async def metadata_for_key(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    key = await _split_key(request, store, _raw_path_tail(request, 4))
    return _reply(request, {"result": await request.app[FACADE].metadata_for_key(store, key)})


async def catalog(request: web.Request) -> web.Response:
    return _reply(request, {"result": await request.app[FACADE].catalog()})


async def get_key(request: web.Request) -> web.Response:
    store = request.match_info["store"]
    key = await _split_key(request, store, _raw_path_tail(request, 3))
    return _reply(request, {"response": await request.app[FACADE].get(store, key)})


_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def _bool_param(request: web.Request, name: str) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return False
    if raw.lower() in _TRUE or raw == "":
        return True
    if raw.lower() in _FALSE:
        return False
    raise InvalidParameter(f"{name} must be true or false, got {raw!r}", parameter=name)


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidParameter(f"{name} must be an integer, got {raw!r}", parameter=name) from None


def _wants_ndjson(request: web.Request) -> bool:
    return NDJSON in request.headers.get("Accept", "")


async def _scan_reply(request: web.Request, store: str, scan: Scan) -> web.StreamResponse:
    """Answer a scan: NDJSON stream if asked, one page if ``limit``/``cursor`` given, else all at once."""
    facade = request.app[FACADE]
    limit = _int_param(request, "limit")
    cursor = request.query.get("cursor")
    if _wants_ndjson(request):
        if limit is not None and limit < 1:
            raise InvalidParameter(f"limit must be positive, got {limit}", limit=limit)
        if cursor is not None:
            scan = decode_cursor(store, cursor)
        return await _stream_ndjson(request, facade.stream_chunks(store, scan), limit)
    if limit is not None or cursor is not None:
        entries, next_cursor = await facade.page(store, scan, limit, cursor)
        return _reply(request, {"result": _entries(entries), "next": next_cursor})
    return _reply(request, {"result": _entries(await facade.collect(store, scan))})


def _ndjson_line(entry: Any) -> str:
    return to_json(_entry_json(entry))


async def _stream_ndjson(
    request: web.Request, chunks: AsyncGenerator[list[Any], None], limit: int | None
) -> web.StreamResponse:
    """Write one JSON entry per line as the facade merges chunks of the owners' pages.

    The first chunk is awaited before the response starts, so errors found up front (unknown store,
    unavailable partition) still get their status. An error after that ends the stream with an
    ``{"error": ...}`` line, since the status is already sent.
    """
    try:
        chunk = await anext(chunks, None)  # errors here go to the middleware with their status
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        left = limit
        try:
            while chunk:
                if left is not None:
                    chunk = chunk[:left]
                    left -= len(chunk)
                await response.write(("\n".join(_ndjson_line(e) for e in chunk) + "\n").encode())
                chunk = None if left == 0 else await anext(chunks, None)
        except RiqrError as err:
            await response.write((json.dumps(err.to_json()) + "\n").encode())
        await response.write_eof()
        return response
    finally:
        await chunks.aclose()


async def all_entries(request: web.Request) -> web.StreamResponse:
    store = request.match_info["store"]
    scan = await request.app[FACADE].make_scan(store, reverse=_bool_param(request, "reverse"))
    return await _scan_reply(request, store, scan)


async def range_entries(request: web.Request) -> web.StreamResponse:
    store = request.match_info["store"]
    raw_lo, raw_hi = _raw_query(request, "from"), _raw_query(request, "to")
    lo = None if raw_lo is None else await _split_key(request, store, raw_lo, query=True)
    hi = None if raw_hi is None else await _split_key(request, store, raw_hi, query=True)
    scan = await request.app[FACADE].make_scan(store, lo=lo, hi=hi, reverse=_bool_param(request, "reverse"))
    return await _scan_reply(request, store, scan)


async def prefix_entries(request: web.Request) -> web.StreamResponse:
    store, prefix = request.match_info["store"], request.match_info["prefix"]
    scan = await request.app[FACADE].make_scan(store, prefix=prefix, reverse=_bool_param(request, "reverse"))
    return await _scan_reply(request, store, scan)


async def windows_of_key(request: web.Request) -> web.StreamResponse:
    store = request.match_info["store"]
    key = await _split_key(request, store, _raw_path_tail(request, 3))
    q = request.query
    scan = await request.app[FACADE].windows(
        store, key, time_from=q.get("from"), time_to=q.get("to"), reverse=_bool_param(request, "reverse")
    )
    return await _scan_reply(request, store, scan)


async def windows_of_range(request: web.Request) -> web.StreamResponse:
    store = request.match_info["store"]
    key_from, key_to = await _key_bounds(request, store)
    q = request.query
    scan = await request.app[FACADE].windows(
        store,
        key_from=key_from,
        key_to=key_to,
        time_from=q.get("from"),
        time_to=q.get("to"),
        reverse=_bool_param(request, "reverse"),
    )
    return await _scan_reply(request, store, scan)


async def sessions_of_key(request: web.Request) -> web.StreamResponse:
    store = request.match_info["store"]
    key = await _split_key(request, store, _raw_path_tail(request, 3))
    q = request.query
    scan = await request.app[FACADE].sessions(
        store, key, earliest_end=q.get("earliestEnd"), latest_start=q.get("latestStart")
    )
    return await _scan_reply(request, store, scan)


async def sessions_of_range(request: web.Request) -> web.StreamResponse:
    store = request.match_info["store"]
    key_from, key_to = await _key_bounds(request, store)
    scan = await request.app[FACADE].sessions(store, key_from=key_from, key_to=key_to)
    return await _scan_reply(request, store, scan)


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
    app.router.add_get("/stores/{store}/prefix/{prefix:.*}", prefix_entries)
    app.router.add_get("/stores/{store}/windows", windows_of_range)
    app.router.add_get("/stores/{store}/windows/{key:.*}", windows_of_key)
    app.router.add_get("/stores/{store}/sessions", sessions_of_range)
    app.router.add_get("/stores/{store}/sessions/{key:.*}", sessions_of_key)
    app.router.add_get("/stores/{store}/approximate-num-entries", approximate_num_entries)
    return app
