"""The web console: a static page over the REST API, served at ``/`` by every HTTP verticle.

The page, its script and its style sheet are files shipped with the package (``runtime/rest/static/``),
plain HTML, JavaScript and CSS with no build step and nothing loaded from elsewhere, so it works on an
air-gapped cluster. They are public (no token), like ``/docs``: they hold no data. Every data call the
page makes goes to this same server's REST API with the token pasted into the page, so the console can
show nothing the token could not read with curl.

The Content-Security-Policy allows scripts and styles from this server only (no inline script), and
connections to this server only: even a value that slipped into the DOM as markup could not run or
send anything elsewhere. The script itself only ever sets ``textContent``.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

__all__ = ["CONSOLE_CSP", "console_page", "console_script", "console_style"]

CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@functools.cache
def _asset(name: str) -> bytes:
    # Read once per process: the files are part of the installed package and never change under it.
    return (resources.files("runtime.rest") / "static" / name).read_bytes()


def _static(name: str, content_type: str) -> web.Response:
    headers = {
        "Content-Security-Policy": CONSOLE_CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        # Revalidate: after an upgrade the page and its script must not come from two versions.
        "Cache-Control": "no-cache",
    }
    return web.Response(body=_asset(name), content_type=content_type, charset="utf-8", headers=headers)


async def console_page(request: web.Request) -> web.Response:
    """The console's HTML (no token needed: it holds no data)."""
    return _static("console.html", "text/html")


async def console_script(request: web.Request) -> web.Response:
    """The console's script."""
    return _static("console.js", "text/javascript")


async def console_style(request: web.Request) -> web.Response:
    """The console's style sheet."""
    return _static("console.css", "text/css")
