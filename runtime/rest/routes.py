"""The route table of the REST API, as data: path, handler, parameters, answer and errors per route.

``build_app`` registers these routes and ``runtime.rest.openapi`` describes them, so the served API and
its document are one list. Parameters and answers name shared shapes (``runtime.rest.openapi``'s
components) rather than repeating them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.config import MAX_KEY_CHARS, MAX_PAGE
from runtime.rest import console, probes
from runtime.rest import handlers as h
from runtime.rest import openapi as doc
from runtime.rest.render import Handler

__all__ = ["Param", "Route", "ROUTES", "PUBLIC_PATHS", "PROBE_PATHS"]


@dataclass(frozen=True)
class Param:
    """A path or query parameter: its name, where it goes, a description and a JSON schema."""

    name: str
    where: str  # "path" or "query"
    description: str
    schema: tuple[tuple[str, Any], ...] = (("type", "string"),)

    @property
    def required(self) -> bool:
        return self.where == "path"


@dataclass(frozen=True)
class Route:
    """One GET path: aiohttp pattern, handler, summary; what it takes and answers, and its own errors.

    ``answer`` names a component schema (or ``"html"``, or a media type such as ``"text/css"``); ``errors``
    are the statuses this route adds to the ones every route may give (``openapi.COMMON_ERRORS``).
    ``public`` routes need no token.
    """

    path: str
    handler: Handler
    summary: str
    params: tuple[Param, ...] = ()
    answer: str = "Entries"
    errors: tuple[int, ...] = ()
    public: bool = False
    head: bool = False  # answers HEAD as well (the probes: load balancers probe with it)
    tag: str = "stores"

    @property
    def query_params(self) -> frozenset[str] | None:
        """The query parameters a store or metadata route takes (any other, or one given twice, is a 400);
        None for the service and console routes, which read none and ignore what they are sent."""
        if self.tag not in ("stores", "metadata"):
            return None
        return frozenset(p.name for p in self.params if p.where == "query")


STORE = Param("store", "path", "The store's name (percent-encoded).")
KEY = Param(
    "key",
    "path",
    f"The key, percent-encoded; a composite key's components joined by '/' (a '/' inside one is %2F). At most "
    f"{MAX_KEY_CHARS} characters as written. Typed by the store's key schema (see GET /stores).",
    (("type", "string"), ("maxLength", MAX_KEY_CHARS)),
)
_BOUND = (("type", "string"), ("maxLength", MAX_KEY_CHARS))
PREFIX = Param(
    "prefix", "path", "A key prefix (string keys, or a composite key's string first column).", _BOUND
)  # fmt: skip
REVERSE = Param("reverse", "query", "Descending key order.", (("type", "boolean"),))
LIMIT = Param(
    "limit",
    "query",
    f"Page size: answer one page and the cursor of the next ('next'), at most {MAX_PAGE}; with NDJSON, stop "
    "after this many (any positive number).",
    (("type", "integer"), ("minimum", 1)),
)
CURSOR = Param("cursor", "query", "The 'next' of the previous page: continues that scan (its bounds travel with it).")
PAGING = (REVERSE, LIMIT, CURSOR)
FROM_KEY = Param("from", "query", "Lower key bound, inclusive; optional.", _BOUND)
TO_KEY = Param("to", "query", "Upper key bound, inclusive; optional.", _BOUND)
KEY_FROM = Param("keyFrom", "query", "Lower key bound, inclusive; optional.", _BOUND)
KEY_TO = Param("keyTo", "query", "Upper key bound, inclusive; optional.", _BOUND)
TIME_FROM = Param("from", "query", "Windows starting at or after this ISO-8601 time.", (("type", "string"),))
TIME_TO = Param("to", "query", "Windows starting at or before this ISO-8601 time.", (("type", "string"),))
EARLIEST_END = Param("earliestEnd", "query", "Sessions ending at or after this ISO-8601 time.")
LATEST_START = Param("latestStart", "query", "Sessions starting at or before this ISO-8601 time.")

_SCAN = (400, 403, 404, 503, 504)
_KEYED = (400, 403, 404, 503, 504)

# A key or prefix is the rest of the path: ``[\s\S]*``, not ``.*``, since a decoded key may hold a line
# break (``%0A``), which ``.`` does not match: such a key would have been 404 "no route", a wrong answer.
ROUTES: tuple[Route, ...] = (
    Route(
        "/health",
        h.health,
        "liveness of this REST server (no token needed)",
        answer="Health",
        public=True,
        head=True,
        tag="service",
    ),  # fmt: skip
    Route(
        "/openapi.json",
        doc.openapi_json,
        "this API as an OpenAPI 3.1 document",
        answer="OpenAPI",
        public=True,
        tag="service",
    ),  # fmt: skip
    Route(
        "/docs",
        doc.docs_page,
        "this API as a browsable page (no external resources)",
        answer="html",
        public=True,
        tag="service",
    ),  # fmt: skip
    Route(
        "/metadata",
        h.metadata,
        "every query actor (of stores the caller may read), as seed-000 metadata instances",
        answer="Instances",
        errors=(503, 504),
        tag="metadata",
    ),  # fmt: skip
    Route(
        "/metadata/stores/{store}",
        h.metadata_for_store,
        "the instances holding a store",
        (STORE,),
        "Instances",
        (400, 403, 404, 503, 504),
        tag="metadata",
    ),  # fmt: skip
    Route(
        r"/metadata/stores/{store}/key/{key:[\s\S]*}",
        h.metadata_for_key,
        "the instance owning a key's partition",
        (STORE, KEY),
        "KeyInstance",
        _KEYED,
        tag="metadata",
    ),  # fmt: skip
    Route(
        "/stores",
        h.catalog,
        "the store catalog (stores the caller may read): kinds, key and value schemas, partitions",
        answer="Catalog",
        errors=(503, 504),
    ),  # fmt: skip
    Route("/stores/{store}/all", h.all_entries, "every entry in key order", (STORE, *PAGING), errors=_SCAN),
    Route(r"/stores/{store}/get/{key:[\s\S]*}", h.get_key, "the value of one key", (STORE, KEY), "Value", _KEYED),
    Route(
        "/stores/{store}/range",
        h.range_entries,
        "the entries between two keys, both inclusive",
        (STORE, FROM_KEY, TO_KEY, *PAGING),
        errors=_SCAN,
    ),  # fmt: skip
    Route(
        r"/stores/{store}/prefix/{prefix:[\s\S]*}",
        h.prefix_entries,
        "the entries whose key starts with a prefix",
        (STORE, PREFIX, *PAGING),
        errors=_SCAN,
    ),  # fmt: skip
    Route(
        "/stores/{store}/windows",
        h.windows_of_range,
        "windows of a key range within a time range",
        (STORE, KEY_FROM, KEY_TO, TIME_FROM, TIME_TO, *PAGING),
        errors=_SCAN,
    ),  # fmt: skip
    Route(
        r"/stores/{store}/windows/{key:[\s\S]*}",
        h.windows_of_key,
        "windows of one key within a time range",
        (STORE, KEY, TIME_FROM, TIME_TO, *PAGING),
        errors=_SCAN,
    ),  # fmt: skip
    Route(
        "/stores/{store}/sessions",
        h.sessions_of_range,
        "sessions of a key range, those ending at or after earliestEnd and starting at or before latestStart",
        (STORE, KEY_FROM, KEY_TO, EARLIEST_END, LATEST_START, *PAGING),
        errors=_SCAN,
    ),  # fmt: skip
    Route(
        r"/stores/{store}/sessions/{key:[\s\S]*}",
        h.sessions_of_key,
        "sessions of one key",
        (STORE, KEY, EARLIEST_END, LATEST_START, *PAGING),
        errors=_SCAN,
    ),  # fmt: skip
    Route(
        "/stores/{store}/approximate-num-entries",
        h.approximate_num_entries,
        "the number of entries",
        (STORE,),
        "Count",
        (400, 403, 404, 503, 504),
    ),  # fmt: skip
    Route(
        "/ready",
        probes.ready,
        "readiness: every partition has a serving copy and no store's feed failed or went stale; 503 lists what "
        "is missing",
        answer="Ready",
        errors=(503,),
        public=True,
        head=True,
        tag="service",
    ),  # fmt: skip
    Route(
        "/metrics",
        probes.metrics,
        "this node's and the cluster's metrics, Prometheus text format 0.0.4 (docs/operations.md)",
        answer="prometheus",
        errors=(403,),
        tag="service",
    ),  # fmt: skip
    Route(
        "/",
        console.console_page,
        "the web console (no token needed to load it)",
        answer="html",
        public=True,
        tag="console",
    ),  # fmt: skip
    Route(
        "/console/console.js",
        console.console_script,
        "the web console's script",
        answer="text/javascript",
        public=True,
        tag="console",
    ),  # fmt: skip
    Route(
        "/console/console.css",
        console.console_style,
        "the web console's style sheet",
        answer="text/css",
        public=True,
        tag="console",
    ),  # fmt: skip
)

PUBLIC_PATHS = frozenset(r.path for r in ROUTES if r.public)
PROBE_PATHS = frozenset(r.path for r in ROUTES if r.head)
