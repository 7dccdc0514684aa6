"""Supervising a topology's queries: any failed query ends the topology at once with status 1; SIGTERM
stops every query and ends it with status 0 (fakes of Spark's StreamingQuery, no Spark)."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from topologies.runner import supervise


class FakeQuery:
    def __init__(self, name: str, *, fails_after: int | None = None) -> None:
        self.name = name
        self.polls = 0
        self.fails_after = fails_after
        self.stopped = False

    @property
    def isActive(self) -> bool:  # noqa: N802 (Spark's name)
        self.polls += 1
        return not self.stopped and (self.fails_after is None or self.polls <= self.fails_after)

    def stop(self) -> None:
        self.stopped = True

    def exception(self) -> Exception | None:
        return RuntimeError("ActorUnavailableError while delivering batch 7") if self.fails_after is not None else None


def test_any_failed_query_stops_the_others_and_exits_1(caplog: pytest.LogCaptureFixture) -> None:
    healthy, failing, other = FakeQuery("riqr-ns-a"), FakeQuery("riqr-ns-order-count", fails_after=2), FakeQuery("b")
    with caplog.at_level(logging.ERROR):
        assert supervise([healthy, failing, other], poll=0.001) == 1
    assert healthy.stopped and other.stopped
    assert "riqr-ns-order-count" in caplog.text and "ActorUnavailableError" in caplog.text


def test_sigterm_stops_every_query_and_exits_0() -> None:
    queries = [FakeQuery("riqr-ns-a"), FakeQuery("riqr-ns-b")]
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert supervise(queries, poll=0.01) == 0
    finally:
        timer.cancel()
    assert all(q.stopped for q in queries)
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are put back
