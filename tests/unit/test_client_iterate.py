"""``Store.iterate_async`` over a facade on the fake bus: byte-sized msgpack chunks, as ``iterate`` uses."""

from typing import Any

from runtime.client import Store
from runtime.facade import Facade
from tests.unit.fakes import FakeBus, kv_spec


class _Client:
    """What ``Store`` needs of ``Client`` for scans, calling a facade in-process instead of over Ray."""

    def __init__(self, facade: Facade) -> None:
        self.facade = facade
        self.calls: list[str] = []

    async def call_async(self, method: str, *args: Any) -> Any:
        self.calls.append(method)
        return await getattr(self.facade, method)(*args)


async def test_iterate_async_walks_every_entry_in_order_in_packed_chunks() -> None:
    bus = FakeBus()
    bus.create_store(kv_spec("many"))
    rows = {f"k{i:05d}": f"v{i}" for i in range(3000)}
    bus.load("many", rows)
    client = _Client(Facade(bus))
    store = Store(client, "many")  # type: ignore[arg-type]
    assert [e async for e in store.iterate_async(page_size=700)] == sorted(rows.items())
    assert set(client.calls) == {"chunk"} and len(client.calls) >= 3000 // 700
    client.calls.clear()
    got = [e async for e in store.iterate_async(lo="k00100", hi="k00199", reverse=True)]
    assert got == sorted(((k, v) for k, v in rows.items() if "k00100" <= k <= "k00199"), reverse=True)


async def test_iterate_async_stopped_early_leaves_no_call_behind() -> None:
    bus = FakeBus()
    bus.create_store(kv_spec("many"))
    bus.load("many", {f"k{i:05d}": i for i in range(3000)})
    client = _Client(Facade(bus))
    entries = Store(client, "many").iterate_async(page_size=100)  # type: ignore[arg-type]
    first = [await anext(entries) for _ in range(5)]
    await entries.aclose()
    assert [k for k, _ in first] == [f"k{i:05d}" for i in range(5)]
    assert len(client.calls) <= 2  # the first chunk and the one prefetched
