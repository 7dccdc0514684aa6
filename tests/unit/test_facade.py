import asyncio
import contextlib
import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runtime.errors import (
    CopyBehind,
    DeadlineExceeded,
    InvalidParameter,
    KeyNotFound,
    MalformedCursor,
    MalformedKey,
    MalformedRange,
    OwnerUnavailable,
    PartitionUnavailable,
    StoreNotFound,
)
from runtime.facade import Facade
from runtime.facade.scatter import PAGES_AHEAD
from runtime.ownership import Endpoint, OwnershipTable, PartitionOwners
from runtime.queries import KeyQuery, PageRequest, RangeQuery, WindowQuery
from runtime.scan import Scan
from tests.unit.fakes import FakeBus, eventually, kv_spec, load_windowed, windowed_spec

CUSTOMERS = {"1": "john", "2": "adam", "3": "daniel", "4": "james", "5": "jack", "6": "mathew", "7": "will"}


@pytest.fixture
def bus() -> FakeBus:
    b = FakeBus()
    b.create_store(kv_spec("customers"))
    b.load("customers", CUSTOMERS)
    return b


@pytest.fixture
async def facade(bus: FakeBus) -> Facade:
    core = Facade(bus, timeout=1.0, refresh_interval=0.01)
    await core.start()
    yield core
    await core.stop()


async def test_get_routes_to_the_owner(facade: Facade, bus: FakeBus) -> None:
    assert await facade.get(KeyQuery("customers", "2")) == "adam"
    assert sum(o.calls.count("get_many") for o in bus.owners.values()) == 1


async def test_absent_keys_and_unknown_stores_are_404s(facade: Facade) -> None:
    with pytest.raises(KeyNotFound):
        await facade.get(KeyQuery("customers", "99"))
    with pytest.raises(StoreNotFound):
        await facade.get(KeyQuery("nope", "1"))


async def test_concurrent_gets_to_one_owner_share_calls(facade: Facade, bus: FakeBus) -> None:
    keys = [str(i) for i in range(1, 8)] * 20
    values = await asyncio.gather(*(facade.get(KeyQuery("customers", k)) for k in keys))
    assert values == [CUSTOMERS[k] for k in keys]
    calls = sum(o.calls.count("get_many") for o in bus.owners.values())
    assert calls <= 2 * len(bus.owners)  # 140 lookups, a call or two per owner


async def test_all_and_range_merge_across_owners_in_key_order(facade: Facade) -> None:
    assert await facade.entries(RangeQuery("customers")) == sorted(CUSTOMERS.items())
    assert await facade.entries(RangeQuery("customers", "1", "5")) == [(k, CUSTOMERS[k]) for k in "12345"]
    assert await facade.entries(RangeQuery("customers", None, "2")) == [("1", "john"), ("2", "adam")]
    assert await facade.entries(RangeQuery("customers", "6", None)) == [("6", "mathew"), ("7", "will")]
    assert await facade.entries(RangeQuery("customers", "5", "1")) == []


async def test_integer_keys_parse_from_text_and_range_numerically(bus: FakeBus) -> None:
    bus.create_store(kv_spec("ints", key_type="long"))
    bus.load("ints", {i: f"v{i}" for i in [1, 2, 10, 20, 100]})
    core = Facade(bus)
    assert await core.get(KeyQuery("ints", "10")) == "v10"
    assert [k for k, _ in await core.entries(RangeQuery("ints", "2", "20"))] == [2, 10, 20]
    with pytest.raises(MalformedKey):
        await core.get(KeyQuery("ints", "ten"))
    with pytest.raises(MalformedRange):
        await core.entries(RangeQuery("ints", "x", None))


async def test_count_sums_over_owners(facade: Facade) -> None:
    assert await facade.count("customers") == 7


async def test_a_partition_without_owner_is_503_never_a_partial_answer(facade: Facade, bus: FakeBus) -> None:
    table = bus.state.view().tables["customers"]
    owners = list(table.partitions)
    owners[1] = PartitionOwners(None)
    bus.state.install(OwnershipTable(table.spec, tuple(owners)), [])
    await facade.views.refresh()
    with pytest.raises(PartitionUnavailable) as info:
        await facade.entries(RangeQuery("customers"))
    assert info.value.details["partitions"] == [1]
    with pytest.raises(PartitionUnavailable):
        await facade.count("customers")
    key_in_1 = next(k for k in CUSTOMERS if table.partition_of(k) == 1)
    with pytest.raises(PartitionUnavailable):
        await facade.get(KeyQuery("customers", key_in_1))


async def test_one_keys_windows_and_a_leading_key_range_ask_only_that_keys_partition(bus: FakeBus) -> None:
    """A partition column value's windows (or a composite range over one leading value) live in one
    partition: only its owner is asked, and another partition without an owner is no reason for a 503."""
    day = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    users = [f"user-{i}" for i in range(16)]
    bus.create_store(windowed_spec("clicks"))
    load_windowed(bus, "clicks", [(u, day + dt.timedelta(minutes=m), day + dt.timedelta(minutes=m + 1), m)
                                  for u in users for m in range(2)])  # fmt: skip
    bus.create_store(kv_spec("bookings", rest=(("ts", "timestamp"),)))
    bus.load("bookings", {(u, day + dt.timedelta(days=d)): f"{u}@{d}" for u in users for d in range(2)})
    core = Facade(bus, timeout=1.0)
    await core.start()
    try:
        for store in ("clicks", "bookings"):
            table = bus.state.view().tables[store]
            owners = list(table.partitions)
            owners[0] = PartitionOwners(None)
            bus.state.install(OwnershipTable(table.spec, tuple(owners)), [])
        await core.views.refresh()
        for owner in bus.owners.values():
            owner.calls.clear()
        clicks = bus.state.view().tables["clicks"]
        alice = next(u for u in users if clicks.partition_of((u,)) != 0)
        windows = await core.entries(WindowQuery("clicks", alice))
        assert [(w.key, w.value) for w in windows] == [(alice, 0), (alice, 1)]
        asked = [u for u, o in bus.owners.items() if "scan" in o.calls]
        assert asked == [clicks.partitions[clicks.partition_of((alice,))].active]
        bookings = bus.state.view().tables["bookings"]
        bob = next(u for u in users if bookings.partition_of((u,)) != 0)
        booked = await core.entries(RangeQuery("bookings", (bob,), (bob,)))  # a partial upper bound: all of bob
        assert [v for _, v in booked] == [f"{bob}@0", f"{bob}@1"]
        lost = next(u for u in users if clicks.partition_of((u,)) == 0)
        with pytest.raises(PartitionUnavailable):  # its own partition has no owner: still a 503
            await core.entries(WindowQuery("clicks", lost))
        with pytest.raises(PartitionUnavailable):  # a range over many keys needs every partition
            await core.entries(WindowQuery("clicks", key_from=users[0], key_to=users[-1]))
    finally:
        await core.stop()


async def test_a_down_owner_is_503_and_triggers_a_refresh(facade: Facade, bus: FakeBus) -> None:
    for owner in bus.owners.values():
        owner.down = True
    fetches = bus.view_fetches
    with pytest.raises(OwnerUnavailable):
        await facade.get(KeyQuery("customers", "1"))
    await eventually(lambda: bus.view_fetches > fetches, what="a refresh of the view")


async def test_a_slow_owner_is_a_504(bus: FakeBus) -> None:
    core = Facade(bus, timeout=0.05)
    for owner in bus.owners.values():
        owner.stall = 0.5
    with pytest.raises(DeadlineExceeded):
        await core.get(KeyQuery("customers", "1"))
    with pytest.raises(DeadlineExceeded):
        await core.entries(RangeQuery("customers"))


async def test_a_store_created_after_start_is_found_by_refreshing_once(facade: Facade, bus: FakeBus) -> None:
    bus.create_store(kv_spec("late"))
    bus.load("late", {"k": "v"})
    assert await facade.get(KeyQuery("late", "k")) == "v"


async def test_the_watcher_picks_up_epoch_changes(facade: Facade, bus: FakeBus) -> None:
    bus.create_store(kv_spec("watched"))
    fetches = bus.view_fetches
    # Nothing asks for the new store: only the background watcher can bring it into the view.
    await eventually(lambda: facade.view.table("watched") is not None, what="the watcher's refresh")
    assert bus.view_fetches > fetches


async def test_metadata_shapes(facade: Facade) -> None:
    instances = await facade.metadata()
    assert len(instances) == 2
    first = instances[0]
    assert set(first) == {
        "host",
        "port",
        "state-store-names",
        "actor",
        "node",
        "partitions",
        "standby-partitions",
        "positions",
    }
    assert first["standby-partitions"] == []
    # No feed reported yet (bus.ingest is empty): the lag is unknown, not 0.
    assert first["positions"] == [
        {
            "partition": p,
            "source": "q",
            "batch_id": 0,
            "state": "serving",
            "role": "active",
            "replica_state": "active",
            "lag_batches": None,
            "lag_seconds": None,
        }
        for p in first["partitions"]
    ]
    assert first["state-store-names"] == ["customers"]
    by_node = {i["node"]: (i["host"], i["port"]) for i in instances}
    assert by_node["node-a"] == ("host-a", 7400)  # the node's HTTP verticle
    assert by_node["node-b"] == ("10.0.0.1", None)  # no HTTP verticle registered on that node
    assert await facade.metadata_for_store("customers") == instances
    owner = await facade.metadata_for_key(KeyQuery("customers", "nobody-has-this-key"))
    assert owner["partition"] in owner["partitions"] and owner["standbys"] == []
    with pytest.raises(StoreNotFound):
        await facade.metadata_for_store("nope")


async def test_catalog(facade: Facade, bus: FakeBus) -> None:
    bus.ingest["customers"] = {"state": "running", "batch_id": 0, "at": 1.5}
    [entry] = await facade.catalog()
    assert entry["name"] == "customers" and entry["key"] == {
        "column": "key",
        "type": "string",
        "columns": [{"column": "key", "type": "string"}],
    }
    assert entry["engine"] == "rocksdb" and entry["ingest"] == {"state": "running", "batch_id": 0, "at": 1.5}
    assert [(e["partition"], e["state"], e["batch_id"]) for e in entry["positions"]] == [
        (p, "serving", 0) for p in range(4)
    ]
    # Every copy at the newest batch the sink reported: no lag; one copy (no standbys) per partition.
    assert [(e["replica_state"], e["lag_batches"], e["lag_seconds"]) for e in entry["positions"]] == [
        ("active", 0, 0.0)
    ] * 4
    assert [len(e["replicas"]) for e in entry["positions"]] == [1] * 4


async def test_lag_per_replica_in_the_catalog_and_metadata(bus: FakeBus) -> None:
    """A standby that missed the newest batch shows its lag in batches and in seconds, and its state;
    the active copy, at the newest batch, shows 0; /metadata's three forms show the same."""
    bus.create_store(kv_spec("r", standbys=1))
    bus.load("r", {"a": 1, "b": 2}, batch_id=0)
    table = bus.state.view().tables["r"]
    # Batch 1 reaches the actives only (a delivery caught halfway, seen from the other side): the
    # standbys stay at batch 0.
    bus.load("r", {"a": 3}, batch_id=1, role="active")
    bus.ingest["r"] = {"state": "running", "batch_id": 1, "source": "q", "acked": [[0, 9.0], [1, 4.0]]}
    core = Facade(bus)
    entry = next(s for s in await core.catalog() if s["name"] == "r")
    assert "acked" not in entry["ingest"]  # only for lag; not part of the catalog
    for e in entry["positions"]:
        active, standby = e["replicas"]
        assert (active["role"], active["replica_state"], active["batch_id"]) == ("active", "active", 1)
        assert (active["lag_batches"], active["lag_seconds"]) == (0, 0.0)
        assert (standby["role"], standby["replica_state"], standby["batch_id"]) == ("standby", "in-sync", 0)
        # It lacks batch 1, acknowledged 4 s ago.
        assert (standby["lag_batches"], standby["lag_seconds"]) == (1, 4.0)
        assert standby["actor"] == table.partitions[e["partition"]].standbys[0]
        assert (e["lag_batches"], e["replica_state"], e["actor"]) == (0, "active", active["actor"])
    instances = await core.metadata_for_store("r")
    lags = {(i["actor"], p["partition"]): (p["role"], p["lag_batches"]) for i in instances for p in i["positions"]}
    for e in entry["positions"]:
        active, standby = e["replicas"]
        assert lags[(active["actor"], e["partition"])] == ("active", 0)
        assert lags[(standby["actor"], e["partition"])] == ("standby", 1)
    assert [i for i in await core.metadata() if i["state-store-names"] == ["r"]] == instances
    owner = await core.metadata_for_key(KeyQuery("r", "a"))
    assert [(c["role"], c["lag_batches"], c["lag_seconds"]) for c in owner["replicas"]] == [
        ("active", 0, 0.0),
        ("standby", 1, 4.0),
    ]
    # The standby receives batch 1: in sync, no lag.
    bus.load("r", {"a": 3}, batch_id=1, role="standby")
    owner = await core.metadata_for_key(KeyQuery("r", "a"))
    assert [(c["replica_state"], c["lag_batches"], c["lag_seconds"]) for c in owner["replicas"]] == [
        ("active", 0, 0.0),
        ("in-sync", 0, 0.0),
    ]


async def test_the_catalog_says_which_partitions_cannot_answer_and_why(facade: Facade, bus: FakeBus) -> None:
    table = facade.view.table("customers")
    assert table is not None
    sick = bus.owners[table.partitions[1].active or ""]
    sick.core.partitions[1].state, sick.core.partitions[1].reason = "incomplete", "it missed batches"
    down = bus.owners[table.partitions[0].active or ""]
    down.down = True
    states = {e["partition"]: (e["state"], e.get("reason")) for e in (await facade.catalog())[0]["positions"]}
    assert states[1] == ("incomplete", "it missed batches")
    assert states[0][0] == "unavailable" and states[2][0] == "unavailable"  # partition 0's owner holds 0 and 2


async def test_a_frozen_copy_holds_the_catalog_and_metadata_for_seconds_not_the_whole_deadline(
    bus: FakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One SIGSTOPped query actor held GET /stores and /metadata for the request's whole 10 s (a black-box
    run): each copy has ``POSITIONS_DEADLINE`` to say its positions, then shows unavailable."""
    import time

    from runtime.facade import metadata

    monkeypatch.setattr(metadata, "POSITIONS_DEADLINE", 0.2)
    facade = Facade(bus, timeout=10.0)
    await facade.catalog()  # the view loaded
    table = facade.views.current.table("customers")
    assert table is not None
    bus.owners[table.partitions[0].active or ""].stall = 30.0  # frozen: never answers in time
    started = time.monotonic()
    states = {e["partition"]: e["state"] for e in (await facade.catalog())[0]["positions"]}
    instances = await facade.metadata()
    assert time.monotonic() - started < 2.0
    assert states[0] == "unavailable" and "serving" in states.values()
    assert any(p["state"] == "unavailable" for i in instances for p in i.get("positions", []))


async def test_reverse_and_prefix(bus: FakeBus) -> None:
    bus.create_store(kv_spec("words"))
    bus.load("words", {w: w.upper() for w in ["apple", "apricot", "banana", "app", "b"]})
    core = Facade(bus, page_size=2)  # tiny pages: every scan spans several page calls per owner
    assert [k for k, _ in await core.entries(RangeQuery("words", reverse=True))] == [
        "banana",
        "b",
        "apricot",
        "apple",
        "app",
    ]
    assert [k for k, _ in await core.entries(RangeQuery("words", prefix="ap"))] == ["app", "apple", "apricot"]
    assert [k for k, _ in await core.entries(RangeQuery("words", prefix="ap", reverse=True))] == [
        "apricot",
        "apple",
        "app",
    ]
    assert await core.entries(RangeQuery("words", "b", "a")) == []


async def test_prefix_needs_string_keys_and_no_bounds(bus: FakeBus) -> None:
    bus.create_store(kv_spec("ints", key_type="long"))
    core = Facade(bus)
    with pytest.raises(InvalidParameter, match="need a string key"):
        await core.entries(RangeQuery("ints", prefix="1"))
    with pytest.raises(InvalidParameter, match="from/to"):
        await core.entries(RangeQuery("customers", prefix="1", lo="1"))


async def test_pages_follow_cursors_to_the_end(facade: Facade) -> None:
    query = RangeQuery("customers")
    seen, cursor = [], None
    while True:
        entries, cursor = await facade.page(query, PageRequest(3, cursor))
        seen += entries
        if cursor is None:
            break
    assert seen == sorted(CUSTOMERS.items())
    with pytest.raises(InvalidParameter):
        await facade.page(query, PageRequest(0))
    entries, _ = await facade.page(query, PageRequest())  # no limit: one page of the default size
    assert len(entries) == min(facade.scatter.page_size, len(CUSTOMERS))
    with pytest.raises(InvalidParameter):
        await facade.page(query, PageRequest(facade.scatter.max_page + 1))


async def test_a_reverse_cursor_goes_on_alone_or_with_reverse_and_never_with_reverse_false(facade: Facade) -> None:
    """Python's ``store.page(limit, cursor)`` leaves ``reverse`` unsaid (None): the cursor's own direction.
    ``reverse=False`` said beside a reverse scan's cursor is the other direction: refused, not continued."""
    from runtime.errors import MalformedCursor

    first = await facade.page(RangeQuery("customers", reverse=True), PageRequest(2))
    newest = sorted(CUSTOMERS.items(), reverse=True)
    assert first.entries == newest[:2]
    for same in (RangeQuery("customers"), RangeQuery("customers", reverse=True)):
        assert (await facade.page(same, PageRequest(2, first.next))).entries == newest[2:4]
    with pytest.raises(MalformedCursor, match="continues another scan"):
        await facade.page(RangeQuery("customers", reverse=False), PageRequest(2, first.next))


async def test_a_reverse_cursor_goes_on_with_its_bounds_repeated_and_reverse_left_out(facade: Facade) -> None:
    """``store.page(3, next, lo=..., hi=...)`` after a reverse first page: ``reverse`` left out (None) was
    read as forward, another scan than the cursor's, and refused; docs/api.md says leave it out or repeat it."""
    from runtime.errors import MalformedCursor

    keys = sorted(CUSTOMERS)
    lo, hi = keys[1], keys[-2]
    inside = sorted(((k, v) for k, v in CUSTOMERS.items() if lo <= k <= hi), reverse=True)
    first = await facade.page(RangeQuery("customers", lo=lo, hi=hi, reverse=True), PageRequest(2))
    assert first.entries == inside[:2]
    for same in (RangeQuery("customers", lo=lo, hi=hi), RangeQuery("customers", lo=lo, hi=hi, reverse=True)):
        assert (await facade.page(same, PageRequest(2, first.next))).entries == inside[2:4]
    for other in (RangeQuery("customers", lo=lo), RangeQuery("customers", lo=lo, hi=hi, reverse=False)):
        with pytest.raises(MalformedCursor, match="continues another scan"):
            await facade.page(other, PageRequest(2, first.next))
    forward = await facade.page(RangeQuery("customers", lo=lo, hi=hi), PageRequest(2))  # and forward stays so
    assert (await facade.page(RangeQuery("customers", lo=lo, hi=hi), PageRequest(2, forward.next))).entries == (
        sorted(inside)[2:4]
    )


async def test_paging_while_the_store_changes_never_repeats_or_skips_a_stable_key(bus: FakeBus) -> None:
    bus.create_store(kv_spec("busy"))
    stable = {f"k{i:05d}": "v" for i in range(0, 2_000, 2)}
    bus.load("busy", stable)
    core = Facade(bus, page_size=64)
    query = RangeQuery("busy")
    seen: list[str] = []
    cursor = None
    batch = 1
    while True:
        entries, cursor = await core.page(query, PageRequest(97, cursor))
        seen += [k for k, _ in entries]
        # Between pages: new keys appear everywhere (odd numbers), some come and go.
        bus.load("busy", {f"k{i:05d}": "new" for i in range(batch, 2_000, 37)}, batch_id=batch)
        batch += 1
        if cursor is None:
            break
    assert len(seen) == len(set(seen)), "a key was returned twice"
    assert set(stable) <= set(seen), "a key present throughout was skipped"
    assert seen == sorted(seen)


async def test_stream_reads_lazily_page_by_page(bus: FakeBus) -> None:
    bus.create_store(kv_spec("big"))
    bus.load("big", {f"k{i:05d}": i for i in range(5_000)})
    core = Facade(bus, page_size=100)
    chunks = core.stream(RangeQuery("big"))
    first = (await anext(chunks))[:10]
    await chunks.aclose()
    assert [k for k, _ in first] == [f"k{i:05d}" for i in range(10)]
    scans = sum(o.calls.count("scan") for o in bus.owners.values() if o.core.spec.name == "big")
    assert scans <= 4  # a page and a prefetched page per owner, not the 50 pages of the store


async def test_composite_keys_get_and_range_over_a_leading_part(bus: FakeBus) -> None:
    bus.create_store(kv_spec("bookings", rest=(("ts", "timestamp"),)))
    day = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = {(c, day + dt.timedelta(days=d)): f"{c}@{d}" for c in ["41", "42", "420"] for d in range(5)}
    bus.load("bookings", rows)
    core = Facade(bus)
    assert await core.get(KeyQuery("bookings", ("42", "2026-01-03T00:00:00Z"))) == "42@2"
    everything_of_42 = await core.entries(RangeQuery("bookings", ("42",), ("42",)))
    assert [v for _, v in everything_of_42] == [f"42@{d}" for d in range(5)]
    assert everything_of_42[0][0] == ("42", day)
    window = await core.entries(RangeQuery("bookings", ("42", "2026-01-02T00:00:00Z"), ("42", "2026-01-04T00:00:00Z")))
    assert [v for _, v in window] == ["42@1", "42@2", "42@3"]
    owner = await core.metadata_for_key(KeyQuery("bookings", ("42",)))
    assert owner["partition"] == (await core.table("bookings")).partition_of(("42", 0))
    with pytest.raises(KeyNotFound):
        await core.get(KeyQuery("bookings", ("42", "2030-01-01T00:00:00Z")))
    with pytest.raises(MalformedKey):
        await core.get(KeyQuery("bookings", ("42",)))
    assert [k for k, _ in await core.entries(RangeQuery("bookings", prefix="42"))][-1] == (
        "420",
        day + dt.timedelta(days=4),
    )


async def test_a_key_sharing_a_batch_with_an_unavailable_partition_still_gets_its_answer(
    facade: Facade, bus: FakeBus
) -> None:
    table = facade.view.table("customers")
    assert table is not None
    by_partition: dict[int, str] = {}
    for key in CUSTOMERS:
        by_partition.setdefault(table.partition_of(key), key)
    owner_uuid, (sick, healthy) = next(
        (u, ps) for u, ps in table.by_owner().items() if all(p in by_partition for p in ps)
    )
    part = bus.owners[owner_uuid].core.partitions[sick]
    part.state, part.reason = "incomplete", "a test said so"
    sick_key, healthy_key = by_partition[sick], by_partition[healthy]
    answers = await asyncio.gather(
        facade.get(KeyQuery("customers", sick_key)),
        facade.get(KeyQuery("customers", healthy_key)),
        return_exceptions=True,
    )
    assert isinstance(answers[0], PartitionUnavailable) and answers[0].details["partitions"] == [sick]
    assert answers[1] == CUSTOMERS[healthy_key]
    assert bus.owners[owner_uuid].calls.count("get_many") == 2  # the shared batch, then the healthy key alone


@pytest.fixture
async def replicated() -> tuple[FakeBus, Facade]:
    b = FakeBus()
    b.create_store(kv_spec("r", standbys=1))
    b.load("r", {f"k{i:03d}": f"v{i}" for i in range(300)})
    core = Facade(b, timeout=2.0, page_size=16)
    await core.start()
    yield b, core
    await core.stop()


def _active_of(bus: FakeBus, facade: Facade, key: str) -> str:
    table = facade.view.table("r")
    assert table is not None
    owner = table.partitions[table.partition_of(key)].active
    assert owner is not None and table.partitions[table.partition_of(key)].standbys
    return owner


async def test_a_get_fails_over_to_the_standby_when_the_active_is_down(replicated: tuple[FakeBus, Facade]) -> None:
    bus, facade = replicated
    active = _active_of(bus, facade, "k007")
    bus.owners[active].down = True
    assert await facade.get(KeyQuery("r", "k007")) == "v7"
    standby = next(u for u in bus.owners if u != active)
    assert "get_many" in bus.owners[standby].calls


async def test_a_dead_active_is_reported_to_the_registry_once_and_its_promotion_reaches_the_facade_at_once(
    replicated: tuple[FakeBus, Facade],
) -> None:
    bus, facade = replicated
    active = _active_of(bus, facade, "k007")
    bus.owners[active].down = True
    for _ in range(3):  # a burst of failed-over lookups tells the registry once
        assert await facade.get(KeyQuery("r", "k007")) == "v7"
    assert bus.suspected == [active]
    # The registry promotes the standby; the facade's long poll sees the new epoch without a timer.
    table = bus.state.view().tables["r"]
    bus.state.replace_table(table.promote({active}))
    await eventually(lambda: facade.view.epoch == bus.state.epoch, timeout=0.5, what="the pushed view")
    standby = _active_of(bus, facade, "k007")
    assert standby != active
    calls = len(bus.owners[active].calls)
    assert await facade.get(KeyQuery("r", "k007")) == "v7"
    assert len(bus.owners[active].calls) == calls  # the promoted copy is asked first: no failover


async def test_a_cursor_of_a_store_dropped_and_declared_again_is_refused_not_continued(
    replicated: tuple[FakeBus, Facade],
) -> None:
    """Same name, same key types: the old cursor verified and continued after its last key on the new
    store, whose keys before it never appeared (a read-path review). Its issuer is not among the new
    store's actors: a 400 saying to begin again."""
    bus, facade = replicated
    first = await facade.page(RangeQuery("r"), PageRequest(5))
    assert [k for k, _ in first.entries] == [f"k{i:03d}" for i in range(5)]
    bus.state.drop("r")
    bus.create_store(kv_spec("r", standbys=1))
    bus.load("r", {f"k{i:03d}": "new" for i in range(10)})
    await eventually(lambda: facade.view.epoch == bus.state.epoch, timeout=0.5, what="the new store's view")
    fetches = bus.view_fetches
    with pytest.raises(MalformedCursor, match="dropped and declared again"):
        await facade.page(RangeQuery("r"), PageRequest(100, first.next))
    assert bus.view_fetches == fetches + 1  # looked at the registry's view again before refusing
    again = await facade.page(RangeQuery("r"), PageRequest(100))
    assert [v for _, v in again.entries] == ["new"] * 10


async def test_a_cursor_goes_on_after_the_copy_that_issued_it_is_promoted_away(
    replicated: tuple[FakeBus, Facade],
) -> None:
    """The same store with another actor answering: the issuer (partition 0's active) is a standby now;
    its cursors are the store's still (a move's ``moved_from``: ``test_cursor``)."""
    from runtime.cursor import issuer_of

    bus, facade = replicated
    table = bus.state.view().tables["r"]
    issuer = issuer_of(table)
    seen, page = [], await facade.page(RangeQuery("r"), PageRequest(40))
    seen += page.entries
    bus.state.replace_table(table.promote({issuer}))  # type: ignore[arg-type]
    await eventually(lambda: facade.view.epoch == bus.state.epoch, timeout=0.5, what="the promotion")
    assert issuer_of(bus.state.view().tables["r"]) != issuer
    while page.next is not None:
        page = await facade.page(RangeQuery("r"), PageRequest(40, page.next))
        seen += page.entries
    assert [k for k, _ in seen] == [f"k{i:03d}" for i in range(300)]


async def test_a_slow_active_is_passed_over_within_the_deadline(
    replicated: tuple[FakeBus, Facade], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import routing

    monkeypatch.setattr(routing, "FAILOVER_AFTER", 0.05)
    bus, facade = replicated
    bus.owners[_active_of(bus, facade, "k010")].stall = 5.0  # far past the 2 s deadline
    assert await facade.get(KeyQuery("r", "k010")) == "v10"


async def test_an_owner_that_gave_no_answer_is_asked_after_its_standby_until_it_answers_again(
    replicated: tuple[FakeBus, Facade], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import routing

    monkeypatch.setattr(routing, "FAILOVER_AFTER", 0.05)
    bus, facade = replicated
    active = _active_of(bus, facade, "k010")
    bus.owners[active].stall = 5.0  # on a node that went away: no answer, no error
    assert await facade.get(KeyQuery("r", "k010")) == "v10"  # failed over after FAILOVER_AFTER
    assert facade.router.silent_for(active) is not None
    asked = bus.owners[active].calls.count("get_many")
    for _ in range(3):  # the standby first: no wait on the silent active
        assert await facade.get(KeyQuery("r", "k010")) == "v10"
    assert bus.owners[active].calls.count("get_many") == asked


@pytest.fixture
def quick_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner is silent after a call out 0.1 s (``SILENT_AFTER``), and a silent one gets 0.1 s
    (``SILENT_BUDGET``): the silent-owner paths in tenths of a second."""
    from runtime.facade import silence

    monkeypatch.setattr(silence, "SILENT_AFTER", 0.1)
    monkeypatch.setattr(silence, "SILENT_BUDGET", 0.1)


@contextlib.asynccontextmanager
async def _one_copy(bus: FakeBus, timeout: float) -> AsyncIterator[tuple[Facade, str]]:
    """A store ``solo`` without standbys (keys k0..k19), a started facade over it with ``timeout``, and the
    owner of k1's partition, its only copy."""
    bus.create_store(kv_spec("solo", standbys=0))
    bus.load("solo", {f"k{i}": f"v{i}" for i in range(20)})
    core = Facade(bus, timeout=timeout)
    await core.start()
    try:
        table = core.view.table("solo")
        assert table is not None
        owner = table.partitions[table.partition_of("k1")].active
        assert owner is not None and not table.partitions[table.partition_of("k1")].standbys
        yield core, owner
    finally:
        await core.stop()


@contextlib.asynccontextmanager
async def _paired(bus: FakeBus, timeout: float) -> AsyncIterator[tuple[Facade, str]]:
    """A store ``r`` with a standby of each partition (keys k000..k049), a started facade over it with
    ``timeout`` and pages of 16, and the active of partition 0."""
    bus.create_store(kv_spec("r", standbys=1))
    bus.load("r", {f"k{i:03d}": f"v{i}" for i in range(50)})
    core = Facade(bus, timeout=timeout, page_size=16)
    await core.start()
    try:
        table = core.view.table("r")
        assert table is not None
        active = table.partitions[0].active
        assert active is not None
        yield core, active
    finally:
        await core.stop()


async def test_a_partition_whose_only_copy_gives_no_answer_is_a_503_within_the_silent_budget_not_a_504(
    bus: FakeBus, quick_silence: None
) -> None:
    async with _one_copy(bus, timeout=2.0) as (core, owner):
        # Its call hangs, and its ping says nothing either way (an actor of an older riqr, without one):
        # the call out longer than SILENT_AFTER alone makes it silent.
        async def no_ping() -> bool:
            raise RuntimeError("no such method")

        bus.owners[owner].ping = no_ping  # type: ignore[method-assign]
        bus.owners[owner].stall = 0.8
        first = asyncio.create_task(core.get(KeyQuery("solo", "k1")))
        await asyncio.sleep(0.3)  # its call has been out longer than SILENT_AFTER
        with pytest.raises(OwnerUnavailable, match="has given no answer in time"):
            await core.get(KeyQuery("solo", "k1"))  # a 503 after SILENT_BUDGET, not a 504 at the deadline
        assert core.router.silent_for(owner) is not None
        assert await first == "v1"  # the request that was waiting already still gets its answer
        assert core.router.silent_for(owner) is None  # which ends the silence: it answers again
        bus.owners[owner].stall = 0.0
        assert await core.get(KeyQuery("solo", "k1")) == "v1"


async def test_an_owner_busy_with_a_long_call_that_answers_its_ping_is_not_silent_for_new_lookups(
    bus: FakeBus, quick_silence: None
) -> None:
    """A call out past SILENT_AFTER made its owner silent for new lookups even after the owner answered the
    ping sent for it: as the last copy they answered 503 after SILENT_BUDGET while it was only busy. An
    answered ping now counts as a sign of life, and clears a miss remembered from before."""
    async with _one_copy(bus, timeout=3.0) as (core, owner):
        bus.owners[owner].stall = 0.8  # busy: its calls are long, its pings answered at once
        pings = bus.owners[owner].calls.count
        first = asyncio.create_task(core.get(KeyQuery("solo", "k1")))
        await eventually(lambda: pings("ping") >= 1, what="the owner pinged")
        await asyncio.sleep(0.02)
        assert core.router.silent_for(owner) is None  # the ping's answer: busy, not gone
        core.router.silence.missed(owner)  # as another lookup it did not answer in time would leave it
        assert core.router.silent_for(owner) is not None
        await eventually(lambda: pings("ping") >= 2, what="the owner pinged again while the call is out")
        await asyncio.sleep(0.02)
        assert core.router.silent_for(owner) is None  # answered: the miss is forgotten
        later = asyncio.create_task(core.get(KeyQuery("solo", "k1")))  # waits for it, no 503
        assert (await first, await later) == ("v1", "v1")


async def test_lookups_already_waiting_on_a_hung_only_copy_answer_503_once_its_ping_goes_unanswered(
    bus: FakeBus, quick_silence: None
) -> None:
    async with _one_copy(bus, timeout=5.0) as (core, owner):
        bus.owners[owner].stall, bus.owners[owner].hung = 30.0, True  # no answer, to pings neither
        started = time.monotonic()
        # Sent before anything found the owner silent: the first waits on the call out, the others queue
        # behind it. All answer 503 once the ping goes unanswered, not 504 at the 5 s deadline.
        table = core.view.table("solo")
        assert table is not None
        keys = [k for k in (f"k{i}" for i in range(20)) if table.partitions[table.partition_of(k)].active == owner]
        waiting = [asyncio.create_task(core.get(KeyQuery("solo", k))) for k in keys]
        assert len(waiting) >= 2
        for task in waiting:
            with pytest.raises(OwnerUnavailable, match="has given no answer in time"):
                await task
        assert time.monotonic() - started < 1.5
        assert bus.owners[owner].calls.count("ping") == 1 and owner in bus.suspected
        assert core.router.silent_for(owner) is not None


async def test_scans_and_counts_start_on_the_standby_of_a_silent_active(
    replicated: tuple[FakeBus, Facade], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import routing

    monkeypatch.setattr(routing, "FAILOVER_AFTER", 0.05)
    bus, facade = replicated
    active = _active_of(bus, facade, "k010")
    bus.owners[active].stall = 5.0  # no answer, no error
    assert await facade.get(KeyQuery("r", "k010")) == "v10"  # the lookup that finds it silent
    keys = [k for k, _ in await facade.entries(RangeQuery("r"))]
    assert keys == [f"k{i:03d}" for i in range(300)]
    assert await facade.count("r") == 300
    assert bus.owners[active].calls.count("scan") == 0 and "count" not in bus.owners[active].calls


async def test_a_scan_or_count_whose_only_copy_is_silent_is_a_503_within_the_silent_budget(
    bus: FakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import silence

    monkeypatch.setattr(silence, "SILENT_BUDGET", 0.1)
    async with _one_copy(bus, timeout=5.0) as (core, owner):
        bus.owners[owner].stall = 30.0
        core.router.silence.missed(owner)  # as a lookup it did not answer leaves it
        with pytest.raises(OwnerUnavailable, match="has given no answer in time"):
            await core.count("solo")  # not a 504 after the 5 s deadline
        with pytest.raises(OwnerUnavailable, match="has given no answer in time"):
            await core.entries(RangeQuery("solo"))


async def test_a_scan_that_outlasts_its_deadline_does_not_make_its_owner_silent_but_a_silent_owners_own_504_stays(
    bus: FakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import silence

    async with _one_copy(bus, timeout=0.2) as (core, owner):
        bus.owners[owner].stall = 1.0  # a large scan, say: slow, not gone
        with pytest.raises(DeadlineExceeded):
            await core.count("solo")
        assert core.router.silent_for(owner) is None  # only small calls (lookups) make an owner silent
        monkeypatch.setattr(silence, "SILENT_BUDGET", 5.0)  # longer than the request's own deadline
        core.router.silence.missed(owner)
        with pytest.raises(DeadlineExceeded):  # the request's deadline ran out first: its 504, not a 503
            await core.get(KeyQuery("solo", "k1"))


async def test_a_long_scan_on_a_hung_only_copy_is_a_503_once_a_ping_goes_unanswered_and_a_busy_one_answers(
    bus: FakeBus, quick_silence: None
) -> None:
    async with _one_copy(bus, timeout=5.0) as (core, owner):
        # Busy, not gone: its calls are long but it answers the ping, so the scan and count wait for it.
        bus.owners[owner].stall = 0.4
        assert len(await core.entries(RangeQuery("solo"))) == 20
        assert await core.count("solo") == 20
        assert "ping" in bus.owners[owner].calls and core.router.silent_for(owner) is None
        # Hung (a node gone, a stopped process): no ping answered either. A 503 after about SILENT_AFTER
        # and SILENT_BUDGET, not a 504 at the 5 s deadline, and the owner is silent for lookups too.
        bus.owners[owner].stall, bus.owners[owner].hung = 30.0, True
        started = time.monotonic()
        with pytest.raises(OwnerUnavailable, match="has given no answer in time"):
            await core.entries(RangeQuery("solo"))
        assert time.monotonic() - started < 2.0
        assert core.router.silent_for(owner) is not None and owner in bus.suspected
        with pytest.raises(OwnerUnavailable, match="has given no answer in time"):
            await core.count("solo")  # silent already: within SILENT_BUDGET
        assert time.monotonic() - started < 3.0


async def test_a_scan_on_a_hung_active_fails_over_to_its_standby_once_its_ping_goes_unanswered(
    bus: FakeBus, quick_silence: None
) -> None:
    async with _paired(bus, timeout=5.0) as (core, active):
        bus.owners[active].stall, bus.owners[active].hung = 30.0, True
        started = time.monotonic()
        assert [k for k, _ in await core.entries(RangeQuery("r"))] == [f"k{i:03d}" for i in range(50)]
        assert time.monotonic() - started < 2.0  # not the 5 s deadline
        assert core.router.silent_for(active) is not None


async def test_a_scan_that_waited_out_a_hung_active_starts_the_next_on_its_standby(
    bus: FakeBus,
) -> None:
    async with _paired(bus, timeout=0.3) as (core, active):
        bus.owners[active].stall = 5.0  # hung, as on a node that went away: only scans ask it here
        keys = [f"k{i:03d}" for i in range(50)]
        assert [k for k, _ in await core.entries(RangeQuery("r"))] == keys  # failed over after the deadline
        asked = bus.owners[active].calls.count("scan")
        assert [k for k, _ in await core.entries(RangeQuery("r"))] == keys
        assert bus.owners[active].calls.count("scan") == asked  # its standby first: no wait on it
        assert core.router.silent_for(active) is None  # slow, not silent: its budget is whole


async def test_a_scan_whose_owner_dies_midway_continues_on_the_standby_with_every_key_once(
    replicated: tuple[FakeBus, Facade],
) -> None:
    bus, facade = replicated
    victim = next(iter(bus.owners))
    bus.owners[victim].down_after = 3  # answers three page calls, then is gone
    keys = [k for chunk in [c async for c in facade.stream(RangeQuery("r"))] for k, _ in chunk]
    assert keys == [f"k{i:03d}" for i in range(300)]
    assert bus.owners[victim].down


async def test_pages_and_counts_fail_over_too(replicated: tuple[FakeBus, Facade]) -> None:
    bus, facade = replicated
    first = await facade.page(RangeQuery("r"), PageRequest(100))
    bus.owners[next(iter(bus.owners))].down = True
    rest = await facade.page(RangeQuery("r"), PageRequest(1000, first.next))
    assert [k for k, _ in first.entries + rest.entries] == [f"k{i:03d}" for i in range(300)]
    assert await facade.count("r") == 300


async def test_with_every_copy_down_the_answer_is_a_503(replicated: tuple[FakeBus, Facade]) -> None:
    bus, facade = replicated
    for owner in bus.owners.values():
        owner.down = True
    with pytest.raises(OwnerUnavailable):
        await facade.get(KeyQuery("r", "k001"))
    with pytest.raises(OwnerUnavailable):
        await facade.entries(RangeQuery("r"))


async def test_a_catching_up_active_is_shown_so_and_its_reads_fail_over_to_the_standby(
    replicated: tuple[FakeBus, Facade],
) -> None:
    bus, facade = replicated
    table = facade.view.table("r")
    assert table is not None
    p = table.partition_of("k007")
    active = _active_of(bus, facade, "k007")
    bus.owners[active].core.partitions[p].start_catch_up()  # as a gap does when the store has peers
    assert await facade.get(KeyQuery("r", "k007")) == "v7"  # 503 partition-catching-up, then the standby
    standby = next(u for u in bus.owners if u != active)
    assert "get_many" in bus.owners[standby].calls
    entry = next(e for e in (await facade.catalog())[0]["positions"] if e["partition"] == p)
    assert entry["state"] == "catching-up" and entry["buffered"] == 0 and "rebuilt from a live peer" in entry["reason"]
    mine = next(i for i in await facade.metadata() if i["actor"] == active)
    assert next(x for x in mine["positions"] if x["partition"] == p)["state"] == "catching-up"


# -- monotonic reads across copies (runtime/monotonic.py) ---------------------------------------------------


def _copies(bus: FakeBus, facade: Facade, key: str) -> tuple[str, str, int]:
    """The active and standby actors of ``key``'s partition, and the partition."""
    table = facade.view.table("r")
    assert table is not None
    owners = table.partitions[table.partition_of(key)]
    assert owners.active is not None
    return owners.active, owners.standbys[0], table.partition_of(key)


async def test_a_standby_ahead_then_the_active_behind_never_serves_the_older_value(
    replicated: tuple[FakeBus, Facade], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import routing, silence

    monkeypatch.setattr(routing, "CATCH_UP_PAUSE", 0.005)
    monkeypatch.setattr(silence, "SILENT_MEMORY", 0.0)  # the active back at once is asked first again
    bus, facade = replicated
    active, standby, _ = _copies(bus, facade, "k007")
    bus.load("r", {"k007": "new"}, batch_id=1, role="standby")  # a delivery halfway: standbys go first
    bus.owners[active].down = True
    assert await facade.get(KeyQuery("r", "k007")) == "new"  # failed over to the standby, at batch 1
    bus.owners[active].down = False
    asked = bus.owners[active].calls.count("get_many")
    assert await facade.get(KeyQuery("r", "k007")) == "new"  # the active (batch 0) answered, and was refused
    assert bus.owners[active].calls.count("get_many") == asked + 1
    # With the standby gone, the active alone is asked again until it catches up: never "v7" meanwhile.
    bus.owners[standby].down = True
    pending = asyncio.ensure_future(facade.get(KeyQuery("r", "k007")))
    await eventually(lambda: bus.owners[active].calls.count("get_many") > asked + 3, what="the active asked again")
    assert not pending.done()
    bus.load("r", {"k007": "new"}, batch_id=1, role="active")
    assert await pending == "new"


async def test_a_copy_that_does_not_catch_up_within_the_deadline_is_a_503_not_an_older_answer(
    replicated: tuple[FakeBus, Facade],
) -> None:
    bus, facade = replicated
    facade.router.timeout = 0.5
    active, standby, partition = _copies(bus, facade, "k007")
    bus.load("r", {"k007": "new"}, batch_id=1, role="standby")
    bus.owners[active].down = True
    assert await facade.get(KeyQuery("r", "k007")) == "new"
    bus.owners[active].down, bus.owners[standby].down = False, True
    with pytest.raises(CopyBehind) as info:
        await facade.get(KeyQuery("r", "k007"))
    assert info.value.status == 503 and info.value.details["partitions"] == [partition]
    assert "q@1" in info.value.message and "q@0" in info.value.message


async def test_a_coalesced_batch_refuses_only_the_partition_whose_copy_is_behind(
    replicated: tuple[FakeBus, Facade], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    from runtime.facade import silence

    monkeypatch.setattr(silence, "SILENT_MEMORY", 0.0)  # the active back at once is asked first again
    bus, facade = replicated
    table = facade.view.table("r")
    assert table is not None
    active, standby, behind = _copies(bus, facade, "k007")
    keys = [f"k{i:03d}" for i in range(300)]
    fine = next(p for p in table.by_owner()[active] if p != behind)
    # The standby of one partition got batch 1; the other partition of the same active is untouched.
    bus.owners[standby].core.apply("q", 1, {behind: pa.table({"key": ["k007"], "value": ["new"]})})
    bus.owners[active].down = True
    assert await facade.get(KeyQuery("r", "k007")) == "new"
    bus.owners[active].down = False
    asked = [k for k in keys if table.partition_of(k) == fine][:3] + ["k007"]
    before = bus.owners[active].calls.count("get_many")
    answers = await asyncio.gather(*(facade.get(KeyQuery("r", k)) for k in asked))
    assert answers == [f"v{int(k[1:])}" for k in asked[:3]] + ["new"]
    assert bus.owners[active].calls.count("get_many") == before + 1  # one coalesced call for all four


async def test_counts_and_scans_do_not_go_back_after_a_standby_answered(replicated: tuple[FakeBus, Facade]) -> None:
    bus, facade = replicated
    active, standby, _ = _copies(bus, facade, "k007")
    bus.load("r", {"k007": "new", "k300": "v300"}, batch_id=1, role="standby")
    for owner in bus.owners.values():
        owner.down = True
    bus.owners[standby].down = False
    assert await facade.get(KeyQuery("r", "k007")) == "new"
    first = await facade.count("r")  # the standby copies are at batch 1, the other actor's actives at 0
    for owner in bus.owners.values():
        owner.down = False
    assert await facade.count("r") == first  # the actives behind were refused for what the standby served
    entries = dict(await facade.entries(RangeQuery("r")))
    assert entries["k007"] == "new"  # the active's page was refused and the scan went on on the standby
    bus.load("r", {"k007": "new", "k300": "v300"}, batch_id=1, role="active")
    assert await facade.count("r") == 301


async def test_a_rebuild_seen_on_a_standby_is_not_undone_by_the_active_still_at_the_old_source(
    replicated: tuple[FakeBus, Facade],
) -> None:
    bus, facade = replicated
    active, standby, _ = _copies(bus, facade, "k007")
    assert await facade.get(KeyQuery("r", "k007")) == "v7"  # the active, at source q
    rebuilt = {f"k{i:03d}": f"r{i}" for i in range(300)}
    bus.load("r", rebuilt, batch_id=0, source="q2", role="standby")  # a rebuild's batch 0, standbys first
    bus.owners[active].down = True
    assert await facade.get(KeyQuery("r", "k007")) == "r7"
    bus.owners[active].down = False
    assert await facade.get(KeyQuery("r", "k007")) == "r7"  # the active at q is refused: q was left
    bus.load("r", rebuilt, batch_id=0, source="q2", role="active")
    assert await facade.get(KeyQuery("r", "k007")) == "r7"


async def test_a_store_dropped_and_created_again_starts_its_marks_over(replicated: tuple[FakeBus, Facade]) -> None:
    bus, facade = replicated
    bus.load("r", {"k007": "w"}, batch_id=1)
    bus.load("r", {"k007": "x"}, batch_id=2)
    assert await facade.get(KeyQuery("r", "k007")) == "x"
    bus.state.drop("r")
    bus.create_store(kv_spec("r", standbys=1))
    bus.load("r", {"k007": "y"})  # the new store's batch 0, same source name: lower than the old mark
    await facade.views.refresh()
    assert await facade.get(KeyQuery("r", "k007")) == "y"


async def test_a_move_of_a_stores_actor_keeps_its_marks(replicated: tuple[FakeBus, Facade]) -> None:
    bus, facade = replicated
    bus.load("r", {"k007": "x"}, batch_id=1)
    assert await facade.get(KeyQuery("r", "k007")) == "x"
    table = facade.view.table("r")
    assert table is not None
    partition = table.partition_of("k007")
    served = facade.marks.get("r", partition)
    assert served is not None
    old = table.partitions[partition].active
    assert old is not None
    bus.state.replace_table(table.with_joining(old, "new-actor").with_replaced(old, "new-actor"))  # runtime.moves
    await facade.views.refresh()
    assert facade.marks.get("r", partition) == served  # an older copy is still refused after the move


def _record_packed_limits(bus: FakeBus) -> list[int | None]:
    """The ``limit`` of every ``scan_packed`` call the bus's owners get from now on, in order."""
    asked: list[int | None] = []
    for owner in bus.owners.values():
        scan_packed = owner.core.scan_packed

        def recording(partitions, scan, limit, max_bytes, fmt, scan_packed=scan_packed):  # type: ignore[no-untyped-def]
            asked.append(limit)
            return scan_packed(partitions, scan, limit, max_bytes, fmt)

        owner.core.scan_packed = recording  # type: ignore[method-assign]
    return asked


async def _many(bus: FakeBus) -> tuple[list[int | None], Facade, OwnershipTable]:
    """A store of 2,000 keys k00000..k01999, the recorder of its owners' packed-scan limits, a facade
    over the bus and the store's table."""
    bus.create_store(kv_spec("many"))
    bus.load("many", {f"k{i:05d}": f"v{i}" for i in range(2000)})
    asked = _record_packed_limits(bus)
    core = Facade(bus)
    return asked, core, await core.table("many")


async def test_an_ndjson_stream_with_a_limit_asks_no_owner_for_more_than_the_limit(bus: FakeBus) -> None:
    asked, core, _ = await _many(bus)
    lines = b"".join([c async for c in core.stream_ndjson(RangeQuery("many"), None, 5)]).splitlines()
    assert [json.loads(line)["key"] for line in lines] == [f"k{i:05d}" for i in range(5)]
    assert asked and all(limit is not None and limit <= 5 for limit in asked)
    # Without a limit, the stream is whole and owners page by bytes only.
    asked.clear()
    lines = b"".join([c async for c in core.stream_ndjson(RangeQuery("many"))]).splitlines()
    assert len(lines) == 2000 and set(asked) == {None}


async def test_a_limited_stream_asks_an_owner_again_only_for_what_is_left(bus: FakeBus) -> None:
    asked, core, table = await _many(bus)
    # Pages of ~200 bytes: an owner's 1,200-entry limit takes several pages, each asking for what is left.
    runs = [r async for r in core.scatter.packed_chunks(table, Scan(), "ndjson", max_bytes=200, limit=1200)]
    lines = b"".join(line for r in runs for line in r.columns[0]).splitlines()
    assert [json.loads(line)["key"] for line in lines] == [f"k{i:05d}" for i in range(1200)]
    assert asked[0] == 1200 and min(a for a in asked if a is not None) < 1200
    assert all(a is not None and a > 0 for a in asked)


async def test_page_entries_caps_every_owner_page_and_a_limit_still_bounds_the_total(bus: FakeBus) -> None:
    asked, core, table = await _many(bus)
    runs = [r async for r in core.scatter.packed_chunks(table, Scan(), "msgpack", page_entries=150)]
    assert [k for r in runs for k in r.columns[0]] == [f"k{i:05d}" for i in range(2000)]
    assert set(asked) == {150}
    asked.clear()
    runs = [r async for r in core.scatter.packed_chunks(table, Scan(), "msgpack", limit=220, page_entries=150)]
    assert [k for r in runs for k in r.columns[0]] == [f"k{i:05d}" for i in range(220)]
    # Each source: 150 (the cap), then what is left of its 220 at most.
    assert asked and all(a is not None and a <= 150 for a in asked) and min(a for a in asked if a) <= 70


async def test_owners_are_asked_for_their_next_page_on_arrival_and_no_further_than_pages_ahead(
    bus: FakeBus,
) -> None:
    bus.create_store(kv_spec("many"))
    bus.load("many", {f"k{i:05d}": f"v{i}" for i in range(3000)})
    core = Facade(bus)
    table = await core.table("many")
    runs = core.scatter.packed_chunks(table, Scan(), "ndjson", page_entries=100)
    first = await anext(runs)
    # Per owner: the page being merged, PAGES_AHEAD waiting, and one arrived that waits for room.
    owners = table.by_owner()
    ahead = 1 + PAGES_AHEAD + 1

    def asked() -> list[int]:
        return [bus.owners[uuid].calls.count("scan") for uuid in owners]

    await eventually(lambda: min(asked()) >= ahead, what=f"{ahead} pages asked of every owner")
    for _ in range(100):  # the fetchers' turns on the loop (the fake owners answer at once): no further
        await asyncio.sleep(0)
    assert asked() == [ahead] * len(owners)
    rest = [r async for r in runs]
    keys = [json.loads(line)["key"] for r in [first, *rest] for line in r.columns[0]]
    assert keys == [f"k{i:05d}" for i in range(3000)]


async def test_a_registry_gone_for_good_is_logged_once_without_a_traceback_and_its_return_once(
    bus: FakeBus, caplog: pytest.LogCaptureFixture
) -> None:
    """``riqr down`` under a running driver: the view's long poll fails every interval until closed."""
    failing = {"on": True}
    real_wait = bus.wait_epoch

    async def wait_epoch(known: int, timeout: float) -> int:
        if failing["on"]:
            raise OwnerUnavailable("registry: the actor is dead", retry_after=5)
        return await real_wait(known, timeout)

    bus.wait_epoch = wait_epoch  # type: ignore[method-assign]
    core = Facade(bus, timeout=1.0, refresh_interval=0.001)
    caplog.set_level("INFO", logger="runtime.facade.view")
    await core.start()
    try:
        await eventually(lambda: core.views._failures >= 20, what="twenty failed refreshes")
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and not warnings[0].exc_info
        assert "the actor is dead" in warnings[0].getMessage()
        failing["on"] = False
        bus.state.register_endpoint(Endpoint("node-b", "host-b", 7400))  # the epoch moves: the poll answers
        await eventually(lambda: core.views._failures == 0, what="the long poll working again")
        assert any("fresh again" in r.getMessage() for r in caplog.records if r.levelname == "INFO")
        assert await core.get(KeyQuery("customers", "1")) == "john"  # served from the cached view all along
    finally:
        await core.stop()


async def test_a_dropped_stores_series_go_from_a_facade_no_one_scrapes(bus: FakeBus) -> None:
    """Only ``/metrics`` forgot a dropped store's series: the Python client's facades, whose metrics no one
    scrapes, kept those of every store they ever served."""
    bus.create_store(kv_spec("dropped"))
    bus.load("dropped", {"1": "x"})
    core = Facade(bus, timeout=1.0, refresh_interval=0.01)
    await core.start()
    try:
        assert await core.get(KeyQuery("customers", "1")) == "john"
        assert await core.get(KeyQuery("dropped", "1")) == "x"

        def stores() -> set[str]:
            core.metrics.fold()
            return {dict(s.labels).get("store", "") for s in core.metrics.samples()} - {""}

        assert stores() == {"customers", "dropped"}
        bus.state.drop("dropped")
        await eventually(lambda: "dropped" not in core.view.tables)
        assert stores() == {"customers"}
    finally:
        await core.stop()


async def test_requests_for_stores_that_do_not_exist_share_the_registrys_view_fetches() -> None:
    """Each request naming a store the view lacks cost the registry a fetch of its own, one after the other:
    a client asking for a wrong name (or anyone, without auth) kept the registry busy with view calls. A
    request takes a fetch begun after it asked, which is as new as its own would be; one begun before
    does not do (the store may have been created meanwhile), and a failed one is no one's answer."""

    class SlowBus(FakeBus):
        fail = False

        async def fetch_view(self) -> Any:
            self.view_fetches += 1
            view = self.state.view()  # as the registry answers: the view when the call reached it
            await asyncio.sleep(0.02)
            if self.fail:
                raise OwnerUnavailable("the registry is restarting", retry_after=1)
            return view

    bus = SlowBus()
    bus.create_store(kv_spec("customers"))
    bus.load("customers", CUSTOMERS)
    core = Facade(bus, timeout=1.0, refresh_interval=60)
    await core.start()
    try:
        fetches = bus.view_fetches
        answers = await asyncio.gather(*(core.get(KeyQuery("nope", "1")) for _ in range(50)), return_exceptions=True)
        assert all(isinstance(a, StoreNotFound) for a in answers)
        # Two: the first request's, begun before the others asked, and one begun after they did (51 before).
        assert bus.view_fetches - fetches == 2

        # A fetch in flight began before the store was made: the request asked after it fetches again,
        # even when that fetch brings a newer epoch (another store made just before it).
        bus.create_store(kv_spec("other"))
        early = asyncio.ensure_future(core.views.refresh())
        await asyncio.sleep(0.005)
        bus.create_store(kv_spec("late"))
        bus.load("late", {"1": "x"})
        assert await core.get(KeyQuery("late", "1")) == "x"
        await early

        bus.fail = True
        fetches = bus.view_fetches
        answers = await asyncio.gather(*(core.get(KeyQuery("nope", "1")) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(a, OwnerUnavailable) for a in answers), answers
        assert bus.view_fetches - fetches == 3  # each tried: none was given another's failure as an answer
    finally:
        await core.stop()
