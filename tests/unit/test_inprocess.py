"""The driver API's in-process facade (runtime.facade.inprocess): the thread coalescer, the shared marks,
and key lookups from plain threads and other event loops over the fake bus."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from runtime.errors import KeyNotFound, OwnerUnavailable, StoreNotFound
from runtime.facade.inprocess import InProcessFacade, LockedMarks, ThreadCoalescer
from runtime.monotonic import Spans
from runtime.queries import KeyQuery, RangeQuery
from tests.integration.helpers import wait_for
from tests.unit.fakes import FakeBus, kv_spec


def test_a_lone_lookup_leaves_at_once_in_its_own_thread() -> None:
    threads: list[str] = []

    def send(items: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return [i * 2 for i in items]

    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    assert batcher.submit(21) == 42
    assert batcher.calls == 1 and threads == [threading.current_thread().name]


def _held_first_call() -> tuple[threading.Event, list[list[int]], Callable[[list[int]], list[int]]]:
    """A ``send`` that doubles its items, records each batch, and holds the first call until released."""
    release = threading.Event()
    batches: list[list[int]] = []

    def send(items: list[int]) -> list[int]:
        batches.append(list(items))
        if len(batches) == 1:
            release.wait(10)
        return [i * 2 for i in items]

    return release, batches, send


def test_lookups_arriving_while_a_call_is_in_flight_leave_together_in_the_next() -> None:
    release, batches, send = _held_first_call()

    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    results: dict[int, int] = {}

    def lookup(i: int) -> None:
        results[i] = batcher.submit(i)

    first = threading.Thread(target=lookup, args=(0,))
    first.start()
    wait_for(lambda: batches, timeout=10, what="the first call in flight", interval=0.001)
    others = [threading.Thread(target=lookup, args=(i,)) for i in range(1, 9)]
    for t in others:
        t.start()
    wait_for(lambda: len(batcher._pending) == 8, timeout=10, what="eight lookups queued", interval=0.001)  # noqa: SLF001
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert results == {i: i * 2 for i in range(9)}
    assert batches[0] == [0] and sorted(batches[1]) == list(range(1, 9)) and batcher.calls == 2


def test_a_failed_call_fails_exactly_its_items() -> None:
    def send(items: list[int]) -> list[int]:
        if -1 in items:
            raise OwnerUnavailable("down", retry_after=1)
        return items

    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    with pytest.raises(OwnerUnavailable):
        batcher.submit(-1)
    assert batcher.submit(5) == 5  # the coalescer is not left busy


class _Interrupted(threading.Event):
    """A waiter's event whose ``wait`` raises KeyboardInterrupt (Ctrl-C in that thread): at once, or only
    once woken (the thread was chosen to send the next batch)."""

    def __init__(self, *, when_woken: bool) -> None:
        super().__init__()
        self.when_woken = when_woken

    def wait(self, timeout: float | None = None) -> bool:
        if self.when_woken:
            super().wait(timeout)
        raise KeyboardInterrupt


@pytest.mark.parametrize("when_woken", [False, True], ids=["while-queued", "once-chosen-to-send"])
def test_a_waiter_interrupted_leaves_without_stalling_the_owner(monkeypatch, when_woken: bool) -> None:  # type: ignore[no-untyped-def]
    """A Ctrl-C while queued left the slot in the queue; picked to send the next batch, it sent nothing, and
    every lookup of that owner, then and later, waited for ever."""
    from runtime.facade import inprocess

    release, batches, send = _held_first_call()

    class Slot(inprocess._Slot):  # type: ignore[type-arg]  # noqa: SLF001
        def __init__(self, item: int) -> None:
            super().__init__(item)
            if item == 2:
                self.done = _Interrupted(when_woken=when_woken)

    monkeypatch.setattr(inprocess, "_Slot", Slot)
    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    results: dict[int, int] = {}
    interrupted: list[int] = []

    def lookup(i: int) -> None:
        try:
            results[i] = batcher.submit(i)
        except KeyboardInterrupt:
            interrupted.append(i)

    first = threading.Thread(target=lookup, args=(1,))
    first.start()
    wait_for(lambda: batches, timeout=10, what="the first call in flight", interval=0.001)
    queued = threading.Thread(target=lookup, args=(2,))
    queued.start()
    if not when_woken:
        queued.join(10)
        assert interrupted == [2] and not batcher._pending  # noqa: SLF001
    else:
        wait_for(lambda: len(batcher._pending) == 1, timeout=10, what="2 queued", interval=0.001)  # noqa: SLF001
    behind = threading.Thread(target=lookup, args=(3,))
    behind.start()
    wait_for(lambda: any(s.item == 3 for s in batcher._pending), timeout=10, what="3 queued", interval=0.001)  # noqa: SLF001
    release.set()
    for t in (first, queued, behind):
        t.join(10)
        assert not t.is_alive()
    assert interrupted == [2] and results == {1: 2, 3: 6}
    assert batcher.submit(4) == 8 and not batcher._busy  # noqa: SLF001
    assert [2 in batch for batch in batches] == [False] * len(batches)  # its item was never sent


def test_a_waiter_out_of_time_leaves_the_queue_and_its_item_is_not_sent() -> None:
    release, batches, send = _held_first_call()
    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    first = threading.Thread(target=batcher.submit, args=(1,))
    first.start()
    wait_for(lambda: batches, timeout=10, what="the first call in flight", interval=0.001)
    with pytest.raises(TimeoutError):
        batcher.submit(2, timeout=0.05)
    assert not batcher._pending  # noqa: SLF001
    release.set()
    first.join(10)
    assert batcher.submit(3, timeout=5) == 6 and batches == [[1], [3]]


def test_two_waiters_of_one_batch_leaving_do_not_leave_the_owner_busy_for_good(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The call in flight chose [1, 2] as the next batch, and both callers' time ran out before 1 (its
    sender) was woken: 2 left first (carried by the batch, not queued), then 1 put the batch back with 2 in
    it, 2 was chosen to send, never sent, and every later lookup of the owner waited out its whole time."""
    import time

    from runtime.facade import inprocess

    class SlowWake(threading.Event):
        def set(self) -> None:  # the sending thread descheduled between choosing 1 and waking it
            time.sleep(0.3)
            super().set()

    class Slot(inprocess._Slot):  # type: ignore[type-arg]  # noqa: SLF001
        __slots__ = ()

        def __init__(self, item: int) -> None:
            super().__init__(item)
            if item == 1:
                self.done = SlowWake()

    monkeypatch.setattr(inprocess, "_Slot", Slot)
    release, batches, send = _held_first_call()
    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    outcomes: dict[int, object] = {}

    def call(i: int, timeout: float | None) -> None:
        try:
            outcomes[i] = batcher.submit(i, timeout)
        except TimeoutError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=call, args=(0, None))]
    threads[0].start()
    wait_for(lambda: batches, timeout=10, what="the first call in flight", interval=0.001)
    for i, timeout in ((1, 0.25), (2, 0.2)):
        threads.append(threading.Thread(target=call, args=(i, timeout)))
        threads[-1].start()
    wait_for(lambda: len(batcher._pending) == 2, timeout=10, what="1 and 2 queued", interval=0.001)  # noqa: SLF001
    release.set()
    for t in threads:
        t.join(10)
    assert outcomes[0] == 0 and isinstance(outcomes[1], TimeoutError) and isinstance(outcomes[2], TimeoutError)
    assert not batcher._busy and not batcher._pending  # noqa: SLF001
    assert batcher.submit(3, timeout=1.0) == 6


@pytest.mark.parametrize("where", ["before-its-call", "in-its-call"])
def test_a_sender_interrupted_hands_its_batch_on_and_raises_its_ctrl_c_alone(monkeypatch, where: str) -> None:  # type: ignore[no-untyped-def]
    """The thread woken to send [2, 3] gets Ctrl-C: before its call began, the batch was never sent nor
    handed on (3 waited for ever); in its call, 3's caller got the KeyboardInterrupt of 2's thread."""
    release, batches, held = _held_first_call()

    def send(items: list[int]) -> list[int]:
        if where == "in-its-call" and items[0] == 2:
            batches.append(list(items))
            raise KeyboardInterrupt
        return held(items)

    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(send)
    if where == "before-its-call":
        real_run = ThreadCoalescer._run

        def run(self: ThreadCoalescer[int, int], batch: list[Any]) -> None:
            if batch[0].item == 2:
                raise KeyboardInterrupt  # between its wake-up and its call
            real_run(self, batch)

        monkeypatch.setattr(ThreadCoalescer, "_run", run)
    outcomes: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            outcomes[i] = batcher.submit(i, 10)
        except BaseException as err:  # noqa: BLE001 - what each caller gets is the point
            outcomes[i] = err

    threads = [threading.Thread(target=call, args=(1,))]
    threads[0].start()
    wait_for(lambda: batches, timeout=10, what="the first call in flight", interval=0.001)
    for i in (2, 3):
        threads.append(threading.Thread(target=call, args=(i,)))
        threads[-1].start()
        wait_for(lambda: len(batcher._pending) == i - 1, timeout=10, what=f"{i} queued", interval=0.001)  # noqa: SLF001, B023
    release.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert outcomes[1] == 2 and isinstance(outcomes[2], KeyboardInterrupt)
    if where == "before-its-call":
        assert outcomes[3] == 6 and batches[-1] == [3]  # sent on by 3 itself
    else:
        assert isinstance(outcomes[3], TimeoutError)  # asks again (the fast path: through the loop's facade)
    assert not batcher._busy and batcher.submit(4, 1) == 8  # noqa: SLF001


def test_many_threads_get_their_own_answers() -> None:
    batcher: ThreadCoalescer[int, int] = ThreadCoalescer(lambda items: [i + 1 for i in items], max_batch=3)
    results: dict[int, list[int]] = {}

    def run(t: int) -> None:
        results[t] = [batcher.submit(t * 1000 + i) for i in range(200)]

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {t: [t * 1000 + i + 1 for i in range(200)] for t in range(8)}


def test_locked_marks_admit_as_marks_do_and_never_move_back_under_threads() -> None:
    marks = LockedMarks()
    assert marks.admit("s", 0, ("q", 3, 3), active=True)
    assert not marks.admit("s", 0, ("q", 2, 2), active=True)

    def climb(offset: int) -> None:
        for b in range(offset, 2000, 4):
            marks.admit("s", 1, ("q", b, b), active=True)

    threads = [threading.Thread(target=climb, args=(o,)) for o in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    mark = marks.get("s", 1)
    assert mark is not None and mark.batch == 1999
    marks.forget("s")
    assert marks.stores() == set()


# -- the in-process facade over the fake bus ------------------------------------------------------------


class BlockingFake:
    """A fake owner's blocking form, as ``verticles.bus.RayOwner.get_many_blocking`` is."""

    def __init__(self, bus: FakeBus, uuid: str) -> None:
        self.bus = bus
        self.uuid = uuid
        self.calls = 0

    def get_many_blocking(self, items: list[tuple[int, Any]], timeout: float) -> tuple[Sequence[bytes | None], Spans]:
        self.calls += 1
        owner = self.bus.owners[self.uuid]
        if owner.down:
            raise OwnerUnavailable("fake owner is down", retry_after=1)
        return owner.core.get_many(items)


@pytest.fixture
def replicated() -> Iterator[tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]]]:
    bus = FakeBus()
    bus.create_store(kv_spec("r", standbys=1))
    bus.load("r", {f"k{i:03d}": f"v{i}" for i in range(100)})
    blocking: dict[str, BlockingFake] = {}

    def owner(uuid: str) -> BlockingFake:
        return blocking.setdefault(uuid, BlockingFake(bus, uuid))

    facade = InProcessFacade(bus, owner, timeout=2.0)
    yield bus, facade, blocking
    facade.close()


def _copies(facade: InProcessFacade, key: str) -> tuple[str, str, int]:
    table = facade.core.view.table("r")
    assert table is not None
    owners = table.partitions[table.partition_of(key)]
    assert owners.active is not None
    return owners.active, owners.standbys[0], table.partition_of(key)


def test_sync_lookups_go_to_the_owner_from_the_calling_thread(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]],
) -> None:
    bus, facade, blocking = replicated
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"  # the first starts the view on the loop
    active, _, _ = _copies(facade, "k007")
    asked = bus.owners[active].calls.count("get_many")
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    assert blocking[active].calls == 1 and bus.owners[active].calls.count("get_many") == asked  # not the loop's
    with pytest.raises(KeyNotFound):
        facade.get(KeyQuery("r", "nope"), 5.0)
    with pytest.raises(StoreNotFound):
        facade.get(KeyQuery("missing", "k1"), 5.0)


def test_async_lookups_from_any_event_loop(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]],
) -> None:
    _, facade, _ = replicated

    async def lookups() -> list[Any]:
        return await asyncio.gather(*(facade.get_async(KeyQuery("r", f"k{i:03d}"), 5.0) for i in range(20)))

    for _ in range(2):  # two loops, one after the other, as asyncio.run callers do
        assert asyncio.run(lookups()) == [f"v{i}" for i in range(20)]
    with pytest.raises(KeyNotFound):
        asyncio.run(facade.get_async(KeyQuery("r", "nope"), 5.0))


def test_a_down_active_fails_over_to_the_standby_and_is_reported(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]],
) -> None:
    bus, facade, blocking = replicated
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    active, standby, _ = _copies(facade, "k007")
    bus.owners[active].down = True
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    assert "get_many" in bus.owners[standby].calls and bus.suspected == [active]


def test_the_fast_path_leaves_an_owner_the_loops_facade_found_silent_to_the_loop(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]],
) -> None:
    bus, facade, blocking = replicated
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    active, standby, _ = _copies(facade, "k007")
    bus.owners[active].down = True
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"  # failed over: the active is remembered silent
    asked = blocking[active].calls
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    assert blocking[active].calls == asked  # not asked again in the caller's thread, with its 1 s wait


def test_the_fast_path_never_serves_a_copy_older_than_what_was_served(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.facade import silence

    monkeypatch.setattr(silence, "SILENT_MEMORY", 0.0)  # the active back at once is asked first again
    bus, facade, blocking = replicated
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    active, standby, _ = _copies(facade, "k007")
    bus.load("r", {"k007": "new"}, batch_id=1, role="standby")  # a delivery halfway: standbys go first
    bus.owners[active].down = True
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "new"  # failed over, at batch 1
    bus.owners[active].down = False
    fast = blocking[active].calls
    assert facade.get(KeyQuery("r", "k007"), 5.0) == "new"  # the active (batch 0) answered fast: refused
    assert blocking[active].calls == fast + 1


def test_a_budget_shorter_than_the_fast_paths_wait_is_kept_on_the_fast_path(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path waited up to a second for a slow owner whatever the caller's budget: ``connect(timeout=0.2)``
    and an owner taking 0.9 s answered after 0.9 s. It waits no longer than the caller may now."""
    import time

    from runtime.errors import DeadlineExceeded

    bus, facade, blocking = replicated
    for _ in range(2):  # the second on the fast path
        assert facade.get(KeyQuery("r", "k007"), 5.0) == "v7"
    active, standby, _ = _copies(facade, "k007")

    def slow(items: list[tuple[int, Any]], timeout: float) -> Any:  # as RayOwner's: ray.get(timeout=)
        time.sleep(min(0.9, timeout))
        if timeout < 0.9:
            raise DeadlineExceeded("a key lookup did not answer in time")
        return bus.owners[active].core.get_many(items)

    monkeypatch.setattr(blocking[active], "get_many_blocking", slow)
    for owner in (active, standby):  # the loop's facade finds both copies as slow
        bus.owners[owner].stall = 0.9
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        facade.get(KeyQuery("r", "k007"), 0.2)
    assert time.monotonic() - started < 0.85  # the owner's 0.9 s not waited for
    assert not facade.core.router.silence.remembered(active)  # out of the caller's time: not the owner's silence
    for owner in (active, standby):
        bus.owners[owner].stall = 0.0
    monkeypatch.undo()
    calls = blocking[active].calls
    assert facade.get(KeyQuery("r", "k007"), 0.5) == "v7"  # a short budget still takes the fast path
    assert blocking[active].calls == calls + 1


def test_no_time_left_is_a_deadline_exceeded(
    replicated: tuple[FakeBus, InProcessFacade, dict[str, BlockingFake]],
) -> None:
    from runtime.errors import DeadlineExceeded

    _, facade, _ = replicated
    with pytest.raises(DeadlineExceeded):
        facade.get(KeyQuery("r", "k007"), 0.0)


def test_a_loop_thread_runs_its_loop_once_made_and_closing_it_at_once_stops_it() -> None:
    """An in-process facade calls itself closed when its loop is not running, so the loop must run from
    the moment the thread is made: a facade used at once (a client's first ``iterate``) was once refused
    with NotConnected. Closing right after making it must stop the thread too, not leave it running."""
    import sys

    from runtime.facade.inprocess import LoopThread

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads trade the interpreter as often as they can: the race shows
    try:
        for i in range(300):
            made = LoopThread(f"riqr-test-loop-{i}")
            assert made.loop.is_running()
            made.close()
            assert not made.loop.is_running()
            assert not made._thread.is_alive()
    finally:
        sys.setswitchinterval(interval)


def test_a_closed_facade_refuses_at_once_rather_than_never_answering(replicated) -> None:  # type: ignore[no-untyped-def]
    """``get_async`` on a facade that ``close_in_process_facades`` stopped scheduled its lookup on a loop that
    never runs again, and its caller awaited forever; the blocking forms waited out their deadline."""
    from runtime.errors import NotConnected

    bus, facade, _ = replicated
    assert facade.get(KeyQuery("r", "k001"), 2.0) == "v1" and not facade.closed
    facade.close()
    assert facade.closed

    async def lookup() -> Any:
        return await asyncio.wait_for(facade.get_async(KeyQuery("r", "k001"), 2.0), 10)

    with pytest.raises(NotConnected, match="closed"):
        asyncio.run(lookup())
    with pytest.raises(NotConnected, match="closed"):
        list(facade.chunks(lambda core: core.entry_chunks(RangeQuery("r"))))


def test_a_lookup_says_what_it_reflects_found_or_not(replicated) -> None:  # type: ignore[no-untyped-def]
    """The driver API's answer to "every answer can say what it reflects": the value with its position,
    as REST's X-Riqr-Position; absent, the KeyNotFound carries it."""
    from runtime.partitioner import partition_of

    _, facade, _ = replicated
    value, position = facade.lookup(KeyQuery("r", "k001"), 2.0)
    assert value == "v1"
    assert position == f"partition={partition_of(kv_spec('r').key.type, 'k001', 4)}; source=q; batch=0"
    with pytest.raises(KeyNotFound) as missing:
        facade.lookup(KeyQuery("r", "nope"), 2.0)
    assert missing.value.position == f"partition={partition_of(kv_spec('r').key.type, 'nope', 4)}; source=q; batch=0"

    async def both() -> Any:
        return await facade.lookup_async(KeyQuery("r", "k002"), 2.0)

    assert asyncio.run(both()) == (
        "v2",
        f"partition={partition_of(kv_spec('r').key.type, 'k002', 4)}; source=q; batch=0",
    )
