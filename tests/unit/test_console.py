"""The web console's files: public, self-contained, under a strict Content-Security-Policy, and its
script never writes markup; the data it shows still needs a token."""

from __future__ import annotations

import re

import pytest

from runtime.auth import AuthConfig, generate_secret, mint_token
from runtime.rest.console import CONSOLE_CSP
from tests.unit.rest_fixtures import every_kind_app

SECRET = generate_secret()
ASSETS = {"/": "text/html", "/console/console.js": "text/javascript", "/console/console.css": "text/css"}


@pytest.fixture
async def secured(aiohttp_client):  # type: ignore[no-untyped-def]
    return await aiohttp_client(every_kind_app(auth=AuthConfig(enabled=True, secret=SECRET)))


async def test_the_console_loads_without_a_token_but_its_data_does_not(secured) -> None:  # type: ignore[no-untyped-def]
    for path, content_type in ASSETS.items():
        resp = await secured.get(path)
        assert resp.status == 200, path
        assert resp.content_type == content_type and resp.charset == "utf-8"
        assert resp.headers["Content-Security-Policy"] == CONSOLE_CSP
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/stores", "/metadata", "/stores/strings/all?limit=2"):
        assert (await secured.get(path)).status == 401
    token = {"Authorization": "Bearer " + mint_token(SECRET)}
    assert (await secured.get("/stores", headers=token)).status == 200


def test_the_policy_allows_scripts_and_connections_to_this_server_only() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CONSOLE_CSP.split(";"))
    assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert directives["default-src"] == "'none'"
    assert "unsafe" not in CONSOLE_CSP


async def test_the_page_references_only_its_own_files(secured) -> None:  # type: ignore[no-untyped-def]
    page = await (await secured.get("/")).text()
    assert "http:" not in page and "https:" not in page and "//" not in page  # nothing from elsewhere
    assert re.search(r"<script>", page) is None  # no inline script (the policy would block it anyway)
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page):
        assert (await secured.get("/" + ref)).status == 200, ref  # relative: works behind a path prefix


async def test_the_script_writes_text_never_markup(secured) -> None:  # type: ignore[no-untyped-def]
    script = await (await secured.get("/console/console.js")).text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    assert "textContent" in script
    assert "sessionStorage" in script and "localStorage" not in script  # the token lives for the tab only
    assert "http" not in script.replace("http://", "")  # only builds links to the cluster's own REST endpoints
