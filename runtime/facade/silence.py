"""Owners that give no answer: which ones a facade has found silent, and for how long.

An actor on a node that went away, or on a host that hangs, neither answers nor fails: Ray keeps calls to it
waiting until it declares the node dead (about 15 s with its default health checks; docs/operations.md,
"A node that goes away"). Each facade remembers such an owner (docs/design.md, "Silent owners"): from a
key lookup it did not answer in time (or any call Ray said it is dead for) until it answers anything, for at most
``SILENT_MEMORY`` after the last such call; and while a key-lookup call to it has been out ``SILENT_AFTER``
or more with no ping answered meanwhile (``runtime.coalesce.Coalescer.busy_for``), which shows the loss
before any request's deadline comes. Key lookups and scans ask a silent owner after its partitions' other
copies, and as the last copy left give it ``SILENT_BUDGET``, then answer 503 (``OwnerUnavailable``:
``silent_owner``) rather than wait for the whole request deadline.

A scan's or count's call may be long by its nature (a filter that reads much to return little), so its
time alone says nothing: one still out after ``SILENT_AFTER`` has its owner pinged on a call of its own
(``answer_or_silence``), and an owner that answers no ping within ``SILENT_BUDGET`` is silent too. The
same ping ends the wait of key lookups already waiting on a call out ``SILENT_AFTER`` (``ping_verdict``,
the coalescer's probe): as the last copy they answer 503 then, not 504 at their deadline.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from runtime.deadline import Deadline, within
from runtime.errors import DeadlineExceeded, OwnerUnavailable

__all__ = [
    "Silence",
    "NoPing",
    "answer_or_silence",
    "ping_verdict",
    "silent_owner",
    "SILENT_MEMORY",
    "SILENT_BUDGET",
    "SILENT_AFTER",
]

T = TypeVar("T")

# How long after the last call it did not answer an owner stays silent (any answer ends it at once).
SILENT_MEMORY = 5.0
# What a silent owner that is the last copy left to ask gets before the answer is a 503.
SILENT_BUDGET = 1.0
# A key-lookup call out this long (with no ping answered meanwhile) makes its owner silent, before any
# lookup's deadline came.
SILENT_AFTER = 2.0


class Silence:
    """The owners this facade found silent. ``busy`` says how long an owner with a key-lookup call in flight
    has shown no sign of life (``runtime.coalesce.Coalescer.busy_for``; None: no call is out); ``clock`` is
    monotonic seconds."""

    def __init__(
        self,
        busy: Callable[[str, float], float | None] = lambda _uuid, _now: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._busy = busy
        self._clock = clock
        # Owner -> when it first and last gave no answer in time, since it last answered.
        self._missed: dict[str, tuple[float, float]] = {}
        # Owner -> when a scan or count to it last outlasted its deadline (``slow``): asked after the
        # others, with its whole budget still (a large scan is not a dead owner).
        self._slow: dict[str, float] = {}

    def silent_for(self, uuid: str, now: float | None = None) -> float | None:
        """For how long ``uuid`` has given no answer in time: since the first call it did not answer, if the
        last such call was within ``SILENT_MEMORY``, or since its key-lookup calls in flight last showed it
        alive (the oldest one's sending, or a ping it answered after), if that is ``SILENT_AFTER`` or more;
        else None (not silent)."""
        now = self._clock() if now is None else now
        marks = self._missed.get(uuid)
        missed = now - marks[0] if marks is not None and now - marks[1] < SILENT_MEMORY else None
        busy = self._busy(uuid, now)
        stuck = busy if busy is not None and busy >= SILENT_AFTER else None
        if missed is None or stuck is None:
            return missed if stuck is None else stuck
        return max(missed, stuck)

    def remembered(self, uuid: str) -> bool:
        """Whether ``uuid`` missed a call within ``SILENT_MEMORY``, without asking how long its call in
        flight has been out: safe from another thread (the driver API's fast path)."""
        marks = self._missed.get(uuid)
        return marks is not None and self._clock() - marks[1] < SILENT_MEMORY

    def missed(self, uuid: str, silent: float | None = None) -> None:
        """``uuid`` gave no answer in time (or Ray said it is dead); ``silent``: its ``silent_for`` when
        the call was made, so the first miss is kept."""
        now = self._clock()
        self._missed[uuid] = (now if silent is None else now - silent, now)

    def slow(self, uuid: str) -> None:
        """A scan or count to ``uuid`` outlasted its deadline: for ``SILENT_MEMORY`` it is asked after its
        partitions' other copies, without a shorter budget."""
        self._slow[uuid] = self._clock()

    def heard(self, uuid: str) -> None:
        """``uuid`` answered (a value, "not here", a copy that cannot serve): it is not silent."""
        self._missed.pop(uuid, None)
        self._slow.pop(uuid, None)

    def pinged(self, uuid: str) -> None:
        """``uuid`` answered a ping while a call of its was out: alive, so a miss is forgotten; but a scan
        that outlasted its deadline there (``slow``) still says it is slow, busy as it is."""
        self._missed.pop(uuid, None)

    def keep_only(self, uuids: Iterable[str]) -> None:
        """Forget the owners not in ``uuids`` (gone from the view). The driver API's callers' threads record
        misses while the loop thread runs this: the keys are copied at once (``list`` of a dict holds the
        GIL throughout; iterating it here could raise "dictionary changed size during iteration")."""
        kept = set(uuids)
        for marks in (self._missed, self._slow):
            for uuid in [u for u in list(marks) if u not in kept]:
                marks.pop(uuid, None)

    def in_order(self, holders: Sequence[str]) -> tuple[str, ...]:
        """``holders`` (a partition's copies, the active first) with the silent or slow ones after the
        others, each group in its order."""
        now = self._clock()

        def later(uuid: str) -> bool:
            slow = self._slow.get(uuid)
            return self.silent_for(uuid, now) is not None or (slow is not None and now - slow < SILENT_MEMORY)

        return tuple(sorted(holders, key=later))

    @staticmethod
    def budget(silent: float | None, seconds: float) -> float:
        """What a call to an owner may wait: ``seconds``, or ``SILENT_BUDGET`` if that is shorter and the
        owner is silent (``silent``: its ``silent_for``)."""
        return min(seconds, SILENT_BUDGET) if silent is not None else seconds


def silent_owner(uuid: str, store: str, partitions: Sequence[int], silent: float) -> OwnerUnavailable:
    """The 503 for ``partitions`` of ``store`` whose last copy left to ask, ``uuid``, is silent."""
    one = len(partitions) == 1
    which = f"partition {partitions[0]}" if one else f"partitions {list(partitions)}"
    return OwnerUnavailable(
        f"query actor {uuid}, the last copy of {which} of store {store} to ask, has given no answer in time for "
        f"{silent:.1f}s: it may be on a node that went away (a standby, if the store has one, is promoted once "
        "the registry sees it)",
        store=store,
        **({"partition": partitions[0]} if one else {}),
        partitions=list(partitions),
        actors=[uuid],
        retry_after=1,
    )


class NoPing(Exception):
    """The owner of a call still out after ``SILENT_AFTER`` answered no ping within ``SILENT_BUDGET``;
    ``silent``: how long the call had been out then."""

    def __init__(self, silent: float) -> None:
        super().__init__(f"no answer to a ping after {silent:.1f}s")
        self.silent = silent


def ping_verdict(
    ping: Callable[[], Awaitable[object]], what: str, heard: Callable[[], None] = lambda: None
) -> Callable[[float], Awaitable[NoPing | None]]:
    """A coalescer's probe (``runtime.coalesce.Coalescer``) for an owner whose call has been out a while:
    ``NoPing`` if ``ping()`` gets no answer within ``SILENT_BUDGET`` (or Ray says the owner is gone); None
    if it answers (busy, not gone: ``heard()`` is called, for what remembers its silence); what else it
    raises otherwise (an actor of an older riqr without ``ping``: it says nothing either way)."""

    async def probe(out: float) -> NoPing | None:
        started = time.monotonic()
        try:
            await within(Deadline.after(SILENT_BUDGET), ping(), f"ping of a {what}'s owner")
        except (OwnerUnavailable, DeadlineExceeded):
            return NoPing(out + time.monotonic() - started)
        heard()
        return None

    return probe


async def answer_or_silence(
    deadline: Deadline, call: Awaitable[T], ping: Callable[[], Awaitable[object]], what: str
) -> T:
    """``call``'s answer by ``deadline`` (``DeadlineExceeded`` past it). A call still out after
    ``SILENT_AFTER`` may be a long one or an owner that is gone: ``ping()`` (a call of the owner's own,
    which its busy threads do not hold up) tells which; ``NoPing`` if neither the ping nor the call
    answers within ``SILENT_BUDGET`` (the call is cancelled), else the call is awaited to its deadline
    (an answer that comes while the ping is out is taken at once; a ping that fails otherwise than by
    "gone" or "no answer", say an actor of an older riqr without ``ping``, says nothing either way). A
    deadline too close for the ping to matter is awaited as it is."""
    if deadline.remaining() <= SILENT_AFTER + SILENT_BUDGET:
        return await within(deadline, call, what)
    started = time.monotonic()
    task = asyncio.ensure_future(within(deadline, call, what))
    probe: asyncio.Future[object] | None = None
    try:
        await asyncio.wait({task}, timeout=SILENT_AFTER)
        if not task.done():
            probe = asyncio.ensure_future(within(Deadline.after(SILENT_BUDGET), ping(), f"ping of a {what}'s owner"))
            await asyncio.wait({task, probe}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({probe})  # bounded by its own budget
                error = probe.exception()
                if isinstance(error, (OwnerUnavailable, DeadlineExceeded)) and not task.done():
                    raise NoPing(time.monotonic() - started)
        return await task
    finally:
        for pending in (task, probe):
            if pending is not None and not pending.done():
                pending.cancel()
        if probe is not None and probe.done() and not probe.cancelled():
            probe.exception()  # retrieved: a failed ping is no error of the caller's
        # Cancelled before the task took its first step (the caller itself cancelled at once): the call
        # was never awaited; closed, it does not warn so.
        if inspect.iscoroutine(call) and inspect.getcoroutinestate(call) == inspect.CORO_CREATED:
            call.close()
