"""A stop lets the batch in progress end (``topologies.inflight``): the count of batches inside their
``foreachBatch`` function per query, the bounded wait, and ``supervise`` stopping each query between two of
its batches (fakes of Spark's StreamingQuery, no Spark)."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from topologies.inflight import IN_FLIGHT, BatchGivenUp, InFlight, ended_by_stop, stop_between_batches
from topologies.runner import supervise

pytestmark = pytest.mark.usefixtures("no_feeders")


Event = tuple[str, str]  # ("stop", query), ("end", query): a batch's end, just before it leaves; ("wait", ...)


class Query:
    """A query whose ``stop()`` records whether a batch of it was inside its function at that moment (and,
    given ``events``, that it was stopped, in order with the batches' ends; then calls ``on_stop``)."""

    def __init__(self, name: str, in_flight: InFlight = IN_FLIGHT, events: list[Event] | None = None) -> None:
        self.name = name
        self.in_flight = in_flight
        self.events = events
        self.on_stop: Callable[[], None] | None = None
        self.stopped = False
        self.stopped_inside: bool | None = None

    @property
    def isActive(self) -> bool:  # noqa: N802 (Spark's name)
        return not self.stopped

    def stop(self) -> None:
        self.stopped_inside = self.in_flight.inside(self.name)
        self.given_up = self.in_flight.given_up(self.name)
        self.stopped = True
        if self.events is not None:
            self.events.append(("stop", self.name))
        if self.on_stop is not None:
            self.on_stop()

    def exception(self) -> Exception | None:
        return None


def batch_for(in_flight: InFlight, name: str, seconds: float) -> tuple[threading.Thread, threading.Event]:
    """A thread that is inside a batch of ``name`` for ``seconds``; the event is set once it is inside."""
    inside = threading.Event()

    def run() -> None:
        with in_flight.batch(name):
            inside.set()
            time.sleep(seconds)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert inside.wait(5)
    return thread, inside


class HeldBatch:
    """A thread inside a batch of ``name`` until ``release()`` (or ``hold`` seconds, a hang guard longer than
    any grace it is tested with); it appends ``("end", name)`` to ``events`` just before leaving the batch."""

    def __init__(self, in_flight: InFlight, name: str, events: list[Event], hold: float = 30.0) -> None:
        self._released = threading.Event()
        inside = threading.Event()

        def run() -> None:
            with in_flight.batch(name):
                inside.set()
                self._released.wait(hold)
                events.append(("end", name))

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert inside.wait(5)

    def release(self) -> None:
        self._released.set()


class RecordingFlight(InFlight):
    """An ``InFlight`` whose waits for a batch to end are recorded in ``events`` as ``("wait", names)``; each
    calls ``on_wait`` first (a test lets a batch end only once the stop waits for it)."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events
        self.on_wait: Callable[[], None] = lambda: None

    def wait_any_out(self, names: Sequence[str], timeout: float) -> bool:
        self.events.append(("wait", ",".join(names)))
        self.on_wait()
        return super().wait_any_out(names, timeout)


def without_waits(events: list[Event]) -> list[Event]:
    return [e for e in events if e[0] != "wait"]


def test_batches_are_counted_per_query_and_leave_on_errors_too() -> None:
    flight = InFlight()
    assert not flight.inside("q") and flight.wait_any_out(["q"], 0)
    with flight.batch("q"):
        assert flight.inside("q") and not flight.inside("other")
        with flight.batch("q"):  # two at once (never in Spark, but counted, not flagged)
            pass
        assert flight.inside("q")
        assert not flight.wait_any_out(["q"], 0.01)
        assert flight.wait_any_out(["other"], 0)
    assert not flight.inside("q")
    with pytest.raises(RuntimeError), flight.batch("q"):
        raise RuntimeError("the batch failed")
    assert not flight.inside("q") and flight.wait_any_out(["q"], 0)
    with flight.batch(None):  # a function not told its query's name is not counted
        assert flight.wait_any_out(["q"], 0)


def test_a_stop_waits_for_the_batch_in_progress_then_stops_between_batches() -> None:
    events: list[Event] = []
    flight = RecordingFlight(events)
    name = "riqr-ns-order-count"
    query = Query(name, flight, events)
    batch = HeldBatch(flight, name, events)
    flight.on_wait = batch.release  # the batch ends only once the stop waits for it
    assert stop_between_batches([query], 10, in_flight=flight) == []
    # It waited while the batch was in progress, and stopped the query after the batch ended.
    assert events[0] == ("wait", name) and without_waits(events) == [("end", name), ("stop", name)]
    assert query.stopped and query.stopped_inside is False
    batch.thread.join(5)


def test_each_query_is_stopped_as_soon_as_its_own_batch_ends_not_after_the_others() -> None:
    events: list[Event] = []
    flight = RecordingFlight(events)
    quick, slow, idle = Query("quick", flight, events), Query("slow", flight, events), Query("idle", flight, events)
    quick_batch, slow_batch = HeldBatch(flight, "quick", events), HeldBatch(flight, "slow", events)
    flight.on_wait = quick_batch.release  # the quick one's batch ends once the stop waits
    quick.on_stop = slow_batch.release  # the slow one's only once the quick one is stopped
    assert stop_between_batches([slow, quick, idle], 10, in_flight=flight) == []
    assert [q.stopped_inside for q in (quick, slow, idle)] == [False, False, False]
    # The idle one at once, before any batch ended; each other one at its own batch's end (waiting for the
    # slow one's before stopping the quick one would wait out the grace: the slow one's ends only after).
    assert without_waits(events) == [("stop", "idle"), ("end", "quick"), ("stop", "quick"), ("end", "slow"),
                                     ("stop", "slow")]  # fmt: skip
    for batch in (quick_batch, slow_batch):
        batch.thread.join(5)


def test_a_batch_longer_than_the_grace_is_stopped_in_progress_and_said_so(caplog: pytest.LogCaptureFixture) -> None:
    events: list[Event] = []
    flight = RecordingFlight(events)
    query = Query("riqr-ns-order-count", flight, events)
    batch = HeldBatch(flight, query.name, events, hold=10.0)  # ends when released below
    assert stop_between_batches([query], 0.05, in_flight=flight) == [query.name]
    # Returned with the batch still in progress: the grace, not the batch, bounded the wait.
    assert flight.inside(query.name) and without_waits(events) == [("stop", query.name)]
    batch.release()
    assert query.stopped and query.stopped_inside is True
    assert query.given_up  # its function is told too: Spark's stop() waits for it
    assert not flight.given_up(query.name)  # and only while the stop runs
    assert "did not end within" in caplog.text and query.name in caplog.text
    batch.thread.join(5)


def test_batches_are_told_the_stop_gave_up_on_them_only_while_their_querys_stop_runs() -> None:
    """Each query is marked given up around its own stop() (one whose batch ended before has none inside to
    tell, but one that enters during that stop is told too), and only then."""
    events: list[Event] = []
    flight = RecordingFlight(events)
    ended, cut = Query("ended", flight, events), Query("cut", flight, events)
    batches = [HeldBatch(flight, "ended", events), HeldBatch(flight, "cut", events)]
    flight.on_wait = batches[0].release  # "ended" ends within the grace, "cut" only after the stop
    assert not flight.given_up("ended") and not flight.given_up("cut")
    assert stop_between_batches([ended, cut], 0.5, in_flight=flight) == ["cut"]
    batches[1].release()
    assert (ended.stopped_inside, cut.stopped_inside) == (False, True) and ended.given_up and cut.given_up
    assert not flight.given_up("cut") and not flight.given_up(None)
    for batch in batches:
        batch.thread.join(5)


def test_a_sink_retrying_gone_owners_gives_up_when_the_stop_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Owners unreachable, or alive and not answering: the sink retries for its delivery timeout (a
    minute), and Spark's stop() would wait that long for it. A stop that gives up ends it within a
    fraction of a second, without reporting the feed failed (its last word, ``stopped``, is said)."""
    from runtime.deadline import Deadline
    from runtime.errors import OwnerUnavailable
    from tests.unit.test_runner import FakeFeeder, one_string_store
    from topologies.delivery import BatchDelivery

    name = "riqr-ns-gone"
    feeder = FakeFeeder()
    delivery = BatchDelivery(one_string_store(), "ns", "unused", query_name=name, feeder=feeder)  # type: ignore[arg-type]

    # Each time the sink looks the owner up, and each slice of its pauses between: whether the stop had
    # given up on the batch by then.
    lookups: list[bool] = []
    pauses: list[bool] = []
    retrying = threading.Event()

    def gone(uuid: str) -> None:
        lookups.append(IN_FLIGHT.given_up(name))
        if len(lookups) == 5:  # its backoff doubles from 50 ms: from here on a pause takes several slices
            retrying.set()
        raise OwnerUnavailable(f"query actor {uuid} is not running", actor=uuid)

    def pause(seconds: float) -> None:  # the only sleep of topologies.delivery: its pause between tries
        pauses.append(IN_FLIGHT.given_up(name))
        time.sleep(seconds)

    sleeps = types.SimpleNamespace(monotonic=time.monotonic, perf_counter=time.perf_counter, sleep=pause)
    monkeypatch.setattr("topologies.delivery.time", sleeps)

    monkeypatch.setattr(delivery, "handle", gone)
    errors: list[BaseException] = []

    def run() -> None:
        with IN_FLIGHT.batch(name):
            try:
                delivery._apply_to("src", 7, {"uuid-1": {0: None}}, Deadline.after(60))
            except BaseException as err:  # noqa: BLE001 (the test looks at it)
                errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    query = Query(name)
    # As Spark's: stop() returns once the query's thread has, and so its function (10 s: a hang guard; the
    # sink would retry for its 60 s).
    query.stop = lambda: (Query.stop(query), thread.join(10))  # type: ignore[method-assign]
    assert retrying.wait(10), "the sink never asked the gone owner again"
    assert stop_between_batches([query], 0.1) == [name]
    thread.join(5)
    assert not thread.is_alive()
    # Its pause saw the stop give up within a slice: no slice of it begun after that, nor an owner asked
    # again (one at most, begun as the stop came), where retrying on would go on until the hang guard.
    assert sum(pauses) <= 1 and sum(lookups) <= 1, (pauses, lookups)
    assert len(errors) == 1 and isinstance(errors[0], BatchGivenUp), errors
    assert "runs again at the next start" in str(errors[0])

    # An owner alive but not answering: its call pending (a fake ray.wait that never sees it ready).
    class Pending:
        class apply_parts:  # noqa: N801 (Ray's method)
            @staticmethod
            def remote(*_args: Any, **_kwargs: Any) -> str:
                return "ref"

    # Each wait on the owner: whether the stop had given up on the batch as it began.
    owner_waits: list[bool] = []
    waiting = threading.Event()

    def never_ready(refs: list[Any], *, num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        owner_waits.append(IN_FLIGHT.given_up(name))
        waiting.set()
        time.sleep(timeout)
        return [], list(refs)

    monkeypatch.setattr(delivery, "handle", lambda uuid: Pending())
    monkeypatch.setattr("topologies.delivery.ray.wait", never_ready)

    def no_ray(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("waited the call's whole timeout: the stop's giving up was not seen")

    monkeypatch.setattr("topologies.delivery.raycalls.get", no_ray)
    monkeypatch.setattr("topologies.delivery._CALL_TIMEOUT", 3.0)
    errors.clear()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    query = Query(name)
    query.stop = lambda: (Query.stop(query), thread.join(10))  # type: ignore[method-assign]
    assert waiting.wait(10), "the sink never waited on the owner"
    assert stop_between_batches([query], 0.1) == [name]
    assert not thread.is_alive()
    # Seen within the wait's slice in progress: no wait on the owner begun after the stop gave up (one at
    # most, begun as it came), where waiting on would take slices until the call's timeout (3 s, then
    # ``no_ray``'s error).
    assert sum(owner_waits) <= 1, owner_waits
    assert len(errors) == 1 and isinstance(errors[0], BatchGivenUp), errors

    class Given:
        sparkSession = JvmSession(interrupted_after=2)  # noqa: N815 (Spark's name)

        def toArrow(self) -> None:  # noqa: N802 (Spark's name)
            raise BatchGivenUp("gave up")

    delivery._source = "src"
    try:
        with IN_FLIGHT.giving_up([name]):  # as stop_between_batches, around the query's stop()
            delivery(Given(), 8)
        raise AssertionError("the batch given up ended without an error: Spark would commit it")
    except BatchGivenUp:
        # What py4j hands the JVM for a Python function's error, which Spark's expression searches.
        proxy_error = f"An exception was raised by the Python Proxy. Return Message: {traceback.format_exc()}"
    assert not [u for u in feeder.updates if u.get("state") == "failed"]
    # Ended as the stop's interruption, which Spark takes for a stop (``ended_by_stop``), and short after
    # the expression's first match (its depth of recursion): no context of the deeper frames.
    match = SPARK_PROXY_ERROR.search(proxy_error)
    assert match is not None, proxy_error
    assert len(proxy_error) - match.start() < 400 and proxy_error.count("Traceback") == 1, proxy_error


class JavaError:
    """What py4j's ``Py4JJavaError.java_exception`` answers of its class (a JVM object, faked)."""

    def __init__(self, name: str, cause: JavaError | None = None) -> None:
        self.name = name
        self.cause = cause
        self._target_id = "o1"

    def getClass(self) -> Any:  # noqa: N802 (Java's name)
        return self

    def getName(self) -> str:  # noqa: N802 (Java's name)
        return self.name

    def getCause(self) -> JavaError | None:  # noqa: N802 (Java's name)
        return self.cause


class JvmSession:
    """A session's ``_jvm`` whose ``java.lang.Thread.sleep`` raises as the JVM does on a thread a query's
    stop interrupted, from the ``interrupted_after``-th call on (None: never; ``error``: that Java class).
    With ``clock`` (a fake ``time.monotonic``'s reading, ``[seconds]``), a sleep moves that clock on instead
    of sleeping, and more than a thousand of them fail (a hang guard)."""

    def __init__(
        self,
        interrupted_after: int | None,
        error: str = "java.lang.InterruptedException",
        clock: list[float] | None = None,
    ) -> None:
        self.sleeps: list[int] = []
        session = self

        class Thread:
            @staticmethod
            def sleep(ms: int) -> None:
                from py4j.protocol import Py4JJavaError

                session.sleeps.append(ms)
                if interrupted_after is not None and len(session.sleeps) >= interrupted_after:
                    raise Py4JJavaError("An error occurred while calling z:java.lang.Thread.sleep.\n", JavaError(error))
                if clock is None:
                    time.sleep(ms / 1000)
                    return
                assert len(session.sleeps) <= 1000, "slept on and on: the wait for the interruption never ended"
                clock[0] += ms / 1000

        self._jvm = type("Jvm", (), {"java": type("java", (), {"lang": type("lang", (), {"Thread": Thread})})})


# Spark's test of a Python function's error for its query's stop (``StreamExecution.PROXY_ERROR``), the same
# expression in Python's syntax.
SPARK_PROXY_ERROR = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|java.nio.channels.ClosedByInterruptException)"
)


def test_a_batch_given_up_ends_as_the_stops_interruption_once_the_jvm_interrupts_the_querys_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark ends a query stopped while its Python function ran as stopped only if the function's error is
    the stop's interruption, which it finds with ``SPARK_PROXY_ERROR`` over the whole message: a long one
    overflowed its stream thread's stack. ``ended_by_stop`` calls into the JVM until the interruption comes,
    and returns a one-line error that says so; py4j's error record of that one is dropped."""
    given_up = BatchGivenUp("delivering batch 4 of order-count: the topology is stopping and gave up")
    session = JvmSession(interrupted_after=3)
    ended = ended_by_stop(session._jvm, given_up)
    assert len(session.sleeps) == 3 and ended is not given_up and getattr(ended, "interrupted", False)
    assert str(ended).startswith(str(given_up)) and SPARK_PROXY_ERROR.search(str(ended))
    assert len(str(ended)) < 400 and "\n" not in str(ended)
    py4j = logging.getLogger("py4j.clientserver")

    def record(error: BaseException) -> logging.LogRecord:
        return py4j.makeRecord(py4j.name, logging.ERROR, __file__, 1, "There was an exception", (),
                               (type(error), error, None))  # fmt: skip

    assert not py4j.filter(record(ended))
    assert py4j.filter(record(given_up)) and py4j.filter(record(RuntimeError("a real failure")))

    # No interruption in time (a JVM thread py4j did not pin): the error as it was, Spark logs it as a failure.
    # On a fake clock that the JVM's sleeps move on: it slept in short calls, 0.2 s in all, then gave up.
    clock = [1000.0]
    session = JvmSession(interrupted_after=None, clock=clock)
    with monkeypatch.context() as patched:
        patched.setattr("topologies.inflight.time", types.SimpleNamespace(monotonic=lambda: clock[0]))
        assert ended_by_stop(session._jvm, given_up, within=0.2) is given_up
    assert len(session.sleeps) > 1 and max(session.sleeps) <= 50, session.sleeps
    assert 200 <= sum(session.sleeps) <= 201, session.sleeps  # its bound, not INTERRUPT_WAIT's 2 s

    # Another Java error is not taken for the interruption.
    # Another Java error is not taken for the interruption, nor a JVM that is gone: the error as it was.
    other = JvmSession(interrupted_after=1, error="java.lang.IllegalStateException")
    assert ended_by_stop(other._jvm, given_up) is given_up

    class Gone:
        @property
        def java(self) -> Any:
            from py4j.protocol import Py4JNetworkError

            raise Py4JNetworkError("Answer from Java side is empty")

    assert ended_by_stop(Gone(), given_up) is given_up


def test_a_batch_whose_job_the_stop_cancels_ends_as_the_stops_interruption_and_only_then() -> None:
    """A query stopped while it planned a batch, or past the grace, has that batch's Spark job cancelled, and
    its function ends with whatever py4j made of that. While the query's stop runs (``giving_up``, as
    ``stop_between_batches`` marks it), ``InFlight.batch`` ends the function as the stop's interruption;
    any other time the error is the function's own."""
    name = "riqr-ns-cancelled"
    in_flight = InFlight()
    session = JvmSession(interrupted_after=2)

    def run(error: BaseException) -> BaseException:
        try:
            with in_flight.batch(name, jvm=lambda: session._jvm):
                raise error
        except BaseException as ended:  # noqa: BLE001 (the test looks at it)
            return ended
        raise AssertionError("the function's error was swallowed")

    cancelled = RuntimeError("Job 12 cancelled part of cancelled job group 5f0c...")
    with in_flight.giving_up([name]):
        assert in_flight.given_up(name)
        ended = run(cancelled)
    assert not in_flight.given_up(name)
    assert isinstance(ended, BatchGivenUp) and getattr(ended, "interrupted", False) and len(session.sleeps) == 2
    assert str(ended).startswith(f"query {name}: its batch in progress ended with the stop (RuntimeError: Job 12")
    assert SPARK_PROXY_ERROR.search(str(ended))
    assert run(cancelled) is cancelled  # no stop running: a failure like any other

    # stop_between_batches marks each stop, of a query between batches (a batch may enter meanwhile) and of
    # one it gives up on alike; and only while the stop runs.
    idle, busy = Query("riqr-ns-idle", in_flight), Query("riqr-ns-busy", in_flight)
    thread, inside = batch_for(in_flight, busy.name, 0.5)
    assert inside.wait(5)
    assert stop_between_batches([idle, busy], 0.05, in_flight=in_flight) == [busy.name]
    # A batch that enters during the stop of a query between batches gives up as well (its stop waits for it).
    assert busy.given_up and idle.given_up
    assert not in_flight.given_up(idle.name) and not in_flight.given_up(busy.name)
    thread.join(5)

    # A job the interruption itself ended (the JVM's InterruptedException, through py4j): no wait for another.
    from py4j.protocol import Py4JJavaError

    session.sleeps.clear()
    with in_flight.giving_up([name]):
        ended = run(
            Py4JJavaError("An error occurred while calling o88.toArrow.\n", JavaError("java.lang.InterruptedException"))
        )
    assert getattr(ended, "interrupted", False) and session.sleeps == []
    # ...also as the cause of a Java error (a job interrupted under toArrow), or of a Python one.
    session.sleeps.clear()
    wrapped = JavaError("org.apache.spark.SparkException", cause=JavaError("java.io.InterruptedIOException"))
    with in_flight.giving_up([name]):
        ended = run(Py4JJavaError("An error occurred while calling o88.toArrow.\n", wrapped))
    assert getattr(ended, "interrupted", False) and session.sleeps == []
    session.sleeps.clear()
    try:
        raise Py4JJavaError(
            "An error occurred while calling o88.toArrow.\n", JavaError("java.lang.InterruptedException")
        )
    except Py4JJavaError as interruption:
        outer = RuntimeError("could not read the batch")
        outer.__cause__ = interruption
    with in_flight.giving_up([name]):
        ended = run(outer)
    assert getattr(ended, "interrupted", False) and session.sleeps == []

    # No interruption to end with: the batch's own error, whole (its cause kept), raised as it was.
    never = JvmSession(interrupted_after=None)
    try:
        raise RuntimeError("a failure of its own") from KeyError("the root of it")
    except RuntimeError as own:
        failed = own
    try:
        with in_flight.giving_up([name]), in_flight.batch(name, jvm=lambda: never._jvm):
            raise failed
    except RuntimeError as raised:
        assert raised is failed and isinstance(raised.__cause__, KeyError)
    assert never.sleeps  # it waited (INTERRUPT_WAIT) for an interruption that did not come


def test_supervise_stops_each_query_between_its_batches_within_one_grace() -> None:
    store, letters, idle = Query("riqr-ns-store"), Query("riqr-deadletter-x"), Query("riqr-ns-idle")
    busy = [batch_for(IN_FLIGHT, store.name, 0.3)[0], batch_for(IN_FLIGHT, letters.name, 0.4)[0]]
    stop = threading.Event()
    stop.set()
    assert supervise([store, letters, idle], poll=0.001, stop=stop, grace=10) == 0
    assert [q.stopped_inside for q in (store, letters, idle)] == [False, False, False]
    for thread in busy:
        thread.join(5)

    # Batches that outlast the grace: every query is stopped by its end, not one grace each (with one
    # each, the second would be stopped a second later, after its batch ended).
    store, letters = Query("riqr-ns-store"), Query("riqr-deadletter-x")
    busy = [batch_for(IN_FLIGHT, store.name, 1.6)[0], batch_for(IN_FLIGHT, letters.name, 1.6)[0]]
    assert supervise([store, letters], poll=0.001, stop=stop, grace=1.0) == 0
    assert store.stopped_inside is True and letters.stopped_inside is True
    for thread in busy:
        thread.join(5)


def test_a_second_signal_while_the_queries_stop_cancels_the_batches_in_progress(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``riqr demo``'s first Ctrl-C set the flag; a second one, while a batch holds the stop up, stops the
    query in its batch at once. Nothing is raised: a KeyboardInterrupt inside a call into the JVM or Ray
    would break that call's connection."""
    events: list[Event] = []
    query = Query("riqr-ns-store", IN_FLIGHT, events)
    batch = HeldBatch(IN_FLIGHT, query.name, events)  # ends only once released, after supervise returned
    stop = threading.Event()
    stop.set()
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN under a shell's background job
    waits: list[Sequence[str]] = []
    real_wait = IN_FLIGHT.wait_any_out

    def wait_any_out(names: Sequence[str], timeout: float) -> bool:
        waits.append(names)
        if len(waits) == 1:  # the second Ctrl-C, as the stop begins waiting for the batch
            os.kill(os.getpid(), signal.SIGINT)
        return real_wait(names, timeout)

    monkeypatch.setattr(IN_FLIGHT, "wait_any_out", wait_any_out)
    try:
        assert supervise([query], poll=0.001, stop=stop, grace=10) == 0
    finally:
        batch.release()
    # Stopped in its batch (which had not ended), within a slice of the wait after the signal rather than
    # at the grace's end (a hundred slices of 0.1 s).
    assert query.stopped and query.stopped_inside is True and events[0] == ("stop", query.name)
    assert 1 <= len(waits) <= 2, len(waits)
    assert "before a second signal" in caplog.text
    assert signal.getsignal(signal.SIGINT) == before  # the handlers are put back
    batch.thread.join(5)


def test_a_stop_looks_at_each_query_just_before_stopping_it() -> None:
    """Stopping one query takes time (Spark waits for its thread); another may start a batch meanwhile,
    and is then waited for rather than stopped in it."""
    flight = InFlight()
    first, second = Query("first", flight), Query("second", flight)
    entered: list[threading.Thread] = []

    def slow_stop() -> None:
        entered.append(batch_for(flight, "second", 0.3)[0])  # the second's next batch begins meanwhile
        Query.stop(first)

    first.stop = slow_stop  # type: ignore[method-assign]
    assert stop_between_batches([first, second], 10, in_flight=flight) == []
    assert first.stopped and second.stopped and second.stopped_inside is False
    entered[0].join(5)


def test_a_rebuilds_stop_waits_for_the_batch_in_progress(running: dict[str, object]) -> None:
    from tests.unit.test_runner import FakeDelivery
    from topologies import sink

    query = Query("riqr-ns-order-count")
    running[query.name] = (FakeDelivery("order-count"), lambda **_: None)
    thread, _ = batch_for(IN_FLIGHT, query.name, 0.3)
    sink.stop_for_rebuild(query.name, query)
    assert query.stopped and query.stopped_inside is False
    thread.join(5)


def test_the_sinks_batch_counts_itself_inside_while_it_runs_and_not_after() -> None:
    from tests.unit.test_runner import FakeFeeder, one_string_store
    from topologies.delivery import BatchDelivery

    name = "riqr-ns-s"
    seen: list[bool] = []

    class Batch:
        def toArrow(self) -> None:  # noqa: N802 (Spark's name)
            seen.append(IN_FLIGHT.inside(name))
            raise RuntimeError("cancelled")  # and the batch goes no further

    delivery = BatchDelivery(one_string_store(), "ns", "unused", query_name=name, feeder=FakeFeeder())  # type: ignore[arg-type]
    delivery._source = "src"
    with pytest.raises(RuntimeError, match="cancelled"):
        delivery(Batch(), 3)
    assert seen == [True] and not IN_FLIGHT.inside(name)
