"""Actors that do not answer (hung, or pinned to a node that is gone) hold the registry, whose calls run one at
a time, for one ``_CALL_TIMEOUT`` in all, not one each: destroying a dropped store's actors, and asking every
query actor and HTTP verticle while a restarted registry rebuilds (``verticles.deploy.RayEnv``; Ray's calls
and the clock faked, so a wait costs no time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from ray.exceptions import GetTimeoutError

from runtime.deadline import Deadline
from verticles import deploy

HUNG = "hung"
# Query actors are named by UUID (``runtime.orphans.ACTOR_NAME``).
A, B, C, D = (f"{i}b1f0c2e-0d4a-4e7b-9c1d-5a6f7e8d9c0b" for i in "1234")


class FakeRay:
    """Actors by name, each answering its calls or hanging; a wait on a hung one takes its whole timeout
    off a fake clock. Records each wait's timeout and who was killed."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.now = 0.0
        self.waits: list[tuple[str, float]] = []
        self.killed: list[str] = []

    def get_actor(self, name: str, namespace: str) -> Any:
        ray = self

        class Method:
            def __init__(self, method: str) -> None:
                self.method = method

            def remote(self) -> tuple[str, str]:
                return (name, self.method)

        class Handle:
            def __getattr__(self, method: str) -> Method:
                return Method(method)

            def __repr__(self) -> str:
                return name

        ray.answers[name]  # noqa: B018 (a KeyError for a name no test made)
        return Handle()

    def get(self, ref: tuple[str, str], timeout: float | None = None) -> Any:
        name, _method = ref
        assert timeout is not None, "every wait on an actor is bounded"
        self.waits.append((name, timeout))
        answer = self.answers[name]
        if answer == HUNG:
            self.now += timeout
            raise GetTimeoutError(f"{name} did not answer within {timeout}s")
        return answer

    def kill(self, handle: Any, **_: Any) -> None:
        self.killed.append(repr(handle))


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install a ``FakeRay`` (over ``ray.get_actor``, ``ray.get``, ``ray.kill``, the namespace's listing and
    the deadlines' clock); the test gives it its actors with ``install(answers)``."""

    def install(answers: dict[str, Any]) -> FakeRay:
        ray = FakeRay(answers)

        @dataclass(frozen=True)
        class FakeClockDeadline(Deadline):
            @classmethod
            def after(cls, seconds: float, clock: Any = None) -> Deadline:
                return cls(ray.now + seconds, seconds)

            def remaining(self, clock: Any = None) -> float:
                return max(0.0, self.at - ray.now)

        monkeypatch.setattr(deploy, "Deadline", FakeClockDeadline)
        monkeypatch.setattr(deploy.ray, "get_actor", ray.get_actor)
        monkeypatch.setattr(deploy.ray, "get", ray.get)
        monkeypatch.setattr(deploy.ray, "kill", ray.kill)
        monkeypatch.setattr(deploy, "_named_in", lambda _namespace: list(answers))
        return ray

    return install


def test_destroying_several_hung_actors_waits_one_bound_in_all_and_kills_every_one(fake_ray: Any) -> None:
    actors = {A: HUNG, B: None, C: HUNG, D: HUNG}
    ray = fake_ray(actors)
    deploy.RayEnv("ns").destroy(list(actors))
    assert ray.now == deploy._CALL_TIMEOUT  # the first hung one used the bound up; the others had what was left
    assert ray.waits == [(A, 30.0), (B, 0.0), (C, 0.0), (D, 0.0)]
    assert ray.killed == list(actors)  # answered or not, every one is killed


def test_a_rebuilding_registry_asks_every_actor_within_one_bound_and_leaves_out_the_hung_ones(fake_ray: Any) -> None:
    info = {"uuid": B, "store": "s", "partitions": [0, 1]}
    ray = fake_ray({A: HUNG, B: info, C: HUNG, "riqr-registry": None})  # the registry itself is not asked
    assert deploy.RayEnv("ns").query_actor_infos() == [info]
    assert ray.now == deploy._CALL_TIMEOUT
    assert [timeout for _name, timeout in ray.waits] == [30.0, 0.0, 0.0]

    where = {"node_id": "n2", "host": "10.0.0.2", "port": 7400}
    ray = fake_ray({"riqr-http-n1": HUNG, "riqr-http-n2": where, "riqr-http-n3": HUNG})
    assert deploy.RayEnv("ns").http_endpoints() == [deploy.Endpoint("n2", "10.0.0.2", 7400)]
    assert ray.now == deploy._CALL_TIMEOUT  # its own bound, once, however many do not answer
