"""The Ray bus in a process that is not connected to Ray (never was, or called ``ray.shutdown``): its calls
say so, and never start or join a Ray cluster by themselves (Ray's automatic ``ray.init``)."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from runtime.errors import NotConnected
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
