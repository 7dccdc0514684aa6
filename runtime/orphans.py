"""Reclaiming the partitions of query actors that will never run again.

A query actor keeps its partitions in ``<data>/<namespace>/<store>/<actor uuid>`` on its node's disk.
``riqr down`` deletes them, but a cluster that crashed or was stopped without it leaves them behind, and
the actors of the next ``riqr up`` get new ids: nothing will open those directories again. Each node's
HTTP verticle sweeps its node's directory of its namespace (``Sweeper``) and deletes an actor's directory
only when all of these hold at every sweep over at least ``grace`` seconds (two sweeps at the least),
and once more just before the deletion:

* **No actor of that name exists in the cluster.** Ray keeps an actor's name while it is alive, being
  created or restarting (listed by ``ray.util.list_named_actors`` through the whole restart), and frees it
  only once the actor is dead for good. So an actor that Ray is restarting, whose process is gone, keeps
  its directory however long its restart takes.
* **The registry does not list it.** An actor whose constructor failed (a partition it could not open)
  is dead to Ray, which does not restart it, but it still owns its partitions in the registry's table:
  its data is what an operator would recover, so it stays. When the registry cannot be asked, nothing
  is deleted.
* **No process holds the directory's owner lock** (``OwnerLock``: an exclusive ``flock`` on its
  ``.owner`` file, taken by the actor when it opens its partitions and held until its process ends; the
  kernel drops it when the process dies, SIGKILL included). This guards the directories of another Ray
  cluster on the same host that shares the data directory and namespace, while its actors run: they
  are not named in this cluster.

Watching a directory over ``grace`` seconds covers what a single look could race with: an actor created between the
listing of names and the look at its directory, another cluster's actor in the middle of its restart.

Only directories named like an actor (a UUID) inside a directory named like a store are looked at, and
no symbolic link is followed; the registry's own ``_registry`` and anything else under the data
directory are never touched.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from runtime.catalog import is_store_name
from runtime.config import RECLAIM_ENV, seconds_setting
from runtime.durable import make_directories
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
# A directory being deleted is first renamed ``<actor uuid>.reclaiming``: the claim of one sweeper when
# several sweep one disk (nodes sharing a data directory). One left by a sweeper that died mid-delete is
# deleted by the next pass.
RECLAIMING = ".reclaiming"
LEFT_AFTER = 60.0  # seconds since its claim before another sweeper deletes a claimed directory


class OwnerLock:
    """An exclusive ``flock`` on ``<directory>/.owner``, held by the process that keeps its data there.

    ``take`` never fails the caller and never waits: when the lock is busy (a sweeper's probe holds it for
    an instant, or a previous incarnation of the actor has not quite exited), a thread keeps trying, every
    50 ms, and after ``WARN_AFTER`` seconds every second after one warning, until it has the lock or the lock
    is released. Meanwhile the actor's name protects the directory from its own cluster's sweepers."""

    WARN_AFTER = 5.0

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd
        self._locked = False
        self._mutex = threading.Lock()  # the descriptor: the retrying thread against ``release``
        self._released = threading.Event()
        self._taken = threading.Event()

    @classmethod
    def take(cls, directory: Path) -> OwnerLock:
        lock = cls(directory, _open_lock_file(directory))
        if not lock._try():
            threading.Thread(target=lock._keep_trying, name="riqr-owner-lock", daemon=True).start()
        return lock

    def _try(self) -> bool:
        with self._mutex:
            if self._fd is None:
                return False
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self._locked = True
            self._taken.set()
            return True

    def _keep_trying(self) -> None:
        started = time.monotonic()
        warned = False
        while not self._released.wait(0.05 if time.monotonic() - started < self.WARN_AFTER else 1.0):
            if self._try():
                if warned:
                    log.warning("%s: took its owner lock at last", self.directory)
                return
            if not warned and time.monotonic() - started >= self.WARN_AFTER:
                warned = True
                log.warning("%s: another process has held its owner lock for %gs; trying on", self.directory,
                            self.WARN_AFTER)  # fmt: skip

    @property
    def held(self) -> bool:
        return self._locked

    def wait_held(self, timeout: float) -> bool:
        """Whether this lock holds, waiting up to ``timeout`` seconds for a busy one."""
        return self._taken.wait(timeout) and self._locked

    def release(self, *, remove: bool = False) -> None:
        """Let go of the lock (or stop trying for it); with ``remove``, delete the lock file first when this
        lock holds it (the directory is going away; a file someone else holds stays theirs)."""
        self._released.set()
        with self._mutex:
            if remove and self._locked:
                (self.directory / OWNER_FILE).unlink(missing_ok=True)
            if self._fd is not None:
                os.close(self._fd)  # closing the last descriptor drops the flock
                self._fd = None
            self._locked = False


def _open_lock_file(directory: Path) -> int:
    """``directory``'s lock file, opened (and the directory made) for a new owner."""
    attempts = 3
    for attempt in range(1, attempts + 1):
        try:
            # Each directory made is synced into its parent: the store's and the actor's are new on a
            # node's first copy, and a power loss that took either name took every partition in it.
            make_directories(directory)
            return os.open(directory / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            # The last actor of the store on this node pruned a parent it found empty between our mkdir of
            # it and of the directory (``verticles.env.prune_empty_dirs``): make them again.
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def held(directory: Path) -> bool:
    """Whether some process holds ``directory``'s owner lock (False when it has no lock file; True when it
    cannot be looked at, so what cannot be checked is kept)."""
    try:
        fd = os.open(directory / OWNER_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as err:
        log.warning("cannot check %s's owner lock (%s); keeping it", directory, err)
        return True
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
    return seconds_setting(environ, RECLAIM_ENV, DEFAULT_RECLAIM_AFTER, meant_for_tests_under=60)


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
    directory on this node). ``names`` lists the actor names that are taken: the namespace's named actors
    (live, being created or restarting) and the query actors its registry lists; it raises when it cannot
    tell, and is asked only when some directory's lock is free, and again before each deletion. ``sweep``
    is called periodically (``run``)."""

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

    def _actor_dirs(self) -> tuple[list[Path], list[Path]]:
        """In the directories named like a store, those named like an actor, and those named like one
        claimed for deletion (``<actor uuid>.reclaiming``): one listing for both."""
        try:
            stores = [p for p in self.root.iterdir() if is_store_name(p.name) and p.is_dir() and not p.is_symlink()]
        except FileNotFoundError:
            return [], []
        actors: list[Path] = []
        claimed: list[Path] = []
        for store in stores:
            try:
                entries = list(store.iterdir())
            except FileNotFoundError:  # deleted meanwhile (riqr down)
                continue
            for p in entries:
                if ACTOR_NAME.match(p.name):
                    into = actors
                elif p.name.endswith(RECLAIMING) and ACTOR_NAME.match(p.name[: -len(RECLAIMING)]):
                    into = claimed
                else:
                    continue
                if p.is_dir() and not p.is_symlink():
                    into.append(p)
        return actors, claimed

    def sweep(self) -> list[Path]:
        """One pass; returns the directories it deleted. A pass that fails forgets every sighting: the two
        sightings a deletion needs are always of consecutive passes that worked."""
        try:
            return self._sweep()
        except BaseException:
            self._since = {}
            raise

    def _still_orphaned(self, directory: Path) -> bool:
        """Looked at again just before deleting: the pass's list of names may be minutes old by now."""
        return not held(directory) and directory.name not in self.names()

    def _reclaim(self, claimed: Path, actor: str) -> int | None:
        """Delete a claimed directory and count its bytes; returns them, or None (and a warning) if some
        of it is left, which a later pass deletes and counts (``_leftovers``)."""
        size = _size(claimed)
        try:
            shutil.rmtree(claimed)
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("could not delete all of %s, the data of query actor %s, which no longer exists: %s; a "
                        "later pass tries again", claimed, actor, err)  # fmt: skip
            return None
        self.reclaimed_bytes += size
        self.reclaimed_dirs += 1
        if self.metrics is not None:
            self.metrics.inc("riqr_reclaimed_bytes_total", amount=size)
        return size

    def _leftovers(self, claimed: list[Path]) -> None:
        """Delete claimed directories left behind: by a sweeper that died while it deleted one, or could
        not delete all of it. One claimed under ``LEFT_AFTER`` seconds ago may be another live sweeper's,
        in the middle of its delete, and is left to it."""
        for left in claimed:
            try:
                claimed_ago = time.time() - left.stat().st_ctime  # the rename set it
            except FileNotFoundError:
                continue
            if claimed_ago >= LEFT_AFTER and not held(left):
                self._reclaim(left, left.name[: -len(RECLAIMING)])

    def _sweep(self) -> list[Path]:
        actors, claimed = self._actor_dirs()
        self._leftovers(claimed)
        now = self.clock()
        names: set[str] | None = None
        orphaned: dict[Path, float] = {}
        deleted: list[Path] = []
        for directory in actors:
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
            if not self._still_orphaned(directory):
                continue
            claim = directory.with_name(directory.name + RECLAIMING)
            try:
                # Atomic: of several sweepers of one disk, one claims the directory and counts it; the
                # others find it gone.
                os.rename(directory, claim)
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("could not delete %s, the data of query actor %s, which no longer exists: %s",
                            directory, directory.name, err)  # fmt: skip
                orphaned[directory] = since
                continue
            size = self._reclaim(claim, directory.name)
            if size is None:
                continue
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
