"""What a scan covers, as a value: bounds (each inclusive or not), direction, and resuming after a key.

A ``Scan`` travels from the facade to every owner; each owner answers one page of it at a time, and the
facade continues with ``scan.after(last_key)``. Because a page resumes strictly after the last key it
returned, paging through a store that is being updated never repeats a key and never skips one that was
present throughout. ``runtime.cursor`` makes that position an opaque token for clients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from runtime.keys import TOP

__all__ = ["Bound", "Scan", "TimeFilter", "TimeWalk", "Pace", "prefix_scan", "JUMP_AFTER", "JUMP_AFTER_MAX"]

# A time-filtered walk seeks past the windows its filter refuses after this many refused in a row: short
# runs are stepped over (a seek costs about what a few steps do), long ones (a key's windows outside the
# time range) cost one seek, not one step each. Seeks that do not pay double the wait, up to the max.
JUMP_AFTER = 8
JUMP_AFTER_MAX = 1024


@dataclass(frozen=True)
class Bound:
    """One end of a scan."""

    key: Any
    inclusive: bool = True


@dataclass(frozen=True)
class TimeFilter:
    """For window and session stores: which windows a scan keeps, by start and end (epoch micros).

    The window start is the key's last column; the end travels with the value. Owners apply the filter,
    so only matching windows cross Ray.
    """

    start_from: int | None = None
    start_to: int | None = None
    end_from: int | None = None

    def admits(self, start: int, end: int) -> bool:
        return (
            (self.start_from is None or start >= self.start_from)
            and (self.start_to is None or start <= self.start_to)
            and (self.end_from is None or end >= self.end_from)
        )

    def admits_none(self) -> bool:
        """Whether no window can pass: its start bounds cross (``windows?from=`` after ``to``). Session bounds
        never do: a session may start before ``latestStart`` and end after a later ``earliestEnd``."""
        return self.start_from is not None and self.start_to is not None and self.start_from > self.start_to

    def to_wire(self) -> list[int | None]:
        return [self.start_from, self.start_to, self.end_from]


class TimeWalk:
    """How an engine walks a window or session scan with a ``TimeFilter`` (``PartitionEngine.scan``) without
    reading every window of every key in its key range.

    Keys are the user's key columns then the window start, so one key's windows lie together in start
    order. ``admits`` says whether an entry passes the filter (``end_of`` reads a window's end from its
    stored value: only sessions' ``earliestEnd`` needs it). After ``JUMP_AFTER`` refused in a row, ``jump``
    says where the walk may seek instead of stepping on: in scan order, to the key's first window that
    can pass (its start bound), or past the key's windows when its last that can pass is behind. A walk
    whose refusals ``jump`` cannot skip (sessions ending before ``earliestEnd``: ends are not in the key)
    steps, as a filter over the whole range would.

    Engines step once before they seek: where that step is already at or past the jump's target
    (keys with a window or two each), seeking would not pay, and the walk waits twice as long before it
    looks again, up to ``JUMP_AFTER_MAX``; a seek that pays sets the wait back (``Pace``, one per walk).
    """

    def __init__(
        self, times: TimeFilter, user_columns: int, reverse: bool = False, end_of: Callable[[bytes], int] | None = None
    ) -> None:
        self.times = times
        self.user_columns = user_columns
        self.reverse = reverse
        lo = -_INF if times.start_from is None else times.start_from
        hi = _INF if times.start_to is None else times.start_to
        end_from = times.end_from
        if end_from is None or end_of is None:
            self.admits: Callable[[Any, bytes], bool] = lambda key, raw: lo <= key[-1] <= hi
        else:
            self.admits = lambda key, raw: lo <= key[-1] <= hi and end_of(raw) >= end_from

    def pace(self) -> Pace:
        """The seeking pace of one engine's walk of this scan (each walk its own: the merge walks a scan's
        partitions side by side)."""
        return Pace(self)

    def jump(self, key: Any) -> Bound | None:
        """Where to seek after ``key`` (refused), in scan order, or None to step on. Always strictly
        past ``key`` in scan order, and never past an entry the filter would keep."""
        start, user, times = key[-1], tuple(key[: self.user_columns]), self.times
        if not self.reverse:
            if times.start_from is not None and start < times.start_from:
                return Bound(user + (times.start_from,))
            if times.start_to is not None and start > times.start_to:
                return Bound(user + (TOP,), inclusive=False)  # the next key's first window
        else:
            if times.start_to is not None and start > times.start_to:
                return Bound(user + (times.start_to,))
            if times.start_from is not None and start < times.start_from:
                return Bound(user, inclusive=False)  # the previous key's last window
        return None


_INF = float("inf")


class Pace:
    """When one engine's walk seeks (``TimeWalk``): once ``patience`` entries in a row were refused (the
    engine counts them: a call per refused entry cost the adverse shape a quarter more), where ``jump`` says; the
    engine steps once first and says whether the seek was still needed (``sought``), and a step that was
    already there doubles the patience, up to ``JUMP_AFTER_MAX``."""

    def __init__(self, walk: TimeWalk) -> None:
        self.jump = walk.jump
        self.patience = JUMP_AFTER

    def sought(self, needed: bool) -> None:
        """The engine's step before the seek was short of the target (``needed``: it sought), or there."""
        self.patience = JUMP_AFTER if needed else min(2 * self.patience, JUMP_AFTER_MAX)


@dataclass(frozen=True)
class Scan:
    """The keys between ``lo`` and ``hi`` (``None``: open), in key order or reversed, optionally only
    the windows a ``TimeFilter`` admits."""

    lo: Bound | None = None
    hi: Bound | None = None
    reverse: bool = False
    times: TimeFilter | None = None

    @classmethod
    def closed(cls, lo: Any = None, hi: Any = None, *, reverse: bool = False) -> Scan:
        """Both ends inclusive (the seed's ``range?from=&to=``); ``None`` leaves an end open."""
        return cls(
            None if lo is None else Bound(lo),
            None if hi is None else Bound(hi),
            reverse,
        )

    def after(self, key: Any) -> Scan:
        """The rest of this scan once ``key`` has been returned (strictly past it, in scan direction)."""
        if self.reverse:
            return replace(self, hi=Bound(key, inclusive=False))
        return replace(self, lo=Bound(key, inclusive=False))

    def is_empty(self) -> bool:
        """Whether no key can fall inside (for example ``from`` above ``to``), or no window (the time filter's
        start bounds cross: without it a key range's windows were all read to be filtered out)."""
        if self.times is not None and self.times.admits_none():
            return True
        if self.lo is None or self.hi is None:
            return False
        if self.lo.key > self.hi.key:
            return True
        return self.lo.key == self.hi.key and not (self.lo.inclusive and self.hi.inclusive)


def _successor(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: there is none)."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            return "".join(chars) + chr(last + 1)
    return None


def prefix_scan(prefix: str, *, reverse: bool = False, composite: bool = False) -> Scan:
    """The keys starting with ``prefix`` (string keys; the empty prefix is every key).

    With ``composite`` the keys are tuples and the prefix applies to their first component.
    """
    if prefix == "":
        return Scan(reverse=reverse)

    def wrap(value: str) -> Any:
        return (value,) if composite else value

    upper = _successor(prefix)
    return Scan(Bound(wrap(prefix)), None if upper is None else Bound(wrap(upper), inclusive=False), reverse)
