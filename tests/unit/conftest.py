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


@pytest.fixture
def no_feeders(monkeypatch: pytest.MonkeyPatch) -> None:
    """``supervise`` gives every feeder of the process its last words: none here. (Run after the
    integration tests, this process holds the feeders of their namespaces, long gone; finishing each
    waited out its timeout, 25 s in all.)"""
    from topologies import feeder

    monkeypatch.setattr(feeder, "_FEEDERS", {})


@pytest.fixture
def running(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """An empty table of the queries ``topologies.sink.materialize`` started in this process."""
    from topologies import sink

    table: dict[str, object] = {}
    monkeypatch.setattr(sink, "_RUNNING", table)
    monkeypatch.setattr(sink, "_REBUILT", {})
    monkeypatch.setattr(sink, "_LOOKS", {})
    monkeypatch.setattr(sink, "_FAILED_LOOKS", {})
    monkeypatch.setattr(sink, "_ASKED", {})
    monkeypatch.setattr(sink, "_UNREGISTERED", {})
    monkeypatch.setattr(sink, "_ensure_looker", lambda: None)  # no thread: the tests record looks themselves
    return table


# Hypothesis: a few seconds of examples in the normal suite; HYPOTHESIS_PROFILE=thorough for a long hunt.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "riqr", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile("thorough", parent=settings.get_profile("riqr"), max_examples=5000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "riqr"))
