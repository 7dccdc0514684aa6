"""Monotonic reads across copies: what an answer reflects, and the marks a facade keeps.

A partition has several copies (the active and its standbys), fed one after another: standbys first,
then the active. At any moment one copy may be a batch ahead of another. A facade that answered from
the copy ahead and then from the one behind would show the store going back in time (a count seen as 1,
then a 404). So every answer from a query actor says, per partition it read, what it reflects: a
``Span`` ``(source, lo, hi)``: the rows read are those of batch ``lo`` of ``source`` or later, and of
batch ``hi`` or earlier (``lo < hi`` only when a batch was being applied during the read). A facade keeps
per ``(store, partition)`` the highest batch it has served (``Marks``) and admits an answer only if its
``lo`` is at least that mark; its ``hi`` then raises the mark. The caller asks another copy, or the same
again shortly, for a refused answer (``runtime.facade.routing``).

Sources (a Spark query id) are not ordered: a rebuild starts a new source at batch 0. The rule, which
relies on standbys getting every batch (the first of a new source included) before the active does:

* an answer from the mark's source is compared by batch;
* an answer from another source is admitted, and the mark moves to it, unless that source is one the
  mark has left after the active copy had shown it (``retired``): copies only move forward, and a
  standby at another source than the one the active showed is ahead (it got the new source first), so a
  source left that way does not come back (refused for ``RETIRE_FOR``, long past any delivery: a bound,
  so that a mark that left the new source for an old one, which a restarted active can show before the
  sink's retry reaches it, does not refuse every copy for good);
* the one case it cannot tell: a facade whose first answer for a partition came from a standby already
  at a new source, then from the active still at the old one, goes back once (see docs/design.md).

Marks are per facade: each HTTP node and each facade verticle keeps its own, so reads are monotonic per
facade, not across nodes.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "Span",
    "Spans",
    "Mark",
    "Marks",
    "span_text",
    "POSITION_HEADER",
    "position_header",
    "SpansSeen",
    "SEEN",
    "collecting",
]

# The response header of a key lookup saying what the answer reflects (docs/api.md, "Freshness").
POSITION_HEADER = "X-Riqr-Position"

# What one partition's part of an answer reflects: (source, lowest batch, highest batch).
Span = tuple[str | None, int, int]
# Per partition read by one call to a query actor.
Spans = dict[int, Span]


@dataclass
class Mark:
    """The highest position a facade has served from one partition.

    ``settled``: the active copy has answered from ``source`` (so a copy at another source is ahead).
    ``retired``: the source the mark left after it was settled; answers from it are refused, for
    ``RETIRE_FOR`` seconds from ``retired_at`` (``Marks``).
    """

    source: str | None
    batch: int
    settled: bool
    retired: str | None = None
    retired_at: float = 0.0


# How long a source the marks left stays refused. Long past a batch's delivery to every copy (the sink
# retries an owner for a minute): a copy still at an old source by then missed the new one's first batch
# and every batch since, and no serving copy does. Without a bound, a mark that left the new source for
# an old one (a restarted active answering from where it stopped, before the sink's retry brought it the
# new source) refused every copy for good once they all reached the new source.
RETIRE_FOR = 300.0


def span_text(span: Span) -> str:
    """A span as a log line or header shows it: ``source@batch`` (``source@lo-hi`` if they differ)."""
    source, lo, hi = span
    return f"{source}@{lo}" if lo == hi else f"{source}@{lo}-{hi}"


def position_header(partition: int, span: Span) -> str:
    """What a key lookup's answer reflects, as ``X-Riqr-Position`` shows it: the key's partition, the
    source (the Spark query run) and the batch: ``partition=3; source=<id>; batch=41`` (``batch=40-41``
    when a batch was being applied during the read: the answer is one of the two states)."""
    source, lo, hi = span  # a span that crossed a codec may be a list: the cache below takes its parts
    return _position_text(partition, source, lo, hi)


class SpansSeen:
    """What an answer made of several owner calls reflects (a scan's pages, a count): per partition, the
    span of every call admitted for it, merged. Calls of one source merge into ``lo`` of the earliest and
    ``hi`` of the latest; a call at another source (a rebuild during a long scan) replaces the span, as the
    facade's marks admit only a newer one."""

    def __init__(self) -> None:
        self.spans: Spans = {}

    def add(self, spans: Spans) -> None:
        for partition, span in spans.items():
            source, lo, hi = span
            seen = self.spans.get(partition)
            if seen is not None and seen[0] == source:
                lo, hi = min(lo, seen[1]), max(hi, seen[2])
            self.spans[partition] = (source, lo, hi)

    def header(self) -> str:
        """Every partition read, as ``X-Riqr-Position`` lists them: a key lookup's form per partition, joined
        by ", " in partition order; empty when nothing was read (an empty range), or when the list would be
        longer than ``MAX_POSITION_CHARS`` (about 40 partitions: proxies refuse headers of a few KiB)."""
        text = ", ".join(position_header(p, self.spans[p]) for p in sorted(self.spans))
        return text if len(text) <= MAX_POSITION_CHARS else ""


# The longest X-Riqr-Position a scan sends: nginx's default proxy buffer (4 KiB on most platforms) holds
# every header of a response, and aiohttp's client refuses a field over 8,190 bytes.
MAX_POSITION_CHARS = 3072

# The spans of the answer being built, set around one request's calls (``collecting``; asyncio tasks copy
# the context when made, so every owner call of the request adds to the same ``SpansSeen``).
SEEN: ContextVar[SpansSeen | None] = ContextVar("riqr_spans_seen", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[SpansSeen]:
    """The spans of every owner call made inside the ``with``, for one answer's position."""
    seen = SpansSeen()
    token = SEEN.set(seen)
    try:
        yield seen
    finally:
        SEEN.reset(token)


@functools.lru_cache(maxsize=4096)  # per answer: a few distinct values a batch, asked thousands of times
def _position_text(partition: int, source: str | None, lo: int, hi: int) -> str:
    batch = str(lo) if lo == hi else f"{lo}-{hi}"
    return f"partition={partition}; source={source or ''}; batch={batch}"


class Marks:
    """Per ``(store, partition)`` high-water marks of what one facade has served.

    ``admit`` decides and records in one step; the facade runs on one event loop, so nothing interleaves.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, retire_for: float = RETIRE_FOR) -> None:
        self._marks: dict[tuple[str, int], Mark] = {}
        self._clock = clock
        self._retire_for = retire_for

    def get(self, store: str, partition: int) -> Mark | None:
        return self._marks.get((store, partition))

    def admit(self, store: str, partition: int, span: Span, *, active: bool) -> bool:
        """Whether an answer reflecting ``span`` (from the active copy or a standby) may be served; if so
        the mark moves to it."""
        source, lo, hi = span
        mark = self._marks.get((store, partition))
        if mark is None:
            self._marks[(store, partition)] = Mark(source, hi, active)
            return True
        if source == mark.source:
            if lo < mark.batch:
                return False
            mark.batch = max(mark.batch, hi)
            mark.settled = mark.settled or active
            return True
        now = self._clock()
        if source == mark.retired and now - mark.retired_at < self._retire_for:
            return False
        if mark.settled:
            self._marks[(store, partition)] = Mark(source, hi, active, mark.source, now)
        else:
            self._marks[(store, partition)] = Mark(source, hi, active, mark.retired, mark.retired_at)
        return True

    def admit_all(self, store: str, spans: Spans, active: frozenset[int] | set[int]) -> list[int]:
        """``admit`` every partition of one answer; returns the partitions refused (empty: admitted).

        All or nothing: if any partition is refused, no mark moves, since the answer is not served.
        """
        saved = {p: self._copy(store, p) for p in spans}
        refused = [p for p, span in sorted(spans.items()) if not self.admit(store, p, span, active=p in active)]
        if refused:
            for p, mark in saved.items():
                if mark is None:
                    self._marks.pop((store, p), None)
                else:
                    self._marks[(store, p)] = mark
        return refused

    def _copy(self, store: str, partition: int) -> Mark | None:
        mark = self._marks.get((store, partition))
        return None if mark is None else Mark(mark.source, mark.batch, mark.settled, mark.retired, mark.retired_at)

    def forget(self, store: str) -> None:
        """Drop a store's marks (it was dropped or recreated: its new partitions start over)."""
        for key in [k for k in self._marks if k[0] == store]:
            del self._marks[key]

    def stores(self) -> set[str]:
        return {store for store, _ in self._marks}
