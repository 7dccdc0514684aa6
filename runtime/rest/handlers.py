"""The REST handlers: each builds a query value from the path and parameters and asks the facade once.

Keys stay percent-encoded (``UrlKey``) until the facade, which knows the store's key schema, splits a
composite key on '/' and decodes each component.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web

from runtime.auth import ANONYMOUS, PRINCIPAL, AuthConfig, visible
from runtime.config import MAX_KEY_CHARS, MAX_WHOLE_MSGPACK_ENTRIES, WHOLE_JSON_BYTES
from runtime.errors import InvalidParameter, MalformedKey, MalformedPath
from runtime.facade import Facade
from runtime.keys import INTEGER_TEXT, MAX_INTEGER_CHARS
from runtime.monotonic import POSITION_HEADER, SpansSeen, collecting
from runtime.queries import KeyQuery, PageRequest, RangeQuery, ScanQuery, SessionQuery, UrlKey, WindowQuery
from runtime.rest.render import entries_json, json_result, reply, stream_ndjson, wants_msgpack, wants_ndjson

__all__ = [
    "FACADE",
    "AUTH",
    "health",
    "metadata",
    "metadata_for_store",
    "metadata_for_key",
    "catalog",
    "get_key",
    "all_entries",
    "range_entries",
    "prefix_entries",
    "windows_of_key",
    "windows_of_range",
    "sessions_of_key",
    "sessions_of_range",
    "approximate_num_entries",
]

FACADE: web.AppKey[Facade] = web.AppKey("riqr.facade", Facade)
AUTH: web.AppKey[AuthConfig] = web.AppKey("riqr.auth", AuthConfig)

_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def _facade(request: web.Request) -> Facade:
    return request.app[FACADE]


def _store(request: web.Request) -> str:
    """The store named in the path, decoded strictly: aiohttp's lenient decoding would turn ``%FF`` into
    U+FFFD and answer 404 for a store nobody asked for. Its segment is the one the matched route names
    (not found by reading the raw path's first segment, which ``/%6Detadata/...`` spells otherwise), and
    the name must be the one aiohttp matched, which is the one the caller's token was checked against."""
    metadata = request.match_info.route.resource is not None and (
        request.match_info.route.resource.canonical.startswith("/metadata/")
    )
    segments = request.rel_url.raw_path.split("/")
    name = _store_name(segments[3] if metadata else segments[2])
    if name != request.match_info.get("store"):
        raise MalformedPath("the store name in the path is malformed: it decodes two ways")
    return name


# Store names as written in paths -> decoded: a deployment has a handful, asked on every request. A name
# that fails to decode raises and is not kept; names nobody has (probes, typos) evict the least recent.
@functools.lru_cache(maxsize=256)
def _store_name(raw: str) -> str:
    if len(raw) > MAX_KEY_CHARS:
        raise MalformedPath(f"the store name is {len(raw)} characters long in the URL; the limit is {MAX_KEY_CHARS}")
    try:
        return UrlKey(raw).text()
    except MalformedKey as err:
        raise MalformedPath(f"the store name in the path is malformed: {err.message}") from None


def _may_read(request: web.Request, store: str) -> bool:
    """Whether the caller may see ``store`` in listings (auth.visible; everyone when auth is off)."""
    return visible(request.app[AUTH], request.get(PRINCIPAL, ANONYMOUS), store)


def _path_key(request: web.Request, skip: int) -> UrlKey:
    """The still-encoded path after its first ``skip`` segments (the key part of the URL)."""
    parts = request.rel_url.raw_path.split("/", skip + 1)
    return UrlKey(parts[skip + 1] if len(parts) > skip + 1 else "")


def _query_key(request: web.Request, name: str) -> UrlKey | None:
    """A query parameter's still-encoded value (the last one if repeated), or None."""
    found = None
    for pair in request.rel_url.raw_query_string.split("&"):
        key, _, value = pair.partition("=")
        if unquote_plus(key) == name:
            found = value
    return None if found is None else UrlKey(found, in_query=True)


def _bool_param(request: web.Request, name: str) -> bool | None:
    """A flag's value, or None when it is not given (``reverse=false`` beside a cursor is not the cursor
    alone: a cursor of a reverse scan sent with it is refused, not continued backwards)."""
    raw = request.query.get(name)
    if raw is None:
        return None
    if raw.lower() in _TRUE or raw == "":
        return True
    if raw.lower() in _FALSE:
        return False
    raise InvalidParameter(f"{name} must be true or false, got {raw!r}", parameter=name)


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if INTEGER_TEXT.fullmatch(raw) is None:  # as keys are (runtime.keys.INTEGER_TEXT)
        raise InvalidParameter(f"{name} must be an integer, got {raw!r}", parameter=name)
    if len(raw) > MAX_INTEGER_CHARS:  # out of every range; int() raised on it (a 500)
        raise InvalidParameter(f"{name} is out of range ({len(raw)} digits)", parameter=name)
    return int(raw)


async def _scan_reply(request: web.Request, query: ScanQuery) -> web.StreamResponse:
    """Answer a scan: an NDJSON stream if asked, one page if ``limit``/``cursor`` given, else all at once.
    A page or a whole answer says what it reflects per partition read (``X-Riqr-Position``); a stream,
    whose headers go before its first entry, does not."""
    facade = _facade(request)
    limit = _int_param(request, "limit")
    cursor = request.query.get("cursor")
    if wants_ndjson(request):
        if limit is not None and limit < 1:
            raise InvalidParameter(f"limit must be positive, got {limit}", parameter="limit", limit=limit)
        return await stream_ndjson(request, facade.stream_ndjson(query, cursor, limit), limit)
    with collecting() as seen:
        if limit is not None or cursor is not None:
            page = await facade.page(query, PageRequest(limit, cursor))
            body = {"result": entries_json(page.entries), "next": page.next}
        elif wants_msgpack(request):  # built whole: its array's length goes first
            body = {"result": entries_json(await facade.entries(query, MAX_WHOLE_MSGPACK_ENTRIES))}
        else:  # the seed's shape, whole when small, else streamed as merged (render.json_result)
            return await json_result(request, facade.stream_ndjson(query), lambda: _position(seen), WHOLE_JSON_BYTES)
    return reply(request, body, headers=_position(seen))


def _position(seen: SpansSeen) -> dict[str, str] | None:
    """The ``X-Riqr-Position`` header of an answer made of owner calls (none when none was made)."""
    header = seen.header()
    return {POSITION_HEADER: header} if header else None


async def health(request: web.Request) -> web.Response:
    """Liveness: this process serves HTTP (it asks nothing of the cluster; no token needed)."""
    return reply(request, {"status": "ok"})


async def metadata(request: web.Request) -> web.Response:
    instances = await _facade(request).metadata()
    shown = [i for i in instances if all(_may_read(request, s) for s in i.get("state-store-names", ()))]
    return reply(request, {"result": shown})


async def metadata_for_store(request: web.Request) -> web.Response:
    return reply(request, {"result": await _facade(request).metadata_for_store(_store(request))})


async def metadata_for_key(request: web.Request) -> web.Response:
    query = KeyQuery(_store(request), _path_key(request, 4))
    return reply(request, {"result": await _facade(request).metadata_for_key(query)})


async def catalog(request: web.Request) -> web.Response:
    stores = await _facade(request).catalog()
    return reply(request, {"result": [s for s in stores if _may_read(request, s["name"])]})


async def get_key(request: web.Request) -> web.Response:
    # The hot route: the path is split once (``/stores/{store}/get/{key}``, the key possibly with '/').
    _, _, raw_store, _, raw_key = request.rel_url.raw_path.split("/", 4)
    value, position = await _facade(request).lookup(KeyQuery(_store_name(raw_store), UrlKey(raw_key)))
    return reply(request, {"response": value}, headers={POSITION_HEADER: position})


async def all_entries(request: web.Request) -> web.StreamResponse:
    return await _scan_reply(request, RangeQuery(_store(request), reverse=_bool_param(request, "reverse")))


async def range_entries(request: web.Request) -> web.StreamResponse:
    query = RangeQuery(
        _store(request),
        lo=_query_key(request, "from"),
        hi=_query_key(request, "to"),
        reverse=_bool_param(request, "reverse"),
    )
    return await _scan_reply(request, query)


async def prefix_entries(request: web.Request) -> web.StreamResponse:
    prefix = _path_key(request, 3).text()  # strictly decoded, like keys
    query = RangeQuery(_store(request), prefix=prefix, reverse=_bool_param(request, "reverse"))
    return await _scan_reply(request, query)


def _window_query(request: web.Request, key: Any = None) -> WindowQuery:
    q = request.query
    return WindowQuery(
        _store(request),
        key=key,
        key_from=None if key is not None else _query_key(request, "keyFrom"),
        key_to=None if key is not None else _query_key(request, "keyTo"),
        time_from=q.get("from"),
        time_to=q.get("to"),
        reverse=_bool_param(request, "reverse"),
    )


async def windows_of_key(request: web.Request) -> web.StreamResponse:
    return await _scan_reply(request, _window_query(request, _path_key(request, 3)))


async def windows_of_range(request: web.Request) -> web.StreamResponse:
    return await _scan_reply(request, _window_query(request))


async def sessions_of_key(request: web.Request) -> web.StreamResponse:
    q = request.query
    query = SessionQuery(
        _store(request),
        key=_path_key(request, 3),
        earliest_end=q.get("earliestEnd"),
        latest_start=q.get("latestStart"),
        reverse=_bool_param(request, "reverse"),
    )
    return await _scan_reply(request, query)


async def sessions_of_range(request: web.Request) -> web.StreamResponse:
    query = SessionQuery(
        _store(request),
        key_from=_query_key(request, "keyFrom"),
        key_to=_query_key(request, "keyTo"),
        earliest_end=request.query.get("earliestEnd"),
        latest_start=request.query.get("latestStart"),
        reverse=_bool_param(request, "reverse"),
    )
    return await _scan_reply(request, query)


async def approximate_num_entries(request: web.Request) -> web.Response:
    with collecting() as seen:
        count = await _facade(request).count(_store(request))
    return reply(request, {"result": count}, headers=_position(seen))
