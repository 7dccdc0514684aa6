"""The registry's pings (``runtime.liveness.Pings``): one in flight per actor, silence counted from the
oldest unanswered one, nothing waited for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.liveness import Pings


class Actors:
    """Pings as tokens; ``frozen`` actors answer none, ``gone`` ones cannot be sent one."""

    def __init__(self) -> None:
        self.now = 0.0
        self.frozen: set[str] = set()
        self.gone: set[str] = set()
        self.sent: list[tuple[str, float]] = []
        self.looks = 0

    def send(self, uuid: str) -> Any:
        if uuid in self.gone:
            raise ValueError(f"no actor {uuid}")
        self.sent.append((uuid, self.now))
        return (uuid, len(self.sent))

    def answered(self, refs: Sequence[Any]) -> list[bool]:
        self.looks += 1
        return [ref[0] not in self.frozen for ref in refs]

    def pings(self, every: float = 5.0) -> Pings:
        return Pings(self.send, self.answered, lambda: self.now, every)


def test_an_answering_actor_is_pinged_every_period_and_never_silent() -> None:
    actors = Actors()
    pings = actors.pings()
    for _ in range(12):
        assert pings.silences(["a", "b"]) == {}
        actors.now += 1.0
    # At 0, 5 and 10 s each: one ping a period, not one a look.
    assert [t for u, t in actors.sent if u == "a"] == [0.0, 5.0, 10.0]


def test_silence_counts_from_the_unanswered_ping_and_no_second_one_is_sent() -> None:
    actors = Actors()
    pings = actors.pings()
    pings.silences(["a", "b"])  # both pinged at 0, answered
    actors.now = 5.0
    pings.silences(["a", "b"])  # pinged again at 5
    actors.frozen = {"a"}  # stops answering from here (its ping of 5 s is never answered)
    actors.now = 6.0
    assert pings.silences(["a", "b"]) == {"a": 1.0}
    actors.now = 30.0
    assert pings.silences(["a", "b"]) == {"a": 25.0}
    assert [t for u, t in actors.sent if u == "a"] == [0.0, 5.0]  # one in flight at a time
    actors.frozen = set()  # it runs again: its ping is answered, and it is not silent
    actors.now = 31.0
    assert pings.silences(["a", "b"]) == {}
    assert actors.sent[-1] == ("a", 31.0)  # due since long: a new one at once


def test_forgetting_starts_afresh_and_actors_not_named_are_dropped() -> None:
    actors = Actors()
    pings = actors.pings()
    actors.frozen = {"a"}
    pings.silences(["a"])
    actors.now = 10.0
    assert pings.silences(["a"]) == {"a": 10.0}
    pings.forget("a")  # restarted: the next silence counts from a new ping
    actors.now = 11.0
    assert pings.silences(["a"]) == {}
    actors.now = 12.0
    assert pings.silences(["a"]) == {"a": 1.0}
    assert pings.silences([]) == {}  # no longer in the view: forgotten
    actors.now = 13.0
    assert pings.silences(["a"]) == {}  # pinged anew
    assert actors.sent[-1] == ("a", 13.0)


def test_an_actor_that_cannot_be_reached_is_not_counted_silent() -> None:
    actors = Actors()
    pings = actors.pings()
    actors.gone = {"a"}  # Ray has no such actor (dead, or not created yet): its death is Ray's to report
    for _ in range(3):
        assert pings.silences(["a"]) == {}
        actors.now += 10.0
    actors.gone = set()
    assert pings.silences(["a"]) == {} and actors.sent == [("a", 30.0)]


def test_nothing_in_flight_is_nothing_to_look_at() -> None:
    actors = Actors()
    pings = actors.pings()
    assert pings.silences([]) == {} and actors.looks == 0
