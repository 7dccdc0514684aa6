import asyncio

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
