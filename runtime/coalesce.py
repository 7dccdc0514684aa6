"""Request coalescing: concurrent key lookups bound for one owner share one call.

A ``Coalescer`` fronts one owner. ``submit(item)`` queues the item; queued items leave together in one
``send(items)`` call, which returns one result per item in order. While ``max_in_flight`` calls are
outstanding, new items wait and form the next batch, so under load batches grow by themselves and an idle
owner sees a lone request leave at once (no timer, no added latency). A failed call fails exactly the
items it carried.

``submit(item, deadline)`` also bounds the wait: at ``deadline`` (a ``time.monotonic()`` instant) the
waiter gets ``TimeoutError``, whether its item is still queued or its call is out. The coalescer keeps
one timer for all its waiters, armed for the earliest deadline (waiters sit in a heap; those answered
leave it as their batch returns), instead of one ``asyncio.timeout`` per request: the timer is re-armed
about once per deadline period, not per request (docs/design.md, "Where a GET's time goes"). An item
whose waiter timed out before its batch left is not sent.

An owner that neither answers nor fails (a host that hangs, a node gone until Ray declares it dead) holds
its call, and with ``max_in_flight`` reached every waiter behind it, until their deadlines. Given a
``probe``, the coalescer asks it once a call has been out ``probe_after``. One timer serves all calls: a
call that leaves arms it unless it is armed, and when it fires with no call out it lapses, so under load
it is set about once per ``probe_after``, not once per call. An exception the probe returns fails every
waiter of the calls out and of the queue (the owner is silent: its callers answer so at once,
docs/design.md, "Silent owners"); None (the owner answered the probe: it is busy, not gone) lets them
wait on, and it asks again ``probe_after`` later.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """Batches ``submit`` calls into ``send`` calls with at most ``max_in_flight`` outstanding."""

    def __init__(
        self,
        send: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_in_flight: int = 2,
        max_batch: int = 1024,
        on_send: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[float], Awaitable[BaseException | None]] | None = None,
        probe_after: float = math.inf,
    ) -> None:
        if max_in_flight < 1 or max_batch < 1:
            raise ValueError("max_in_flight and max_batch must be at least 1")
        self._send = send
        self._on_send = on_send  # told each call's batch size (the coalesced-batch-size metric)
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._in_flight = 0
        self._scheduled = False
        # The calls in flight, referenced so none is garbage-collected before it answers its waiters.
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # how many send() calls were made (tests read it)
        # Waiters with a deadline, earliest first, and the one timer that expires them.
        self._clock = clock
        self._deadlines: list[tuple[float, int, asyncio.Future[R]]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        # When each call in flight was sent (``busy_for``), and its waiters (failed whole by a probe).
        self._sent_at: list[float] = []
        self._out: dict[int, list[tuple[T, asyncio.Future[R]]]] = {}
        # The probe of calls out long (``probe``): its timer, and whether a probe is under way.
        self._probe = probe
        self._probe_after = probe_after
        self._watch: asyncio.TimerHandle | None = None
        self._probing = False
        self._alive_at = -math.inf  # when the owner last answered a probe

    async def submit(self, item: T, deadline: float | None = None) -> R:
        """The result for ``item``; ``TimeoutError`` if it is not there by ``deadline`` (monotonic seconds)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._order), fut))
            if deadline < self._timer_at:
                self._arm(loop, deadline)
        if not self._scheduled and self._in_flight < self._max_in_flight:
            # Let every request that arrives in this loop iteration join the batch.
            self._scheduled = True
            loop.call_soon(self._dispatch)
        return await fut

    @property
    def timed_waiters(self) -> int:
        """Waiters with a deadline still held for the timer (answered ones leave as their batch returns)."""
        return len(self._deadlines)

    def busy_for(self, now: float | None = None) -> float | None:
        """How long the owner has shown no sign of life while calls are out: since the oldest call in flight
        was sent, or since the owner last answered a probe if that is later (None: no call is out). An
        owner that does not answer shows here before any waiter's deadline comes; one busy with a long call
        that answers its probes does not stay silent for it."""
        if not self._sent_at:
            return None
        return (self._clock() if now is None else now) - max(min(self._sent_at), self._alive_at)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, at - self._clock()), self._expire)

    def _expire(self) -> None:
        """The timer: fail every waiter whose deadline has come, then arm for the next one."""
        self._timer, self._timer_at = None, math.inf
        now = self._clock()
        heap = self._deadlines
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_exception(TimeoutError())
        if heap:
            self._arm(asyncio.get_running_loop(), heap[0][0])

    def _prune(self) -> None:
        """Drop answered waiters from the front of the deadline heap (they leave as their batches return)."""
        heap = self._deadlines
        while heap and heap[0][2].done():
            heapq.heappop(heap)

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._pending and self._in_flight < self._max_in_flight:
            batch = [entry for entry in self._pending[: self._max_batch] if not entry[1].done()]
            del self._pending[: self._max_batch]
            if not batch:
                continue  # every waiter of these timed out (or went away) while queued
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.calls += 1
        if self._on_send is not None:
            self._on_send(len(batch))
        sent = self._clock()
        self._sent_at.append(sent)
        self._out[id(batch)] = batch
        if self._probe is not None and self._watch is None and not self._probing:
            self._watch = asyncio.get_running_loop().call_later(self._probe_after, self._look)
        try:
            results = await self._send([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"send returned {len(results)} results for {len(batch)} items")
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # every waiter must hear about the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        else:
            for (_, fut), result in zip(batch, results):
                if not fut.done():
                    fut.set_result(result)
        finally:
            self._in_flight -= 1
            self._sent_at.remove(sent)
            del self._out[id(batch)]  # the probe's timer stays: it lapses by itself if no call is out then
            self._prune()
            if self._pending:
                self._dispatch()

    def _look(self) -> None:
        """The probe's timer: probe if a call has been out ``probe_after``, else wait for the oldest to be."""
        self._watch = None
        out = self.busy_for()
        if out is None or self._probing:
            return
        loop = asyncio.get_running_loop()
        if out < self._probe_after:
            self._watch = loop.call_later(self._probe_after - out, self._look)
            return
        self._probing = True
        oldest = min(self._sent_at)
        task = loop.create_task(self._probe_owner(oldest, self._clock() - oldest))
        self._tasks.add(task)
        task.add_done_callback(self._probed)

    async def _probe_owner(self, oldest: float, out: float) -> None:
        """Probe the owner of the call sent at ``oldest``, out ``out`` seconds now; fail every waiter if the
        probe says so and that call is still out."""
        assert self._probe is not None
        try:
            verdict = await self._probe(out)
        except Exception:  # a probe that fails says nothing either way: its waiters wait on
            return
        if verdict is None:
            self._alive_at = self._clock()  # busy, not gone: not silent for ``probe_after`` more
            return
        if oldest not in self._sent_at:
            return  # the call it was about answered meanwhile
        waiters = [fut for batch in self._out.values() for _, fut in batch] + [fut for _, fut in self._pending]
        self._pending.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(verdict)
        self._prune()

    def _probed(self, task: asyncio.Task[None]) -> None:
        """A probe ended (whatever its end, a cancel before its first step included): while calls are out,
        look again ``probe_after`` after the probe for the call it was about, or once a newer call sent
        meanwhile has been out that long."""
        self._tasks.discard(task)
        self._probing = False
        if not self._sent_at or self._watch is not None or task.cancelled():
            return
        out = self.busy_for() or 0.0  # since the probe's answer, if it had one
        wait = self._probe_after - out if out < self._probe_after else self._probe_after
        self._watch = asyncio.get_running_loop().call_later(wait, self._look)
