"""``Store.iterate`` and ``Store.iterate_async`` over the in-process facade on the fake bus: the owners'
packed msgpack pages merged in the caller's process, one chunk made ahead, nothing left running after an
early stop."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.client import Store
from runtime.errors import InvalidParameter, NotConnected, PartitionUnavailable
from runtime.facade.inprocess import InProcessFacade
from runtime.ownership import OwnershipTable, PartitionOwners
from tests.unit.fakes import FakeBus, kv_spec, load_windowed, windowed_spec


class _Client:
    """What ``Store`` needs of ``Client`` for ``iterate``: the process's in-process facade."""

    def __init__(self, keys: InProcessFacade) -> None:
        self.keys = keys


def _unused_blocking(uuid: str) -> Any:
    raise AssertionError("iterate makes no blocking key lookups")


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
def facade(bus: FakeBus) -> Iterator[InProcessFacade]:
    facade = InProcessFacade(bus, _unused_blocking, timeout=2.0)
    yield facade
    facade.close()


def _store(facade: InProcessFacade, name: str) -> Store:
    return Store(_Client(facade), name)  # type: ignore[arg-type]


def _scans(bus: FakeBus) -> int:
    return sum(owner.calls.count("scan") for owner in bus.owners.values())


def test_iterate_walks_every_entry_in_order_from_the_owners_pages(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("many"))
    rows = {f"k{i:05d}": f"v{i}" for i in range(3000)}
    bus.load("many", rows)
    store = _store(facade, "many")
    assert list(store.iterate(page_size=700)) == sorted(rows.items())
    # Pages of at most 700 entries from each of the two owners: at least 1,500 / 700 pages each.
    assert _scans(bus) >= 2 * (1500 // 700)
    got = list(store.iterate(lo="k00100", hi="k00199", reverse=True))
    assert got == sorted(((k, v) for k, v in rows.items() if "k00100" <= k <= "k00199"), reverse=True)
    assert list(store.iterate(prefix="k0299")) == [(f"k0299{i}", f"v299{i}") for i in range(10)]
    assert list(store.iterate(lo="x")) == []


def test_iterate_keeps_typed_and_composite_keys(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("ints", key_type="long"))
    ints = {i: f"v{i}" for i in range(-500, 500, 7)}
    bus.load("ints", ints)
    assert list(_store(facade, "ints").iterate(page_size=10)) == sorted(ints.items())
    bus.create_store(kv_spec("pairs", rest=(("n", "long"),)))
    pairs = {(f"u{i % 5}", i): f"v{i}" for i in range(200)}
    bus.load("pairs", pairs)
    got = list(_store(facade, "pairs").iterate(reverse=True))
    assert got == sorted(pairs.items(), reverse=True) and all(type(k) is tuple for k, _ in got)
    bus.create_store(kv_spec("text"))
    text = {"é": "1", "z": "2", "a\x00b": "3", "日本": "4", "": "5"}
    bus.load("text", text)
    assert list(_store(facade, "text").iterate()) == sorted(text.items())


def test_iterate_of_a_window_store_gives_its_windows(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(windowed_spec("w"))
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    windows = [(f"u{i}", t0, t0 + dt.timedelta(minutes=5), i) for i in range(20)]
    load_windowed(bus, "w", windows)
    got = list(_store(facade, "w").iterate())
    assert [(w.key, w.value) for w in got] == [(f"u{i}", i) for i in sorted(range(20), key=lambda i: f"u{i}")]


def test_iterate_stopped_early_leaves_no_call_behind(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("many"))
    bus.load("many", {f"k{i:05d}": i for i in range(3000)})
    entries = _store(facade, "many").iterate(page_size=100)
    first = [next(entries) for _ in range(5)]
    entries.close()
    assert [k for k, _ in first] == [f"k{i:05d}" for i in range(5)]
    # Per source (at most one per partition): the page merged, the next one prefetched, and the pages of
    # the chunk made ahead; none of the store's 30 pages of 100 beyond those.
    asked = _scans(bus)
    assert asked <= 3 * 4
    facade._thread.run(asyncio.sleep(0.05))
    assert _scans(bus) == asked


async def test_iterate_async_walks_every_entry_and_stops_cleanly(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("many"))
    rows = {f"k{i:05d}": f"v{i}" for i in range(3000)}
    bus.load("many", rows)
    store = _store(facade, "many")
    assert [e async for e in store.iterate_async(page_size=700)] == sorted(rows.items())
    got = [e async for e in store.iterate_async(lo="k00100", hi="k00199", reverse=True)]
    assert got == sorted(((k, v) for k, v in rows.items() if "k00100" <= k <= "k00199"), reverse=True)
    entries = store.iterate_async(page_size=100)
    first = [await anext(entries) for _ in range(5)]
    await entries.aclose()
    assert [k for k, _ in first] == [f"k{i:05d}" for i in range(5)]
    asked = _scans(bus)
    await asyncio.sleep(0.05)
    assert _scans(bus) == asked


def test_iterate_fails_over_to_a_standby_mid_scan(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("r", standbys=1))
    rows = {f"k{i:05d}": f"v{i}" for i in range(2000)}
    bus.load("r", rows)
    first = next(iter(bus.owners.values()))
    first.down_after = 2  # answers two pages, then is down
    assert list(_store(facade, "r").iterate(page_size=100)) == sorted(rows.items())


def test_iterate_of_an_empty_store_or_one_with_an_empty_owner(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("none"))
    assert list(_store(facade, "none").iterate()) == []
    bus.create_store(kv_spec("one"))
    bus.load("one", {"only": "1"})  # one partition, so one owner has nothing at all
    assert list(_store(facade, "one").iterate(reverse=True)) == [("only", "1")]
    assert list(_store(facade, "one").iterate(page_size=1)) == [("only", "1")]


def test_iterate_of_a_store_with_an_unowned_partition_raises_before_any_entry(
    bus: FakeBus, facade: InProcessFacade
) -> None:
    bus.create_store(kv_spec("holes"))
    bus.load("holes", {f"k{i:03d}": i for i in range(100)})
    table = bus.state.view().tables["holes"]
    owners = list(table.partitions)
    owners[2] = PartitionOwners(None)
    bus.state.install(OwnershipTable(table.spec, tuple(owners)), [])
    with pytest.raises(PartitionUnavailable) as info:
        list(_store(facade, "holes").iterate())
    assert info.value.details["partitions"] == [2]


def test_a_page_size_beyond_the_largest_page_is_refused(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("many"))
    with pytest.raises(InvalidParameter):
        list(_store(facade, "many").iterate(page_size=10**9))


def test_iterate_after_the_client_was_closed_raises_and_an_open_one_closes_without_hanging(bus: FakeBus) -> None:
    bus.create_store(kv_spec("many"))
    bus.load("many", {f"k{i:05d}": i for i in range(3000)})
    facade = InProcessFacade(bus, _unused_blocking, timeout=2.0)
    entries = _store(facade, "many").iterate(page_size=100)
    assert next(entries) == ("k00000", 0)
    facade.close()
    entries.close()  # the loop is gone: nothing to end there, and no wait for it
    with pytest.raises(NotConnected):
        list(_store(facade, "many").iterate())


class _PagingClient(_Client):
    """``_Client`` with the facade verticle's ``call``, served by the same in-process facade's core."""

    def call(self, method: str, *args: Any) -> Any:
        async def on_the_loop() -> Any:
            core = await self.keys._core()  # noqa: SLF001
            return await getattr(core, method)(*args)

        return self.keys._thread.run(on_the_loop(), 5.0)  # noqa: SLF001


def test_windows_and_sessions_page_and_stream_in_python_as_over_rest(bus: FakeBus, facade: InProcessFacade) -> None:
    """Python answered window and session queries as whole lists only; REST paged and streamed them."""
    t0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    bus.create_store(windowed_spec("w"))
    windows = [
        (user, t0 + dt.timedelta(minutes=m), t0 + dt.timedelta(minutes=m + 1), m) for user in "abc" for m in range(5)
    ]
    load_windowed(bus, "w", windows)
    bus.create_store(windowed_spec("s", kind="session"))
    load_windowed(bus, "s", windows)
    store = Store(_PagingClient(facade), "w")  # type: ignore[arg-type]
    every = store.windows_range()
    assert len(every) == 15
    assert list(store.iterate_windows()) == every
    assert list(store.iterate_windows(key="b", reverse=True)) == store.windows("b", reverse=True)
    seen: list[Any] = []
    cursor = None
    while True:
        page = store.windows_page(4, cursor, key_from="a", key_to="b", time_from=t0 + dt.timedelta(minutes=1))
        seen += page.entries
        if (cursor := page.next) is None:
            break
    assert seen == store.windows_range("a", "b", t0 + dt.timedelta(minutes=1)) and len(seen) == 8
    sessions = Store(_PagingClient(facade), "s")  # type: ignore[arg-type]
    first = sessions.sessions_page(2, key="c")
    rest = sessions.sessions_page(10, first.next, key="c")
    assert first.entries + rest.entries == sessions.sessions("c") and rest.next is None
    assert list(sessions.iterate_sessions(key_from="b")) == sessions.sessions_range("b")

    async def in_async_code() -> tuple[list[Any], list[Any]]:
        streamed = [w async for w in store.iterate_windows_async(key="a")]
        found = [s async for s in sessions.iterate_sessions_async(key_from="c")]
        return streamed, found

    streamed, found = asyncio.run(in_async_code())
    assert streamed == store.windows("a") and found == sessions.sessions_range("c")


async def test_a_next_cancelled_then_closed_at_once_ends_the_generator_without_a_runtime_error() -> None:
    """A caller's Ctrl-C or timeout cancels its ``next`` on the loop only by and by, and the close that
    followed ran ``aclose`` while that ``next`` still ran: RuntimeError("aclose(): asynchronous generator is
    already running") in place of the caller's own interrupt (19 of 30 Ctrl-Cs in a black-box run)."""
    from runtime.facade.inprocess import _Ahead

    ended: list[str] = []

    async def slow() -> Any:
        try:
            for i in range(100):
                await asyncio.sleep(0.01)
                yield [i]
        finally:
            ended.append("finally")

    async def core() -> Any:
        return None

    for delay in (0.0, 0.005, 0.015, 0.03):
        ended.clear()
        ahead: _Ahead[list[int]] = _Ahead(core, lambda _: slow())
        assert await ahead.next() == [0]
        asking = asyncio.ensure_future(ahead.next())
        await asyncio.sleep(delay)
        asking.cancel()
        await ahead.close()  # at once, as the interrupted caller's cleanup does
        assert ended == ["finally"], delay
        await asyncio.wait([asking])
        assert asking.cancelled() or asking.result() == [1], delay  # cancelled, or done before it was


async def test_iterate_async_under_a_timeout_ends_in_the_timeout(bus: FakeBus, facade: InProcessFacade) -> None:
    bus.create_store(kv_spec("slow"))
    bus.load("slow", {f"k{i:05d}": "v" for i in range(2000)})
    for owner in bus.owners.values():
        owner.stall = 0.01
    store = _store(facade, "slow")
    for limit in (0.02, 0.05, 0.08, 0.12, 0.2):
        seen = 0
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(limit):
                async for _ in store.iterate_async(page_size=50):
                    seen += 1
        assert seen < 2000
    assert len([e async for e in store.iterate_async(page_size=500)]) == 2000  # and the client goes on
