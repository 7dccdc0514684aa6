"""Request coalescing: concurrent key lookups bound for one owner share one call.

A ``Coalescer`` fronts one owner. ``submit(item)`` queues the item; queued items leave together in one
``send(items)`` call, which returns one result per item in order. While ``max_in_flight`` calls are
outstanding, new items wait and form the next batch, so under load batches grow by themselves and an idle
owner sees a lone request leave at once (no timer, no added latency). A failed call fails exactly the
items it carried.
"""

from __future__ import annotations

import asyncio
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

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if not self._scheduled and self._in_flight < self._max_in_flight:
            # Let every request that arrives in this loop iteration join the batch.
            self._scheduled = True
            loop.call_soon(self._dispatch)
        return await fut

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._pending and self._in_flight < self._max_in_flight:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.calls += 1
        if self._on_send is not None:
            self._on_send(len(batch))
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
            if self._pending:
                self._dispatch()
