"""Turning answers and errors into HTTP responses: JSON by default, msgpack when the ``Accept`` header
prefers it, NDJSON for streams. The one error middleware lives here: riqr errors get their own status
(and Retry-After for 503s), aiohttp's routing errors become JSON too, and anything else is a logged 500,
which no client input should ever reach.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from runtime.codec import to_json
from runtime.errors import RiqrError
from runtime.windows import Windowed

__all__ = ["reply", "error_middleware", "stream_ndjson", "entries_json", "wants_ndjson", "MSGPACK", "NDJSON"]

log = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
NDJSON = "application/x-ndjson"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return MSGPACK in accept and "application/json" not in accept.split(MSGPACK)[0]


def wants_ndjson(request: web.Request) -> bool:
    return NDJSON in request.headers.get("Accept", "")


def _msgpack_default(obj: Any) -> Any:
    # Timestamps (window bounds, timestamp keys) travel as ISO-8601 text, as in JSON.
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    raise TypeError(f"cannot encode a value of type {type(obj).__name__}")


def reply(request: web.Request, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A response with ``body`` encoded as the client asked (JSON unless it prefers msgpack)."""
    if _wants_msgpack(request):
        packed = msgpack.packb(body, use_bin_type=True, default=_msgpack_default)
        return web.Response(body=packed, status=status, content_type=MSGPACK, headers=headers)
    return web.Response(text=to_json(body), status=status, content_type="application/json", headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place errors become HTTP responses."""
    try:
        return await handler(request)
    except RiqrError as err:
        if err.status >= 500:
            log.info("%s %s -> %d %s", request.method, request.path, err.status, err.message)
        return reply(request, err.to_json(), status=err.status, headers=err.headers())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "not-found" if exc.status == 404 else "method-not-allowed" if exc.status == 405 else "http-error"
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        body = {"error": {"code": code, "message": exc.reason, "path": request.path}}
        return reply(request, body, status=exc.status, headers=headers)
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        body = {"error": {"code": "internal", "message": "internal error; see the server log"}}
        return reply(request, body, status=500)


def _entry_json(entry: Any) -> dict[str, Any]:
    if isinstance(entry, Windowed):
        return entry.to_json()
    return {"key": entry[0], "value": entry[1]}


def entries_json(entries: list[Any]) -> list[dict[str, Any]]:
    """Scan entries in the seed's ``{"key", "value"}`` shape (windows add ``"window"``)."""
    return [_entry_json(entry) for entry in entries]


async def stream_ndjson(
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
                await response.write(("\n".join(to_json(_entry_json(e)) for e in chunk) + "\n").encode())
                chunk = None if left == 0 else await anext(chunks, None)
        except RiqrError as err:
            await response.write((to_json(err.to_json()) + "\n").encode())
        await response.write_eof()
        return response
    finally:
        await chunks.aclose()
