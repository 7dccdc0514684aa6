"""What a hostile or careless client sends gets a JSON 4xx; auth filters listings; the OpenAPI document
covers every route and validates; the server announces no version."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
from openapi_spec_validator import validate
from yarl import URL

from runtime.auth import AuthConfig, generate_secret, mint_token
from runtime.config import MAX_KEY_CHARS, MAX_QUERY_PARAMS
from runtime.cursor import generate_cursor_key
from runtime.rest import ROUTES, build_app
from runtime.rest.openapi import openapi_document
from tests.unit.rest_fixtures import every_kind_app

SECRET = generate_secret()


@pytest.fixture
async def client(aiohttp_client):  # type: ignore[no-untyped-def]
    return await aiohttp_client(every_kind_app())


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack", "application/x-ndjson"])
@pytest.mark.parametrize(
    "path",
    [
        "/stores/strings/all",
        "/stores/longs/all",
        "/stores/bookings/all",
        "/stores/clicks/windows",
        "/stores/visits/sessions",
        "/stores/clicks/windows/alice?limit=1",
        "/stores",
        "/metadata",
    ],  # fmt: skip
)
async def test_every_value_encodes_in_every_format(client, path: str, accept: str) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get(path, headers={"Accept": accept})
    assert resp.status == 200, await resp.text()
    body = await resp.read()
    if resp.content_type == "application/msgpack":
        msgpack.unpackb(body, strict_map_key=False)
    elif resp.content_type == "application/x-ndjson":
        [json.loads(line) for line in body.splitlines()]
    else:
        json.loads(body)  # strict: no NaN


async def test_big_integers_and_nan_have_a_spelling(client) -> None:  # type: ignore[no-untyped-def]
    body = await (await client.get("/stores/strings/get/a%2Fb", headers={"Accept": "application/msgpack"})).read()
    assert msgpack.unpackb(body) == {"response": 2**64 - 1}
    assert await (await client.get("/stores/strings/get/%C3%A9")).json() == {"response": "NaN"}
    error = await client.get("/stores/longs/get/" + "9" * 30, headers={"Accept": "application/msgpack"})
    assert error.status == 400 and msgpack.unpackb(await error.read())["error"]["code"] == "malformed-key"


async def test_a_huge_limit_in_msgpack_is_a_400_not_a_500(client) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get("/stores/strings/all?limit=" + "9" * 30, headers={"Accept": "application/msgpack"})
    assert resp.status == 400 and msgpack.unpackb(await resp.read())["error"]["code"] == "invalid-parameter"


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/stores/%FF/all", 400, "malformed-path"),
        ("/metadata/stores/%E9/key/1", 400, "malformed-path"),
        ("/stores/strings/prefix/%FF", 400, "malformed-key"),
        ("/stores/strings/get/" + "k" * (MAX_KEY_CHARS + 1), 400, "key-too-long"),
        ("/stores/strings/range?from=" + "k" * (MAX_KEY_CHARS + 1), 400, "key-too-long"),
        ("/stores/strings/all?" + "&".join(f"p{i}=1" for i in range(MAX_QUERY_PARAMS + 1)), 400, "too-many-parameters"),
        (
            "/stores/strings/all?" + "&&".join(f"p{i}=1" for i in range(MAX_QUERY_PARAMS + 1)),
            400,
            "too-many-parameters",
        ),
        # Empty pieces are no parameters: 16 and a trailing '&' are read, and the first unknown one named.
        ("/stores/strings/all?" + "&".join(f"p{i}=1" for i in range(MAX_QUERY_PARAMS)) + "&", 400, "invalid-parameter"),
        ("/stores/strings/all?cursor=" + "A" * 5000, 400, "malformed-cursor"),
        ("/stores/clicks/windows?from=yesterday", 400, "malformed-range"),
        ("/stores/clicks/windows?from=2026-01-01T00:00:00.000000100Z", 400, "malformed-range"),  # nanoseconds
        ("/stores/strings/all?limit=1_0", 400, "invalid-parameter"),
        ("/stores/strings/all?limit=" + "9" * 5000, 400, "invalid-parameter"),  # int() raised: a 500
        ("/stores/longs/get/" + "9" * 1000, 400, "malformed-key"),
        ("/stores/longs/get/1_0", 400, "malformed-key"),
        ("/stores/longs/get/%200", 400, "malformed-key"),
        # An offset that moves the instant past year 9999 or before year 1: an absent key's 404 wrote the
        # key back as a datetime, which raised (a 500).
        ("/stores/bookings/get/42/9999-12-31T23:59:59-01:00", 400, "malformed-key"),
        ("/stores/bookings/get/42/0001-01-01T00:00:00%2B01:00", 400, "malformed-key"),
        ("/stores/bookings/range?from=42/9999-12-31T23:59:59-01:00", 400, "malformed-range"),
        ("/stores/clicks/windows?to=9999-12-31T23:59:59-01:00", 400, "malformed-range"),
    ],
)
async def test_hostile_requests_get_their_code(client, path: str, status: int, code: str) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get(path)
    assert resp.status == status and (await resp.json())["error"]["code"] == code


async def test_empty_pieces_of_a_query_string_count_for_no_parameter(client) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get("/stores/strings/all?limit=2" + "&" * 40)
    assert resp.status == 200 and len((await resp.json())["result"]) == 2


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/stores/strings/all?from=a&to=b", "from"),  # once answered the whole store
        ("/stores/strings/prefix/a?to=b", "to"),
        ("/stores/strings/get/a?limit=1", "limit"),
        ("/stores/visits/sessions?keyFrom=a&from=2026-01-01T00:00:00Z", "from"),  # windows' bound, not sessions'
        ("/stores/visits/sessions?earliestEnd=2026-01-01T00:00:00Z&earliestEnd=2026-01-02T00:00:00Z", "earliestEnd"),
        ("/stores/strings/range?from=a&from=b", "from"),  # took the last; windows' from took the first
        ("/stores/clicks/windows?from=2026-01-01T00:00:00Z&from=2026-01-02T00:00:00Z", "from"),
        ("/stores/strings/all?limit=1&limit=5", "limit"),
        ("/stores/strings/all?Limit=1", "Limit"),
        ("/stores?verbose=1", "verbose"),
        ("/metadata/stores/strings?x", "x"),
    ],
)
async def test_a_parameter_the_route_does_not_take_or_given_twice_is_a_400(client, path: str, parameter: str) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get(path)
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["code"] == "invalid-parameter" and error["parameter"] == parameter, error


async def test_parameters_the_route_takes_empty_pairs_and_service_routes(client, secured) -> None:  # type: ignore[no-untyped-def]
    got = await client.get("/stores/strings/range?from=a&&to=z&limit=2&")  # empty pairs are nothing
    assert got.status == 200 and len((await got.json())["result"]) <= 2
    for path in ("/health?probe=1", "/ready?x=1", "/openapi.json?v=2", "/docs?x"):
        assert (await client.get(path)).status in (200, 503), path  # service routes ignore parameters
    # a caller without a token learns nothing, not even which parameters a route takes
    assert (await secured.get("/stores/strings/all?nope=1")).status == 401


async def test_a_cursor_of_another_store_or_query_kind_is_a_400(client) -> None:  # type: ignore[no-untyped-def]
    page = await (await client.get("/stores/clicks/windows?limit=1")).json()
    for path in ("/stores/visits/sessions", "/stores/clicks/all", "/stores/strings/all"):
        resp = await client.get(f"{path}?limit=1&cursor={page['next']}")
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "malformed-cursor", path


async def test_a_cursor_comes_alone_or_with_the_parameters_that_issued_it(client) -> None:  # type: ignore[no-untyped-def]
    """With other bounds or the other direction, a cursor once continued its own scan silently."""
    first = await (await client.get("/stores/longs/range?from=0&limit=1")).json()
    assert first["result"] == [{"key": 0, "value": "zero"}] and first["next"]
    rest = [{"key": 2**63 - 1, "value": "max"}]
    for same in ("from=0&", ""):
        got = await client.get(f"/stores/longs/range?{same}limit=1&cursor={first['next']}")
        assert got.status == 200 and (await got.json())["result"] == rest, same
    for other in ("from=-5&", "from=0&to=9&", "from=0&reverse=true&", "reverse=true&"):
        got = await client.get(f"/stores/longs/range?{other}limit=1&cursor={first['next']}")
        assert got.status == 400 and (await got.json())["error"]["code"] == "malformed-cursor", other
    # The other direction said with its default value: a reverse scan's cursor with reverse=false was taken
    # as a cursor alone and continued backwards, a 200 in the order the request did not ask for.
    backwards = await (await client.get("/stores/strings/all?reverse=true&limit=1")).json()
    for path in ("/stores/strings/all?reverse=false&", "/stores/visits/sessions?reverse=0&"):
        cursor = backwards["next"] if "strings" in path else (await (await client.get(
            "/stores/visits/sessions?reverse=true&limit=1")).json())["next"]  # fmt: skip
        got = await client.get(f"{path}limit=1&cursor={cursor}")
        assert got.status == 400 and (await got.json())["error"]["code"] == "malformed-cursor", path
    alone = await client.get(f"/stores/strings/all?limit=1&cursor={backwards['next']}")  # alone: its own scan
    assert alone.status == 200 and (await alone.json())["result"][0]["key"] < backwards["result"][0]["key"]
    # Its parameters repeated with the direction left out: the cursor's own direction, as when it comes alone.
    for path in ("/stores/clicks/windows/alice?", "/stores/longs/range?from=-5&"):
        first = await (await client.get(f"{path}reverse=true&limit=1")).json()
        assert first["next"], path
        got = await client.get(f"{path}limit=1&cursor={first['next']}")
        assert got.status == 200, (path, await got.text())
        again = await client.get(f"{path}reverse=true&limit=1&cursor={first['next']}")
        assert (await got.json())["result"] == (await again.json())["result"], path


@pytest.mark.parametrize(
    "path",
    [
        "/stores/strings/all?reverse=true&",
        "/stores/longs/range?from=-9223372036854775808&",
        "/stores/strings/prefix/?",  # the prefix in the path: never a bare request
        "/stores/clicks/windows/alice?",
        "/stores/clicks/windows?keyFrom=a&",
        "/stores/visits/sessions?reverse=true&",
    ],
)
async def test_every_page_to_the_end_with_the_parameters_repeated(client, path: str) -> None:  # type: ignore[no-untyped-def]
    """A page's cursor carried the scan as continued, so the third page with the first's parameters was
    refused as another scan's; the console keeps the path (and so a prefix or key) on every page."""
    whole = (await (await client.get(path.rstrip("?&"))).json())["result"]
    seen: list[Any] = []
    cursor = None
    while True:
        resp = await client.get(f"{path}limit=1" + (f"&cursor={cursor}" if cursor else ""))
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        seen += body["result"]
        cursor = body["next"]
        if cursor is None:
            break
    assert seen == whole and len(whole) >= 3, path


async def test_a_cursor_pages_on_any_node_of_the_deployment(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    key = generate_cursor_key()
    one, other = (
        await aiohttp_client(every_kind_app(cursor_key=key)),
        await aiohttp_client(every_kind_app(cursor_key=key)),
    )
    page = await (await one.get("/stores/bookings/all?limit=2")).json()
    rest = await (await other.get(f"/stores/bookings/all?limit=100&cursor={page['next']}")).json()
    assert len(page["result"]) + len(rest["result"]) == 9


async def test_bodies_and_other_methods_are_json_errors(client) -> None:  # type: ignore[no-untyped-def]
    ready, probed = await client.get("/ready"), await client.head("/ready")
    assert probed.status == ready.status and await probed.read() == b""
    assert probed.headers["Content-Type"] == ready.headers["Content-Type"]
    resp = await client.get("/stores/strings/all", data=b"x" * 5000)
    assert resp.status == 413 and (await resp.json())["error"]["code"] == "payload-too-large"
    assert "over 1024 bytes" in (await resp.json())["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x"

    resp = await client.get("/stores/strings/all", data=chunks())  # chunked, one byte: refused, and said why
    error = (await resp.json())["error"]
    assert resp.status == 413 and error["code"] == "payload-too-large" and "chunked request body" in error["message"]
    assert (await client.get("/stores/strings/all", data=b"x" * 10)).status == 200  # a small body is ignored
    for method in ("POST", "PUT", "DELETE", "PATCH", "HEAD"):
        for path in ("/stores/strings/all", "/stores/strings/get/a/b", "/health"):
            resp = await client.request(method, path)
            if method == "HEAD" and path == "/health":  # the probes take HEAD (load balancers use it)
                assert resp.status == 200 and await resp.read() == b"", (method, path)
                continue
            allow = "GET,HEAD" if path == "/health" else "GET"
            assert resp.status == 405 and resp.headers["Allow"].replace(" ", "") == allow, (method, path)
            if method != "HEAD":
                assert (await resp.json())["error"]["code"] == "method-not-allowed"
        for path in ("/no/such/path", "/health/%0A", "/%0A%0D"):  # decoded newlines included
            resp = await client.request(method, path)
            assert resp.status == 404, (method, path)  # no route takes the path with any method
            if method != "HEAD":
                assert (await resp.json())["error"]["code"] == "not-found", (method, path)


async def test_no_version_banner_and_no_content_sniffing(client) -> None:  # type: ignore[no-untyped-def]
    paths = ("/stores", "/nope", "/stores/nope/all", "/stores/strings/get/a", "/stores/strings/get/zz", "/health/%0A")
    answers = [await client.get(path) for path in paths]
    answers.append(await client.get("/stores/strings/all", headers={"Accept": "application/x-ndjson"}))
    answers.append(await client.post("/stores"))
    assert answers[-2].status == 200  # a stream sets its headers itself
    for answer in answers:
        assert answer.headers["Server"] == "riqr", answer.url
        assert answer.headers["X-Content-Type-Options"] == "nosniff", answer.url


async def test_store_names_are_decoded_strictly_and_remembered_within_a_bound(client) -> None:  # type: ignore[no-untyped-def]
    from runtime.rest import handlers

    kept = handlers._store_name.cache_info().maxsize  # noqa: SLF001
    assert kept is not None
    for i in range(kept + 50):
        assert (await client.get(f"/stores/no-store-{i}/get/k")).status == 404
    assert handlers._store_name.cache_info().currsize <= kept  # noqa: SLF001
    for _ in range(2):  # the second time from the remembered names: the same answers
        assert (await client.get("/stores/%FF/get/k")).status == 400
        assert (await (await client.get("/stores/str%69ngs/get/a")).json()) == {"response": "x"}


@pytest.fixture
async def secured(aiohttp_client):  # type: ignore[no-untyped-def]
    return await aiohttp_client(every_kind_app(auth=AuthConfig(enabled=True, secret=SECRET)))


def _bearer(*stores: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + mint_token(SECRET, stores=stores)}


async def test_unrouted_paths_and_methods_need_a_token_like_any_other(secured) -> None:  # type: ignore[no-untyped-def]
    unrouted = (("GET", "/no/such/path"), ("GET", "/health/%0A"), ("POST", "/stores/strings/all"), ("HEAD", "/stores"))
    for method, path in unrouted:
        assert (await secured.request(method, path)).status == 401, (method, path)
        assert (await secured.request(method, path, headers=_bearer("*"))).status in (404, 405), (method, path)
    # the same header twice is served from the token cache: the same caller, the same verdicts
    for _ in range(2):
        assert (await secured.get("/stores/strings/get/a", headers=_bearer("longs"))).status == 403


async def test_refusals_come_in_the_format_asked_for(secured) -> None:  # type: ignore[no-untyped-def]
    """401 and 403 were JSON whatever the caller's Accept said; every other error came as msgpack."""
    msgpack_only = {"Accept": "application/msgpack"}
    missing = await secured.get("/stores/strings/all", headers=msgpack_only)
    assert missing.status == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert msgpack.unpackb(await missing.read())["error"]["code"] == "unauthorized"
    refused = await secured.get("/stores/strings/all", headers={**msgpack_only, **_bearer("longs")})
    assert refused.status == 403 and msgpack.unpackb(await refused.read())["error"]["code"] == "forbidden"
    assert (await (await secured.get("/stores/strings/all")).json())["error"]["code"] == "unauthorized"


async def test_listings_show_only_what_the_token_may_read(secured) -> None:  # type: ignore[no-untyped-def]
    assert (await secured.get("/stores")).status == 401
    stores = (await (await secured.get("/stores", headers=_bearer("longs", "clicks"))).json())["result"]
    assert sorted(s["name"] for s in stores) == ["clicks", "longs"]
    instances = (await (await secured.get("/metadata", headers=_bearer("longs"))).json())["result"]
    assert instances and {n for i in instances for n in i["state-store-names"]} == {"longs"}
    assert (await secured.get("/stores/strings/all", headers=_bearer("longs"))).status == 403


async def test_the_store_answered_is_the_store_authorized_however_the_path_is_spelled(secured) -> None:  # type: ignore[no-untyped-def]
    """``/%6Detadata/...`` is routed as ``/metadata/...``: the handler once read the raw first segment, took
    the path for ``/stores/...`` and answered about a store named ``stores``, not the one the token was
    checked against."""
    for plain, spelled in (
        ("/metadata/stores/longs", "/%6Detadata/stores/longs"),
        ("/metadata/stores/longs/key/0", "/%6Detadata/%73tores/longs/key/0"),
        ("/stores/longs/get/0", "/%73tores/lon%67s/get/0"),
    ):
        expected = await secured.get(plain, headers=_bearer("longs"))
        # sent as spelled: yarl would otherwise normalize %6D to m on the client's side
        raw = URL(str(secured.make_url("")).rstrip("/") + spelled, encoded=True)
        got = await secured.session.get(raw, headers=_bearer("longs"))
        assert expected.status == got.status == 200, spelled
        assert await got.json() == await expected.json(), spelled
        assert (await secured.session.get(raw, headers=_bearer("strings"))).status == 403, spelled


async def test_docs_spec_and_health_need_no_token(secured) -> None:  # type: ignore[no-untyped-def]
    for path in ("/health", "/openapi.json", "/docs"):
        assert (await secured.get(path)).status == 200, path
    page = await (await secured.get("/docs")).text()
    assert "openapi.json" in page and "http" not in page.replace("http-equiv", "")  # nothing from elsewhere


@pytest.mark.parametrize("auth_enabled", [True, False])
def test_the_openapi_document_covers_every_route_and_validates(auth_enabled: bool) -> None:
    doc = openapi_document(ROUTES, auth_enabled=auth_enabled)
    validate(doc)  # OpenAPI 3.1 schema
    assert len(doc["paths"]) == len(ROUTES)
    for route in ROUTES:
        item = doc["paths"][route.path.replace(r":[\s\S]*", "")]  # OpenAPI paths hold no patterns
        assert set(item) == ({"get", "head"} if route.path in ("/health", "/ready") else {"get"})
        op = item["get"]
        assert {p["name"] for p in op["parameters"]} == {p.name for p in route.params}
        assert {"200", "400", "405", "413", "414", "431"} <= set(op["responses"])  # 400: more than 16 parameters
        assert ("401" in op["responses"]) == (auth_enabled and not route.public)


async def test_the_served_document_is_the_one_built_from_the_routes(secured) -> None:  # type: ignore[no-untyped-def]
    served = await (await secured.get("/openapi.json")).json()
    assert served == json.loads(json.dumps(openapi_document(ROUTES)))
    app = build_app.__doc__
    assert app is not None


async def test_a_store_name_too_long_says_so_and_the_accept_headers_weights_are_honoured(client) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get("/stores/" + "s" * (MAX_KEY_CHARS + 1) + "/all")
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["code"] == "malformed-path"
    assert (
        error["message"]
        == f"the store name is {MAX_KEY_CHARS + 1} characters long in the URL; the limit is {MAX_KEY_CHARS}"
    )
    refused = {"Accept": "application/json, application/x-ndjson;q=0"}  # NDJSON not acceptable: JSON
    assert (await client.get("/stores/strings/all", headers=refused)).content_type == "application/json"
    listed_first = {"Accept": "application/msgpack, application/x-ndjson"}
    answer = await client.get("/stores/strings/all", headers=listed_first)
    assert answer.content_type == "application/msgpack"
    assert set(msgpack.unpackb(await answer.read(), strict_map_key=False)) == {"result"}


@pytest.mark.parametrize(
    "path",
    [
        "/stores/strings/get/a",
        "/stores/strings/all",
        "/stores/strings/all?limit=1",
        "/stores/strings/approximate-num-entries",
        "/stores/clicks/windows",
        "/stores",
        "/metadata",
        "/metadata/stores/strings",
        "/metadata/stores/strings/key/a",
        "/health",
    ],
)
async def test_answers_match_the_openapi_documents_schemas_field_for_field(client, path: str) -> None:  # type: ignore[no-untyped-def]
    """The key metadata's answer is {"result": instance} (seed 000), but the document described a bare
    instance; it validated only because the schema allowed any field. Every top-level field of an answer
    is now one its schema names, and the answer validates."""
    import jsonschema

    doc = openapi_document(ROUTES)
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    route = doc["paths"][next(p for p in doc["paths"] if _matches(p, URL(path).path))]["get"]
    schema = route["responses"]["200"]["content"]["application/json"]["schema"]
    named = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    assert set(body) <= set(named["properties"]), (path, sorted(set(body) - set(named["properties"])))
    jsonschema.validate(body, {**schema, "components": doc["components"]})
    if path.startswith("/stores/strings/"):
        assert "X-Riqr-Position" in route["responses"]["200"]["headers"] and resp.headers.get("X-Riqr-Position")


def _matches(template: str, path: str) -> bool:
    """Whether an OpenAPI path template (``/stores/{store}/get/{key}``) matches ``path``: a ``{key}`` at
    the end takes the rest of the path, any other parameter one segment."""
    import re

    parts = re.split(r"(\{\w+\})", template)
    pattern = "".join(
        ("[\\s\\S]*" if part == "{key}" and n == len(parts) - 2 else "[^/]+")
        if part.startswith("{")
        else re.escape(part)
        for n, part in enumerate(parts)
    )
    return re.fullmatch(pattern, path) is not None


def test_the_error_codes_of_the_openapi_document_are_those_docs_api_md_lists() -> None:
    from pathlib import Path

    from runtime.rest.openapi import ERROR_CODES

    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    errors = text[text.index("\n## Errors") :]
    rows = [line for line in errors.splitlines() if line.startswith("| 4") or line.startswith("| 5")]
    documented = {(int(row.split("|")[1]), code) for row in rows for code in _codes(row.split("|")[2])}
    listed = {(status, code) for status, codes in ERROR_CODES.items() for code in codes}
    assert listed <= documented, sorted(listed - documented)
    # Only a bug's 500 is in the docs and not a route's possible answers.
    assert {code for _, code in documented - listed} == {"internal"}, sorted(documented - listed)


def _codes(cell: str) -> list[str]:
    return [part.strip("` ") for part in cell.split(",") if part.strip()]


@pytest.mark.parametrize(
    "path",
    [
        "/stores/clicks/windows?from=yesterday",  # a time bound: had no "store"
        "/stores/visits/sessions?earliestEnd=bad",
        "/stores/strings/get/a?limit=1",  # a parameter the route does not take
        "/stores/longs/get/1_0",
        "/stores/strings/all?cursor=" + "A" * 5000,
    ],
)
async def test_every_error_of_a_stores_route_names_the_store(client, path: str) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get(path)
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["store"] == path.split("/")[2], error
    resp = await client.get("/stores/%FF/all")  # a name that does not decode is not echoed
    assert "store" not in (await resp.json())["error"]
