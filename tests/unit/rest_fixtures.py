"""One app over every store kind, shared by the REST hardening tests and the property suite."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from runtime.auth import AuthConfig
from runtime.codec import encode_value
from runtime.facade import Facade
from runtime.pages import encode_page, external_keys
from runtime.rest import build_app
from tests.unit.fakes import FakeBus, kv_spec, load_windowed, windowed_spec

DAY = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
STORES = ("strings", "longs", "bookings", "clicks", "visits")


# Values a stored msgpack value can decode to that JSON or msgpack answers must still spell: the sink only
# writes what Arrow gives it, so these go in behind the owner (``_OddValues``).
ODD_VALUES: dict[str, Any] = {
    "a": "x",
    "a/b": 2**64 - 1,
    "é": float("nan"),
    "inf": float("-inf"),
    "": b"\x00\xff",
    "z": {1: [None, True, 1.5]},
}


class _OddValues:
    """A query core whose values are ``ODD_VALUES`` (by key) instead of what was loaded."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def get_many(self, items: list[tuple[int, Any]]) -> tuple[Sequence[bytes | None], Any]:
        found, spans = self._core.get_many(items)
        return [None if raw is None else encode_value(ODD_VALUES[key]) for (_, key), raw in zip(items, found)], spans

    def scan(self, partitions: Sequence[int], scan: Any, limit: int | None) -> tuple[Sequence[tuple[Any, bytes]], Any]:
        entries, spans = self._core.scan(partitions, scan, limit)
        return [(k, encode_value(ODD_VALUES[k])) for k, _ in entries], spans

    def scan_packed(self, partitions: Sequence[int], scan: Any, limit: int | None, max_bytes: int, fmt: str) -> Any:
        """The same page, the same keys, with their odd values (whole JSON answers and NDJSON come this way)."""
        page, spans = self._core.scan_packed(partitions, scan, limit, max_bytes, fmt)
        codec, schema = self._core._codec, self._core.spec.key  # noqa: SLF001
        values = [encode_value(ODD_VALUES[k]) for k in external_keys(schema, codec, page.keys)]
        return encode_page(schema, codec, page.keys, values, fmt, page.more), spans


def every_kind_bus() -> FakeBus:
    """kv stores with string, long and composite keys; a window and a session store; values of every
    type an answer can hold (uint64, NaN and infinities, bytes, maps with integer keys; datetimes in
    keys and windows)."""
    bus = FakeBus()
    bus.create_store(kv_spec("strings"))
    bus.load("strings", {k: "-" for k in ODD_VALUES})
    for uuid in bus.state.view().tables["strings"].all_owners():
        bus.owners[uuid].core = _OddValues(bus.owners[uuid].core)  # type: ignore[assignment]
    bus.create_store(kv_spec("longs", key_type="long"))
    bus.load("longs", {-(2**63): "min", 0: "zero", 2**63 - 1: "max"})
    bus.create_store(kv_spec("bookings", rest=(("ts", "timestamp"),)))
    bus.load("bookings", {(c, DAY + dt.timedelta(days=d)): f"{c}@{d}" for c in ["a/b", "42", "é"] for d in range(3)})
    for kind, name in (("window", "clicks"), ("session", "visits")):
        bus.create_store(windowed_spec(name, kind))
        load_windowed(bus, name, [(u, DAY + dt.timedelta(minutes=m), DAY + dt.timedelta(minutes=m + 1), 2**40 + m)
                                  for u in ("alice", "bob/c") for m in range(3)])  # fmt: skip
    return bus


def every_kind_app(auth: AuthConfig | None = None, cursor_key: bytes | None = None) -> web.Application:
    return build_app(Facade(every_kind_bus(), timeout=1.0, cursor_key=cursor_key), auth=auth)
