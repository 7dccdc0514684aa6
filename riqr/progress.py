"""Progress of the slow steps of ``riqr demo`` and ``riqr up``, on stderr.

On a terminal each step is a live line with a spinner and its elapsed time (``rich``), which stays as a
check mark and its duration when the step is done. Anywhere else (CI, a log file, a pipe) it is two plain
lines per step, so logs keep a record of what took how long and nothing redraws in them.

Every step, from any thread, is recorded in ``timings`` with when it started and ended relative to the
start of the command, which ``summary`` turns into one line (``riqr demo`` prints it when ready).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text

__all__ = ["Steps", "StepTiming"]


@dataclass(frozen=True)
class StepTiming:
    """One step: what it was, when it started and ended (seconds since the command started), whether it
    succeeded."""

    what: str
    started: float
    ended: float
    ok: bool = True

    @property
    def seconds(self) -> float:
        return self.ended - self.started


class _Seconds(ProgressColumn):
    """A step's elapsed time as ``3.4s`` (rich's own column shows whole seconds only)."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text("" if elapsed is None else f"{elapsed:.1f}s", style="progress.elapsed")


class Steps:
    """Steps of one command, shown under ``prefix`` (``[riqr demo]``) on ``stream`` (default stderr)."""

    def __init__(
        self,
        prefix: str,
        stream: TextIO | None = None,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.timings: list[StepTiming] = []
        self._clock = clock
        self._origin = clock()
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        if self.live:
            console = Console(file=self.stream)
            self._progress = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"),
                TextColumn("{task.description}"),
                _Seconds(),
                console=console,
            )

    def __enter__(self) -> Steps:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def elapsed(self) -> float:
        """Seconds since these steps were created (the command's start)."""
        return self._clock() - self._origin

    def say(self, message: str) -> None:
        """A line of its own, above the live steps on a terminal."""
        if self._progress is not None:
            self._progress.console.print(f"{self.prefix} {message}", markup=False, highlight=False)
        else:
            self._line(message)

    def _line(self, text: str) -> None:
        """``prefix text`` and its newline in one write: ``print`` writes them apart, and steps running in two
        threads (``riqr demo`` starts Spark beside Ray) then ran their lines together."""
        with self._lock:
            self.stream.write(f"{self.prefix} {text}\n")
            self.stream.flush()

    def _record(self, what: str, started: float, ok: bool) -> float:
        timing = StepTiming(what, started, self.elapsed(), ok)
        with self._lock:
            self.timings.append(timing)
        return timing.seconds

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """One slow step: shown while it runs, then with how long it took (or that it failed)."""
        started = self.elapsed()
        if self._progress is None:
            self._line(f"{what} ...")
            try:
                yield
            except BaseException:
                seconds = self._record(what, started, ok=False)
                self._line(f"{what}: failed after {seconds:.1f}s")
                raise
            seconds = self._record(what, started, ok=True)
            self._line(f"{what}: done in {seconds:.1f}s")
            return
        task = self._progress.add_task(what, total=1)
        try:
            yield
        except BaseException:
            self._record(what, started, ok=False)
            self._progress.update(task, description=f"{what} [red]failed[/]")
            self._progress.stop_task(task)
            raise
        self._record(what, started, ok=True)
        self._progress.update(task, completed=1)
        self._progress.stop_task(task)

    def summary(self) -> str:
        """Each step's duration and when it ended, in the order they ended: ``what 3.1s (at 3.4s); ...``."""
        with self._lock:
            done = sorted(self.timings, key=lambda t: t.ended)
        return "; ".join(f"{t.what} {t.seconds:.1f}s (at {t.ended:.1f}s)" + ("" if t.ok else " failed") for t in done)
