"""A request's deadline as a value: it is set once at the edge and every hop spends from it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from runtime.errors import DeadlineExceeded

__all__ = ["Deadline", "backoff", "within"]

T = TypeVar("T")


@dataclass(frozen=True)
class Deadline:
    """The monotonic instant by which an answer is due, and the budget it was set with (for messages)."""

    at: float
    budget: float

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        return cls(clock() + seconds, seconds)

    def remaining(self, clock: Callable[[], float] = time.monotonic) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - clock())

    def exceeded(self, what: str) -> DeadlineExceeded:
        """The error to raise when ``what`` did not finish in time."""
        return DeadlineExceeded(f"{what} did not complete within {self.budget:g}s", timeout=self.budget)


async def within(deadline: Deadline, awaitable: Awaitable[T], what: str) -> T:
    """Await ``awaitable`` until ``deadline``; ``DeadlineExceeded`` (504) if it is not done by then."""
    try:
        async with asyncio.timeout(deadline.remaining()):
            return await awaitable
    except TimeoutError:
        raise deadline.exceeded(what) from None


def backoff(first: float, attempts: int, most: float) -> float:
    """The wait after the ``attempts``-th failure in a row (1: the first): ``first``, doubled at each
    failure since, at most ``most``, for any count: the doubling stops at 64 (``2 ** 1024`` times a float
    is an ``OverflowError``, which a registry retrying a failing actor once a minute met in 17 hours)."""
    return min(most, first * (1 << min(max(0, attempts - 1), 64)))
