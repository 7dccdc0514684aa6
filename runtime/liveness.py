"""Which query actors Ray lists alive but that answer nothing: the registry's pings (``Pings``).

A process that is stopped (SIGSTOP), or hung in a way that keeps its threads from running, is alive to
Ray: its node answers Ray's health checks, so nothing restarts it. Reads fail over past it (a facade
pings an owner whose call is long: ``runtime.facade.silence``), but every copy takes each batch, so the
topology's next batch waits on it until the delivery's minute is out, fails, and fails the query; a
standby frozen for good stopped ingest for good. The registry pings every live query actor now and then
and restarts one that has left a ping unanswered for ``RIQR_RESTART_SILENT_AFTER`` seconds; it reopens
its partitions from disk as after any crash, and the waiting batch goes to the restarted process.

The ping is answered in its own concurrency group (``runtime.config.PROBE_GROUP``), so a long apply or
scan does not hold it up: only a process that runs nothing at all leaves it unanswered.

This module is the bookkeeping, with the sending and the looking injected: one ping in flight per actor,
a new one once it was answered and ``every`` seconds have passed, the silence counted from the sending
of the oldest unanswered one. Looking costs nothing while the pings are in flight (a look at which are
done, never a wait).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Pings"]


@dataclass
class _InFlight:
    ref: Any
    sent: float


class Pings:
    """One ping in flight per actor; ``silences`` says for how long each has left one unanswered.

    ``send(uuid)`` starts a ping and returns what ``answered`` looks at (raises if the actor cannot be
    reached at all: no ping then, and none counted); ``answered(refs)`` says, without waiting, which of
    ``refs`` are done (an error is an answer too: a call to an actor that died fails at once, and its death
    is Ray's to report, not silence)."""

    def __init__(
        self,
        send: Callable[[str], Any],
        answered: Callable[[Sequence[Any]], list[bool]],
        clock: Callable[[], float],
        every: float,
    ) -> None:
        self._send, self._answered, self._clock, self._every = send, answered, clock, every
        self._in_flight: dict[str, _InFlight] = {}
        self._last_sent: dict[str, float] = {}

    def silences(self, uuids: Sequence[str]) -> dict[str, float]:
        """For each of ``uuids`` with a ping unanswered, the seconds since it was sent; starts the pings
        that are due. Actors not named are forgotten (dropped, moved away)."""
        now = self._clock()
        wanted = set(uuids)
        for uuid in [u for u in self._in_flight if u not in wanted]:
            del self._in_flight[uuid]
        for uuid in [u for u in self._last_sent if u not in wanted]:
            del self._last_sent[uuid]
        pending = list(self._in_flight.items())
        if pending:
            for (uuid, _), done in zip(pending, self._answered([f.ref for _, f in pending]), strict=True):
                if done:
                    del self._in_flight[uuid]
        silent: dict[str, float] = {}
        for uuid in uuids:
            flight = self._in_flight.get(uuid)
            if flight is not None:
                silent[uuid] = now - flight.sent
            elif now - self._last_sent.get(uuid, float("-inf")) >= self._every:
                try:
                    self._in_flight[uuid] = _InFlight(self._send(uuid), now)
                except Exception:  # noqa: BLE001 - not reachable at all: Ray's to report, not silence
                    continue
                self._last_sent[uuid] = now
        return silent

    def forget(self, uuid: str) -> None:
        """Start afresh with ``uuid`` (restarted, or restarting: its next silence counts from a new ping)."""
        self._in_flight.pop(uuid, None)
        self._last_sent.pop(uuid, None)
