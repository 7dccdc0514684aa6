"""Helpers for integration tests: HTTP over a real client, waiting on conditions with a deadline."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """GET ``url``; returns (status, headers, decoded JSON body), for errors too."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read() or b"null")


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 90.0,
    what: str = "condition",
    interval: float = 0.1,
    fatal: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll until ``condition()`` is truthy; returns its value.

    Exceptions count as "not yet", except those in ``fatal``, which end the wait at once.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except fatal:
            raise
        except Exception as err:  # not ready yet
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last error: {last!r}")
