"""The one adapter from Ray's failures to riqr's errors (Ray's exception classes, no Ray started)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    ActorUnschedulableError,
    GetTimeoutError,
    RayTaskError,
)

from runtime import raycalls
from runtime.deadline import Deadline
from runtime.errors import DeadlineExceeded, InternalError, OwnerUnavailable, StoreConflict


def test_a_riqr_error_raised_in_an_actor_comes_back_as_itself() -> None:
    conflict = StoreConflict("store 's' already exists", store="s")
    wrapped = RayTaskError("create_store", "traceback", conflict)
    assert raycalls.translate(wrapped, "create_store") == conflict


def test_any_other_error_inside_an_actor_is_an_internal_error() -> None:
    err = raycalls.translate(RayTaskError("scan", "traceback", KeyError("x")), "scan", actor="a1")
    assert isinstance(err, InternalError) and err.status == 500 and err.details == {"actor": "a1"}


def test_restarting_dead_and_late_actors() -> None:
    restarting = raycalls.translate(ActorUnavailableError("restarting", None), "get", actor="a1")
    assert isinstance(restarting, OwnerUnavailable) and restarting.details["retry_after"] == 1
    dead = raycalls.translate(ActorDiedError(), "get", actor="a1")
    assert isinstance(dead, OwnerUnavailable) and dead.details["retry_after"] == 5
    assert isinstance(raycalls.translate(GetTimeoutError("late"), "get"), DeadlineExceeded)
    # Pinned to a node that died: unavailable until the registry re-creates it elsewhere.
    orphan = raycalls.translate(ActorUnschedulableError("node gone"), "apply", actor="a1")
    assert isinstance(orphan, OwnerUnavailable) and orphan.details["retry_after"] == 1


def test_an_actor_whose_constructor_raised_says_what_it_raised() -> None:
    """The registry's "could not create query actor X again" said only "the actor died": the cause was in
    the new actor's worker log, on whichever node it ran (an operations run)."""
    traceback = (
        'ray::QueryActor.__init__() (pid=4242, ip=10.0.0.2)\n  File "runtime/query.py", line 90, in __init__\n'
        "    raise OSError(28, 'No space left on device')\nOSError: [Errno 28] No space left on device\n"
    )
    cause = RayTaskError("QueryActor.__init__", traceback, OSError(28, "No space left on device"))
    err = raycalls.translate(ActorDiedError(cause), "re-creating query actor a1", actor="a1")
    assert isinstance(err, OwnerUnavailable)
    assert err.message.endswith("the actor died: its constructor raised OSError: [Errno 28] No space left on device")
    long = RayTaskError("QueryActor.__init__", "ValueError: " + "x" * 1000, ValueError("x"))
    assert len(raycalls.translate(ActorDiedError(long), "re-creating").message) < 400
    assert raycalls.translate(ActorDiedError(), "get").message == "get: the actor died"  # any other death


def test_errors_that_are_not_rays_are_not_swallowed() -> None:
    with pytest.raises(ZeroDivisionError):
        raycalls.translate(ZeroDivisionError(), "get")


class Flaky:
    """A call that says "restarting" ``failures`` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise ActorUnavailableError("restarting", None)
        return "answer"


async def test_a_restarting_actor_is_called_again_within_the_deadline() -> None:
    flaky = Flaky(failures=3)
    told: list[str] = []
    answer = await raycalls.call(flaky, "get", deadline=Deadline.after(5), on_restarting=lambda: told.append("x"))
    assert answer == "answer" and flaky.calls == 4
    assert told == ["x"]  # said once, when first found restarting, not at every retry


async def test_past_the_deadline_a_restarting_actor_is_a_503() -> None:
    flaky = Flaky(failures=1_000_000)
    with pytest.raises(OwnerUnavailable):
        await raycalls.call(flaky, "get", deadline=Deadline.after(0.1))
    assert flaky.calls >= 2


async def test_a_dead_actor_is_not_retried() -> None:
    calls = []

    async def dead() -> None:
        calls.append(1)
        raise ActorDiedError()

    with pytest.raises(OwnerUnavailable):
        await raycalls.call(dead, "get", deadline=Deadline.after(5))
    assert calls == [1]


def test_the_deadline_value() -> None:
    now = [100.0]
    deadline = Deadline.after(2.0, clock=lambda: now[0])
    assert deadline.remaining(clock=lambda: now[0]) == 2.0
    now[0] = 103.0
    assert deadline.remaining(clock=lambda: now[0]) == 0.0
    assert "2s" in deadline.exceeded("scan").message


async def test_within_turns_a_timeout_into_a_504() -> None:
    with pytest.raises(DeadlineExceeded, match="slow thing"):
        from runtime.deadline import within

        await within(Deadline.after(0.01), asyncio.sleep(1), "slow thing")
