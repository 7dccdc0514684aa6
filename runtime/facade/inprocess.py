"""The facade core run inside the caller's process: the Python driver API's key lookups in one Ray hop,
and ``Store.iterate``'s stream merged here from the owners' pages (``InProcessFacade.chunks``).

The driver API used to send every query to the facade verticle of its node, which asked the owner: two
Ray hops. For key lookups the client now runs the same ``Facade`` in its own process, with the same
``Bus`` (``verticles.bus.RayBus``), and calls the query actors itself:

* **One loop thread per process and namespace** (``LoopThread``) runs the ``Facade``: the cached view
  with the registry long poll (``ViewCache``), per-owner coalescing, failover to standbys within the
  deadline, suspect reports and the monotonic marks. ``get_async`` callers and the slow path of
  ``get`` hand their lookup to it (``asyncio.run_coroutine_threadsafe``), so they work from any thread
  and any event loop, as the client's callers (plain threads, Spark driver code, ``asyncio.run``) need.
* **A blocking fast path** for sync ``get``: the calling thread resolves the owner from the same cached
  view, binds the key, and makes the call to the active owner itself (``ray.get`` in that thread),
  coalesced with the other threads' lookups for that owner (``ThreadCoalescer``). Handing a sync call
  to a loop thread and back costs two thread wake-ups, about as much as the Ray call itself on a small
  machine (docs/benchmarks.md), so only what needs the loop goes there: whenever the fast path cannot
  answer (no view yet, an unknown store, no owner, the owner failed or was slower than
  ``FAILOVER_AFTER``, its copy is older than what this process served), the lookup goes to the loop's
  ``Facade``, which fails over, waits for a copy to catch up, and reports the owner, under the
  request deadline. Everything the fast path answers is admitted by the same marks (``LockedMarks``,
  which the threads and the loop share), so reads stay monotonic per process.

Nothing here imports Ray: the owners' blocking call comes in as ``BlockingOwner``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from runtime.bus import Bus
from runtime.codec import decode_value, to_jsonable
from runtime.config import DEFAULT_REQUEST_TIMEOUT
from runtime.deadline import Deadline, within
from runtime.errors import DeadlineExceeded, KeyNotFound, NotConnected, OwnerUnavailable, RiqrError
from runtime.facade import Facade
from runtime.facade.routing import FAILOVER_AFTER
from runtime.monotonic import Mark, Marks, Span, Spans
from runtime.ownership import Route
from runtime.queries import KeyQuery, bind_key
from runtime.windows import require_kind

__all__ = ["InProcessFacade", "BlockingOwner", "ThreadCoalescer", "LockedMarks", "LoopThread"]

T = TypeVar("T")
R = TypeVar("R")

Answer = tuple[bytes | None, Span]


class BlockingOwner(Protocol):
    """A query actor called from a plain thread."""

    def get_many_blocking(self, items: list[tuple[int, Any]], timeout: float) -> tuple[Sequence[bytes | None], Spans]:
        """``OwnerClient.get_many``, blocking for at most ``timeout`` seconds; riqr's errors on failure
        (``DeadlineExceeded`` when it did not answer in time), no retry."""
        ...


class LockedMarks(Marks):
    """``Marks`` shared by threads: the fast path's callers and the loop thread decide under one lock,
    so a mark never moves back when two answers are admitted at once."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._lock = threading.RLock()

    def get(self, store: str, partition: int) -> Mark | None:
        with self._lock:
            return super().get(store, partition)

    def admit(self, store: str, partition: int, span: Span, *, active: bool) -> bool:
        with self._lock:
            return super().admit(store, partition, span, active=active)

    def admit_all(self, store: str, spans: Spans, active: frozenset[int] | set[int]) -> list[int]:
        with self._lock:
            return super().admit_all(store, spans, active)

    def forget(self, store: str) -> None:
        with self._lock:
            super().forget(store)

    def stores(self) -> set[str]:
        with self._lock:
            return super().stores()


class _Slot(Generic[T, R]):
    __slots__ = ("item", "done", "result", "error", "batch", "left")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = threading.Event()
        self.result: R | None = None
        self.error: BaseException | None = None
        self.batch: list[_Slot[T, R]] | None = None  # set when this slot's thread is to send a batch
        self.left = False  # its caller stopped waiting (out of time, interrupted): never chosen to send

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class ThreadCoalescer(Generic[T, R]):
    """``runtime.coalesce.Coalescer`` for blocking callers: concurrent ``submit`` calls from plain threads
    bound for one owner share one ``send`` call, with one call in flight.

    The first caller finding no call in flight sends its item at once (an idle owner adds no latency).
    Callers arriving while a call is in flight queue; when it returns, the first of them is woken to send
    everything queued as the next batch, in its own thread, so no thread of riqr's own sits in between.
    A failed call fails exactly the items it carried.
    """

    def __init__(
        self,
        send: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 1024,
        on_send: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._send = send
        self._max_batch = max_batch
        self._on_send = on_send
        self._lock = threading.Lock()
        self._pending: list[_Slot[T, R]] = []
        self._busy = False
        self.calls = 0  # how many send() calls were made (tests read it)

    def submit(self, item: T, timeout: float | None = None) -> R:
        """``item``'s result. ``timeout``: how long to wait queued behind the call in flight, after which
        ``TimeoutError`` (the item is then not sent, or its answer not waited for)."""
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            if self._busy:
                self._pending.append(slot)
            else:
                self._busy = True
                slot.batch = [slot]
        if slot.batch is None:
            try:
                woken = slot.done.wait(timeout)
            except BaseException:  # Ctrl-C in the caller's thread: it leaves, and nobody waits for it
                self._abandon(slot)
                raise
            if not woken and self._abandon(slot) or not slot.done.is_set():
                raise TimeoutError(f"no answer within {timeout:g}s of waiting for the call in flight")
        if slot.batch is not None:  # this thread sends: it found the owner idle, or was woken to
            try:
                self._run(slot.batch)
            except BaseException:
                if slot.batch is not None:  # interrupted before its call began: the batch goes on without it
                    self._abandon(slot)
                raise
        return slot.outcome()

    def _abandon(self, slot: _Slot[T, R]) -> bool:
        """``slot``'s caller leaves while it waits (interrupted, or out of time): take it out of the queue
        or, if it had been woken to send the next batch, hand that batch (without its item) on to the next
        waiter; True then. False if a call carries it (its answer may be in already). Before, an
        interrupted waiter stayed queued, was chosen to send, and everything queued for the owner waited
        for ever."""
        with self._lock:
            slot.left = True
            if any(queued is slot for queued in self._pending):
                self._pending = [queued for queued in self._pending if queued is not slot]
                return True
            batch, slot.batch = slot.batch, None
            if batch is None:
                return False
            # Back to the head of the queue, without those whose callers left meanwhile (one of them chosen
            # to send would never send: the owner's queue stalled for good).
            self._pending[:0] = [queued for queued in batch if not queued.left]
            sender = self._next_sender()
        if sender is not None:
            sender.done.set()
        return True

    def _next_sender(self) -> _Slot[T, R] | None:
        """Under the lock, the call just over: the next batch's sender (its batch set), or None and the owner
        idle."""
        following = self._pending[: self._max_batch]
        del self._pending[: self._max_batch]
        if following:
            following[0].batch = following
            return following[0]
        self._busy = False
        return None

    def _run(self, batch: list[_Slot[T, R]]) -> None:
        try:
            self.calls += 1
            if self._on_send is not None:
                self._on_send(len(batch))
            results = self._send([slot.item for slot in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"send returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:  # every waiter must hear about the failure
            for slot in batch:
                slot.error = exc
            if not isinstance(exc, Exception):  # the sending thread's own Ctrl-C: not the others' to raise
                interrupted = TimeoutError("the thread sending this lookup's call was interrupted; ask again")
                for slot in batch[1:]:
                    slot.error = interrupted
        else:
            for slot, result in zip(batch, results):
                slot.result = result
        finally:  # whatever happened in this thread (a Ctrl-C too), the waiters and the next batch go on
            with self._lock:
                batch[0].batch = None  # handed on (``submit`` hands on a batch whose call never began)
                sender = self._next_sender()
            for slot in batch[1:]:  # batch[0] is this thread's own
                slot.done.set()
            if sender is not None:
                sender.done.set()


async def _cancel_others() -> None:
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=1.0)


class LoopThread:
    """An asyncio event loop on a daemon thread of its own; coroutines are run on it from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        # Returns once the loop runs: callers take ``loop.is_running()`` to mean "not closed" (a facade
        # refuses calls on a loop that does not run), and ``close`` stops only a running loop. The thread
        # used to be started and left to reach ``run_forever`` in its own time, so a facade used at once
        # could be refused with NotConnected, and one closed at once left its thread running.
        running = threading.Event()
        self.loop.call_soon(running.set)  # before the thread starts: nothing else touches the loop yet
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        if not running.wait(timeout=60):
            raise RuntimeError(f"the event loop thread {name} did not start within 60 s")

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Closed here, in its own thread, once stopped: left to the garbage collector, a stopped loop's
            # close could meet its self-pipe already finalized ("Invalid file descriptor: -1", unraisable).
            self.loop.close()

    def _running(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """``coro``, unless the loop was stopped (``close``): it would never run it, and a caller awaiting
        it without a timeout waited forever. Then ``NotConnected``."""
        if not self.loop.is_running():
            coro.close()
            raise NotConnected("this process's riqr client was closed (close_in_process_facades); connect again")
        return coro

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it in this (other) thread."""
        future = asyncio.run_coroutine_threadsafe(self._running(coro), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        except BaseException:
            future.cancel()  # interrupted (KeyboardInterrupt): do not leave the lookup running
            raise

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and await it from another event loop (cancelling it with the caller)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._running(coro), self.loop))

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        """Cancel what still runs on the loop (an ``iterate`` left open, say: its owners' page tasks),
        give it a moment to end, and stop the loop, so nothing is left pending on a loop that never runs."""
        if self.loop.is_running():
            with contextlib.suppress(Exception):  # stopping anyway
                asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop).result(timeout=2)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


class InProcessFacade:
    """Key lookups from the caller's process straight to the query actors (see the module's notes)."""

    def __init__(
        self,
        bus: Bus,
        blocking: Callable[[str], BlockingOwner],
        *,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        name: str = "riqr-client",
    ) -> None:
        self.marks = LockedMarks()
        self.core = Facade(bus, timeout=timeout, marks=self.marks)
        self._blocking = blocking
        self._thread = LoopThread(name)
        self._started = False
        self._batchers: dict[str, ThreadCoalescer[tuple[int, Any, Deadline], Answer]] = {}
        self._batchers_lock = threading.Lock()
        self.core.views.listeners.append(self._forget_gone)

    @property
    def timeout(self) -> float:
        return self.core.timeout

    @property
    def closed(self) -> bool:
        """Whether ``close`` stopped it (``close_in_process_facades``): a new one serves from then on."""
        return not self._thread.loop.is_running()

    def close(self) -> None:
        """Stop the view's long poll and the loop thread."""
        if self._started:
            with contextlib.suppress(Exception):  # stopping: nothing left to tell anyone
                self._thread.run(self.core.stop(), timeout=5)
        self._thread.close()

    # -- the loop's side ------------------------------------------------------------------------------

    async def _core(self) -> Facade:
        if not self._started:
            await self.core.start()  # concurrent first callers share the view's one fetch
            self._started = True
        return self.core

    async def _get(self, query: KeyQuery, budget: float) -> Any:
        core = await self._core()
        if budget >= core.timeout:  # the facade's own deadline is the shorter one
            return await core.get(query)
        return await within(Deadline.after(budget), core.get(query), f"get on {query.store}")

    async def _lookup(self, query: KeyQuery, budget: float) -> tuple[Any, str]:
        core = await self._core()
        if budget >= core.timeout:  # as ``_get``: the router's own deadline, its failover and reports, decide
            return await core.lookup(query)
        return await within(Deadline.after(budget), core.lookup(query), f"get on {query.store}")

    def lookup(self, query: KeyQuery, budget: float) -> tuple[Any, str]:
        """A key's value and its position (``Facade.lookup``), blocking; through the loop's facade, which
        fails over and keeps the marks as ``get`` does (not its thread fast path, which has no position)."""
        if budget <= 0:
            raise Deadline.after(budget).exceeded(f"get on {query.store}")
        try:
            return self._thread.run(self._lookup(query, budget), budget + 1.0)
        except concurrent.futures.TimeoutError:  # only if the loop thread itself is stuck
            raise DeadlineExceeded(f"get on {query.store} did not complete within {budget:g}s") from None

    async def lookup_async(self, query: KeyQuery, budget: float) -> tuple[Any, str]:
        return await self._thread.run_async(self._lookup(query, budget))

    async def get_async(self, query: KeyQuery, budget: float) -> Any:
        """The value of a key, for a caller on any event loop (coalesced on the loop thread)."""
        return await self._thread.run_async(self._get(query, budget))

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self._thread.run_async(coro)

    def chunks(self, make: Callable[[Facade], AsyncIterator[list[T]]]) -> Iterator[list[T]]:
        """The chunks of ``make(facade)`` (an async generator of the loop's ``Facade``, such as
        ``Facade.entry_chunks``) for a plain thread, the next one made on the loop while this thread uses
        one. Stopping early (closing the iterator) ends the generator and its owners' calls."""
        ahead = _Ahead(self._core, make)
        try:
            while (chunk := self._thread.run(ahead.next())) is not None:
                yield chunk
        finally:
            if self._thread.loop.is_running():  # else closed: nothing runs there any more
                with contextlib.suppress(concurrent.futures.TimeoutError):  # its cleanup is stuck: leave it
                    self._thread.run(ahead.close(), timeout=_CLOSE_WAIT)

    async def chunks_async(self, make: Callable[[Facade], AsyncIterator[list[T]]]) -> AsyncGenerator[list[T], None]:
        """``chunks`` for a caller on any event loop."""
        ahead = _Ahead(self._core, make)
        try:
            while (chunk := await self._thread.run_async(ahead.next())) is not None:
                yield chunk
        finally:
            if self._thread.loop.is_running():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._thread.run_async(ahead.close()), _CLOSE_WAIT)

    # -- the calling thread's side --------------------------------------------------------------------

    def get(self, query: KeyQuery, budget: float) -> Any:
        """The value of a key, blocking: the fast path in this thread, else the loop's ``Facade``."""
        deadline = Deadline.after(budget)
        if budget <= 0:
            raise deadline.exceeded(f"get on {query.store}")
        answer = self._fast_get(query, deadline)
        if answer is not _SLOW:
            return answer
        remaining = deadline.remaining()
        if remaining <= 0:
            raise deadline.exceeded(f"get on {query.store}")
        try:
            return self._thread.run(self._get(query, remaining), remaining + 1.0)
        except concurrent.futures.TimeoutError:  # only if the loop thread itself is stuck
            raise DeadlineExceeded(f"get on {query.store} did not complete within {budget:g}s") from None

    def _fast_get(self, query: KeyQuery, deadline: Deadline) -> Any:
        table = self.core.views.current.table(query.store)
        if table is None or not self._started:
            return _SLOW
        spec = table.spec
        require_kind(spec, "kv")
        key = bind_key(spec, query.key)
        route = table.resolve(key)
        if not isinstance(route, Route) or self.core.router.silence.remembered(route.owner):
            return _SLOW  # a silent owner: the loop's facade asks its standby first, or answers 503 sooner
        try:
            # Waits no longer than the caller may: queued behind the call in flight, and for its own call
            # (``_blocking_per_item``: 0.2 s asked and an owner taking 0.9 s answered after 0.9 s before).
            value, span = self._batcher(route.owner).submit((route.partition, key, deadline), deadline.remaining())
        except TimeoutError:  # the caller's time ran out, not the owner's: nothing to say of it
            return _SLOW
        except RiqrError as err:
            if isinstance(err, (DeadlineExceeded, OwnerUnavailable)):  # no answer: the loop's facade asks it last
                self.core.router.silence.missed(route.owner)
            # The loop's facade asks again, fails over, refreshes the view and reports the owner.
            return _SLOW
        if not self.marks.admit(spec.name, route.partition, span, active=True):
            return _SLOW  # older than what was served: the loop's facade asks the other copies
        if value is None:
            shown = to_jsonable(spec.key.external(key))
            raise KeyNotFound(f"key {shown!r} is not in store {spec.name!r}", store=spec.name, key=shown)
        return decode_value(value)

    def _batcher(self, uuid: str) -> ThreadCoalescer[tuple[int, Any, Deadline], Answer]:
        batcher = self._batchers.get(uuid)
        if batcher is None:
            with self._batchers_lock:
                batcher = self._batchers.get(uuid)
                if batcher is None:
                    batcher = self._batchers[uuid] = ThreadCoalescer(_blocking_per_item(self._blocking(uuid)))
        return batcher

    def _forget_gone(self, view: Any) -> None:
        with self._batchers_lock:
            for uuid in set(self._batchers) - set(view.actors):
                del self._batchers[uuid]


# How long closing a stream waits for its generator to end on the loop (it only cancels and cleans up).
_CLOSE_WAIT = 5.0


# How many times ``_Ahead.close`` cancels what still runs (a generator that swallows a cancellation and
# yields makes its ``next`` start another prefetch).
_CLOSE_ROUNDS = 8


class _Ahead(Generic[T]):
    """An async generator of the loop's facade, read one item ahead: ``next`` answers the item asked for
    before (or asks now, the first time) and asks for the following one before returning, so the loop makes
    it while the caller uses this one. Runs on the loop thread only."""

    def __init__(self, core: Callable[[], Coroutine[Any, Any, Facade]], make: Callable[[Facade], AsyncIterator[T]]):
        self._core = core
        self._make = make
        self._items: AsyncIterator[T] | None = None
        self._ahead: asyncio.Task[T | None] | None = None  # the generator's next item, being made
        self._asking: asyncio.Task[Any] | None = None  # the ``next`` call running, if any

    async def next(self) -> T | None:
        """The next item, or None after the last."""
        self._asking = asyncio.current_task()
        try:
            if self._items is None:
                self._items = self._make(await self._core())
            if self._ahead is None:
                self._ahead = asyncio.ensure_future(anext(self._items, None))
            # Kept in ``_ahead`` while awaited: cancelled with this call (a Ctrl-C, a caller's timeout), it is
            # still there for ``close`` to wait out.
            item = await self._ahead
            self._ahead = None
            if item is not None:
                self._ahead = asyncio.ensure_future(anext(self._items, None))
            return item
        finally:
            self._asking = None

    async def close(self) -> None:
        """Stop the item being made ahead and a ``next`` still running, if any, and end the generator (its
        ``finally`` runs). The caller's interrupt cancels its ``next`` on the loop only by and by: ``aclose``
        while that still ran raised "aclose(): asynchronous generator is already running" (a RuntimeError in
        place of the caller's KeyboardInterrupt or timeout), so both are waited out first."""
        for _ in range(_CLOSE_ROUNDS):  # again while a cancelled ``next`` went on to start another prefetch
            tasks = [t for t in (self._asking, self._ahead) if t is not None and t is not asyncio.current_task()]
            running = [t for t in tasks if not t.done()]
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running)
            for task in tasks:  # retrieved: an error of theirs (a prefetch that failed) is nobody's now
                if not task.cancelled():
                    task.exception()
            if not running:
                break
        self._ahead = self._asking = None
        aclose = getattr(self._items, "aclose", None)
        if aclose is not None:
            await aclose()


class _Slow:
    """The fast path's "ask the loop's facade" (a lookup's value may be None, so not None)."""


_SLOW: Any = _Slow()


def _blocking_per_item(owner: BlockingOwner) -> Callable[[list[tuple[int, Any, Deadline]]], Sequence[Answer]]:
    """``get_many_blocking`` as the coalescer wants it: one ``(value, span of its partition)`` per
    ``(partition, key, deadline)`` item, within ``FAILOVER_AFTER`` (the loop's facade takes over from a
    slower owner) or the time the sending caller has left, if shorter: then ``TimeoutError`` when the owner
    did not answer in that time (the caller's time ran out; the owner is not said to be silent)."""

    def send(items: list[tuple[int, Any, Deadline]]) -> Sequence[Answer]:
        # The sender's own time (its item is the batch's first): the others stop waiting at theirs, and one of
        # them nearly out of time does not cut the call short for the rest.
        wait = min(FAILOVER_AFTER, items[0][2].remaining())
        if wait <= 0:
            raise TimeoutError("no time left to ask the owner")
        try:
            values, spans = owner.get_many_blocking([(p, key) for p, key, _ in items], wait)
        except DeadlineExceeded:
            if wait < FAILOVER_AFTER:
                raise TimeoutError(f"the owner did not answer within the {wait:.3g}s its caller had left") from None
            raise
        return [(value, spans[p]) for (p, _, _), value in zip(items, values)]

    return send
