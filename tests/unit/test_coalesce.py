import asyncio
import time

import pytest

from runtime.coalesce import Coalescer


class Recorder:
    def __init__(self, delay: float = 0.0, fail: Exception | None = None) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.fail = fail
        self.in_flight = 0
        self.max_seen = 0
        self.started = asyncio.Event()  # set when a call is in flight
        self.release: asyncio.Event | None = None  # when set up, calls wait for it before answering

    async def send(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.in_flight += 1
        self.max_seen = max(self.max_seen, self.in_flight)
        self.started.set()
        try:
            if self.release is not None:
                await self.release.wait()
            await asyncio.sleep(self.delay)
            if self.fail is not None:
                raise self.fail
            return [i * 10 for i in items]
        finally:
            self.in_flight -= 1


async def test_a_lone_request_leaves_at_once_and_gets_its_answer() -> None:
    rec = Recorder()
    assert await Coalescer(rec.send).submit(4) == 40
    assert rec.batches == [[4]]


async def test_concurrent_requests_share_one_call() -> None:
    rec = Recorder()
    c = Coalescer(rec.send)
    results = await asyncio.gather(*(c.submit(i) for i in range(50)))
    assert results == [i * 10 for i in range(50)]
    assert rec.batches == [list(range(50))]
    assert c.calls == 1


async def test_requests_arriving_while_calls_are_in_flight_form_the_next_batch() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()
    c = Coalescer(rec.send, max_in_flight=1)
    first = asyncio.ensure_future(c.submit(0))
    await rec.started.wait()  # the first call is now in flight, held until released
    rest = [asyncio.ensure_future(c.submit(i)) for i in range(1, 20)]
    rec.release.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [i * 10 for i in range(1, 20)]
    assert rec.batches == [[0], list(range(1, 20))]
    assert rec.max_seen == 1


async def test_in_flight_calls_are_bounded_and_batches_are_capped() -> None:
    rec = Recorder(delay=0.01)
    c = Coalescer(rec.send, max_in_flight=2, max_batch=10)
    results = await asyncio.gather(*(c.submit(i) for i in range(45)))
    assert results == [i * 10 for i in range(45)]
    assert rec.max_seen <= 2
    assert all(len(b) <= 10 for b in rec.batches)
    assert sorted(i for b in rec.batches for i in b) == list(range(45))


async def test_a_failed_call_fails_exactly_its_items() -> None:
    rec = Recorder(fail=ConnectionError("owner gone"))
    c = Coalescer(rec.send)
    results = await asyncio.gather(*(c.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    rec.fail = None
    assert await c.submit(5) == 50


async def test_a_wrong_number_of_results_is_an_error_not_a_misdelivery() -> None:
    async def short(items: list[int]) -> list[int]:
        return items[:-1]

    c = Coalescer(short)
    with pytest.raises(RuntimeError, match="2 results for 3 items"):
        await asyncio.gather(c.submit(1), c.submit(2), c.submit(3))


def test_rejects_bad_limits() -> None:
    with pytest.raises(ValueError):
        Coalescer(Recorder().send, max_in_flight=0)


# -- deadlines: one timer for all waiters ---------------------------------------------------------------


async def test_a_waiter_times_out_at_its_deadline_while_its_call_hangs() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()  # the call never answers until released
    c = Coalescer(rec.send, max_in_flight=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await c.submit(1, deadline=time.monotonic() + 0.05)
    assert loop.time() - started >= 0.04
    untimed = asyncio.ensure_future(c.submit(2))  # no deadline: waits for the answer, however long
    rec.release.set()
    assert await untimed == 20


async def test_waiters_time_out_in_deadline_order_not_submission_order() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()
    c = Coalescer(rec.send, max_in_flight=1)
    now = time.monotonic()
    late = asyncio.ensure_future(c.submit(1, deadline=now + 5))
    soon = asyncio.ensure_future(c.submit(2, deadline=now + 0.03))
    with pytest.raises(TimeoutError):
        await soon
    assert not late.done()
    rec.release.set()
    assert await late == 10


async def test_a_queued_item_whose_waiter_timed_out_is_not_sent() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()
    c = Coalescer(rec.send, max_in_flight=1)
    first = asyncio.ensure_future(c.submit(0))
    await rec.started.wait()
    expired = asyncio.ensure_future(c.submit(1, deadline=time.monotonic() + 0.02))
    kept = asyncio.ensure_future(c.submit(2, deadline=time.monotonic() + 5))
    with pytest.raises(TimeoutError):
        await expired
    rec.release.set()
    assert await first == 0 and await kept == 20
    assert rec.batches == [[0], [2]]


async def test_answered_waiters_leave_the_deadline_heap() -> None:
    rec = Recorder()
    c = Coalescer(rec.send, max_in_flight=1)
    deadline = time.monotonic() + 10
    for _ in range(3):
        assert await asyncio.gather(*(c.submit(i, deadline) for i in range(100))) == [i * 10 for i in range(100)]
    assert c.timed_waiters == 0


async def test_a_deadline_already_past_times_out_at_once() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()
    c = Coalescer(rec.send, max_in_flight=1)
    with pytest.raises(TimeoutError):
        await c.submit(1, deadline=time.monotonic() - 1)
    rec.release.set()


async def test_busy_for_is_how_long_the_oldest_call_in_flight_has_been_out() -> None:
    now = [100.0]
    rec = Recorder()
    rec.release = asyncio.Event()
    c = Coalescer(rec.send, max_in_flight=1, clock=lambda: now[0])
    assert c.busy_for() is None  # nothing out
    waiter = asyncio.create_task(c.submit(1))
    await rec.started.wait()
    now[0] += 2.5
    assert c.busy_for() == 2.5
    rec.release.set()
    assert await waiter == 10
    assert c.busy_for() is None


class Silent(Exception):
    pass


async def test_a_call_out_past_probe_after_fails_its_waiters_and_the_queue_when_the_probe_says_so() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()  # the owner never answers
    probes: list[float] = []

    async def probe(out: float) -> BaseException | None:
        probes.append(out)
        return Silent(f"out {out:.2f}s")

    c = Coalescer(rec.send, max_in_flight=1, probe=probe, probe_after=0.05)
    started = time.monotonic()
    first = asyncio.ensure_future(c.submit(0, time.monotonic() + 10))
    await rec.started.wait()
    queued = asyncio.ensure_future(c.submit(1, time.monotonic() + 10))  # behind it: never sent
    for waiter in (first, queued):
        with pytest.raises(Silent):
            await waiter
    assert time.monotonic() - started < 1 and len(probes) == 1 and probes[0] >= 0.05
    assert rec.batches == [[0]]
    # When the call comes back at last, what queued since leaves.
    later = asyncio.ensure_future(c.submit(2))
    rec.release.set()
    assert await later == 20 and rec.batches == [[0], [2]]


async def test_an_owner_that_answers_the_probe_keeps_its_waiters_and_is_probed_again_while_the_call_is_out() -> None:
    rec = Recorder()
    rec.release = asyncio.Event()
    probes: list[float] = []

    busy: list[float | None] = []

    async def probe(out: float) -> BaseException | None:
        probes.append(out)
        busy.append(c.busy_for())
        if len(probes) == 3:
            rec.release.set()  # busy, not gone: its answer comes
        return None

    c = Coalescer(rec.send, max_in_flight=1, probe=probe, probe_after=0.02)
    assert await c.submit(3, time.monotonic() + 10) == 30
    assert len(probes) == 3 and probes == sorted(probes)  # each the time the call has been out
    # What shows the owner silent counts from its last answer to a probe, not from the call's start.
    # Each probe after the first was answered at least probe_after after the call was sent.
    assert busy[0] is not None and busy[0] >= probes[0], (busy, probes)
    assert all(b is not None and b <= out - 0.019 for b, out in zip(busy[1:], probes[1:])), (busy, probes)
    # No call out: nothing probed, and no timer left behind.
    await asyncio.sleep(0.06)
    assert len(probes) == 3 and c._watch is None


async def test_a_call_that_answers_before_probe_after_is_never_probed() -> None:
    probes: list[float] = []

    async def probe(out: float) -> BaseException | None:
        probes.append(out)
        return Silent()

    c = Coalescer(Recorder(delay=0.01).send, max_in_flight=1, probe=probe, probe_after=0.2)
    for i in range(5):
        assert await c.submit(i, time.monotonic() + 1) == i * 10
    await asyncio.sleep(0.25)
    assert probes == [] and c._watch is None


async def test_a_call_sent_while_the_probe_of_the_one_before_was_out_is_probed_in_its_turn() -> None:
    probes: list[float] = []
    first_back = asyncio.Event()
    hang = asyncio.Event()  # never set: the second call hangs

    async def send(items: list[int]) -> list[int]:
        if items == [0]:
            await asyncio.sleep(0.07)  # back while the probe of it is out
            first_back.set()
            return [0]
        await hang.wait()
        return [i * 10 for i in items]

    async def probe(out: float) -> BaseException | None:
        probes.append(out)
        if len(probes) == 1:
            await first_back.wait()  # a slow ping: the call it is about answers first, and the next leaves
            await asyncio.sleep(0.02)
            return None
        return Silent()

    c = Coalescer(send, max_in_flight=1, probe=probe, probe_after=0.05)
    first = asyncio.ensure_future(c.submit(0, time.monotonic() + 5))
    await asyncio.sleep(0.06)  # the first call is out, its probe under way
    second = asyncio.ensure_future(c.submit(1, time.monotonic() + 5))
    assert await first == 0
    started = time.monotonic()
    with pytest.raises(Silent):  # by the probe of its own call, not at its 5 s deadline
        await second
    assert time.monotonic() - started < 1 and len(probes) == 2
