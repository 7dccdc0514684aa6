"""The Ray bus in a process that is not connected to Ray (never was, or called ``ray.shutdown``): its calls
say so, and never start or join a Ray cluster by themselves (Ray's automatic ``ray.init``); and calls to
actors that never answer give up at their deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import ray

from runtime.errors import DeadlineExceeded, NotConnected
from verticles.bus import RayBus, RayOwner


async def test_a_bus_without_ray_says_not_connected_and_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # As in a process after ray.shutdown() (the full suite's session may still be connected here).
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def no_lookup(*_: Any, **__: Any) -> Any:
        raise AssertionError("the bus looked an actor up, which would start or join Ray")

    monkeypatch.setattr(ray, "get_actor", no_lookup)
    bus = RayBus("riqr-offline")
    with pytest.raises(NotConnected):
        await bus.fetch_epoch()
    with pytest.raises(NotConnected):
        await bus.wait_epoch(0, 0.01)
    with pytest.raises(NotConnected):
        await RayOwner("00000000-0000-4000-8000-000000000001", "riqr-offline", 1.0).positions()
    bus.suspect("00000000-0000-4000-8000-000000000001")  # fire and forget: quietly nothing


class _Silent:
    """An actor handle whose every method's call never answers (a registry busy with a long call)."""

    def __getattr__(self, name: str) -> Any:
        class Method:
            @staticmethod
            def remote(*_: Any) -> Any:
                return asyncio.get_running_loop().create_future()  # awaited like an ObjectRef, never done

            @staticmethod
            def options(**_: Any) -> Any:
                return Method

        return Method


async def test_registry_calls_give_up_at_their_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``raycalls.call`` asked again until the deadline but waited past it: a view refresh, and so the first
    lookup of a store the caller's view lacked, waited as long as the registry took."""
    bus = RayBus("riqr-silent", timeout=0.2)
    monkeypatch.setattr(bus, "_registry_actor", lambda: _Silent())
    started = time.monotonic()
    async with asyncio.timeout(10):  # without the bound, the test's own end rather than a hang
        with pytest.raises(DeadlineExceeded):
            await bus.fetch_view()
        with pytest.raises(DeadlineExceeded):
            await bus.wait_epoch(0, 0.1)
    assert time.monotonic() - started < 3


async def test_the_clients_async_calls_give_up_at_its_timeout() -> None:
    """``all_async`` and every other async scan of a client waited for ever on a facade verticle that did not
    answer, where the blocking forms' ``ray.get`` stopped at ``connect(timeout=)``."""
    from runtime.client import Client

    client = Client(_Silent(), "riqr-silent", timeout=0.2)
    started = time.monotonic()
    async with asyncio.timeout(10):
        with pytest.raises(DeadlineExceeded):
            await client.call_async("entries", None)
    assert time.monotonic() - started < 3


async def test_a_call_the_client_stops_waiting_for_is_cancelled_in_the_facade(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller with a short timeout that asks again piled scans up in the facade verticle, each running to
    the facade's own deadline: the call given up on (the client's timeout, or the caller's own cancel) is
    cancelled, and only it (its owners' reads are not: ``recursive=False``)."""
    from runtime.client import Client

    cancelled: list[tuple[Any, bool]] = []
    monkeypatch.setattr(ray, "cancel", lambda ref, recursive=True: cancelled.append((ref, recursive)))
    client = Client(_Silent(), "riqr-silent", timeout=0.2)
    with pytest.raises(DeadlineExceeded):
        await client.call_async("entries", None)
    assert len(cancelled) == 1 and cancelled[0][1] is False
    waiting = asyncio.ensure_future(Client(_Silent(), "riqr-silent", timeout=30).call_async("page", None))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(cancelled) == 2 and cancelled[1][0] is not cancelled[0][0]


async def test_a_long_lived_bus_and_view_forget_actors_the_view_no_longer_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client living through moves and drops kept a handle, and a suspicion, for every actor it ever met."""
    from runtime.facade.view import ViewCache
    from tests.unit.fakes import FakeBus, kv_spec

    fake = FakeBus()
    fake.create_store(kv_spec("kept"))
    fake.create_store(kv_spec("dropped"))
    gone = sorted(fake.state.view().tables["dropped"].all_owners())
    kept = sorted(fake.state.view().tables["kept"].all_owners())

    class Registry:
        class view:  # noqa: N801 - an actor method's name
            @staticmethod
            def remote() -> Any:
                answered = asyncio.get_running_loop().create_future()
                answered.set_result(fake.state.view())
                return answered

    bus = RayBus("riqr-forget")
    monkeypatch.setattr(bus, "_registry_actor", lambda: Registry())
    await bus.fetch_view()
    for uuid in gone + kept:
        bus.owner(uuid)
    views = ViewCache(fake)
    await views.refresh()
    for uuid in gone + kept:
        views.suspect(uuid)
    fake.state.drop("dropped")
    await bus.fetch_view()
    await views.refresh()
    assert sorted(bus._owners) == kept  # noqa: SLF001
    assert sorted(views._suspected) == kept  # noqa: SLF001


async def test_a_verticles_registry_calls_give_up_at_their_deadline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An HTTP verticle's calls to the registry (its endpoint and read replicas, at start and at stop) waited
    for as long as a busy registry took. They stop at the deadline: a start fails (and is tried again), a
    stop goes on without the registry, saying so."""
    from verticles import deploy

    env = deploy.RayEnv("riqr-silent")
    monkeypatch.setattr(deploy, "_CALL_TIMEOUT", 0.2)
    monkeypatch.setattr(env, "_registry", lambda: _Silent())
    started = time.monotonic()
    async with asyncio.timeout(10):
        with pytest.raises(DeadlineExceeded):
            await env.endpoint_of("node-1")
        with pytest.raises(DeadlineExceeded):
            await env.add_reader(object())  # type: ignore[arg-type]
        with caplog.at_level("WARNING", logger="verticles.deploy"):
            await env.drop_reader("00000000-0000-4000-8000-000000000001", "its HTTP verticle stopped")
            await env.unregister_endpoint("node-1")
    assert time.monotonic() - started < 4
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "the registry did not answer drop_reader",
        "the registry did not answer unregister_endpoint",
    ]


async def test_a_stopping_verticle_finds_the_registry_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``riqr down`` kills the registry first: a verticle stopping after it goes on quietly; one whose
    registry dies during the call (Ray's "the actor died") goes on too."""
    from runtime.errors import OwnerUnavailable
    from verticles import deploy

    def gone() -> Any:
        raise ValueError("Failed to look up actor with name 'riqr-registry'")

    env = deploy.RayEnv("riqr-silent")
    monkeypatch.setattr(env, "_registry", gone)
    await env.drop_reader("00000000-0000-4000-8000-000000000001", "its HTTP verticle stopped")
    await env.unregister_endpoint("node-1")

    async def dies(*_: Any) -> Any:
        raise OwnerUnavailable("registry drop_reader: the actor died", retry_after=5)

    monkeypatch.setattr(env, "_ask_registry", dies)
    await env.drop_reader("00000000-0000-4000-8000-000000000001", "its HTTP verticle stopped")
    await env.unregister_endpoint("node-1")


def test_a_peer_of_the_riqr_before_at_least_is_asked_again_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """During an upgrade a restarted actor runs newer code than its peers: one whose ``open_snapshot`` takes
    no ``at_least`` raised TypeError, and every catch-up from it failed. It is asked again without; a peer
    is never sent ``at_least=None`` as an argument at all."""
    from runtime import raycalls
    from runtime.engines import Position
    from runtime.errors import InternalError
    from verticles import deploy

    sent: list[tuple[Any, ...]] = []

    class OldPeer:
        class open_snapshot:  # noqa: N801 - a Ray method's shape
            @staticmethod
            def remote(*args: Any) -> tuple[Any, ...]:
                sent.append(args)
                return args

    def get(ref: tuple[Any, ...], what: str, **_: Any) -> str:
        if len(ref) > 1:  # the old signature: open_snapshot(self, partition)
            raise InternalError(f"{what} failed inside the actor: TypeError")
        return "offer"

    monkeypatch.setattr(raycalls, "get", get)
    peer = object.__new__(deploy.RaySnapshotPeer)
    peer.uuid, peer._handle = "00000000-0000-4000-8000-000000000002", OldPeer()
    assert peer.open_snapshot(3, Position("q", 7)) == "offer"
    assert peer.open_snapshot(3) == "offer"
    assert sent == [(3, Position("q", 7)), (3,), (3,)]


def test_the_registrys_ping_handles_of_actors_no_longer_pinged_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's handle cache for pings kept every query actor it ever pinged (dropped stores', moved
    actors'): handles unused for their minute go at the next ping."""
    from verticles import deploy

    now = [1000.0]

    class Actor:
        class ping:  # noqa: N801 - a Ray method's shape
            @staticmethod
            def options(**_: Any) -> Any:
                return Actor.ping

            @staticmethod
            def remote() -> str:
                return "pinged"

    monkeypatch.setattr(deploy.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(deploy.ray, "get_actor", lambda name, namespace=None: Actor())
    env = deploy.RayEnv("riqr-pings")
    for n in range(5):
        env.send_ping(f"dropped-{n}")
    assert len(env._ping_handles) == 5  # noqa: SLF001
    for _ in range(3):  # only one actor is still pinged, every 30 s
        now[0] += 30.0
        assert env.send_ping("alive") == "pinged"
    assert sorted(env._ping_handles) == ["alive"]  # noqa: SLF001
