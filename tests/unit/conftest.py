"""Unit tests never start Ray: any attempt fails loudly instead of silently booting a cluster."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("unit tests must not start or join Ray; move this test to tests/integration")

    monkeypatch.setattr(ray, "init", refuse)


# Hypothesis: a few seconds of examples in the normal suite; HYPOTHESIS_PROFILE=thorough for a long hunt.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "riqr", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile("thorough", parent=settings.get_profile("riqr"), max_examples=5000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "riqr"))
