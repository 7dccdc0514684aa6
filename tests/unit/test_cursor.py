"""Cursors are unforgeable (HMAC keyed per deployment) and checked against the store they continue."""

from __future__ import annotations

import base64

import msgpack
import pytest

from runtime.cursor import CursorCodec, generate_cursor_key
from runtime.errors import MalformedCursor
from runtime.keys import TOP
from runtime.scan import Bound, Scan, TimeFilter
from tests.unit.fakes import kv_spec, windowed_spec

KEY = generate_cursor_key()
BOOKINGS = kv_spec("s", rest=(("ts", "timestamp"),))


def test_round_trip_continues_the_same_scan() -> None:
    codec = CursorCodec(KEY)
    scan = Scan.closed(("c1", 5), ("c1", TOP), reverse=True)
    token = codec.encode("s", "range", scan, ("c1", 7))
    assert codec.decode(BOOKINGS, "range", token) == scan.after(("c1", 7))
    assert "=" not in token and "/" not in token and "+" not in token  # URL-safe


def test_every_codec_with_the_deployment_key_accepts_the_others_cursors() -> None:
    token = CursorCodec(KEY).encode("s", "range", Scan(), "k")
    assert CursorCodec(KEY).decode(kv_spec("s"), "range", token) == Scan().after("k")
    with pytest.raises(MalformedCursor):
        CursorCodec(generate_cursor_key()).decode(kv_spec("s"), "range", token)


def _forge(codec: CursorCodec, body: list[object]) -> str:
    """A cursor with a genuine tag over an arbitrary body: what a stale cursor of a recreated store is."""
    packed = msgpack.packb(body, use_bin_type=True)
    tag = codec._tag(packed)  # the only way to test validation behind the tag
    enc = lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")  # noqa: E731
    return f"{enc(packed)}.{enc(tag)}"


def _tampered(token: str) -> str:
    body, tag = token.split(".")
    return ("B" if body[0] != "B" else "C") + body[1:] + "." + tag


FOREIGN = CursorCodec(KEY).encode("other", "range", Scan(), "k")


@pytest.mark.parametrize(
    "token",
    [
        "",
        ".",
        "..",
        "not-base64!",
        "AAAA",
        "AAAA.AAAA",
        "x" * 5000,
        FOREIGN,
        _tampered(FOREIGN),
        CursorCodec(KEY).encode("s", "window", Scan(), "k"),
    ],  # fmt: skip
)
def test_foreign_tampered_and_junk_cursors_are_rejected(token: str) -> None:
    with pytest.raises(MalformedCursor):
        CursorCodec(KEY).decode(kv_spec("s"), "range", token)


@pytest.mark.parametrize(
    "body",
    [
        [2, "s", "range", False, None, None, 1, None],  # an integer key in a string store
        [2, "s", "range", "yes", None, None, "k", None],  # a direction that is not a boolean
        [2, "s", "range", False, "k", None, "k", None],  # a scalar bound
        [2, "s", "range", False, ["k"], None, "k", None],  # a bound without its inclusiveness
        [2, "s", "range", False, None, None, None, None],  # no last key
        [2, "s", "range", False, None, None, "k", [1, 2, 3]],  # a time filter on a kv store
        [2, "s", "range", False, None, None, ["k"], None],  # a composite key in a scalar store
        [2, "s", "range", False, None, None, {"k": 1}, None],
        [2, "s", "range", False, None, None, "k"],  # too short
    ],
)
def test_cursors_that_do_not_fit_the_store_are_400s_even_with_a_good_tag(body: list[object]) -> None:
    codec = CursorCodec(KEY)
    with pytest.raises(MalformedCursor):
        codec.decode(kv_spec("s"), "range", _forge(codec, body))


def test_window_cursors_check_components_and_the_time_filter() -> None:
    codec, spec = CursorCodec(KEY), windowed_spec("w")
    good = Scan(Bound(("u",)), Bound(("u", TOP)), False, TimeFilter(1, None))
    token = codec.encode("w", "window", good, ("u", 5))
    assert codec.decode(spec, "window", token) == good.after(("u", 5))
    for body in (
        [2, "w", "window", False, None, None, ["u", "not-a-time"], None],
        [2, "w", "window", False, None, None, ["u"], None],  # a last key must be whole
        [2, "w", "window", False, None, None, ["u", 1], ["a", None, None]],
        [2, "w", "window", False, None, None, ["u", 1], [True, None, None]],
        [2, "w", "window", False, [["u", 1, 2], True], None, ["u", 1], None],  # too many components
    ):
        with pytest.raises(MalformedCursor):
            codec.decode(spec, "window", _forge(codec, body))


def test_big_integers_do_not_pass_as_long_keys() -> None:
    codec = CursorCodec(KEY)
    with pytest.raises(MalformedCursor):
        codec.decode(kv_spec("s", key_type="int"), "range", _forge(codec, [2, "s", "range", False, None, None,
                                                                          2**40, None]))  # fmt: skip


async def test_pages_go_on_after_the_longest_key_a_url_names_and_long_stored_keys(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """A window scan of one 1,024-character key (the URL's limit) carries the key in both bounds and as
    the last key; a store can hold far longer keys than a URL names. Page 2 of each must be served: the
    cursor was over the decode limit, and every continuation a 400."""
    import datetime as dt
    import random
    from urllib.parse import quote

    from runtime.facade import Facade
    from runtime.rest import build_app
    from tests.unit.fakes import FakeBus, load_windowed

    day = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rng = random.Random(7)
    user = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(1024))
    stored = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3500)) + str(i) for i in range(3)
    ]
    bus = FakeBus()
    bus.create_store(windowed_spec("clicks"))
    load_windowed(bus, "clicks", [(user, day + dt.timedelta(minutes=m), day + dt.timedelta(minutes=m + 1), m)
                                  for m in range(3)])  # fmt: skip
    bus.create_store(kv_spec("long-keys"))
    bus.load("long-keys", {k: "v" for k in stored})
    client = await aiohttp_client(build_app(Facade(bus, timeout=1.0)))

    starts = []
    url = f"/stores/clicks/windows/{user}?limit=1"
    while url:
        resp = await client.get(url)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        starts += [w["window"]["start"] for w in body["result"]]
        url = body["next"] and f"/stores/clicks/windows/{user}?limit=1&cursor={quote(body['next'])}"
    assert starts == [(day + dt.timedelta(minutes=m)).isoformat() for m in range(3)]

    keys = []
    url = "/stores/long-keys/all?limit=1"
    while url:
        resp = await client.get(url)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        keys += [e["key"] for e in body["result"]]
        url = body["next"] and f"/stores/long-keys/all?limit=1&cursor={quote(body['next'])}"
    assert keys == sorted(stored)


def test_a_cursor_over_the_limit_says_so_rather_than_that_it_is_not_ours() -> None:
    """A page that ends at a very long stored key (keys have no limit in the store) gives a cursor longer
    than the decoder reads: refused, but naming the length and the ways to read on, not as a forgery."""
    import secrets

    from runtime.cursor import MAX_CURSOR_CHARS

    codec = CursorCodec(KEY)
    short = codec.encode("s", "range", Scan(), secrets.token_urlsafe(30_000))  # 40,000 random characters
    assert len(short) <= MAX_CURSOR_CHARS and codec.decode(kv_spec("s"), "range", short).lo is not None
    token = codec.encode("s", "range", Scan(), secrets.token_urlsafe(60_000))
    assert len(token) > MAX_CURSOR_CHARS
    with pytest.raises(MalformedCursor) as refused:
        codec.decode(kv_spec("s"), "range", token)
    assert (
        f"over the limit of {MAX_CURSOR_CHARS:,}" in refused.value.message and "Store.iterate" in refused.value.message
    )
    assert "not one this server issued" not in refused.value.message
    assert refused.value.details == {"store": "s", "limit": MAX_CURSOR_CHARS}


def test_a_cursor_of_a_store_declared_again_with_other_key_types_is_refused() -> None:
    """A long key and a timestamp key are both integers inside: the cursor's bound would be read as the
    other type's and the scan continued from a meaningless place. A cursor without the types (issued
    before they were carried) is taken as it was."""
    codec = CursorCodec(KEY)
    longs, times = kv_spec("s", key_type="long"), kv_spec("s", key_type="timestamp")
    token = codec.encode("s", "range", Scan(), 1_700_000_000_000_000, longs.key.type_label)
    assert codec.decode(longs, "range", token) == Scan().after(1_700_000_000_000_000)
    with pytest.raises(MalformedCursor, match="when its key was long; it is timestamp now"):
        codec.decode(times, "range", token)
    before = codec.encode("s", "range", Scan(), 1_700_000_000_000_000)
    assert codec.decode(times, "range", before) == Scan().after(1_700_000_000_000_000)


def test_a_cursor_is_taken_while_its_issuer_is_in_the_stores_lineage() -> None:
    """A store dropped and declared again with the same key types: the cursor verified and went on after
    its last key, skipping the new store's keys before it. It names the actor that issued it (partition
    0's active); a move keeps that actor in ``moved_from``, a store declared again has other actors."""
    from dataclasses import replace

    from runtime.cursor import issuer_of
    from runtime.ownership import ActorInfo, OwnershipTable, PartitionOwners
    from runtime.registry import RegistryState

    codec, spec = CursorCodec(KEY), kv_spec("s", partitions=2)
    table = OwnershipTable(spec, (PartitionOwners("a", ("b",)), PartitionOwners("b", ("a",))))
    assert issuer_of(table) == "a"
    assert issuer_of(OwnershipTable(spec, (PartitionOwners(None, ()), PartitionOwners(None, ("c", "b"))))) == "b"
    token = codec.encode("s", "range", Scan(), "k5", spec.key.type_label, issuer_of(table))
    assert codec.decode(spec, "range", token, table.lineage()) == Scan().after("k5")
    moved = replace(
        table, partitions=(PartitionOwners("m", ("b",)), PartitionOwners("b", ("m",))), moved_from=frozenset({"a"})
    )
    assert codec.decode(spec, "range", token, moved.lineage()) == Scan().after("k5")  # a move: the same store
    # promoted away, then removed by `riqr standbys` (a review: its cursors were refused as another store's)
    registry = RegistryState()
    promoted = OwnershipTable(spec, (PartitionOwners("b", ("a",)), PartitionOwners("b", ("a",))))
    registry.install(promoted, [ActorInfo(u, "s", "n", "10.0.0.1", (0, 1)) for u in ("a", "b")])
    registry.remove_actor(promoted.without_standby("a"), "a")
    removed = registry.view().tables["s"]
    assert "a" not in removed.all_owners()
    assert codec.decode(spec, "range", token, removed.lineage()) == Scan().after("k5")
    again = OwnershipTable(spec, (PartitionOwners("x", ("y",)), PartitionOwners("y", ("x",))))
    with pytest.raises(MalformedCursor, match="dropped and declared again since"):
        codec.decode(spec, "range", token, again.lineage())
    assert codec.decode(spec, "range", token) == Scan().after("k5")  # no lineage to check against
    before = codec.encode("s", "range", Scan(), "k5", spec.key.type_label)  # issued before issuers were carried
    assert codec.decode(spec, "range", before, again.lineage()) == Scan().after("k5")
    untyped = codec.encode("s", "range", Scan(), "k5", None, "a")
    assert codec.decode(spec, "range", untyped, table.lineage()) == Scan().after("k5")
