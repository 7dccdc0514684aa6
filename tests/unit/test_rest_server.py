"""Raw malformed requests over TCP against a real server: aiohttp's parser refusals are JSON with the
right status. These only show with a real server (the test client speaks valid HTTP), and they fail
loudly if an aiohttp upgrade breaks ``runtime.rest.server``'s one private hook."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from runtime.config import MAX_HEADERS, MAX_URL_CHARS
from runtime.rest.server import start_runner
from tests.unit.rest_fixtures import every_kind_app


async def _serve() -> web.AppRunner:
    runner = await start_runner(every_kind_app())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner


@pytest.fixture(params=["asyncio", "uvloop"])
async def port(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The server on asyncio's loop, or on uvloop's (what Ray's async actors run when uvloop is installed)."""
    if request.param == "asyncio":
        runner = await _serve()
        yield int(runner.addresses[0][1])
        await runner.cleanup()
        return
    import uvloop

    loop = uvloop.new_event_loop()
    ready: concurrent.futures.Future[tuple[web.AppRunner, int]] = concurrent.futures.Future()

    def serve() -> None:
        async def main() -> None:
            try:
                runner = await _serve()
            except BaseException as err:  # said to the test, which would otherwise wait for ever
                ready.set_exception(err)
                raise
            stop = asyncio.Event()
            ready.set_result((runner, int(runner.addresses[0][1])))
            stopping.append((asyncio.get_running_loop(), stop))
            await stop.wait()
            await runner.cleanup()

        loop.run_until_complete(main())
        loop.close()

    stopping: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    _, port = await asyncio.wrap_future(ready)
    yield port
    server_loop, stop = stopping[0]
    server_loop.call_soon_threadsafe(stop.set)
    await asyncio.to_thread(thread.join, 10)


async def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()  # until the server closes: every refusal closes the connection
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


GET = b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (GET % (b"/stores/\xff\xfe/all", b""), 400, "bad-request"),
        (GET % (b"/stores", b"X-Bad\x01: v\r\n"), 400, "bad-request"),
        (GET % (b"/stores", b"X-Big: " + b"a" * 10_000 + b"\r\n"), 431, "headers-too-large"),
        (GET % (b"/stores", b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1))), 431, "headers-too-large"),
        (GET % (b"/stores", b"Transfer-Encoding: chunked\r\n") + b"zz\r\nabc\r\n0\r\n\r\n", 400, "bad-request"),
        (GET % (b"/" + b"a" * (MAX_URL_CHARS + 1), b""), 414, "uri-too-long"),
        (GET % (b"/" + b"a" * 1_000_000, b""), 414, "uri-too-long"),  # read whole, not reset
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad-request"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "bad-request"),  # TLS on the HTTP port
    ],
)
async def test_parser_refusals_are_json(port: int, request_bytes: bytes, status: int, code: str) -> None:
    got, headers, body = await _exchange(port, request_bytes)
    assert got == status, body
    assert headers["content-type"].startswith("application/json")
    assert headers["server"] == "riqr"
    assert json.loads(body)["error"]["code"] == code


async def test_the_server_keeps_serving_after_refusals(port: int) -> None:
    await _exchange(port, GET % (b"/stores/\xff/all", b""))
    status, headers, body = await _exchange(port, GET % (b"/stores/strings/get/a", b"Connection: close\r\n"))
    assert status == 200 and json.loads(body) == {"response": "x"} and headers["server"] == "riqr"


REQUEST = b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"


async def _secured_port() -> tuple[web.AppRunner, int, str]:
    from runtime.auth import AuthConfig, generate_secret, mint_token

    secret = generate_secret()
    runner = await start_runner(every_kind_app(auth=AuthConfig(enabled=True, secret=secret)))
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1]), mint_token(secret, stores=["*"])


async def test_a_target_that_is_not_a_path_needs_a_token_and_is_a_json_error() -> None:
    """aiohttp's router matched no route for ``OPTIONS *`` or ``CONNECT host:port`` and answered them itself:
    text, with its version in ``Server``, no token asked for, not counted. They take the catch-all too."""
    runner, port, token = await _secured_port()
    auth = b"Authorization: Bearer %s\r\n" % token.encode()
    try:
        status, headers, body = await _exchange(port, REQUEST % (b"OPTIONS", b"*", b""))
        assert status == 401 and headers["server"] == "riqr", body
        assert json.loads(body)["error"]["code"] == "unauthorized"
        status, headers, body = await _exchange(port, REQUEST % (b"OPTIONS", b"*", auth))
        assert status == 404 and headers["server"] == "riqr" and headers["content-type"].startswith("application/json")
        assert json.loads(body)["error"]["code"] == "not-found"
        # CONNECT: aiohttp reads what follows as a body of no length, refused before the token is looked at
        # (every request's limits are); the point is that riqr answers it, in JSON.
        for extra in (b"", auth):
            status, headers, body = await _exchange(port, REQUEST % (b"CONNECT", b"x:80", extra))
            assert status == 413 and headers["server"] == "riqr", body
            assert json.loads(body)["error"]["code"] == "payload-too-large"
    finally:
        await runner.cleanup()


async def test_a_raw_fragment_in_the_target_is_a_400_not_a_shorter_key(port: int) -> None:
    """A raw '#' ends the path for yarl: ``get/a#b`` answered key ``a``'s value. '%23' is the key's '#'."""
    status, _, body = await _exchange(port, REQUEST % (b"GET", b"/stores/strings/get/a#b", b""))
    assert status == 400 and json.loads(body)["error"]["code"] == "malformed-path", body
    assert "%23" in json.loads(body)["error"]["message"]
    status, _, body = await _exchange(port, REQUEST % (b"GET", b"/stores/strings/get/a%23b", b""))
    assert status == 404 and json.loads(body)["error"]["code"] == "key-not-found", body


async def test_an_expect_header_goes_through_the_pipeline_like_any_request() -> None:
    """aiohttp answered ``Expect: bogus`` with its own text 417 (its version in ``Server``, no token asked
    for), and ``Expect: 100-continue`` with ``100 Continue`` before the token was looked at."""
    runner, port, token = await _secured_port()
    auth = b"Authorization: Bearer %s\r\n" % token.encode()
    try:
        for expect in (b"bogus", b"100-continue"):
            headers = b"Expect: %s\r\nContent-Length: 5\r\n" % expect
            status, got, body = await _exchange(port, REQUEST % (b"GET", b"/health", headers) + b"12345")
            assert status == 200 and got["server"] == "riqr", body
            assert not body.startswith(b"HTTP/1.1 100"), body
            status, got, body = await _exchange(port, REQUEST % (b"GET", b"/stores/strings/get/a", headers) + b"12345")
            assert status == 401 and got["server"] == "riqr" and b"100 Continue" not in body, body
            status, got, body = await _exchange(
                port, REQUEST % (b"GET", b"/stores/strings/get/a", headers + auth) + b"12345"
            )
            assert status == 200 and json.loads(body) == {"response": "x"}, body
    finally:
        await runner.cleanup()
