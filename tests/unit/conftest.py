"""Unit tests never start Ray: any attempt fails loudly instead of silently booting a cluster."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("unit tests must not start or join Ray; move this test to tests/integration")

    monkeypatch.setattr(ray, "init", refuse)
