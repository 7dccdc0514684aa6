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
