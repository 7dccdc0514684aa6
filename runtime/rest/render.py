"""Turning answers and errors into HTTP responses: JSON by default, msgpack when the ``Accept`` header
prefers it, NDJSON for streams. Errors become responses in one place, ``error_response``: riqr errors
get their own status (and Retry-After for 503s), aiohttp's routing errors become JSON too, and anything
else is a logged 500, which no client input should ever reach.

Every value riqr answers with encodes in every format: datetimes as ISO-8601 text, bytes as base64 in
JSON (bin in msgpack), integers beyond 64 bits as decimal text in msgpack (it has no wider integers), and
NaN or infinite floats as the text ``"NaN"``/``"Infinity"`` in JSON (which has no such numbers). An error
body that still cannot be encoded falls back to a fixed minimal JSON error, so rendering an error never
fails.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from runtime.codec import encode_json
from runtime.errors import MalformedPath, RiqrError
from runtime.windows import Windowed

__all__ = [
    "reply",
    "error_reply",
    "error_response",
    "stream_ndjson",
    "json_result",
    "wants_msgpack",
    "entries_json",
    "encode_json",
    "wants_ndjson",
    "negotiate",
    "JSON",
    "MSGPACK",
    "NDJSON",
    "SERVER_NAME",
    "COMMON_HEADERS",
]

log = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
NDJSON = "application/x-ndjson"
# What the Server header says: no product version for scanners to match against known vulnerabilities.
SERVER_NAME = "riqr"
# On every answer: no version in ``Server``, and no content sniffing (a JSON body with markup in a value is
# never rendered as a page).
COMMON_HEADERS = {"Server": SERVER_NAME, "X-Content-Type-Options": "nosniff"}
_MINIMAL_ERROR = b'{"error":{"code":"internal","message":"the error could not be encoded"}}'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


JSON = "application/json"
_ANSWERS = (JSON, MSGPACK)  # what any answer can be
_STREAMS = (JSON, NDJSON, MSGPACK)  # what a scan's answer can be
_MAX_RANGES = 32


def wants_msgpack(request: web.BaseRequest) -> bool:
    return negotiate(accept_header(request), _ANSWERS) == MSGPACK


def wants_ndjson(request: web.BaseRequest) -> bool:
    return negotiate(accept_header(request), _STREAMS) == NDJSON


def accept_header(request: web.BaseRequest) -> str:
    """The request's Accept ranges as one list: a header sent on several lines is one comma-separated list
    (RFC 9110, 5.3), so ``Accept: application/json`` then ``Accept: application/x-ndjson`` asks for both."""
    lines = request.headers.getall("Accept", ())
    return lines[0] if len(lines) == 1 else ", ".join(lines)


@functools.lru_cache(maxsize=512)  # clients send the same few headers again and again
def negotiate(accept: str, offered: tuple[str, ...]) -> str:
    """The media type of ``offered`` that ``accept`` (an Accept header) prefers (RFC 9110, 12.5.1): each
    type's weight is the ``q`` of the most specific range that matches it (``type/subtype`` over
    ``type/*`` over ``*/*``), ``q=0`` refuses it; the highest weight wins, and of equal weights the one the
    client listed first, then the first offered. msgpack and NDJSON are answered only to a client that
    names them: a wildcard stands for JSON (``application/json;q=0.5, */*`` is not a request for a stream).
    No header, or none offered acceptable: JSON (the header is a preference: JSON rather than 406). Only
    the first ``_MAX_RANGES`` ranges are read, so a long header costs little before it is cached."""
    if not accept or accept == "*/*" or accept == JSON:
        return JSON
    ranges: list[tuple[str, str, float, int]] = []  # type, subtype, q, position
    for position, item in enumerate(accept.split(",", _MAX_RANGES)[:_MAX_RANGES]):
        media, *params = item.split(";")
        kind, _, sub = media.strip().lower().partition("/")
        q = 1.0
        for param in params:
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(1.0, max(0.0, float(value)))
                except ValueError:
                    q = 0.0  # a weight that cannot be read: the range counts for nothing
        if kind and sub:
            ranges.append((kind, sub, q, position))
    best: tuple[float, int, int] | None = None  # (-weight, listed at, offered at): smallest wins
    chosen = JSON
    for rank, media in enumerate(offered):
        kind, _, sub = media.partition("/")
        matches = [
            (specificity, q, position)
            for r_kind, r_sub, q, position in ranges
            for specificity in [
                2
                if (r_kind, r_sub) == (kind, sub)
                else 1
                if (r_kind, r_sub) == (kind, "*")
                else 0
                if (r_kind, r_sub) == ("*", "*")
                else -1
            ]  # fmt: skip
            if specificity == 2 or (specificity >= 0 and media == JSON)
        ]
        if not matches:
            continue
        _, q, position = max(matches, key=lambda m: (m[0], -m[2]))
        key = (-q, position, rank)
        if q > 0 and (best is None or key < best):
            best, chosen = key, media
    return chosen


def _msgpack_default(obj: Any) -> Any:
    # Timestamps (window bounds, timestamp keys) travel as ISO-8601 text, as in JSON.
    if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
        return obj.isoformat()
    if isinstance(obj, int):  # only called for integers msgpack cannot hold (beyond 64 bits)
        return str(obj)
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    raise TypeError(f"cannot encode a value of type {type(obj).__name__}")


def _encode(request: web.BaseRequest, body: Any) -> tuple[bytes, str]:
    if wants_msgpack(request):
        packed: bytes = msgpack.packb(body, use_bin_type=True, default=_msgpack_default)
        return packed, MSGPACK
    return encode_json(body), "application/json"


def reply(request: web.Request, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A response with ``body`` encoded as the client asked (JSON unless it prefers msgpack)."""
    data, content_type = _encode(request, body)
    return web.Response(body=data, status=status, content_type=content_type, headers=headers)


def error_reply(
    request: web.BaseRequest, body: dict[str, Any], status: int, headers: dict[str, str] | None = None
) -> web.Response:
    """An error response that cannot fail: in the format asked for if possible, else a minimal JSON error."""
    try:
        data, content_type = _encode(request, body)
    except Exception:
        log.warning("an error body for %s could not be encoded; sent a minimal one", request.path, exc_info=True)
        data, content_type = _MINIMAL_ERROR, "application/json"
    return web.Response(body=data, status=status, content_type=content_type, headers=headers)


_INTERNAL = "internal error; see the server log"


def error_body(request: web.BaseRequest, exc: RiqrError) -> dict[str, Any]:
    """``exc``'s JSON body. Every error of a store's route names the store, whichever layer raised it (a
    key's parser, an owner's call), in an answer's body as in a stream's last line; not a 401 or 403 (said
    alike for every store), nor a name that did not decode."""
    body = exc.to_json()
    store = request.match_info.get("store") if isinstance(request, web.Request) else None
    if store is not None and exc.status not in (401, 403) and not isinstance(exc, MalformedPath):
        body["error"].setdefault("store", store)
    return body


def error_response(request: web.BaseRequest, exc: Exception) -> web.Response:
    """The one place errors become HTTP responses (``runtime.rest.pipeline`` calls it): a riqr error with
    its own status, aiohttp's routing errors as JSON, anything else a logged 500. Re-raises an
    ``HTTPException`` below 400 (a redirect is not an error)."""
    if isinstance(exc, RiqrError):
        if exc.status >= 500:
            log.info("%s %s -> %d %s", request.method, request.path, exc.status, exc.message)
        return error_reply(request, error_body(request, exc), status=exc.status, headers=exc.headers())
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code = "not-found" if exc.status == 404 else "method-not-allowed" if exc.status == 405 else "http-error"
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        body = {"error": {"code": code, "message": exc.reason, "path": request.path}}
        return error_reply(request, body, status=exc.status, headers=headers)
    log.error("unhandled error serving %s %s", request.method, request.path, exc_info=exc)
    body = {"error": {"code": "internal", "message": _INTERNAL}}
    return error_reply(request, body, status=500)


def _entry_json(entry: Any) -> dict[str, Any]:
    if isinstance(entry, Windowed):
        return entry.to_json()
    return {"key": entry[0], "value": entry[1]}


def entries_json(entries: list[Any]) -> list[dict[str, Any]]:
    """Scan entries in the seed's ``{"key", "value"}`` shape (windows add ``"window"``)."""
    return [_entry_json(entry) for entry in entries]


BROKE_OFF = web.RequestKey("riqr.broke_off", int)
"""The request's key for the status of an answer that failed after its 200 was sent (``broke_off``)."""
CLIENT_LEFT = 499
"""The status counted for a client that went away before its answer was whole (nginx's code for it)."""


def broke_off(request: web.BaseRequest, status: int) -> None:
    """Say that ``request``'s streamed answer ended in ``status`` after its 200 went out: the pipeline
    counts that status, not the 200, so a cut answer shows in the error rate."""
    request[BROKE_OFF] = status


def _as_array_items(chunk: bytes) -> bytes:
    """NDJSON lines (each a JSON value ending in a newline, none inside: JSON strings escape it) as the
    items of a JSON array, comma-separated."""
    return chunk[:-1].replace(b"\n", b",")


async def json_result(
    request: web.Request,
    chunks: AsyncGenerator[bytes, None],
    headers: Callable[[], dict[str, str] | None],
    whole_bytes: int,
) -> web.StreamResponse:
    """``{"result": [...]}`` of a scan from its NDJSON chunks (``Facade.stream_ndjson``: whole lines), the
    seed's shape with memory flat whatever the size.

    Up to ``whole_bytes`` of entries it is one response with ``headers()`` (computed once the scan is
    done: its position). A larger result is written as the facade merges it, without them. An error found
    before the first byte gets its status; one after it cuts the connection, so the client sees a broken
    body (curl exits 18, aiohttp raises ``ClientPayloadError``) and never a shorter list as if whole."""
    try:
        pieces: list[bytes] = []
        size = 0
        async for chunk in chunks:  # errors here go to the pipeline with their status
            if chunk:
                pieces.append(chunk)
                size += len(chunk)
                if size > whole_bytes:
                    break
        else:
            items = _as_array_items(b"".join(pieces)) if pieces else b""
            return web.Response(body=b'{"result":[' + items + b"]}", content_type="application/json", headers=headers())
        response = web.StreamResponse(headers={"Content-Type": "application/json", **COMMON_HEADERS})
        await response.prepare(request)
        try:
            await response.write(b'{"result":[' + _as_array_items(b"".join(pieces)))  # the likeliest to find it gone
            async for chunk in chunks:
                if chunk:
                    await response.write(b"," + _as_array_items(chunk))
        except ConnectionError:  # the client went away: nothing to tell it
            broke_off(request, CLIENT_LEFT)
            return response
        except Exception as err:  # noqa: BLE001 - the status is sent: the only honest end is a cut
            log.warning("%s %s: the answer broke off after it began (%s: %s); connection cut", request.method,
                        request.path, type(err).__name__, err)  # fmt: skip
            broke_off(request, err.status if isinstance(err, RiqrError) else 500)
            if request.transport is not None:
                request.transport.abort()
            return response
        return await _end(request, response, b"]}")
    finally:
        await chunks.aclose()


async def stream_ndjson(
    request: web.Request, chunks: AsyncGenerator[bytes, None], limit: int | None
) -> web.StreamResponse:
    """Write the NDJSON lines of a scan as the facade merges them (``Facade.stream_ndjson``: chunks of
    whole lines, already encoded), at most ``limit`` lines.

    The first chunk is awaited before the response starts, so errors found up front (unknown store,
    unavailable partition) still get their status. An error after that ends the stream with an
    ``{"error": ...}`` line, since the status is already sent.
    """
    try:
        chunk = await anext(chunks, None)  # errors here go to the middleware with their status
        response = web.StreamResponse(headers={"Content-Type": NDJSON, **COMMON_HEADERS})
        await response.prepare(request)
        left = limit
        try:
            while chunk:
                if left is not None:
                    lines = chunk.count(b"\n")
                    if lines > left:
                        chunk = b"".join(chunk.splitlines(keepends=True)[:left])
                        lines = left
                    left -= lines
                await response.write(chunk)
                chunk = None if left == 0 else await anext(chunks, None)
        except RiqrError as err:
            broke_off(request, err.status)
            return await _end(request, response, encode_json(error_body(request, err)) + b"\n")
        except ConnectionError:  # the client went away (reset, or gone while a write drained): nothing to tell it
            broke_off(request, CLIENT_LEFT)
            return response
        except Exception as err:  # noqa: BLE001 - a bug: the stream ends with the 500's line, as any error's
            # Left to the pipeline, it built a second response and wrote it into this one's body.
            log.error("unhandled error streaming %s %s", request.method, request.path, exc_info=err)
            broke_off(request, 500)
            return await _end(
                request, response, encode_json({"error": {"code": "internal", "message": _INTERNAL}}) + b"\n"
            )
        return await _end(request, response, b"")
    finally:
        await chunks.aclose()


async def _end(request: web.Request, response: web.StreamResponse, last: bytes) -> web.StreamResponse:
    """Write a streamed answer's ``last`` bytes and end it. A client gone by then is a client that left
    (499), not a server error: the write and the end raised past the stream's own handling, so a soak
    run's cut streams were 500s in the metrics, each with a traceback in the log."""
    try:
        if last:
            await response.write(last)
        await response.write_eof()
    except ConnectionError:
        if request.get(BROKE_OFF) is None:  # a stream that ended in an error is counted as that error
            broke_off(request, CLIENT_LEFT)
    return response
