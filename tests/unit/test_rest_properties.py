"""Property-based tests over the REST API: whatever a client sends, no 5xx, every error is JSON (or the
msgpack asked for) with a ``code``, and the app keeps serving.

The app is the real one (``build_app``) over the in-process fake bus, with every store kind. Requests
are random paths built on every route (and off them), keys of every type and encoding, bounds, limits,
cursors (random, truncated, from another store, tampered), ``Accept`` variants and methods. Bounded by
the hypothesis profile (tests/unit/conftest.py): a few seconds by default, more with
``HYPOTHESIS_PROFILE=thorough``. Failing examples found while writing it are kept as explicit cases in
``test_regressions_found_by_the_properties``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from runtime.rest import ROUTES
from tests.promtext import samples
from tests.unit.rest_fixtures import STORES, every_kind_app


class Served:
    """The app behind a test client, on an event loop of its own (hypothesis drives sync tests)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.client: TestClient[Any, Any] = self.run(self._start())
        self.cursors = [self.run(self._cursor(p)) for p in CURSOR_SOURCES]

    @staticmethod
    async def _start() -> TestClient[Any, Any]:
        client = TestClient(TestServer(every_kind_app()))  # built inside the loop it will run on
        await client.start_server()
        return client

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _cursor(self, path: str) -> str:
        body = await (await self.client.get(path)).json()
        assert body["next"], path
        return str(body["next"])

    async def request(self, method: str, url: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        async with self.client.request(method, URL(url, encoded=True), headers=headers) as resp:
            return resp.status, resp.content_type, await resp.read()

    def close(self) -> None:
        self.run(self.client.close())
        self.loop.close()


CURSOR_SOURCES = ["/stores/strings/all?limit=1", "/stores/bookings/range?from=42&limit=1",
                  "/stores/clicks/windows/alice?limit=1", "/stores/visits/sessions?limit=1",
                  "/stores/longs/all?reverse=true&limit=1"]  # fmt: skip


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    app = Served()
    yield app
    app.close()


def _encoded(text: str) -> str:
    # Leaves '%' alone, so bad escapes such as %zz or %FF get through, and '+' (a space in a query). What
    # no client library would send (raw spaces, control bytes) is test_rest_server's, over a raw socket.
    return quote(text, safe="/%+")


KEY_TEXT = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        [
            "a",
            "42",
            "é",
            "bob/c",
            "alice",
            "",
            "-",
            "1e10",
            "%",
            "%zz",
            "%FF",
            "%C3%A9",
            "%2F",
            "..",
            "2026-01-01T00:00:00Z",
            "42/2026-01-02T00:00:00Z",
            "a%2Fb/2026-01-01T00:00:00Z",
        ]
    ),  # fmt: skip
    st.binary(max_size=6).map(lambda b: "".join(f"%{x:02X}" for x in b)),
    st.lists(st.text(max_size=4), min_size=2, max_size=4).map("/".join),
    st.integers(min_value=1000, max_value=1100).map(lambda n: "k" * n),
).map(_encoded)
STORE = st.one_of(st.sampled_from([*STORES, "nope", "%FF", "%2e%2e", ""]), st.text(max_size=8).map(_encoded))
PARAM_NAMES = ["from", "to", "keyFrom", "keyTo", "limit", "cursor", "reverse", "earliestEnd", "latestStart"]


@st.composite
def cursors(draw: st.DrawFn) -> str:
    """A real cursor of some scan, possibly truncated or tampered with, or random text."""
    index = draw(st.integers(min_value=0, max_value=len(CURSOR_SOURCES) - 1))
    how = draw(st.sampled_from(["real", "truncated", "tampered", "random"]))
    if how == "random":
        return draw(st.text(max_size=40).map(_encoded))
    return f"<cursor {index} {how} {draw(st.integers(min_value=0, max_value=200))}>"


def _cursor_value(served: Served, value: str) -> str:
    if not value.startswith("<cursor "):
        return value
    _, index, how, n = value.strip("<>").split()
    real = served.cursors[int(index)]
    if how == "truncated":
        return real[: int(n) % max(len(real), 1)]
    if how == "tampered":
        i = int(n) % len(real)
        return real[:i] + ("A" if real[i] != "A" else "B") + real[i + 1 :]
    return real


VALUE = st.one_of(
    KEY_TEXT,
    st.sampled_from(
        [
            "true",
            "false",
            "maybe",
            "0",
            "-1",
            "10000",
            "10001",
            "9" * 30,
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00+01:00",
            "yesterday",
        ]
    ),  # fmt: skip
    cursors(),
)
ACCEPT = st.sampled_from([None, "application/json", "application/msgpack", "application/x-ndjson", "*/*",
                          "application/msgpack, application/json", "text/html", "",
                          "application/msgpack;q=0"])  # fmt: skip
METHOD = st.sampled_from(["GET"] * 6 + ["POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])


@st.composite
def paths(draw: st.DrawFn) -> str:
    route = draw(st.sampled_from(ROUTES)).path
    path = route.replace("{store}", draw(STORE))
    for name in (r"{key:[\s\S]*}", r"{prefix:[\s\S]*}"):
        path = path.replace(name, draw(KEY_TEXT))
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        path += "/" + draw(KEY_TEXT)  # off the routes
    if path.startswith("//"):  # after "/" (the console): a client would read "//x" as a host name
        path = "/" + path.lstrip("/")
    return path


@st.composite
def queries(draw: st.DrawFn) -> list[tuple[str, str]]:
    names = st.one_of(st.sampled_from(PARAM_NAMES), st.text(max_size=5).map(_encoded))
    return draw(st.lists(st.tuples(names, VALUE), max_size=6))


def _strict_json(data: bytes) -> Any:
    """``data`` as JSON, strictly: UTF-8, and no NaN or Infinity (Python's ``json`` takes them; JSON has no
    such numbers, and riqr spells them as text)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def decoded(content_type: str, body: bytes) -> Any:
    """A successful answer's body, decoded as its content type says (what the app answers: JSON, msgpack,
    NDJSON, Prometheus text, and the console's and docs' HTML, script and style); fails on a body that does
    not parse as that, or on any other content type."""
    if content_type == "application/json":
        return _strict_json(body)
    if content_type == "application/msgpack":
        return msgpack.unpackb(body, strict_map_key=False)  # maps with integer keys are values too
    if content_type == "application/x-ndjson":
        assert not body or body.endswith(b"\n"), body[-100:]  # whole lines only
        return [_strict_json(line) for line in body.splitlines()]
    if content_type == "text/plain":  # /metrics
        return samples(body.decode("utf-8"))
    if content_type in ("text/html", "text/javascript", "text/css"):
        return body.decode("utf-8")
    raise AssertionError(f"a successful answer of an unexpected content type: {content_type!r}")


def check(served: Served, method: str, path: str, query: list[tuple[str, str]], accept: str | None) -> None:
    pairs = [(quote(k, safe="%"), _cursor_value(served, v)) for k, v in query]
    url = path + ("?" + "&".join(f"{k}={v}" for k, v in pairs) if pairs else "")
    headers = {} if accept is None else {"Accept": accept}
    status, content_type, body = served.run(served.request(method, url, headers))
    assert status < 500, (method, url, accept, status, body[:300])
    if method == "HEAD":  # the headers only, whatever the status
        return
    if status < 300:
        try:
            decoded(content_type, body)
        except Exception as err:
            raise AssertionError(f"{method} {url} (Accept {accept!r}): {status} {content_type} whose body "
                                 f"does not parse ({err!r}): {body[:300]!r}") from err  # fmt: skip
        return
    if status < 400:  # a redirect: its Location says where, its body nothing
        return
    error = msgpack.unpackb(body) if content_type == "application/msgpack" else _strict_json(body)
    assert content_type in ("application/json", "application/msgpack"), content_type
    assert isinstance(error["error"]["code"], str) and error["error"]["code"], error


@given(method=METHOD, path=paths(), query=queries(), accept=ACCEPT)
def test_no_request_gets_a_5xx_and_every_error_is_json(
    served: Served, method: str, path: str, query: list[tuple[str, str]], accept: str | None
) -> None:
    check(served, method, path, query, accept)


@pytest.mark.parametrize(
    ("method", "path", "query", "accept"),
    [
        ("GET", "/stores/strings/all", [("limit", "9" * 30)], "application/msgpack"),  # big int in the error
        ("GET", "/stores/clicks/windows", [], "application/msgpack"),  # datetimes in msgpack
        ("GET", "/stores/visits/sessions/alice", [], "application/msgpack"),
        ("GET", "/stores/clicks/all", [("cursor", "<cursor 2 real 0>")], None),  # a window cursor on 'all'
        ("GET", "/stores/strings/all", [("cursor", "<cursor 0 tampered 3>")], None),
        ("GET", "/stores/strings/all", [("cursor", "<cursor 0 truncated 7>")], None),
        ("GET", "/stores/longs/all", [("cursor", "<cursor 1 real 0>")], None),  # from another store
        ("GET", "/stores/%FF/all", [], None),  # was a 404 for the store named U+FFFD
        ("GET", "/stores/strings/prefix/%FF", [], None),  # was a scan of the prefix U+FFFD
        ("GET", "/stores/strings/get/%C3%A9", [], None),  # a NaN value: was not JSON at all
        ("GET", "/stores/strings/all", [], "application/x-ndjson"),
        ("GET", "/stores/bookings/range", [("from", "k" * 1025)], None),
        ("GET", "/stores/clicks/windows", [("from", "2026-01-01T00:00:00+01:00")], None),
        ("DELETE", "/stores/strings/get/a", [], "application/msgpack"),
    ],
)
def test_regressions_found_by_the_properties(
    served: Served, method: str, path: str, query: list[tuple[str, str]], accept: str | None
) -> None:
    check(served, method, path, query, accept)


def test_the_app_keeps_serving(served: Served) -> None:
    status, _, body = served.run(served.request("GET", "/stores/strings/get/a", {}))
    assert status == 200 and json.loads(body) == {"response": "x"}
