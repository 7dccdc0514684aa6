"""Window and session stores through the facade and the REST app (fake bus, real query cores)."""

import datetime as dt
import json

import pytest

from runtime.catalog import StoreSpec, ValueField
from runtime.errors import InvalidParameter, MalformedRange
from runtime.facade import Facade
from runtime.keys import KeySchema
from runtime.queries import KeyQuery, RangeQuery, SessionQuery, WindowQuery
from runtime.rest import build_app
from runtime.windows import Windowed
from tests.unit.fakes import FakeBus, kv_spec, load_windowed, windowed_spec

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def minute(n: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=n)


@pytest.fixture
def bus() -> FakeBus:
    b = FakeBus()
    b.create_store(windowed_spec("orders-per-minute"))
    # Tumbling one-minute windows: alice orders in minutes 0, 1, 3; bob in 1; carol in 2.
    load_windowed(
        b,
        "orders-per-minute",
        [
            ("alice", minute(0), minute(1), 2),
            ("alice", minute(1), minute(2), 1),
            ("alice", minute(3), minute(4), 5),
            ("bob", minute(1), minute(2), 1),
            ("carol", minute(2), minute(3), 7),
        ],
    )
    b.create_store(windowed_spec("order-sessions", kind="session"))
    # Sessions: alice 12:00:00-12:00:40 and 12:05:00-12:05:10; bob 12:01:00-12:02:00.
    load_windowed(
        b,
        "order-sessions",
        [
            ("alice", T0, T0 + dt.timedelta(seconds=40), 3),
            ("alice", minute(5), minute(5) + dt.timedelta(seconds=10), 1),
            ("bob", minute(1), minute(2), 4),
        ],
    )
    b.create_store(kv_spec("plain"))
    # Windows of (region, shop) keys, shop a number: for the errors of keys with more than one column.
    b.create_store(
        StoreSpec(
            "shop-windows",
            KeySchema("region", "string", (("shop", "long"), ("window_start", "timestamp"))),
            (ValueField("count", "bigint"),),
            kind="window",
        )
    )
    load_windowed(
        b,
        "shop-windows",
        [
            (("eu", 1), minute(0), minute(1), 3),
            (("eu", 20), minute(0), minute(1), 4),
            (("us", 1), minute(1), minute(2), 5),
        ],
    )
    return b


async def test_fetch_a_key_over_a_time_range_and_backwards(bus: FakeBus) -> None:
    core = Facade(bus)
    got = await core.entries(WindowQuery("orders-per-minute", "alice", time_from=minute(1), time_to=minute(3)))
    assert got == [Windowed("alice", minute(1), minute(2), 1), Windowed("alice", minute(3), minute(4), 5)]
    back = WindowQuery("orders-per-minute", "alice", time_from=minute(0), time_to=minute(9), reverse=True)
    assert [w.start for w in await core.entries(back)] == [minute(3), minute(1), minute(0)]


async def test_fetch_a_key_range_and_all_keys_over_a_time_range(bus: FakeBus) -> None:
    core = Facade(bus)
    query = WindowQuery(
        "orders-per-minute", key_from="alice", key_to="bob", time_from="2026-01-01T12:01:00Z", time_to=minute(1)
    )
    assert [(w.key, w.value) for w in await core.entries(query)] == [("alice", 1), ("bob", 1)]
    every = WindowQuery("orders-per-minute", time_from=minute(2), time_to=minute(3))
    assert [(w.key, w.start) for w in await core.entries(every)] == [("alice", minute(3)), ("carol", minute(2))]
    everything = await core.entries(RangeQuery("orders-per-minute"))
    assert len(everything) == 5 and all(isinstance(w, Windowed) for w in everything)


async def test_crossed_time_bounds_are_empty_without_reading_a_window(bus: FakeBus) -> None:
    """``from`` after ``to`` is empty for a key range as for one key (Kafka's fetch gives an empty iterator),
    and the scan is known empty before any owner is asked: it once read every window to filter out all."""
    core = Facade(bus)
    for key in ("alice", None):
        crossed = WindowQuery("orders-per-minute", key, time_from=minute(3), time_to=minute(1))
        assert crossed.bind(windowed_spec("orders-per-minute")).is_empty(), key
        assert await core.entries(crossed) == [], key
    sessions = SessionQuery("order-sessions", earliest_end=minute(2), latest_start=T0)  # alice's first spans
    assert not sessions.bind(windowed_spec("order-sessions", kind="session")).is_empty()


async def test_a_key_with_a_key_range_is_refused_not_ignored(bus: FakeBus) -> None:
    core = Facade(bus)
    for query in (
        WindowQuery("orders-per-minute", "alice", key_from="b"),
        WindowQuery("orders-per-minute", "alice", key_to="b"),
        SessionQuery("order-sessions", "alice", key_from="a", key_to="z"),
    ):
        with pytest.raises(InvalidParameter, match="not both"):
            await core.entries(query)


async def test_sessions_of_a_key_a_range_and_find_sessions(bus: FakeBus) -> None:
    core = Facade(bus)
    alice = await core.entries(SessionQuery("order-sessions", "alice"))
    assert [(s.start, s.end, s.value) for s in alice] == [
        (T0, T0 + dt.timedelta(seconds=40), 3),
        (minute(5), minute(5) + dt.timedelta(seconds=10), 1),
    ]
    both = await core.entries(SessionQuery("order-sessions", key_from="a", key_to="bz"))
    assert [s.key for s in both] == ["alice", "alice", "bob"]
    # findSessions: end >= 12:00:30 and start <= 12:04 -> only alice's first session.
    found = SessionQuery("order-sessions", "alice", earliest_end=T0 + dt.timedelta(seconds=30), latest_start=minute(4))
    assert [s.start for s in await core.entries(found)] == [T0]
    late = SessionQuery("order-sessions", "alice", earliest_end=minute(5), latest_start=minute(9))
    assert [s.start for s in await core.entries(late)] == [minute(5)]


async def test_sessions_backwards_newest_first_and_keys_descending(bus: FakeBus) -> None:
    """Kafka's ``backwardFetch`` and ``backwardFindSessions``: the same sessions, in the opposite order."""
    core = Facade(bus)
    back = await core.entries(SessionQuery("order-sessions", "alice", reverse=True))
    assert [s.start for s in back] == [minute(5), T0]
    both = await core.entries(SessionQuery("order-sessions", key_from="a", key_to="bz", reverse=True))
    assert [(s.key, s.start) for s in both] == [("bob", minute(1)), ("alice", minute(5)), ("alice", T0)]
    every = await core.entries(SessionQuery("order-sessions", reverse=True))
    assert every == list(reversed(await core.entries(SessionQuery("order-sessions"))))
    found = SessionQuery("order-sessions", "alice", earliest_end=T0, latest_start=minute(9), reverse=True)
    assert [s.start for s in await core.entries(found)] == [minute(5), T0]


async def test_queries_of_the_wrong_kind_and_bad_bounds_are_400s(bus: FakeBus) -> None:
    core = Facade(bus)
    with pytest.raises(InvalidParameter, match="kv store"):
        await core.entries(WindowQuery("plain", "k"))
    with pytest.raises(InvalidParameter, match="window store"):
        await core.entries(SessionQuery("orders-per-minute", "alice"))
    with pytest.raises(InvalidParameter):
        await core.get(KeyQuery("orders-per-minute", "alice"))
    with pytest.raises(MalformedRange, match="ISO-8601"):
        await core.entries(WindowQuery("orders-per-minute", "alice", time_from="yesterday"))


@pytest.fixture
async def client(bus: FakeBus, aiohttp_client):  # type: ignore[no-untyped-def]
    return await aiohttp_client(build_app(Facade(bus)))


async def test_rest_window_and_session_paths(client) -> None:  # type: ignore[no-untyped-def]
    body = await (
        await client.get("/stores/orders-per-minute/windows/alice?from=2026-01-01T12:01:00Z&to=2026-01-01T12:03:00Z")
    ).json()
    assert body == {
        "result": [
            {
                "key": "alice",
                "window": {"start": "2026-01-01T12:01:00+00:00", "end": "2026-01-01T12:02:00+00:00"},
                "value": 1,
            },
            {
                "key": "alice",
                "window": {"start": "2026-01-01T12:03:00+00:00", "end": "2026-01-01T12:04:00+00:00"},
                "value": 5,
            },
        ]
    }
    body = await (await client.get("/stores/orders-per-minute/windows?keyFrom=b&from=2026-01-01T12:00:00Z")).json()
    assert [e["key"] for e in body["result"]] == ["bob", "carol"]
    body = await (
        await client.get(
            "/stores/order-sessions/sessions/alice?earliestEnd=2026-01-01T12:00:30Z&latestStart=2026-01-01T12:04:00Z"
        )
    ).json()
    assert [e["window"]["start"] for e in body["result"]] == ["2026-01-01T12:00:00+00:00"]
    body = await (await client.get("/stores/order-sessions/sessions?keyFrom=b")).json()
    assert [e["key"] for e in body["result"]] == ["bob"]
    # findSessions(keyFrom, keyTo, earliestEnd, latestStart): each key's findSessions, over the range
    bounds = "earliestEnd=2026-01-01T12:00:30Z&latestStart=2026-01-01T12:04:00Z"
    everyone = await (await client.get("/stores/order-sessions/sessions")).json()
    keys = sorted({e["key"] for e in everyone["result"]})
    each = [
        e
        for k in keys
        for e in (await (await client.get(f"/stores/order-sessions/sessions/{k}?{bounds}")).json())["result"]
    ]
    ranged = await client.get(f"/stores/order-sessions/sessions?keyFrom=a&keyTo=z&{bounds}")
    assert ranged.status == 200 and (await ranged.json())["result"] == each
    assert 0 < len(each) < len(everyone["result"])  # the bounds leave some sessions out
    body = await (await client.get("/stores/order-sessions/sessions/alice?reverse=true")).json()
    assert [e["window"]["start"] for e in body["result"]] == ["2026-01-01T12:05:00+00:00", "2026-01-01T12:00:00+00:00"]
    body = await (await client.get("/stores/order-sessions/sessions?reverse=true&limit=2")).json()
    assert [e["key"] for e in body["result"]] == ["bob", "alice"] and body["next"]
    more = await (await client.get(f"/stores/order-sessions/sessions?limit=2&cursor={body['next']}")).json()
    assert [e["window"]["start"] for e in more["result"]] == ["2026-01-01T12:00:00+00:00"] and more["next"] is None
    assert (await client.get("/stores/order-sessions/sessions/alice?reverse=maybe")).status == 400
    resp = await client.get("/stores/orders-per-minute/all", headers={"Accept": "application/x-ndjson"})
    lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert len(lines) == 5 and set(lines[0]) == {"key", "window", "value"}
    body = await (await client.get("/stores/orders-per-minute/windows/alice?limit=2")).json()
    assert len(body["result"]) == 2 and body["next"]
    more = await (await client.get(f"/stores/orders-per-minute/windows/alice?limit=2&cursor={body['next']}")).json()
    assert [e["window"]["start"] for e in more["result"]] == ["2026-01-01T12:03:00+00:00"] and more["next"] is None


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/stores/plain/windows/k", "invalid-parameter"),
        ("/stores/orders-per-minute/sessions/alice", "invalid-parameter"),
        ("/stores/orders-per-minute/windows/alice?from=noon", "malformed-range"),
        ("/stores/order-sessions/sessions/alice?latestStart=1700000000", "malformed-range"),
        ("/stores/orders-per-minute/get/alice", "invalid-parameter"),
        ("/stores/orders-per-minute/range?from=a", "invalid-parameter"),
        # a key in the path is a key: malformed-key, as for get; a key range's bound is malformed-range
        ("/stores/shop-windows/windows/eu", "malformed-key"),  # one column of two
        ("/stores/shop-windows/windows/eu/x", "malformed-key"),  # the shop is no number
        ("/stores/shop-windows/windows?keyFrom=eu/1/2", "malformed-range"),  # three columns of two
        ("/stores/shop-windows/windows?keyTo=eu/x", "malformed-range"),
        ("/stores/shop-windows/windows?keyFrom=%FF", "malformed-range"),
    ],
)
async def test_rest_errors_say_what_was_wrong(client, path: str, code: str) -> None:  # type: ignore[no-untyped-def]
    resp = await client.get(path)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == code


async def test_a_key_range_bound_may_give_the_leading_columns_only_as_ranges_do(client) -> None:  # type: ignore[no-untyped-def]
    """``keyFrom=eu`` of a (region, shop) store was a 400, where ``range?from=eu`` of a composite key is the
    first key of region eu, and ``to=eu`` the last (docs/api.md)."""

    async def keys(query: str) -> list[list[object]]:
        resp = await client.get(f"/stores/shop-windows/windows?{query}")
        assert resp.status == 200, await resp.text()
        return [e["key"] for e in (await resp.json())["result"]]

    assert await keys("keyFrom=eu&keyTo=eu") == [["eu", 1], ["eu", 20]]
    assert await keys("keyFrom=eu/2") == [["eu", 20], ["us", 1]]
    assert await keys("keyTo=eu/1") == [["eu", 1]]
    assert await keys("keyFrom=f") == [["us", 1]]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [("keyFrom=eu/x", "keyFrom"), ("keyTo=eu/x", "keyTo"), ("keyTo=eu/1/2", "keyTo"), ("from=noon", "from")],
)
async def test_a_bad_bound_names_its_parameter(client, query: str, parameter: str) -> None:  # type: ignore[no-untyped-def]
    error = (await (await client.get(f"/stores/shop-windows/windows?{query}")).json())["error"]
    assert error["code"] == "malformed-range" and error["parameter"] == parameter, error
