"""Request limits checked before any handler runs (docs/api.md, "Limits").

aiohttp's parser already refuses request lines and header fields over the limits (``runtime.rest.server``
makes those refusals JSON); this middleware checks what the parser lets through: the URL's length as the
app sees it (for servers set up without riqr's parser limits), the number of query parameters, and a body
where no route reads one.
"""

from __future__ import annotations

from aiohttp import web

from runtime.config import MAX_BODY_BYTES, MAX_QUERY_PARAMS, MAX_URL_CHARS
from runtime.errors import PayloadTooLarge, TooManyParameters, UriTooLong
from runtime.rest.render import Handler

__all__ = ["limits_middleware"]


@web.middleware
async def limits_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what is over a limit with its own status (414, 400, 413), before authentication."""
    if len(request.raw_path) > MAX_URL_CHARS:
        raise UriTooLong(f"the URL is longer than {MAX_URL_CHARS} characters", limit=MAX_URL_CHARS)
    raw_query = request.rel_url.raw_query_string
    if raw_query and raw_query.count("&") + 1 > MAX_QUERY_PARAMS:
        raise TooManyParameters(f"at most {MAX_QUERY_PARAMS} query parameters", limit=MAX_QUERY_PARAMS)
    length = request.content_length
    if (length is not None and length > MAX_BODY_BYTES) or (length is None and request.body_exists):
        # A chunked body has no length up front: no route reads one, so it is refused whatever its size.
        raise PayloadTooLarge(f"no route takes a request body over {MAX_BODY_BYTES} bytes", limit=MAX_BODY_BYTES)
    return await handler(request)
