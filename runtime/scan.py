"""What a scan covers, as a value: bounds (each inclusive or not), direction, and resuming after a key.

A ``Scan`` travels from the facade to every owner; each owner answers one page of it at a time, and the
facade continues with ``scan.after(last_key)``. Because a page resumes strictly after the last key it
returned, paging through a store that is being updated never repeats a key and never skips one that was
present throughout. ``runtime.cursor`` makes that position an opaque token for clients.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Bound", "Scan", "TimeFilter", "prefix_scan"]


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
