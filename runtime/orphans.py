"""Reclaiming the partitions of query actors that will never run again.

A query actor keeps its partitions in ``<data>/<namespace>/<store>/<actor uuid>`` on its node's disk.
``riqr down`` deletes them, but a cluster that crashed or was stopped without it leaves them behind, and
the actors of the next ``riqr up`` get new ids: nothing will open those directories again. Each node's
HTTP verticle sweeps its node's directory of its namespace (``Sweeper``) and deletes an actor's directory
only when, at two sweeps at least ``grace`` seconds apart, both of these hold:

* **No actor of that name exists in the cluster.** Ray keeps an actor's name while it is alive, being
  created or restarting (listed by ``ray.util.list_named_actors`` through the whole restart), and frees it
  only once the actor is dead for good. So an actor that Ray is restarting, whose process is gone, keeps
  its directory however long its restart takes.
* **No process holds the directory's owner lock** (``OwnerLock``: an exclusive ``flock`` on its
  ``.owner`` file, taken by the actor when it opens its partitions and held until its process ends; the
  kernel drops it when the process dies, SIGKILL included). This guards the directories of another Ray
  cluster on the same host that shares the data directory and namespace: their actors are not named in
  this cluster.

The two sweeps ``grace`` apart cover what a single look could race with: an actor created between the
listing of names and the look at its directory, a query actor that the registry re-creates under the
same name after its node died, and another cluster's actor in the middle of its restart.

Only directories named like an actor (a UUID) inside a directory named like a store are looked at; the
registry's own ``_registry`` and anything else under the data directory are never touched.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from runtime.catalog import is_store_name
from runtime.config import RECLAIM_ENV
from runtime.metrics import Metrics

__all__ = [
    "ACTOR_NAME",
    "OWNER_FILE",
    "DEFAULT_RECLAIM_AFTER",
    "OwnerLock",
    "Sweeper",
    "held",
    "reclaim_after",
    "sweep_every",
]

log = logging.getLogger(__name__)

OWNER_FILE = ".owner"
# Seconds a directory must stay orphaned before it is deleted (``$RIQR_RECLAIM_AFTER``; ``off``: never).
DEFAULT_RECLAIM_AFTER = 300.0
# A query actor's name: a uuid4 (``verticles.registry``).
ACTOR_NAME = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


class OwnerLock:
    """An exclusive ``flock`` on ``<directory>/.owner``, held by the process that keeps its data there.

    ``take`` never fails the caller: if another process holds the lock (a previous incarnation of the
    actor that has not quite exited), the directory is protected by that holder meanwhile and by the
    actor's name after it; a warning says so."""

    def __init__(self, directory: Path, fd: int | None) -> None:
        self.directory = directory
        self._fd = fd

    @classmethod
    def take(cls, directory: Path) -> OwnerLock:
        fd = _open_lock_file(directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            log.warning("%s: another process holds its owner lock; going on without it", directory)
            return cls(directory, None)
        return cls(directory, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, *, remove: bool = False) -> None:
        """Let go of the lock; with ``remove``, delete the lock file first (the directory is going away)."""
        if remove:
            (self.directory / OWNER_FILE).unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _open_lock_file(directory: Path) -> int:
    """``directory``'s lock file, opened (and the directory made) for a new owner."""
    attempts = 3
    for attempt in range(1, attempts + 1):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return os.open(directory / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            # The last actor of the store on this node pruned a parent it found empty between our mkdir of
            # it and of the directory (``verticles.env.prune_empty_dirs``): make them again.
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def held(directory: Path) -> bool:
    """Whether some process holds ``directory``'s owner lock (False when it has no lock file)."""
    try:
        fd = os.open(directory / OWNER_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's own lock, if it got it
    return False


def reclaim_after(environ: Mapping[str, str] = os.environ) -> float | None:
    """The grace period ``$RIQR_RECLAIM_AFTER`` asks for, in seconds (None: ``off``, no sweeping); a value
    that is not a number of seconds is reported and the default used."""
    raw = environ.get(RECLAIM_ENV, "").strip()
    if not raw:
        return DEFAULT_RECLAIM_AFTER
    if raw.lower() == "off":
        return None
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not grace >= 0 or grace == float("inf"):
        log.warning("%s=%r is not a number of seconds or 'off'; using %g", RECLAIM_ENV, raw, DEFAULT_RECLAIM_AFTER)
        return DEFAULT_RECLAIM_AFTER
    return grace


def sweep_every(grace: float) -> float:
    """How often to sweep for a given ``grace``: a fifth of it, between half a second and a minute."""
    return min(60.0, max(0.5, grace / 5))


def _size(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total


class Sweeper:
    """Finds and deletes the directories of actors that no longer exist under ``root`` (a namespace's data
    directory on this node). ``names`` lists the namespace's named actors (live, being created or
    restarting); it is asked only when some directory's lock is free. ``sweep`` is called periodically."""

    def __init__(
        self,
        root: Path,
        names: Callable[[], set[str]],
        grace: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        self.root = root
        self.names = names
        self.grace = grace
        self.clock = clock
        self.metrics = metrics  # counts the bytes deleted (``riqr_reclaimed_bytes_total``)
        self._since: dict[Path, float] = {}  # directory -> when it was first seen orphaned, in a row of sweeps
        self.reclaimed_bytes = 0
        self.reclaimed_dirs = 0

    def _actor_dirs(self) -> Iterator[Path]:
        try:
            stores = [p for p in self.root.iterdir() if is_store_name(p.name) and p.is_dir()]
        except FileNotFoundError:
            return
        for store in stores:
            try:
                yield from (
                    p for p in store.iterdir() if ACTOR_NAME.match(p.name) and p.is_dir() and not p.is_symlink()
                )
            except FileNotFoundError:  # deleted meanwhile (riqr down)
                continue

    def sweep(self) -> list[Path]:
        """One pass; returns the directories it deleted."""
        now = self.clock()
        names: set[str] | None = None
        orphaned: dict[Path, float] = {}
        deleted: list[Path] = []
        for directory in list(self._actor_dirs()):
            if held(directory):
                continue
            if names is None:
                names = self.names()  # after the listing: an actor whose directory was listed is named by now
            if directory.name in names:
                continue
            since = self._since.get(directory)
            if since is None or now - since < self.grace:  # always two sightings, whatever the grace
                orphaned[directory] = now if since is None else since
                continue
            size = _size(directory)
            try:
                shutil.rmtree(directory)
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("could not delete %s, the data of query actor %s, which no longer exists: %s",
                            directory, directory.name, err)  # fmt: skip
                orphaned[directory] = since
                continue
            self.reclaimed_bytes += size
            self.reclaimed_dirs += 1
            if self.metrics is not None:
                self.metrics.inc("riqr_reclaimed_bytes_total", amount=size)
            deleted.append(directory)
            log.warning("deleted %s (%d bytes): the partitions of query actor %s, which no longer exists (a "
                        "crash or a stop without `riqr down` left them)", directory, size, directory.name)  # fmt: skip
        self._since = orphaned
        return deleted

    def run(self, stop: threading.Event) -> None:
        """Sweep every ``sweep_every(grace)`` seconds until ``stop`` is set (a thread's target); a failed
        sweep is logged and the next one goes on."""
        while not stop.wait(sweep_every(self.grace)):
            try:
                self.sweep()
            except Exception:
                log.warning("sweeping %s for the data of actors that no longer exist failed", self.root, exc_info=True)
