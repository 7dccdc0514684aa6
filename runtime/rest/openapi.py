"""The REST API's OpenAPI 3.1 document, generated from the route table, and a page that shows it.

``openapi_document(ROUTES)`` turns each ``Route`` (path, parameters, answer, errors) into an operation;
the shapes of answers and errors are the components below, written once. ``/docs`` is a static page that
fetches ``/openapi.json`` from the same server and lists paths, parameters and answers: no CDN, no
external script, so it works air-gapped and leaks nothing to third parties.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from runtime.config import MAX_BODY_BYTES, MAX_HEADER_FIELD_BYTES, MAX_HEADERS, MAX_QUERY_PARAMS, MAX_URL_CHARS
from runtime.lag import REPLICA_STATES

# Routes are ``runtime.rest.routes.Route`` values; typed loosely here because that module imports this
# one (for the handlers below), and the layering test forbids import cycles.
Route = Any

__all__ = ["SPEC", "openapi_document", "openapi_json", "docs_page", "COMMON_ERRORS", "ERROR_CODES"]

SPEC: web.AppKey[dict[str, Any]] = web.AppKey("riqr.openapi", dict)

# Statuses any route may answer, and the error codes behind each status (docs/api.md lists them too).
COMMON_ERRORS = (400, 405, 413, 414, 431)  # 400: too-many-parameters, checked on every path
ERROR_CODES: dict[int, tuple[str, ...]] = {
    400: (
        "bad-request",
        "malformed-key",
        "key-too-long",
        "malformed-range",
        "malformed-cursor",
        "malformed-path",
        "invalid-parameter",
        "too-many-parameters",
        "result-too-large",
    ),  # fmt: skip
    401: ("unauthorized",),
    403: ("forbidden",),
    404: ("not-found", "store-not-found", "key-not-found"),
    405: ("method-not-allowed",),
    413: ("payload-too-large",),
    414: ("uri-too-long",),
    431: ("headers-too-large",),
    503: (
        "unavailable",
        "partition-unavailable",
        "partition-incomplete",
        "partition-catching-up",
        "owner-unavailable",
        "copy-behind",
        "not-connected",
    ),
    504: ("deadline-exceeded",),
}
_REASONS = {400: "Bad request", 401: "Missing or invalid bearer token", 403: "Not allowed to read this store",
            404: "Not found", 405: "Only GET", 413: "Request body too large", 414: "URL too long",
            431: "Headers too large", 503: "Unavailable; retry after Retry-After seconds",
            504: "Deadline exceeded"}  # fmt: skip

_ANY: dict[str, Any] = {"description": "any JSON value (the store's value schema, see GET /stores)"}
_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
_COMPONENTS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                "additionalProperties": True,
            }
        },
    },
    "Entry": {
        "type": "object",
        "required": ["key", "value"],
        "properties": {
            "key": {"description": "the key: a scalar, or an array of components for composite keys"},
            "value": _ANY,
            "window": {
                "type": "object",
                "properties": {
                    "start": {"type": "string", "format": "date-time"},
                    "end": {"type": "string", "format": "date-time"},
                },  # fmt: skip
            },
        },
    },
    "Entries": {
        "type": "object",
        "required": ["result"],
        "properties": {
            "result": {"type": "array", "items": {"$ref": "#/components/schemas/Entry"}},
            "next": {"type": ["string", "null"], "description": "cursor of the next page (paged answers only)"},
        },
    },
    "Value": {"type": "object", "required": ["response"], "properties": {"response": _ANY}},
    "Count": {"type": "object", "required": ["result"], "properties": {"result": {"type": "integer"}}},
    "Position": {
        "type": "object",
        "description": "one copy of a partition: what its query actor reports, and how far it is behind the "
        "newest batch the store's sink acknowledged (docs/operations.md, 'Lag')",
        "properties": {
            "partition": {"type": "integer"},
            "source": {"type": ["string", "null"], "description": "the streaming query's id its batches come from"},
            "batch_id": {"type": "integer", "description": "the last batch applied (-1: none yet)"},
            "state": {
                "type": "string",
                "description": "the copy's own state: serving, loading, incomplete, lost, "
                "catching-up, rebuilding, unavailable, unknown, unassigned",
            },  # fmt: skip
            "reason": {"type": "string"},
            "buffered": {"type": "integer", "description": "batches buffered while catching up"},
            "role": {"enum": ["active", "standby"]},
            "replica_state": {"enum": list(REPLICA_STATES)},
            "lag_batches": {
                "type": ["integer", "null"],
                "description": "acknowledged batches the copy does not show; null when unknown",
            },  # fmt: skip
            "lag_seconds": {
                "type": ["number", "null"],
                "description": "0 when lag_batches is 0, else seconds "
                "since the first batch the copy lacks was acknowledged; null when unknown",
            },  # fmt: skip
        },
        "additionalProperties": True,
    },
    "Replica": {
        "description": "a copy of a partition, with its actor and node",
        "allOf": [
            {"$ref": "#/components/schemas/Position"},
            {
                "type": "object",
                "properties": {"actor": {"type": ["string", "null"]}, "node": {"type": ["string", "null"]}},
            },
        ],
    },
    "Instance": {
        "type": "object",
        "properties": {
            "host": {"type": "string"},
            "port": {"type": ["integer", "null"]},
            "state-store-names": {"type": "array", "items": {"type": "string"}},
            "actor": {"type": "string"},
            "node": {"type": "string"},
            "partitions": {"type": "array", "items": {"type": "integer"}},
            "standby-partitions": {"type": "array", "items": {"type": "integer"}},
            "positions": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/Position"},
                "description": "every partition the actor holds, active and standby",
            },
            "partition": {"type": "integer", "description": "the key's partition (key lookups only)"},
            "standbys": {
                "type": "array",
                "items": {"type": "object"},
                "description": "instances holding a standby copy of the key's partition (key lookups only)",
            },
            "replicas": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/Replica"},
                "description": "every copy of the key's partition, the active first (key lookups only)",
            },
        },  # fmt: skip
        "additionalProperties": True,
    },
    "Instances": {
        "type": "object",
        "required": ["result"],
        "properties": {"result": {"type": "array", "items": {"$ref": "#/components/schemas/Instance"}}},
    },  # fmt: skip
    "KeyInstance": {
        "type": "object",
        "required": ["result"],
        "properties": {"result": {"$ref": "#/components/schemas/Instance"}},
    },  # fmt: skip
    "Store": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "kind": {"enum": ["kv", "window", "session"]},
            "key": {
                "type": "object",
                "description": "the first key column (column, type) and every key column (columns)",
                "additionalProperties": True,
            },
            "value": {"type": "array", "items": _OBJECT, "description": "the value columns (column, type)"},
            "partitions": {"type": "integer"},
            "actors": {"type": "integer", "description": "query actors holding the active copies"},
            "standbys": {"type": ["integer", "null"]},
            "engine": {"type": "string", "description": "the copies' storage engine: rocksdb or memory"},
            "read_replicas": {"type": "boolean", "description": "whether HTTP verticles keep copies of the store"},
            "ingest": {"type": ["object", "null"], "additionalProperties": True},
            "positions": {
                "type": "array",
                "description": "per partition: the active copy's position, state and lag, and every copy's",
                "items": {
                    "allOf": [
                        {"$ref": "#/components/schemas/Position"},
                        {
                            "type": "object",
                            "properties": {
                                "actor": {"type": ["string", "null"]},
                                "replicas": {"type": "array", "items": {"$ref": "#/components/schemas/Replica"}},
                            },
                        },
                    ]
                },
            },  # fmt: skip
        },
        "additionalProperties": True,
    },
    "Catalog": {
        "type": "object",
        "properties": {"result": {"type": "array", "items": {"$ref": "#/components/schemas/Store"}}},
    },
    "Health": {"type": "object", "properties": {"status": {"type": "string"}}},
    "Ready": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"enum": ["ready", "not-ready"]},
            "stores": {"type": "integer"},
            "partitions": {"type": "integer"},
            "missing": {
                "type": "array",
                "description": "a partition with no serving copy (store, partition, state, reason), a store "
                "whose feed failed or went stale, no heartbeat (store, ingest, reason), or, when this node "
                "never reached the registry, {registry: 'unreachable', reason}",
                "items": _OBJECT,
            },
        },
    },
    "OpenAPI": _OBJECT,
}


def _oas_path(aiohttp_path: str) -> str:
    r"""``/get/{key:[\s\S]*}`` -> ``/get/{key}``: OpenAPI has no regular expressions in paths."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", aiohttp_path)


def _answer(name: str) -> dict[str, Any]:
    if name == "html":
        return {"description": "OK", "content": {"text/html": {"schema": {"type": "string"}}}}
    if name == "prometheus":
        media = "text/plain; version=0.0.4; charset=utf-8"
        return {"description": "OK", "content": {media: {"schema": {"type": "string"}}}}
    if "/" in name:  # a media type: a static file
        return {"description": "OK", "content": {name: {"schema": {"type": "string"}}}}
    ref = {"$ref": f"#/components/schemas/{name}"}
    if name == "OpenAPI":  # this document is JSON whatever the Accept header asks
        return {"description": "OK", "content": {"application/json": {"schema": ref}}}
    content: dict[str, Any] = {"application/json": {"schema": ref}, "application/msgpack": {"schema": ref}}
    if name == "Entries":
        content["application/x-ndjson"] = {"schema": {"$ref": "#/components/schemas/Entry"}}
    return {"description": "OK", "content": content}


# The headers an error answer comes with, by status.
_ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": 'Bearer realm="riqr", with error="invalid_token" for a token sent and refused (RFC 6750)',
            "schema": {"type": "string"},
        }
    },
    405: {"Allow": {"description": "the methods the path takes", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "seconds to wait before asking again", "schema": {"type": "integer"}}},
}
# An answer made of the store's copies says what it reflects (docs/api.md, "What an answer reflects").
_POSITION_HEADER = {
    "X-Riqr-Position": {
        "description": "per partition read, the source and batch the answer reflects (left off when "
        "nothing was read, on streams, and when too long for proxies)",
        "schema": {"type": "string"},
    },
}


def _error(status: int) -> dict[str, Any]:
    codes = ", ".join(ERROR_CODES[status])
    ref = {"$ref": "#/components/schemas/Error"}
    answer = {"description": f"{_REASONS[status]} (error codes: {codes})",
              "content": {"application/json": {"schema": ref}, "application/msgpack": {"schema": ref}}}  # fmt: skip
    if status in _ERROR_HEADERS:
        answer["headers"] = _ERROR_HEADERS[status]
    return answer


def _operation(route: Route, auth_enabled: bool) -> dict[str, Any]:
    statuses = set(route.errors) | set(COMMON_ERRORS) | (set() if route.public or not auth_enabled else {401})
    responses: dict[str, Any] = {"200": _answer(route.answer)}
    if route.tag == "stores" and route.answer in ("Value", "Entries", "Count"):
        responses["200"]["headers"] = _POSITION_HEADER
    responses.update({str(s): _error(s) for s in sorted(statuses)})
    if route.answer == "Ready":  # not ready is a 503 whose body says what is missing, not an error
        responses["503"] = {**_answer("Ready"), "description": "Not ready: 'missing' lists what"}
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.handler.__name__,
        "tags": [route.tag],
        "parameters": [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required,
                "description": p.description,
                "schema": dict(p.schema),
            }
            for p in route.params
        ],
        "responses": responses,
    }
    if route.public:
        op["security"] = []  # no token needed, whatever the global requirement
    return op


def openapi_document(routes: Iterable[Route], *, auth_enabled: bool = True) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (every route a GET)."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "riqr REST API",
            "version": "1",
            "description": (
                "Interactive queries over the state of Spark Structured Streaming jobs. Limits: request line "
                f"{MAX_URL_CHARS} bytes, header field {MAX_HEADER_FIELD_BYTES} bytes, {MAX_HEADERS} headers, "
                f"{MAX_QUERY_PARAMS} query parameters, request body {MAX_BODY_BYTES} bytes. Answers are JSON, "
                "msgpack with 'Accept: application/msgpack', NDJSON streams of scans with 'Accept: "
                'application/x-ndjson\'. Errors are {"error": {"code", "message", ...}}.'
            ),
        },
        "paths": {_oas_path(r.path): _operations(r, auth_enabled) for r in routes},
        "components": {"schemas": _COMPONENTS},
    }
    if auth_enabled:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}
        doc["security"] = [{"bearer": []}]
    return doc


def _operations(route: Route, auth_enabled: bool) -> dict[str, Any]:
    """A route's GET, and its HEAD where it takes one (the same answer without the body)."""
    get = _operation(route, auth_enabled)
    if not route.head:
        return {"get": get}
    head = {**get, "operationId": get["operationId"] + "Head", "summary": get["summary"] + " (headers only)"}
    return {"get": get, "head": head}


async def openapi_json(request: web.Request) -> web.Response:
    """The document this app was built with."""
    return web.json_response(request.app[SPEC])


_DOCS_STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}
code{background:#eee;padding:0 .2em}
section{border-top:1px solid #ccc;padding:.5em 0}td{padding:0 .5em;vertical-align:top}"""

_DOCS_SCRIPT = """
const el = (tag, text) => {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;  // text, never HTML: the spec's strings are not markup
  return e;
};
fetch("openapi.json").then(r => r.json()).then(spec => {
  document.getElementById("about").textContent = spec.info.description;
  const root = document.getElementById("paths");
  for (const [path, item] of Object.entries(spec.paths)) {
    const op = item.get, s = el("section");
    const h = el("h3"); h.append(el("code", "GET " + path)); s.append(h, el("p", op.summary));
    if (op.parameters.length) {
      const t = el("table");
      for (const p of op.parameters) {
        const row = el("tr"); row.append(el("td", p.name), el("td", p.in), el("td", p.description)); t.append(row);
      }
      s.append(t);
    }
    const ul = el("ul");
    for (const [status, r] of Object.entries(op.responses)) ul.append(el("li", status + ": " + r.description));
    s.append(ul); root.append(s);
  }
});
"""

_DOCS_HTML = (
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>riqr REST API</title>
<style>"""
    + _DOCS_STYLE
    + """</style></head>
<body><h1>riqr REST API</h1><p id="about">Loading <a href="openapi.json">openapi.json</a> ...</p><div id="paths"></div>
<script>"""
    + _DOCS_SCRIPT
    + """</script></body></html>
"""
)


def _csp_hash(source: str) -> str:
    """A CSP source allowing exactly this inline script or style (CSP Level 2 hashes)."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode("ascii") + "'"


# The page may run its own script and style (by their hashes: nothing injected would match), and load
# nothing but this server's openapi.json.
_DOCS_CSP = (
    f"default-src 'none'; connect-src 'self'; script-src {_csp_hash(_DOCS_SCRIPT)}; "
    f"style-src {_csp_hash(_DOCS_STYLE)}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


async def docs_page(request: web.Request) -> web.Response:
    """A self-contained page rendering ``/openapi.json`` (relative URL: works behind a path prefix)."""
    return web.Response(text=_DOCS_HTML, content_type="text/html", headers={"Content-Security-Policy": _DOCS_CSP})
