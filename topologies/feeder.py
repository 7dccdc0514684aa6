"""The topology process's side of ingest liveness (``runtime.feeds``): one ``Feeder`` per namespace
keeps the state of every store this process feeds and tells the registry.

* **Right away, without waiting**, when something changes: a query starts, a batch is delivered, a batch
  fails, a dead-letter or late-row total moves (``update``, ``dead_letters``, ``late_rows``). A slow or
  restarting registry never holds up a batch. A report the registry turns out not to take (it died, or
  ``riqr down`` and ``riqr up`` made a new one while this process held the old one's handle) wakes the
  heartbeat at once, which looks the registry up again and sends the whole state: the report is late by
  one lookup, not lost until the next beats.
* **Every ``FEED_HEARTBEAT_INTERVAL`` seconds**, from a daemon thread: the whole state of every live feed,
  in one call, waiting for the answer (so calls never pile up behind a registry that is down). Before
  each beat the thread asks each feed's streaming query whether it still runs: one that ended is reported
  ``stopped``, or ``failed`` with its exception, and after that only that last word rides the beats, until
  the registry takes it (one lost to a registry restarting would otherwise leave the feed to turn
  ``stale``); a last word made before the run claimed the store again is ignored by the registry
  (``runtime.feeds``). A process killed with SIGKILL simply stops beating, and the registry turns its
  feeds ``stale``.
* **Last words** from the supervisor (``finish``): ``stopped`` on SIGTERM, ``failed`` naming the query
  that failed; sent and waited for before the process exits, after which the feeder says nothing more.

Every report carries the feed's whole state, dead-letter and late-row totals included, so a registry that restarted
and lost what it had not yet saved is whole again after one heartbeat.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from runtime.config import FEED_HEARTBEAT_INTERVAL, REGISTRY_NAME
from runtime.feeds import FAILED, RUNNING, STOPPED, FeedReport

__all__ = ["FeedLink", "RayFeedLink", "Feeder", "feeder_for", "finish_all", "run_ended_here"]

log = logging.getLogger(__name__)

# How long the supervisor waits for the registry to take its last words before the process exits.
FINISH_TIMEOUT = 5.0
_RETRY_PAUSE = 0.1
_MAX_ERROR = 500


class FeedLink(Protocol):
    """How a feeder reaches the registry."""

    def submit(self, reports: Sequence[FeedReport]) -> Any:
        """Send ``reports`` without waiting; returns what ``wait`` takes (raises if it cannot send)."""
        ...

    def wait(self, pending: Any, timeout: float) -> Any:
        """Wait until the registry took ``pending`` and return its answer (the stores another feed holds,
        ``Registry.report_feeds``); raises if it did not within ``timeout`` seconds."""
        ...

    def watch(self, pending: Any, failed: Callable[[], None], answered: Callable[[Any], None]) -> None:
        """Call ``failed`` if the registry does not take ``pending`` (the link forgets the registry it sent
        to first), else ``answered`` with its answer: one of them, once, from any thread."""
        ...


class RayFeedLink:
    """The registry of ``namespace`` over Ray; the handle is looked up again after a failure (after
    ``riqr down`` and ``riqr up`` the registry is a new actor)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._registry: Any = None

    def submit(self, reports: Sequence[FeedReport]) -> Any:
        import ray

        if not ray.is_initialized():  # the process left Ray (shut down): a heartbeat must not join it again
            raise ConnectionError("this process is not connected to Ray")
        if self._registry is None:
            self._registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)  # ValueError: not up
        return self._registry.report_feeds.remote(list(reports))

    def wait(self, pending: Any, timeout: float) -> Any:
        from runtime import raycalls

        try:
            return raycalls.get(pending, "reporting ingest to the registry", timeout=timeout)
        except Exception:
            self._registry = None
            raise

    def watch(self, pending: Any, failed: Callable[[], None], answered: Callable[[Any], None]) -> None:
        # A call to a dead actor's handle is accepted by ``remote()`` and fails only when its result
        # arrives: without this, a handle cached before ``riqr down``/``up`` swallowed every report sent
        # without waiting until a heartbeat, which waits, found it dead.
        def done(future: Any) -> None:
            if future.cancelled() or future.exception() is not None:
                self._registry = None
                failed()
            else:
                answered(future.result())

        pending.future().add_done_callback(done)


class QueryLike(Protocol):
    """What the feeder asks of a Spark ``StreamingQuery``."""

    @property
    def isActive(self) -> bool: ...  # noqa: N802 (Spark's name)

    def exception(self) -> Any: ...


def _clip(text: str) -> str:
    """At most ``_MAX_ERROR`` characters: a JVM exception's text can carry a whole stack trace."""
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 3] + "..."


def _describe(err: Any) -> str:
    return _clip(f"{type(err).__name__}: {err}")


def _pid_namespace() -> str | None:
    """This process's PID namespace (Linux), which containers sharing a host name (host networking) do not
    share: a pid means the same process only within one. None where it cannot be read."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def _run_id() -> str:
    """host:pid:random, and :pid-namespace where there is one (``run_ended_here``)."""
    namespace = _pid_namespace()
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}" + (f":{namespace}" if namespace else "")


def run_ended_here(run: str) -> bool:
    """Whether ``run`` (a feeder's id, ``_run_id``) was a process of this host and PID namespace that no
    longer exists. False for a run of another host or container, for an id it cannot read, and for one
    whose process may still run (a pid taken again since by another process errs on the safe side: the
    claim then waits for the bound)."""
    parts = run.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit():
        return False
    namespace = parts[3] if len(parts) == 4 else None
    if parts[0] != socket.gethostname() or namespace != _pid_namespace():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists, as another user's
        return False
    return False


@dataclass(frozen=True)
class _Feed:
    report: FeedReport
    query: QueryLike | None = None


class Feeder:
    """The stores one process feeds in one namespace, and the heartbeat that keeps them alive at the
    registry. ``link`` and ``clock`` are injectable so the rules are unit-tested without Ray or Spark."""

    def __init__(
        self,
        link: FeedLink,
        *,
        interval: float = FEED_HEARTBEAT_INTERVAL,
        clock: Callable[[], float] = time.time,
        name: str = "riqr",
    ) -> None:
        self.id = _run_id()
        self.interval = interval
        self._link = link
        self._clock = clock
        self._name = name
        self._feeds: dict[str, _Feed] = {}
        # Last words (``stopped``, ``failed``) the registry has not taken yet: each rides every beat until it
        # is taken, or the store is fed from here again. A failed query's report lost to a registry that was
        # restarting would otherwise leave its feed to turn ``stale``, which says less than ``failed``.
        self._last_words: dict[str, FeedReport] = {}
        # Per store, the report fields every report of it carries once told (``dead_letters``, ``late_rows``):
        # totals kept by the topology, so a report made anew (a claim, a state change) never drops them.
        self._carried: dict[str, dict[str, Any]] = {}
        # Stores another feed holds now, each with why (the registry's answers): this process no longer
        # feeds them. ``_claims`` counts this process's claims per store, so an answer to a report sent
        # before a claim of its own does not undo it.
        self._superseded: dict[str, str] = {}
        self._claims: dict[str, int] = {}
        # Answers to reports sent without waiting, with the claims as they stood: Ray calls back on its own
        # thread (or at once, under the lock), which must not wait on anything, so the heartbeat's thread
        # reads them (``_take_answers``), woken at once.
        self._answers: deque[tuple[dict[str, int], Any]] = deque()
        self._words_taken: deque[dict[str, FeedReport]] = deque()  # the same for last words sent at once
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._nudge = threading.Event()  # beat now: a report sent without waiting was not taken
        self._thread: threading.Thread | None = None
        self.closed = False

    def now(self) -> float:
        """This feeder's clock: the time its reports carry (``FeedReport.at``), claims' included."""
        return self._clock()

    # -- what the sink and the dead-letter writer say -------------------------------------------------

    def update(self, store: str, **changes: Any) -> None:
        """Change ``store``'s feed (starting it if this process did not feed it yet) and tell the registry
        now, without waiting. A ``stopped`` or ``failed`` state is the feed's last word: it is sent, and
        the feed is forgotten once the registry has taken it (until then each beat sends it again). After
        ``finish`` this does nothing."""
        with self._lock:
            if self.closed:
                return
            feed = self._feeds.get(store) or _Feed(FeedReport(store, self.id, RUNNING))
            changes.setdefault("at", self._clock())
            for name in ("incomplete", "catching_up"):
                if name in changes:
                    changes[name] = tuple(changes[name])
            if changes.get("state", feed.report.state) != FAILED:
                changes.setdefault("error", None)
            report = replace(feed.report, **{**changes, **self._carried.get(store, {})})
            if report.live and store in self._superseded:
                return  # another topology feeds it: this one says no more about it (its next batch fails)
            if report.live:
                self._feeds[store] = replace(feed, report=report)
                self._last_words.pop(store, None)
            else:
                self._feeds.pop(store, None)
                self._last_words[store] = report
            self._send_now([report])
        self._ensure_beating()

    def attach(self, store: str, query: QueryLike | None) -> None:
        """The streaming query feeding ``store``: the heartbeat reports the feed ended when it has (None:
        none for now, as while the query is started again; the feed beats on without asking one)."""
        with self._lock:
            feed = self._feeds.get(store)
            if feed is not None:
                self._feeds[store] = replace(feed, query=query)

    def dead_letters(self, store: str, topic: str, total: int) -> None:
        """``store``'s topology has dead-lettered ``total`` records of ``topic`` so far. Sent with the
        store's feed, now if this process feeds it already, else once it does."""
        with self._lock:
            letters = {**self._carried.get(store, {}).get("dead_letters", {}), topic: total}
            self._carry(store, dead_letters=letters)

    def late_rows(self, store: str, total: int) -> None:
        """``store``'s query has dropped ``total`` input rows as late so far (``topologies.lateness``). Sent
        like ``dead_letters``."""
        with self._lock:
            self._carry(store, late_rows=total)

    def dropped_rows(self, store: str, counts: Mapping[str, int]) -> None:
        """The sink dropped rows of ``store`` it could not store, ``counts`` by reason: added to this
        process's totals (across its deliveries: an in-place rebuild's new one goes on counting), carried by
        every report from now on. Not sent by itself: the batch's own report follows."""
        with self._lock:
            if self.closed:
                return
            totals = dict(self._carried.get(store, {}).get("dropped_rows", {}))
            for reason, count in counts.items():
                totals[reason] = totals.get(reason, 0) + count
            self._carried.setdefault(store, {})["dropped_rows"] = totals

    def _carry(self, store: str, **fields: Any) -> None:
        """Under the lock: every report of ``store`` carries ``fields`` from now on; the feed's, now."""
        if self.closed:
            return
        self._carried.setdefault(store, {}).update(fields)
        feed = self._feeds.get(store)
        if feed is not None:
            report = replace(feed.report, **fields)
            self._feeds[store] = replace(feed, report=report)
            self._send_now([report])

    def superseded(self, store: str) -> str | None:
        """Why this process no longer feeds ``store``, if the registry said another feed holds it (a
        topology from another checkpoint took it while this one was silent past the bound); else None."""
        with self._lock:
            return self._superseded.get(store)

    def claimed(self, report: FeedReport) -> None:
        """This process has taken ``report.store``'s feed with ``report`` (``Registry.claim_feed``): whatever
        the registry said about it before no longer holds, and the feed beats from now on, before its
        query starts (a slow start does not let the claim go stale) until its last word."""
        with self._lock:
            if self.closed:
                return
            store = report.store
            self._superseded.pop(store, None)
            self._last_words.pop(store, None)
            self._claims[store] = self._claims.get(store, 0) + 1
            feed = self._feeds.get(store)
            if feed is None:
                self._feeds[store] = _Feed(replace(report, **self._carried.get(store, {})))
        self._ensure_beating()

    def _taken(self, sent: Mapping[str, FeedReport]) -> None:
        """Under the lock: the registry took these last words; each is forgotten, unless a newer one replaced
        it since."""
        for store, report in sent.items():
            if self._last_words.get(store) is report:
                del self._last_words[store]

    def _forget_taken_words(self) -> None:
        """Under the lock: last words the registry took, as Ray's callbacks queued them."""
        while self._words_taken:
            self._taken(self._words_taken.popleft())

    def _take_answers(self) -> None:
        while self._answers:
            self._answered(*self._answers.popleft())

    def _answered(self, claims: dict[str, int], answer: Any) -> None:
        """The registry's answer to reports sent when this process's claims stood at ``claims``: the
        stores another feed holds, with why. Each is no longer fed from here (its feed forgotten: no more
        heartbeats for it; its next batch fails, ``topologies.delivery``), once, unless this process has
        claimed it again since."""
        if not isinstance(answer, dict) or not answer:
            return
        with self._lock:
            for store, why in answer.items():
                if store in self._superseded or self._claims.get(store, 0) != claims.get(store, 0):
                    continue
                self._superseded[store] = str(why)
                self._feeds.pop(store, None)
                log.error("store %s: this topology no longer feeds it: %s", store, why, extra={"store": store})

    def live_stores(self) -> list[str]:
        with self._lock:
            return sorted(self._feeds)

    # -- the heartbeat -------------------------------------------------------------------------------

    def beat(self, timeout: float | None = None) -> None:
        """One heartbeat: every live feed's state, after asking its query whether it still runs.

        Queries are asked outside the lock (each is a call into Spark's JVM), so a batch report never
        waits for them. A query that cannot be asked is left out of this beat: if that lasts, the
        registry calls its feed stale, which is the safe side.
        """
        with self._lock:
            feeds = dict(self._feeds)
        ended: dict[str, tuple[str, str | None]] = {}
        unknown: set[str] = set()
        for store, feed in feeds.items():
            if feed.query is None:
                continue
            try:
                if not feed.query.isActive:
                    err = feed.query.exception()
                    ended[store] = (STOPPED, None) if err is None else (FAILED, _describe(err))
            except Exception:
                log.debug("could not ask the query feeding %s whether it runs", store, exc_info=True)
                unknown.add(store)
        with self._lock:
            if self.closed:
                return
            self._forget_taken_words()
            reports = []
            for store, feed in list(self._feeds.items()):
                if store in unknown:
                    continue
                if store in ended and feeds.get(store) == feed:
                    state, error = ended[store]
                    self._last_words[store] = replace(feed.report, state=state, error=error, at=self._clock())
                    del self._feeds[store]
                    log.info("store %s: its query ended (%s)", store, error or state, extra={"store": store})
                else:
                    reports.append(feed.report)
            last_words = dict(self._last_words)
            reports.extend(last_words.values())
            pending = self._submit(reports) if reports else None
            claims = dict(self._claims)
        if pending is not None:
            ok, answer = self._wait(pending, self.interval if timeout is None else timeout)
            if ok:
                with self._lock:
                    self._taken(last_words)
                self._answered(claims, answer)

    def finish(
        self, failed_query: str | None = None, error: str | None = None, timeout: float = FINISH_TIMEOUT
    ) -> None:
        """The process is ending: every live feed's last word, waited for, then silence.

        With no ``failed_query`` the topology is stopping on purpose: ``stopped``. Otherwise the feed of
        that query ``failed`` with ``error``, and the others ``failed`` because it did (their process
        exits with it). Called before the queries are stopped, so the heartbeat cannot report them
        ``stopped`` first. Returns once the heartbeat's thread has ended too (within ``timeout`` in all):
        a beat still waiting on the registry when the process ends and Ray shuts down would have Ray end
        the process with exit status 1 as the call returned.
        """
        until = time.monotonic() + timeout
        with self._lock:
            if self.closed:
                return
            self._forget_taken_words()
            now, reports = self._clock(), [r for s, r in self._last_words.items() if s not in self._feeds]
            for feed in self._feeds.values():
                if failed_query is None:
                    state, why = STOPPED, None
                elif feed.report.query == failed_query:
                    state, why = FAILED, _clip(error or "its query stopped")
                else:
                    state, why = FAILED, _clip(f"stopped because query {failed_query} of its topology failed: {error}")
                reports.append(replace(feed.report, state=state, error=why, at=now))
            self._feeds.clear()
            self._last_words.clear()
            self.closed = True
        self._stop.set()
        self._nudge.set()
        if reports:
            self._deliver(reports, timeout)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(until - time.monotonic(), 0.0))
            if thread.is_alive():
                log.warning("the ingest heartbeat of %s is still waiting on the registry", self._name)

    def _deliver(self, reports: Sequence[FeedReport], timeout: float) -> None:
        """Send ``reports`` until the registry takes them or ``timeout`` passes: last words are not
        repeated by a heartbeat, and a registry that is restarting, or that this process has not yet
        seen come back, fails a call it would take a moment later. Reports are whole states, so one
        taken twice does no harm."""
        deadline = time.monotonic() + timeout
        while True:
            pending = self._submit(reports)
            if pending is not None and self._wait(pending, max(deadline - time.monotonic(), 0.1))[0]:
                return
            if time.monotonic() + _RETRY_PAUSE >= deadline:
                log.warning("the registry did not take the last ingest reports of %s within %gs",
                            [r.store for r in reports], timeout)  # fmt: skip
                return
            time.sleep(_RETRY_PAUSE)

    # -- plumbing ------------------------------------------------------------------------------------

    def _submit(self, reports: Sequence[FeedReport]) -> Any:
        """Hand ``reports`` to the link (under the lock, so the registry gets reports in the order their
        states were taken); None if it could not."""
        try:
            return self._link.submit(reports)
        except Exception:
            log.debug("could not report ingest of %s", [r.store for r in reports], exc_info=True)
            return None

    def _send_now(self, reports: Sequence[FeedReport]) -> None:
        """Send without waiting; if the registry does not take them, the heartbeat beats at once (the
        beat carries every live feed's whole state, so it makes up for them)."""
        pending = self._submit(reports)
        if pending is None:
            return  # no registry to send to: the next beat looks it up again
        claims = dict(self._claims)  # under the lock, as callers hold it
        last_words = {r.store: r for r in reports if self._last_words.get(r.store) is r}

        def answered(answer: Any) -> None:
            if last_words:
                self._words_taken.append(last_words)
            if isinstance(answer, dict) and answer:
                self._answers.append((claims, answer))
                self._nudge.set()

        try:
            self._link.watch(pending, self._nudge.set, answered)
        except Exception:
            log.debug("cannot watch an ingest report", exc_info=True)

    def _wait(self, pending: Any, timeout: float) -> tuple[bool, Any]:
        """Whether the registry took ``pending`` within ``timeout``, and its answer if so."""
        try:
            return True, self._link.wait(pending, timeout)
        except Exception:
            log.debug("the registry did not take an ingest report", exc_info=True)
            return False, None

    def _ensure_beating(self) -> None:
        with self._lock:
            if self._thread is not None or self.closed:
                return
            self._thread = threading.Thread(target=self._run, name=f"riqr-feeder-{self._name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._nudge.wait(self.interval)
            if self._stop.is_set():
                return
            self._nudge.clear()
            try:
                self._take_answers()
                self.beat()
            except Exception:  # the heartbeat must outlive any one failure
                log.warning("ingest heartbeat failed", exc_info=True)


_FEEDERS: dict[str, Feeder] = {}
_FEEDERS_LOCK = threading.Lock()


def feeder_for(namespace: str) -> Feeder:
    """This process's feeder for ``namespace`` (one heartbeat thread per namespace, started with the
    first feed)."""
    with _FEEDERS_LOCK:
        feeder = _FEEDERS.get(namespace)
        if feeder is None or feeder.closed:
            feeder = _FEEDERS[namespace] = Feeder(RayFeedLink(namespace), name=namespace)
        return feeder


def finish_all(failed_query: str | None = None, error: str | None = None, timeout: float = FINISH_TIMEOUT) -> None:
    """``finish`` every feeder of this process (the topology process is ending)."""
    with _FEEDERS_LOCK:
        feeders = list(_FEEDERS.values())
    for feeder in feeders:
        feeder.finish(failed_query, error, timeout)
