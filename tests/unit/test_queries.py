"""Query values: keys as URL text decoded by the store's schema, and binding queries to scans."""

from __future__ import annotations

import pytest

from runtime.errors import InvalidParameter, MalformedKey, MalformedRange
from runtime.queries import RangeQuery, UrlKey, bind_key, bind_partition_key, check_limit
from runtime.scan import Bound, Scan
from tests.unit.fakes import kv_spec, windowed_spec

BOOKINGS = kv_spec("bookings", rest=(("ts", "timestamp"),))


def test_a_url_key_is_split_by_the_schema_then_decoded() -> None:
    assert UrlKey("a%2Fb").decode(1) == "a/b"  # one column: '/' is part of the key
    assert UrlKey("a/b").decode(1) == "a/b"
    assert UrlKey("a%2Fb/2026-01-01T00:00:00Z").decode(2) == ("a/b", "2026-01-01T00:00:00Z")
    assert UrlKey("x+y", in_query=True).decode(1) == "x y"  # '+' is a space in a query string only
    assert UrlKey("x+y").decode(1) == "x+y"
    assert UrlKey("").decode(1) == ""


@pytest.mark.parametrize("raw", ["%FF", "%C3", "abc%", "%zz", "%2"])
def test_bad_percent_encoding_is_a_malformed_key_not_a_different_key(raw: str) -> None:
    with pytest.raises(MalformedKey):
        UrlKey(raw).decode(1)


def test_binding_keys_by_the_store_schema() -> None:
    ints = kv_spec("ints", key_type="long")
    assert bind_key(ints, UrlKey("-12")) == -12 and bind_key(ints, 7) == 7
    with pytest.raises(MalformedKey):
        bind_key(ints, UrlKey("ten"))
    assert bind_key(BOOKINGS, UrlKey("42/1970-01-01T00:00:01Z")) == ("42", 1_000_000)
    assert bind_partition_key(BOOKINGS, UrlKey("42")) == ("42",)
    with pytest.raises(MalformedKey):
        bind_key(BOOKINGS, UrlKey("42"))  # a whole key needs both columns


def test_range_queries_bind_to_closed_scans() -> None:
    ints = kv_spec("ints", key_type="long")
    assert RangeQuery("ints", UrlKey("2", True), UrlKey("20", True), reverse=True).bind(ints) == Scan(
        Bound(2), Bound(20), True
    )
    assert RangeQuery("ints").bind(ints) == Scan()
    with pytest.raises(MalformedRange):
        RangeQuery("ints", lo=UrlKey("x", True)).bind(ints)


@pytest.mark.parametrize(
    ("query", "match"),
    [
        (RangeQuery("ints", prefix="1"), "need a string key"),
        (RangeQuery("s", prefix="a", lo="a"), "from/to"),
    ],
)
def test_unusable_scans_say_why(query: RangeQuery, match: str) -> None:
    spec = kv_spec(query.store, key_type="long" if query.store == "ints" else "string")
    with pytest.raises(InvalidParameter, match=match):
        query.bind(spec)


def test_a_key_range_on_a_window_store_points_at_its_window_queries() -> None:
    with pytest.raises(InvalidParameter, match="window queries"):
        RangeQuery("w", lo="a").bind(windowed_spec("w"))
    assert RangeQuery("w").bind(windowed_spec("w")) == Scan()  # `all` is fine


@pytest.mark.parametrize("limit", [0, -1, 10_001, True, "10", 1.5])
def test_page_limits_are_checked(limit: object) -> None:
    with pytest.raises(InvalidParameter):
        check_limit(limit)  # type: ignore[arg-type]
    assert check_limit(10_000) == 10_000


@pytest.mark.parametrize("reverse", ["false", "true", 0, 1, "no"])
def test_a_direction_from_python_code_is_true_or_false(reverse: object) -> None:
    """``bool()`` read ``reverse="false"`` as backwards: any direction but True, False or None (not given) is
    refused, for every scan kind."""
    from runtime.queries import SessionQuery, WindowQuery

    queries = [
        (RangeQuery("s", reverse=reverse), kv_spec("s")),  # type: ignore[arg-type]
        (RangeQuery("s", prefix="a", reverse=reverse), kv_spec("s")),  # type: ignore[arg-type]
        (WindowQuery("w", "k", reverse=reverse), windowed_spec("w", "window")),  # type: ignore[arg-type]
        (SessionQuery("x", "k", reverse=reverse), windowed_spec("x", "session")),  # type: ignore[arg-type]
    ]
    for query, spec in queries:
        with pytest.raises(InvalidParameter, match="reverse must be True or False"):
            query.bind(spec)
    assert RangeQuery("s", reverse=None).bind(kv_spec("s")) == RangeQuery("s", reverse=False).bind(kv_spec("s"))
    assert RangeQuery("s", reverse=True).bind(kv_spec("s")).reverse


def test_one_keys_windows_and_sessions_need_that_key() -> None:
    """``store.windows(None)`` answered every key's windows; the ``_range`` forms are for that."""
    import asyncio

    from runtime.client import Store

    class NoCalls:
        def call(self, *_: object) -> object:
            raise AssertionError("called the facade")

        call_async = call

    store = Store(NoCalls(), "w")  # type: ignore[arg-type]
    calls = [
        ("windows", lambda: store.windows(None)),
        ("sessions", lambda: store.sessions(None)),
        ("find_sessions", lambda: store.find_sessions(None, None, None)),
        ("windows", lambda: asyncio.run(store.windows_async(None))),
        ("sessions", lambda: asyncio.run(store.sessions_async(None))),
        ("find_sessions", lambda: asyncio.run(store.find_sessions_async(None, None, None))),
    ]
    for method, call in calls:
        every = (
            r"iterate_sessions\(earliest_end=, latest_start=\)" if method == "find_sessions" else rf"{method}_range\(\)"
        )
        with pytest.raises(InvalidParameter, match=rf"^{method}\(\) needs a key \(None given\); {every} reads"):
            call()
