"""``riqr down`` and dropping a store stop actors that may be dead already (killed, their node lost): that
is one line at info, while a real failure stays a warning (``verticles.deploy``; Ray's calls faked)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, GetTimeoutError

from verticles import deploy


class _Handle:
    class destroy:  # noqa: N801 (Ray's method-handle shape)
        @staticmethod
        def remote() -> str:
            return "ref"


def _teardown(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, outcomes: dict[str, Any]) -> None:
    """``RayEnv.destroy`` over actors whose lookup or call ends as ``outcomes`` says."""

    def get_actor(name: str, namespace: str) -> _Handle:
        if outcomes[name] == "gone":
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return _Handle()

    calls = iter(outcomes[n] for n in outcomes if outcomes[n] != "gone")

    def get(ref: Any, timeout: float | None = None) -> None:
        outcome = next(calls)
        if isinstance(outcome, BaseException):
            raise outcome

    monkeypatch.setattr(deploy.ray, "get_actor", get_actor)
    monkeypatch.setattr(deploy.ray, "get", get)
    monkeypatch.setattr(deploy.ray, "kill", lambda *a, **k: None)
    with caplog.at_level(logging.INFO, logger="verticles.deploy"):
        deploy.RayEnv("ns").destroy(list(outcomes))


def test_actors_dead_or_gone_already_are_one_info_line_each(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _teardown(monkeypatch, caplog, {"gone": "gone", "dead": ActorDiedError(), "fine": None})
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("INFO", None), ("INFO", None)]
    assert "gone already" in caplog.records[0].getMessage() and "dead already" in caplog.records[1].getMessage()


def test_real_failures_stay_warnings(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _teardown(monkeypatch, caplog, {"slow": GetTimeoutError("timed out"), "odd": RuntimeError("disk on fire")})
    slow, odd = caplog.records
    assert (slow.levelname, slow.exc_info) == ("WARNING", None) and "did not answer in time" in slow.getMessage()
    assert odd.levelname == "WARNING" and odd.exc_info is not None  # unknown: the traceback helps
