"""Helpers for integration tests: HTTP over a real client, waiting on conditions with a deadline, and
background load whose wrong answers are counted while a test breaks things."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.faults import KEYS, Ledger, read_counts, write_orders


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """GET ``url``; returns (status, headers, decoded JSON body), for errors too."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read() or b"null")


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 90.0,
    what: str = "condition",
    interval: float = 0.1,
    fatal: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll until ``condition()`` is truthy; returns its value.

    Exceptions count as "not yet", except those in ``fatal``, which end the wait at once.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except fatal:
            raise
        except Exception as err:  # not ready yet
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last error: {last!r}")


class Load:
    """Threads that read (and write) while a test breaks things, and what they found.

    ``every(step)`` runs ``step()`` over and over in a thread of its own until the ``with`` block ends; a
    step returns the description of a wrong answer, or None when the answer was right (a writer's step
    always returns None). ``every_async`` does the same with a coroutine function, on an event loop of
    its thread's own. A step that raises ends its thread, and the exception is kept in ``errors``: a test
    asserts both ``wrong`` and ``errors`` empty. ``steps`` counts the steps taken so far, so a test can
    wait for more of them after each fault (``wait_more``).
    """

    def __init__(self) -> None:
        self.wrong: list[str] = []
        self.errors: list[BaseException] = []
        self.steps = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _took(self, verdict: str | None) -> None:
        with self._lock:
            self.steps += 1
            if verdict is not None:
                self.wrong.append(verdict)

    def every(self, step: Callable[[], str | None]) -> None:
        def run() -> None:
            try:
                while not self._stop.is_set():
                    self._took(step())
            except BaseException as err:  # the test's assertion on ``errors`` names it
                self.errors.append(err)

        self._start(run)

    def every_async(self, step: Callable[[], Awaitable[str | None]]) -> None:
        async def loop() -> None:
            while not self._stop.is_set():
                self._took(await step())

        def run() -> None:
            try:
                asyncio.run(loop())
            except BaseException as err:
                self.errors.append(err)

        self._start(run)

    def _start(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True, name=f"load-{len(self._threads)}")
        self._threads.append(thread)
        thread.start()

    def wait_more(self, steps: int, what: str, timeout: float = 90.0) -> None:
        """Wait until ``steps`` more steps were taken than now."""
        target = self.steps + steps
        wait_for(lambda: self.steps >= target, timeout=timeout, what=what)

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


@contextlib.contextmanager
def orders_under_load(
    home: Path, url: str, read_pause: float = 0.0, keys: Sequence[str] | None = None
) -> Iterator[Ledger]:
    """Orders landing in ``home`` and their counts read from ``url`` in the background while the block
    runs; the ledger records what was produced and every answer. The reader sends its GETs one after the
    other, ``read_pause`` seconds apart (none: as fast as the runtime answers). ``keys``: the keys ordered
    for and read, none of them in the seed (by default the seed's topology's, after its seed)."""
    if keys is None:
        ledger, keys = Ledger(), KEYS
    else:
        ledger = Ledger(produced=Counter())
    stop = threading.Event()
    threads = [
        threading.Thread(target=write_orders, args=(home, ledger, stop), kwargs={"keys": keys}, daemon=True),
        threading.Thread(target=read_counts, args=(url, ledger, stop, 0, read_pause), kwargs={"keys": keys},
                         daemon=True),
    ]  # fmt: skip
    for t in threads:
        t.start()
    try:
        yield ledger
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    # A load that broke (a writer that could not write, a reader that got no JSON) leaves the fault it was
    # for unexercised: that fails the test, after the block's own checks had their say.
    assert ledger.errors == [], ledger.errors[:10]
    assert not any(t.is_alive() for t in threads), "a load thread did not stop"


def wait_for_every_order_counted(url: str, ledger: Ledger) -> None:
    """Until every key's order count equals the orders produced for it (nothing lost, nothing extra)."""

    def exactly_what_was_produced() -> bool:
        counts = {k: http_get(f"{url}/stores/order-count/get/{k}")[2].get("response") for k in ledger.produced}
        return counts == dict(ledger.produced)

    wait_for(exactly_what_was_produced, timeout=60, what="every count equal to the orders produced")


def supervised(queries: list[Any], scenario: Callable[[], dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """Run ``scenario`` in a thread while ``supervise`` runs ``queries`` in this (the main) thread, as a
    topology process runs them, until the scenario ends. Returns supervise's exit status and what the
    scenario returned; raises what it raised."""
    from topologies.runner import supervise

    outcome: dict[str, Any] = {}
    stop = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = scenario()
        except BaseException as err:  # raised in the test's thread below
            outcome["error"] = err
        finally:
            stop.set()

    thread = threading.Thread(target=run, name="scenario", daemon=True)
    thread.start()
    status = supervise(queries, poll=0.2, stop=stop)
    thread.join(timeout=60)
    if "error" in outcome:
        raise outcome["error"]
    return status, outcome["result"]


# Event times of the session and window tests: seconds after T0.
T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> int:
    return int((T0 + dt.timedelta(seconds=seconds)).timestamp() * 1000)


def iso(seconds: float) -> str:
    """As answers show it."""
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


def session_triples(body: Any) -> list[tuple[str, str, int]]:
    return [(x["window"]["start"], x["window"]["end"], x["value"]) for x in body["result"]]


class GrowingReads:
    """Judges one reader's answers (one thread, through one REST node, so reads are monotonic) for keys
    whose value grows with every batch that writes them: right is a 503, or a value that was written
    (``history``) and is not older than one this reader saw already. A value merely ever written was
    accepted before, which let an older answer after a failover or a give-back pass."""

    def __init__(self, history: dict[int, set[int]]) -> None:
        self.history = history
        self.seen: dict[int, int] = {}

    def judge(self, key: int, status: int, body: Any) -> str | None:
        """None when the answer is right, else what was wrong with it."""
        if status == 503:
            return None
        value = body.get("response") if status == 200 and isinstance(body, dict) else None
        if value not in self.history[key]:
            return f"{key}: {status} {body}"
        if value < self.seen.get(key, value):
            return f"{key}: {value} after {self.seen[key]}: back in time"
        self.seen[key] = value
        return None


class SessionReader:
    """Reads a session store's answers for ``keys`` over REST in a loop, keeping every answer that is neither
    the expected one nor a 503: a rebuild must never show a store missing sessions it had."""

    def __init__(
        self, url: str, store: str, expected: dict[str, list[tuple[str, str, int]]], pause: float = 0.002
    ) -> None:
        self.url, self.store, self.expected, self.pause = url, store, expected, pause
        self.wrong: list[tuple[str, int, Any]] = []
        self.answers = {200: 0, 503: 0}
        self.errors: list[str] = []  # what broke a read (no answer, a body that is no JSON): checked at exit
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for key, sessions in self.expected.items():
                try:
                    status, _, body = http_get(f"{self.url}/stores/{self.store}/sessions/{key}")
                except Exception as err:  # recorded, and the reader reads on: a silent stop hid every fault
                    self.errors.append(f"{key}: {type(err).__name__}: {err}"[:300])
                    continue
                try:
                    got = session_triples(body) if status == 200 else None
                except (KeyError, TypeError) as err:
                    got = f"a 200 that is no list of sessions: {err!r}"
                if status in self.answers:
                    self.answers[status] += 1
                if status != 503 and got != sessions:
                    self.wrong.append((key, status, got if status == 200 else body))
            self.stop.wait(self.pause)

    def more(self, answers: int, what: str) -> None:
        """Wait until the reader got ``answers`` more 200s than it had (what was served goes on being served)."""
        had = self.answers[200]
        wait_for(lambda: self.answers[200] >= had + answers, what=what)

    def __enter__(self) -> SessionReader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        if exc[0] is None:  # the block's own failure, if any, is the one to see
            assert not self.thread.is_alive(), "the session reader did not stop"
            assert self.errors == [], self.errors[:10]
