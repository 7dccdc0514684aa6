"""Progress of the slow steps of ``riqr demo`` and ``riqr up``, on stderr.

On a terminal each step is a live line with a spinner and its elapsed time (``rich``), which stays as a
check mark and its duration when the step is done. Anywhere else (CI, a log file, a pipe) it is two plain
lines per step, so logs keep a record of what took how long and nothing redraws in them.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = ["Steps"]


class Steps:
    """Steps of one command, shown under ``prefix`` (``[riqr demo]``) on ``stream`` (default stderr)."""

    def __init__(self, prefix: str, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._progress: Progress | None = None
        if self.live:
            console = Console(file=self.stream)
            self._progress = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
            )

    def __enter__(self) -> Steps:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def say(self, message: str) -> None:
        """A line of its own, above the live steps on a terminal."""
        if self._progress is not None:
            self._progress.console.print(f"{self.prefix} {message}", markup=False, highlight=False)
        else:
            print(f"{self.prefix} {message}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """One slow step: shown while it runs, then with how long it took (or that it failed)."""
        started = time.monotonic()
        if self._progress is None:
            print(f"{self.prefix} {what} ...", file=self.stream, flush=True)
            try:
                yield
            except BaseException:
                print(f"{self.prefix} {what}: failed after {time.monotonic() - started:.1f}s", file=self.stream)
                raise
            print(f"{self.prefix} {what}: done in {time.monotonic() - started:.1f}s", file=self.stream, flush=True)
            return
        task = self._progress.add_task(what, total=1)
        try:
            yield
        except BaseException:
            self._progress.update(task, description=f"{what} [red]failed[/]")
            self._progress.stop_task(task)
            raise
        self._progress.update(task, completed=1)
        self._progress.stop_task(task)
