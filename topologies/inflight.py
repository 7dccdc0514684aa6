"""Which streaming queries of this process are inside their ``foreachBatch`` function, so a stop can let
the batch in progress end instead of cancelling it.

Spark's ``StreamingQuery.stop()`` cancels the jobs of the micro-batch in progress at once. riqr's sink
(``topologies.delivery.BatchDelivery``) and the dead-letter writer (``topologies.deadletter``) run their
batch's job inside their Python ``foreachBatch`` function (``toArrow``), so the
cancellation comes back through py4j as an error in that function. py4j logs it with a traceback, hands
it back to the JVM, and the query's stream thread logs it again (Spark's check of whether the error was
the stop's runs regular expressions over the whole Python traceback, and once overflowed the thread's
stack doing so). Nothing is lost, the batch runs again at the next start, but a topology stopped on
purpose under load printed pages of errors every time.

So a stop waits, bounded, until the query's function has returned, then calls ``stop()``: between two
batches Spark is listing its source, writing its logs or planning, which a stop interrupts quietly. The
next batch enters the function only after all that (100 ms or more here), so the window between the look
and the stop is small; a batch that outlasts the bound (a large backlog) is cancelled as before. A query
stopped while it plans a batch may still run that batch's job, which the stop has already cancelled. The
function of a batch cancelled either way ends, while the stop runs (``InFlight.stopping``), as that stop's
interruption (``ended_by_stop``), which Spark takes for a stop: nothing is logged as an error (docs/design.md,
"A stop lets the batch in progress end").

A stop that gives up waiting also tells the functions still inside (``InFlight.given_up``): Spark's
``stop()`` cancels Spark's jobs but then waits for the function, and the sink's function may be waiting on
Ray, retrying owners that are gone for up to its delivery timeout. It gives up within a quarter second,
and ends its batch as Spark expects of a function its stop interrupted (``ended_by_stop``): Spark then
ends the query as stopped, not as failed, and nobody logs the batch as an error.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["IN_FLIGHT", "BatchGivenUp", "InFlight", "STOP_GRACE", "ended_by_stop", "stop_between_batches"]

log = logging.getLogger(__name__)

# How long a stop waits for the batch in progress, at most. ``ray job stop`` sends SIGTERM and SIGKILLs
# the job 3 s later (``RAY_JOB_STOP_WAIT_TIME_S``): the wait leaves time for the queries' and Spark's stop.
STOP_GRACE = 1.5


# How long a function whose batch a stop gave up on waits for that stop to interrupt its query's thread.
INTERRUPT_WAIT = 2.0

# What Spark looks for in a Python ``foreachBatch`` function's error to tell that its query's stop
# interrupted it (``StreamExecution.PROXY_ERROR``, SPARK-39218): py4j's Java error, then the interruption.
INTERRUPTED = ("py4j.protocol.Py4JJavaError: An error occurred while calling z:java.lang.Thread.sleep: "
               "java.lang.InterruptedException (the query's stop interrupted its stream thread)")  # fmt: skip


class BatchGivenUp(RuntimeError):
    """A stop gave up waiting for this batch: its function ends it unfinished (it runs again at the next
    start, as any batch a stop cancels)."""


def ended_by_stop(
    jvm: Any, error: BaseException, query: str | None = None, within: float = INTERRUPT_WAIT
) -> BaseException:
    """The error a ``foreachBatch`` function of ``query`` whose batch ended with ``error`` while its query
    was being stopped ends with, once that stop has interrupted the query's thread (waiting at most
    ``within`` seconds for it). ``error`` is ``BatchGivenUp`` (the stop gave up waiting for the batch) or
    whatever the stop's cancellation of the batch's Spark job made of it.

    ``stop()`` marks the query terminated, cancels its jobs, then interrupts its stream thread and waits for
    it, and that thread is the one running the function (py4j's pinned threads: the function's calls into
    the JVM run on the thread that called it). Spark ends a query whose last batch failed with an
    interruption after its stop as stopped; any other error fails the query, and Spark and py4j log it with
    pages of traceback. So the function calls into the JVM (a short ``Thread.sleep``) until the
    interruption comes back as py4j's ``Py4JJavaError`` (or finds it in ``error`` already: a job the
    interruption ended), and ends with that, in one line: Spark recognizes the interruption by a regular
    expression over the function's error message, which recurses once per character after the first match
    of its prefix, and the Java stack trace py4j's error carries overflowed the stream thread's stack
    (measured: 5,204 characters did). An interruption that does not come in time (a JVM thread py4j does
    not pin, or a JVM that is gone) leaves ``error`` as it is: the query then ends failed, but its batch
    still runs again at the next start. ``error`` may not be the stop's doing (a batch that failed on its
    own as the stop came): its first line is in the info line, its traceback at debug level.
    """
    from py4j.protocol import Py4JError

    if isinstance(error, BatchGivenUp):
        told = str(error)
    else:  # the batch's own error, in a line (py4j's str() of a Java error asks the JVM for its stack)
        why = getattr(error, "errmsg", None) or str(error)
        told = (f"query {query}: its batch in progress ended with the stop ({type(error).__name__}: "
                f"{_first_line(why)}); it runs again at the next start")  # fmt: skip
        log.debug("query %s: the error its batch ended with during the stop", query, exc_info=error)
    try:
        interrupted = _interruption_in(error)
        thread = jvm.java.lang.Thread
        deadline = time.monotonic() + within
        while not interrupted and (left := deadline - time.monotonic()) > 0:
            try:
                thread.sleep(max(1, int(min(left, 0.05) * 1000)))
            except Py4JError as err:
                if not _interruption_in(err):
                    raise
                interrupted = True
    except Py4JError:  # the JVM gone, or another error of it: the batch's own error says more
        log.debug("query %s: no interruption of its stop to end the batch with", query, exc_info=True)
        return error
    if not interrupted:
        return error
    ended = BatchGivenUp(f"{told} ({INTERRUPTED})")
    ended.interrupted = True  # type: ignore[attr-defined]
    _quiet_given_up()  # before py4j logs it, once the function has raised it
    log.info("%s; ended as the stop's interruption", told)
    return ended


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else f"{line[: limit - 3]}..."


# The Java exceptions Spark takes for its stop's interruption (``StreamExecution.IO_EXCEPTION_NAMES``).
_INTERRUPTIONS = frozenset(
    {"java.lang.InterruptedException", "java.io.InterruptedIOException", "java.nio.channels.ClosedByInterruptException"}
)


def _interruption_in(error: BaseException, depth: int = 8) -> bool:
    """Whether ``error`` is py4j's error for a Java interruption (``_INTERRUPTIONS``), or one caused by it
    (looked at ``depth`` causes deep, on either side). Raises py4j's error if the JVM cannot be asked."""
    from py4j.protocol import Py4JJavaError

    seen: BaseException | None = error
    for _ in range(depth):
        if seen is None:
            return False
        if isinstance(seen, Py4JJavaError):
            java: Any = seen.java_exception
            for _ in range(depth):
                if java is None:
                    break
                if java.getClass().getName() in _INTERRUPTIONS:
                    return True
                java = java.getCause()
        seen = seen.__cause__ or seen.__context__
    return False


class _GivenUpQuiet(logging.Filter):
    """Drops py4j's error record for a batch that ended as its stop's interruption (``ended_by_stop``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, BatchGivenUp) and getattr(error, "interrupted", False))


_QUIET = _GivenUpQuiet()


def _quiet_given_up() -> None:
    """py4j logs every error of a Python function the JVM called, with its traceback, at error level; a
    batch a stop gave up on and ended as the stop's interruption is not one (the stop's warning names it).
    Idempotent."""
    py4j = logging.getLogger("py4j.clientserver")
    if _QUIET not in py4j.filters:
        py4j.addFilter(_QUIET)


class InFlight:
    """Per query name, how many calls of its ``foreachBatch`` function are running."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside: dict[str, int] = {}
        self._given_up: collections.Counter[str] = collections.Counter()  # its stop() running, at once

    @contextlib.contextmanager
    def batch(self, name: str | None, jvm: Callable[[], Any] | None = None) -> Iterator[None]:
        """Around the body of a ``foreachBatch`` function of the query ``name`` (None: not counted). With
        ``jvm`` (the session's ``_jvm``, asked for only then), an error that ends the body while the query's
        stop runs ends it as that stop's interruption (``ended_by_stop``): a batch the stop gave up on, or
        whose Spark job it cancelled (a query stopped while it planned the batch, or past the grace)."""
        if name is None:
            yield
            return
        with self._cond:
            self._inside[name] = self._inside.get(name, 0) + 1
        try:
            yield
        except Exception as error:
            if jvm is None or not self.given_up(name):
                raise
            try:
                ended = ended_by_stop(jvm(), error, name)
            except Exception:  # no session to ask (a fake, or one already gone)
                log.debug("query %s: could not end its batch as the stop's interruption", name, exc_info=True)
                ended = error
            if ended is error:  # no interruption to end with: the batch's own error, whole
                raise
            raise ended from None
        finally:
            with self._cond:
                left = self._inside[name] - 1
                if left:
                    self._inside[name] = left
                else:
                    del self._inside[name]
                self._cond.notify_all()

    def inside(self, name: str) -> bool:
        with self._cond:
            return name in self._inside

    def given_up(self, name: str | None) -> bool:
        """Whether a stop has stopped waiting for the batch in progress of query ``name``: a function
        still inside should end it now (the batch runs again at the next start)."""
        with self._cond:
            return name is not None and self._given_up[name] > 0

    @contextlib.contextmanager
    def giving_up(self, names: Sequence[str]) -> Iterator[None]:
        """``given_up`` is true for ``names`` inside (around their queries' ``stop()``: every stop gives up
        on the batch in progress, if one is still inside or enters meanwhile)."""
        with self._cond:
            self._given_up.update(names)
        try:
            yield
        finally:
            with self._cond:
                self._given_up.subtract(names)
                self._given_up += collections.Counter()  # drops the names at zero

    def wait_any_out(self, names: Sequence[str], timeout: float) -> bool:
        """Wait until at least one of ``names`` has no batch inside its function, at most ``timeout``
        seconds; True if one has."""
        with self._cond:
            return self._cond.wait_for(lambda: any(n not in self._inside for n in names), timeout=max(0.0, timeout))


IN_FLIGHT = InFlight()


def stop_between_batches(
    queries: Sequence[Any],
    timeout: float = STOP_GRACE,
    *,
    in_flight: InFlight = IN_FLIGHT,
    hurry: threading.Event | None = None,
) -> list[str]:
    """Stop every query of ``queries``, each as soon as no batch of it is inside its ``foreachBatch``
    function (looked at just before its stop), all within ``timeout`` seconds, or at once when ``hurry``
    is set (a second signal); those still in a batch then are stopped in it, their batch cancelled, and
    their names returned."""
    deadline = time.monotonic() + timeout
    pending = [(q.name, q) for q in queries]  # the name once: each read of it is a call into the JVM
    while pending:
        waiting = []
        for name, query in pending:
            if in_flight.inside(name):
                waiting.append((name, query))
            else:
                with in_flight.giving_up([name]):  # a batch entered meanwhile ends as the stop's
                    query.stop()
        pending = waiting
        left = deadline - time.monotonic()
        if not pending or left <= 0 or (hurry is not None and hurry.is_set()):
            break
        # In slices, so that a set ``hurry`` is seen within a tenth of a second.
        in_flight.wait_any_out([name for name, _ in pending], min(left, 0.1))
    # ``stop()`` cancels Spark's jobs, but waits for the query's thread, which waits for the function:
    # a sink waiting on Ray (owners unreachable, retried for a minute) is told to give up too. Each query
    # just before its own stop: the function ends its batch once that stop interrupts its thread
    # (``ended_by_stop``), and the stops run one after the other.
    for name, query in pending:
        log.warning("query %s: its batch in progress did not end %s; the stop cancels it (it runs again at "
                    "the next start)", name, "before a second signal" if hurry is not None and hurry.is_set()
                    else f"within {timeout:.1f}s", extra={"query": name})  # fmt: skip
        with in_flight.giving_up([name]):
            query.stop()
    return [name for name, _ in pending]
