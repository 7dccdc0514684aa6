"""Request limits checked before any handler runs (docs/api.md, "Limits").

aiohttp's parser already refuses request lines and header fields over the limits (``runtime.rest.server``
makes those refusals JSON); ``check_limits`` checks what the parser lets through: the URL's length as the
app sees it (for servers set up without riqr's parser limits), the number of query parameters, and a body
where no route reads one. The request pipeline (``runtime.rest.pipeline``) calls it before authentication.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from aiohttp import web

from runtime.config import MAX_BODY_BYTES, MAX_QUERY_PARAMS, MAX_URL_CHARS
from runtime.errors import InvalidParameter, MalformedPath, PayloadTooLarge, TooManyParameters, UriTooLong

__all__ = ["check_limits", "check_params"]


def check_limits(request: web.BaseRequest) -> None:
    """Raise what is over a limit, each with its own status (414, 400, 413)."""
    raw_path = request.raw_path
    if len(raw_path) > MAX_URL_CHARS:
        raise UriTooLong(f"the URL is longer than {MAX_URL_CHARS} characters", limit=MAX_URL_CHARS)
    if "#" in raw_path:  # a fragment is the client's, never sent: read as one, "get/a#b" looked up key "a"
        raise MalformedPath("a '#' in the request's target: write a '#' of a key or bound as %23")
    raw_query = request.rel_url.raw_query_string
    # Empty pieces ("?a=1&&b=2", a trailing '&') are no parameters: counted only when the '&'s alone are over.
    if raw_query.count("&") >= MAX_QUERY_PARAMS and sum(1 for p in raw_query.split("&") if p) > MAX_QUERY_PARAMS:
        raise TooManyParameters(f"at most {MAX_QUERY_PARAMS} query parameters", limit=MAX_QUERY_PARAMS)
    if not request.body_exists:  # the common case, decided without parsing a header
        return
    length = request.content_length
    if length is None:
        # A chunked body has no length up front: no route reads one, so it is refused whatever its size.
        raise PayloadTooLarge(
            f"no route takes a chunked request body (Transfer-Encoding: chunked), whatever its size; a body of at "
            f"most {MAX_BODY_BYTES} bytes with a Content-Length is ignored",
            limit=MAX_BODY_BYTES,
        )
    if length > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"no route takes a request body over {MAX_BODY_BYTES} bytes", limit=MAX_BODY_BYTES)


def check_params(request: web.BaseRequest, takes: frozenset[str]) -> None:
    """``InvalidParameter`` for a query parameter the route does not take, or one given twice.

    A store's routes ignored both: ``all?from=2&to=4`` answered the whole store and ``windows?from=a&from=b``
    the first bound while ``range?from=1&from=5`` took the last. A filter the server drops is a wrong answer
    to the caller who sent it, so it is refused, as Elasticsearch refuses an unrecognized parameter."""
    seen: set[str] = set()
    for pair in request.rel_url.raw_query_string.split("&"):
        if not pair:
            continue  # "?a=1&&b=2", or a trailing '&'
        name = unquote_plus(pair.partition("=")[0])
        if name not in takes:
            taken = ", ".join(sorted(takes)) or "none"
            raise InvalidParameter(f"this route takes no parameter {name!r} (it takes: {taken})", parameter=name)
        if name in seen:
            raise InvalidParameter(f"parameter {name!r} is given more than once", parameter=name)
        seen.add(name)
