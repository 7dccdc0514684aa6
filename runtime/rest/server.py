"""Serving the REST app: a runner whose HTTP-level rejections are JSON like every other error.

aiohttp's parser refuses some requests before any application code runs (raw non-ASCII bytes in the
request line, bad header bytes, a header or URL over the limits, too many headers, bad chunking) and
answers them from ``RequestHandler.handle_error`` with a text/plain body. riqr answers them with its
error shape and the status that says what was wrong: 414 for a request line over ``MAX_URL_CHARS``, 431
for a header field over ``MAX_HEADER_FIELD_BYTES`` or more than ``MAX_HEADERS`` headers, 400 otherwise.

aiohttp has no public option for this, so ``serve_json_parser_errors`` is the one private hook: it makes
the runner's ``web.Server`` build riqr's ``RequestHandler`` subclass, which overrides the public
``handle_error``. tests/unit/test_rest_server.py sends raw malformed requests to a real server and fails
loudly if an aiohttp upgrade breaks this.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_request import BaseRequest

from runtime import logs
from runtime.config import MAX_URL_CHARS
from runtime.rest.render import COMMON_HEADERS, encode_json

__all__ = ["JsonErrorRequestHandler", "serve_json_parser_errors", "start_runner", "parser_error"]

log = logging.getLogger(__name__)
# Anyone can send a malformed request: its lines are throttled (``logs.Throttled``).
_MALFORMED = logs.Throttled(log)


def parser_error(status: int, exc: BaseException | None) -> tuple[int, dict[str, Any]]:
    """The status and JSON body for an error aiohttp's server hit outside the app (``handle_error``).

    The body never quotes the request: aiohttp's messages do (a header value may be a bearer token).
    """
    if isinstance(exc, LineTooLong):
        # Which limit was exceeded is the one thing LineTooLong reports reliably (args: line, limit, size).
        if str(exc.args[1]) == str(MAX_URL_CHARS):
            return 414, _body("uri-too-long", f"the request line is longer than {MAX_URL_CHARS} bytes")
        return 431, _body("headers-too-large", "a header field is too large")
    if isinstance(exc, BadHttpMessage) and "too many headers" in exc.message.lower():
        return 431, _body("headers-too-large", "too many header fields")
    if status < 500:
        reason = type(exc).__name__ if exc is not None else "the request"
        return status, _body("bad-request", f"malformed HTTP request ({reason})")
    return 500, _body("internal", "internal error; see the server log")


def _body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


# After refusing a request the client may still be sending it (a 1 MB URL): closing at once would make
# the kernel reset the connection and the client would never read the answer. So the connection first
# stops writing, then discards input until the client closes, for at most this long and this much.
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 4 * 1024 * 1024


class _LingeringTransport:
    """The connection's transport, whose ``close`` can wait for the client (see ``LINGER_SECONDS``)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.lingering = False
        self.discarded = 0

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the transport's own methods (write,
        # is_closing, ...), which stay bound to it, so each is looked up once per connection, not per call.
        value = getattr(self._transport, name)
        if callable(value):
            setattr(self, name, value)
        return value

    def close(self) -> None:
        if not self.lingering or self._transport.is_closing():
            self._transport.close()
            return
        if self._transport.can_write_eof():
            self._transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self._transport.close)

    def discard(self, data: bytes) -> None:
        self.discarded += len(data)
        if self.discarded > LINGER_MAX_BYTES:
            self._transport.close()


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, answering server-level errors in riqr's JSON shape and
    closing gently after them."""

    __slots__ = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whatever the loop: uvloop's (which Ray's async actors use when it is
        # installed) does not subclass asyncio.Transport, so no isinstance check here.
        super().connection_made(_LingeringTransport(cast(asyncio.Transport, transport)))  # type: ignore[arg-type]

    def _lingering(self) -> _LingeringTransport | None:
        transport = self.transport
        return transport if isinstance(transport, _LingeringTransport) and transport.lingering else None

    def data_received(self, data: bytes) -> None:
        lingering = self._lingering()
        if lingering is not None:
            lingering.discard(data)  # the rest of a refused request
        else:
            super().data_received(data)

    def eof_received(self) -> None:
        lingering = self._lingering()
        if lingering is not None:
            lingering._transport.close()  # the client is done: close now rather than after the linger
        else:
            super().eof_received()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # Part of a response is out already: nothing can be said any more but closing the connection.
            raise ConnectionError("a response was already being sent")
        status, body = parser_error(status, exc)
        if status >= 500:
            log.error("error serving a request: %s", type(exc).__name__, exc_info=exc)
        else:
            # Only the kind: the exception text quotes request bytes, which may hold credentials.
            _MALFORMED.info("rejected a malformed request with %d: %s", status, type(exc).__name__)
        response = web.Response(
            body=encode_json(body), status=status, content_type="application/json", headers=COMMON_HEADERS
        )
        response.force_close()
        if isinstance(self.transport, _LingeringTransport):
            self.transport.lingering = True
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        protocol = super().__call__()
        protocol.__class__ = JsonErrorRequestHandler  # same slots, one overridden method
        return protocol


def serve_json_parser_errors(server: web.Server) -> web.Server:
    """Make ``server`` (a set-up runner's ``runner.server``) answer parser errors as JSON.

    The one place riqr reaches below aiohttp's public surface; it checks the parts it relies on, so a
    change in aiohttp fails here, at start, rather than silently serving text/plain again.
    """
    if type(server) is not web.Server:
        raise TypeError(f"expected aiohttp's web.Server, got {type(server).__name__}")
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    if params[:5] != ["self", "request", "status", "exc", "message"]:
        raise TypeError(f"aiohttp's RequestHandler.handle_error changed: {params}")
    server.__class__ = _JsonErrorServer
    return server


async def start_runner(app: web.Application) -> web.AppRunner:
    """A set-up runner for ``app`` whose connections answer parser errors as JSON (no access log: it
    would record URLs, and riqr logs what it refuses itself)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server = runner.server
    assert server is not None  # set by setup()
    serve_json_parser_errors(server)
    return runner
