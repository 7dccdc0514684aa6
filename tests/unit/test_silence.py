"""Which owners a facade finds silent, and for how long (``runtime.facade.silence``): pure, a fake clock."""

from __future__ import annotations

from runtime.facade.silence import SILENT_AFTER, SILENT_BUDGET, SILENT_MEMORY, Silence, silent_owner


def test_an_owner_is_silent_from_a_missed_call_until_it_answers_or_the_memory_runs_out() -> None:
    now = [100.0]
    silence = Silence(clock=lambda: now[0])
    assert silence.silent_for("a") is None
    silence.missed("a")
    now[0] += 1.0
    assert silence.silent_for("a") == 1.0
    silence.missed("a", silence.silent_for("a"))  # a second miss keeps the first's time
    now[0] += SILENT_MEMORY - 0.5
    assert silence.silent_for("a") == SILENT_MEMORY + 0.5  # within the memory of the last miss
    now[0] += 1.0
    assert silence.silent_for("a") is None  # no miss for SILENT_MEMORY: asked first again
    silence.missed("a")
    silence.heard("a")  # any answer ends it
    assert silence.silent_for("a") is None


def test_a_call_out_for_silent_after_makes_its_owner_silent_before_any_miss() -> None:
    busy = {"a": SILENT_AFTER - 0.1, "b": SILENT_AFTER + 0.5}
    silence = Silence(busy=lambda uuid, _now: busy.get(uuid), clock=lambda: 0.0)
    assert silence.silent_for("a") is None and silence.silent_for("b") == SILENT_AFTER + 0.5
    assert silence.in_order(("b", "a", "c")) == ("a", "c", "b")  # the silent last, the others in order
    b, a = silence.silent_for("b"), silence.silent_for("a")
    assert silence.budget(b, 10.0) == SILENT_BUDGET and silence.budget(a, 10.0) == 10.0
    assert silence.budget(b, 0.2) == 0.2  # never longer than asked


def test_owners_gone_from_the_view_are_forgotten_and_the_503_names_what_it_is_about() -> None:
    silence = Silence(clock=lambda: 0.0)
    silence.missed("a")
    silence.missed("b")
    silence.keep_only(["b"])
    assert silence.silent_for("a") is None and silence.silent_for("b") == 0.0
    one = silent_owner("b", "s", [3], 2.5)
    assert (one.status, one.code, one.details["partition"], one.details["retry_after"]) == (
        503,
        "owner-unavailable",
        3,
        1,
    )
    assert "for 2.5s" in one.message and "partition 3 of store s" in one.message
    assert "partition" not in silent_owner("b", "s", [1, 2], 2.5).details


def test_a_slow_owner_is_asked_after_the_others_but_keeps_its_whole_budget_until_it_answers() -> None:
    now = [0.0]
    silence = Silence(clock=lambda: now[0])
    silence.slow("a")  # a scan to it outlasted its deadline
    assert silence.in_order(("a", "b")) == ("b", "a")
    assert silence.silent_for("a") is None and silence.budget(silence.silent_for("a"), 10.0) == 10.0
    now[0] += SILENT_MEMORY
    assert silence.in_order(("a", "b")) == ("a", "b")  # forgotten after a while
    silence.slow("a")
    silence.heard("a")  # or at its first answer
    assert silence.in_order(("a", "b")) == ("a", "b")
    # A ping it answered while a lookup's call was out says it is alive, not that it is quick: a miss is
    # forgotten, its slowness for scans is not.
    silence.slow("a")
    silence.missed("a")
    silence.pinged("a")
    assert silence.silent_for("a") is None and silence.in_order(("a", "b")) == ("b", "a")


# -- a long call: a ping says whether its owner is there (answer_or_silence) ---------------------------------


def _race(call_seconds: float, ping: str, deadline: float) -> tuple[str, list[str]]:
    """``answer_or_silence`` with SILENT_AFTER and SILENT_BUDGET at 0.05 s, a call of ``call_seconds`` and a
    ping that ``answers``, ``hangs``, ``fails`` (gone) or ``breaks`` (any other error): its outcome, and what
    happened in order."""
    import asyncio

    import pytest

    from runtime.deadline import Deadline
    from runtime.errors import DeadlineExceeded, OwnerUnavailable
    from runtime.facade import silence

    events: list[str] = []

    async def call() -> str:
        try:
            await asyncio.sleep(call_seconds)
        except asyncio.CancelledError:
            events.append("call cancelled")
            raise
        return "answer"

    async def pinged() -> bool:
        events.append("ping")
        if ping == "hangs":
            await asyncio.sleep(60)
        if ping == "fails":
            raise OwnerUnavailable("gone")
        if ping == "breaks":  # an actor of an older riqr, without ``ping``
            raise AttributeError("'QueryVerticle' object has no attribute 'ping'")
        return True

    async def run() -> str:
        try:
            return await silence.answer_or_silence(Deadline.after(deadline), call(), pinged, "scan")
        except silence.NoPing as err:
            assert err.silent >= 0.05  # the call was out SILENT_AFTER at least
            await asyncio.sleep(0.01)  # the call's cancellation lands
            return "no ping"
        except DeadlineExceeded:
            return "504"

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(silence, "SILENT_AFTER", 0.05)
        patch.setattr(silence, "SILENT_BUDGET", 0.05)
        return asyncio.run(run()), events


def test_a_call_answered_before_silent_after_asks_no_ping() -> None:
    assert _race(0.01, "hangs", 5.0) == ("answer", [])


def test_a_long_call_whose_owner_answers_a_ping_is_awaited_to_its_answer_or_deadline() -> None:
    assert _race(0.3, "answers", 5.0) == ("answer", ["ping"])
    assert _race(5.0, "answers", 0.4) == ("504", ["ping", "call cancelled"])


def test_a_long_call_whose_owner_answers_no_ping_is_cancelled_as_silent() -> None:
    assert _race(5.0, "hangs", 5.0) == ("no ping", ["ping", "call cancelled"])
    assert _race(5.0, "fails", 5.0) == ("no ping", ["ping", "call cancelled"])


def test_a_deadline_too_close_for_a_ping_to_matter_is_awaited_as_it_is() -> None:
    assert _race(5.0, "hangs", 0.08) == ("504", ["call cancelled"])


def test_an_answer_that_comes_while_the_ping_is_out_is_taken_whatever_the_ping_does() -> None:
    assert _race(0.07, "hangs", 5.0) == ("answer", ["ping"])


def test_a_ping_that_fails_otherwise_than_by_gone_says_nothing_and_the_call_is_awaited() -> None:
    assert _race(0.3, "breaks", 5.0) == ("answer", ["ping"])


def test_forgetting_owners_while_other_threads_record_misses_never_raises() -> None:
    """The driver API's callers record misses from their own threads while the loop thread forgets the
    owners a new view lacks: iterating the dict there raised "dictionary changed size during iteration",
    which skipped the view's other listeners."""
    import sys
    import threading
    import time

    silence = Silence()
    done = threading.Event()

    def record() -> None:
        n = 0
        while not done.is_set():
            silence.missed(f"u{n % 5000}")
            n += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer = threading.Thread(target=record)
    writer.start()
    try:
        kept = [f"u{j}" for j in range(0, 5000, 2)]
        ends = time.monotonic() + 1.0
        while time.monotonic() < ends:
            silence.keep_only(kept)
    finally:
        done.set()
        writer.join()
        sys.setswitchinterval(interval)
