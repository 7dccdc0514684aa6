"""The SparkSession riqr's topologies run on: ``local[*]`` by default, any master by configuration.

``class_archive``: the driver JVM maps the classes an earlier run loaded from a class data sharing archive
(the JDK's AppCDS) instead of loading and verifying them again from Spark's jars, which measured as most of
the JVM's start-up CPU (docs/benchmarks.md, "Demo start-up"). ``riqr demo`` writes one when it stops and
uses it; a topology process uses one that is there (``shared_archive_options``), so a topology started
again after a crash feeds its stores again sooner, but never writes one: it may run for weeks and be
killed at any point, and the archive is a cache of the machine, made by a short run that stops cleanly.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "spark_session",
    "SparkNotStarted",
    "DEFAULT_CONF",
    "local_shuffle_partitions",
    "ClassArchive",
    "class_archive",
    "shared_archive_options",
    "class_cache_dir",
    "stop_jvm",
    "jars_fingerprint",
    "ignore_sigterm_in_jvm",
]

log = logging.getLogger(__name__)

# Small shuffles: streaming state is partitioned by spark.sql.shuffle.partitions, and the default of 200
# makes every micro-batch of a small job pay for 200 tasks.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.metricsEnabled": "false",
    # Local paths (file://: checkpoints, state store files, landing files) through Hadoop's raw local file
    # system rather than its checksummed one, which writes a .crc file beside every file. A micro-batch
    # writes an offset log entry, a commit log entry and a state file per shuffle partition, each with its
    # .crc; without them the offset and commit logs took 26-46 ms a batch against 42-96 ms
    # (bench/spark_batch.py, bench/ingest.py; docs/benchmarks.md). The logs are still written to a temporary
    # file and renamed into place, as before; what goes is Hadoop's check of a file against its .crc when
    # read back (local disks and their file systems have their own).
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}

_LOG4J = Path(__file__).with_name("log4j2.properties")


def local_shuffle_partitions(master: str) -> int | None:
    """For a local master, one shuffle partition per two cores it has (at least 1, at most the default 4);
    None for a cluster master (the default stands).

    A micro-batch of a stateful query runs one task per shuffle partition, each opening and committing
    its part of the state; with more partitions than cores they queue. On the 2-core machine Spark's own
    micro-batch of order-count (bench/spark_batch.py) took 378-426 ms of trigger execution with 2 against
    592-654 ms with 4, and 348-350 ms with 1 against 479-696 ms with 2; end to end, freshness went from
    about 830 to about 550 ms at p50 idle, and 1,000,000 records into the noop sink took no longer
    (docs/benchmarks.md). Half the cores, not all: in local mode riqr's query actors, its HTTP verticle and
    the sink share the machine with Spark's tasks (only the 2-core case is measured). It applies to new
    checkpoints only: a restarted query keeps its checkpoint's count.
    """
    if master == "local":
        return 1
    if not master.startswith("local["):
        return None
    inside = master[len("local[") :].split("]", 1)[0].split(",", 1)[0]
    cores = (os.cpu_count() or 1) if inside == "*" else int(inside) if inside.isdigit() else None
    return None if cores is None else max(1, min(int(DEFAULT_CONF["spark.sql.shuffle.partitions"]), cores // 2))


def spark_session(  # type: ignore[no-untyped-def]
    master: str | None = None,
    app_name: str = "riqr",
    conf: Mapping[str, str] | None = None,
    java_options: Sequence[str] = (),
):
    """Get or create the SparkSession: ``master`` else ``$RIQR_SPARK_MASTER`` else ``local[*]``.

    ``java_options`` go to the driver JVM after riqr's own (its log4j configuration)."""
    from pyspark.sql import SparkSession

    master = master or os.environ.get("RIQR_SPARK_MASTER", "local[*]")
    if master.startswith("local"):
        # A local driver talks to itself only; this also spares the "hostname resolves to loopback" warning.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = os.environ.get("RIQR_SPARK_LOG4J", str(_LOG4J))
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {
        "spark.driver.extraJavaOptions": " ".join([f"-Dlog4j2.configurationFile=file:{log4j}", *java_options]),
        **DEFAULT_CONF,
        **(conf or {}),
    }
    local = local_shuffle_partitions(master)
    if local is not None and "spark.sql.shuffle.partitions" not in (conf or {}):
        settings["spark.sql.shuffle.partitions"] = str(local)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as err:
        if _condition(err) == "JAVA_GATEWAY_EXITED":  # spark-submit's own words are on standard error above
            raise SparkNotStarted(_no_jvm_reason()) from err
        raise
    spark.sparkContext.setLogLevel("ERROR")
    ignore_sigterm_in_jvm(spark)
    return spark


class SparkNotStarted(RuntimeError):
    """Spark's driver JVM did not start: most often no Java, or not one Spark 4 runs on."""


def _condition(err: BaseException) -> str | None:
    """A PySpark error's condition (``JAVA_GATEWAY_EXITED``...), None for any other exception."""
    condition = getattr(err, "getCondition", None)
    try:
        return str(condition()) if callable(condition) else None
    except Exception:  # noqa: BLE001 - not PySpark's, or one without a condition
        return None


def _no_jvm_reason() -> str:
    """What to say when the driver JVM exited before it answered: the Java it would have used."""
    java_home = os.environ.get("JAVA_HOME")
    on_path = shutil.which("java")
    if java_home:
        where = f"JAVA_HOME={java_home}" + ("" if Path(java_home, "bin", "java").exists() else " (no bin/java there)")
    else:
        where = f"JAVA_HOME is not set; java on PATH: {on_path or 'none'}"
    return (
        f"Spark's driver JVM did not start ({where}): Spark 4 needs Java 17 or 21, as java on PATH or JAVA_HOME; "
        "spark-submit's own words, if any, are above"
    )


def ignore_sigterm_in_jvm(spark: Any) -> bool:
    """Make the driver JVM this process started ignore SIGTERM; its Python driver stops it.

    ``ray job stop`` sends SIGTERM to the job's whole process tree, the driver JVM included, and so does a
    ``kill`` of a process group. The JVM's own handler then runs its shutdown hooks, which stop the
    SparkContext under the queries: the batch in progress is cancelled (py4j's and Spark's tracebacks)
    while the Python driver is still stopping the queries between two batches (``topologies.inflight``).
    PySpark starts the JVM with SIGINT ignored for the same reason (a terminal's Ctrl-C reaches the whole
    foreground group); this does so for SIGTERM. The JVM still ends with its driver: ``stop_jvm`` closes
    its stdin, it exits on the broken pipe if the driver dies, and SIGKILL ends it as before. A session on
    a JVM this process did not start (no gateway process) is left alone. True if the handler was set."""
    context = spark.sparkContext
    if getattr(context._gateway, "proc", None) is None:
        return False
    try:
        jvm = context._jvm
        jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), jvm.sun.misc.SignalHandler.SIG_IGN)
    except Exception as err:  # a JVM without sun.misc: SIGTERM stops it as before
        log.warning("could not make Spark's driver JVM ignore SIGTERM: %s", err)
        return False
    return True


def class_cache_dir() -> Path:
    """Where riqr keeps caches that belong to the machine, not to a riqr home: ``$XDG_CACHE_HOME/riqr``,
    else ``~/.cache/riqr``."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "riqr"


def jars_fingerprint(directory: Path) -> str:
    """The name, size and modification time of every jar in ``directory``: what the JVM checks before it
    maps an archive (besides its own build). pyspark reinstalled in place (a recreated ``.venv``) has the
    same version and path but jars with new times, which the JVM would refuse to map."""
    entries = []
    with contextlib.suppress(OSError):
        for jar in sorted(directory.glob("*.jar")):
            with contextlib.suppress(OSError):
                stat = jar.stat()
                entries.append(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _archive_key() -> str:
    """What the archive is good for: which pyspark (version, where, and its jars as the JVM checks them)
    and which java, so an upgrade or a reinstall gets an archive of its own. Keyed only by version and
    path, an archive made for an earlier install of the same pyspark was found by name, refused by the
    JVM (its jars' times differ), and never replaced: every later demo loaded its classes cold."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java") or "java"
    with contextlib.suppress(OSError):
        java = os.path.realpath(java)
    jars = jars_fingerprint(Path(pyspark.__file__).parent / "jars")
    key = f"{pyspark.__version__}\0{java}\0{pyspark.__file__}\0{jars}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """The driver JVM's class archive: ``options`` for ``spark_session``; ``creating`` is where this run's
    JVM writes a new archive when it exits (None when an archive was there to use); ``publish`` moves it
    into place once the JVM has exited (``stop_jvm``)."""

    path: Path
    options: tuple[str, ...]
    creating: Path | None

    @property
    def warm(self) -> bool:
        return self.creating is None

    def publish(self) -> bool:
        """Move a complete new archive into place; True if one was published. A JVM that did not exit
        cleanly leaves no file, or one this discards, so the archive is never half written."""
        if self.creating is None:
            return False
        try:
            if self.creating.stat().st_size > 0:
                os.replace(self.creating, self.path)
                prune_archives(self.path.parent, keep=self.path)
                return True
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self.creating.unlink()
        return False


# Archives kept besides the newest (each is about 170 MB; a checkout with its own .venv gets its own, since
# the key includes pyspark's path), and how old a leftover of a run killed while writing one must be to go.
KEEP_ARCHIVES = 2
STALE_WRITE_SECONDS = 3600.0


def prune_archives(directory: Path, *, keep: Path, now: float | None = None) -> list[Path]:
    """Delete all but the ``KEEP_ARCHIVES`` most recently written archives in ``directory`` (never
    ``keep``, the one just published) and partial archives of runs that died writing one over an hour ago.
    Returns what it deleted; a file it cannot delete is left."""
    now = time.time() if now is None else now
    archives = sorted(directory.glob("spark-classes-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    doomed = [p for p in archives if p != keep][KEEP_ARCHIVES - 1 :]
    doomed += [p for p in directory.glob(".spark-classes-*.tmp") if now - p.stat().st_mtime > STALE_WRITE_SECONDS]
    deleted = []
    for path in doomed:
        with contextlib.suppress(OSError):
            path.unlink()
            deleted.append(path)
    return deleted


_QUIET = ("-Xshare:auto", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _archive_path(cache: Path | None) -> Path | None:
    """Where this machine's archive goes, or None where there can be none: no home directory to hold the
    cache (some containers run without one), or a path with whitespace (Spark splits the driver's
    ``extraJavaOptions`` at whitespace, so the JVM would be handed half a path and refuse to start)."""
    try:
        directory = cache if cache is not None else class_cache_dir()
    except RuntimeError:  # Path.home(): no HOME and no passwd entry
        return None
    path = directory / f"spark-classes-{_archive_key()}.jsa"
    return None if any(c.isspace() for c in str(path)) else path


def _mapping(path: Path) -> tuple[str, ...]:
    """The driver JVM options that map the archive at ``path``."""
    return (f"-XX:SharedArchiveFile={path}", *_QUIET)


def class_archive(cache: Path | None = None) -> ClassArchive | None:
    """The class archive of this machine's pyspark and java under ``cache`` (``class_cache_dir()``): used
    when it exists, else created by this run's JVM when it exits. None where there can be none (see
    ``_archive_path``; also a cache directory that cannot be read or made): the JVM then starts without one,
    slower, never failing for it.

    The JVM validates an archive before mapping it (same JVM build, same jars): one that does not match is
    ignored and the JVM loads its classes as usual, so a stale archive costs time, never correctness. Its
    notes about that (and about classes it cannot archive) are silenced."""
    path = _archive_path(cache)
    if path is None:
        return None
    try:
        if path.is_file():
            return ClassArchive(path, _mapping(path), None)
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a read-only or unreadable home, say
        log.info("no class archive for Spark's JVM: %s cannot be read or made (%s)", path.parent, err)
        return None
    creating = path.parent / f".{path.name}.{os.getpid()}.tmp"
    return ClassArchive(path, (f"-XX:ArchiveClassesAtExit={creating}", *_QUIET), creating)


def shared_archive_options(cache: Path | None = None) -> tuple[str, ...]:
    """The driver JVM options that map the class archive under ``cache`` (``class_cache_dir()``) if one was
    written (by ``riqr demo``), else none: nothing is created. As with ``class_archive``, the JVM ignores an
    archive that does not match its build and jars, so a stale one costs time, never correctness."""
    path = _archive_path(cache)
    try:
        return _mapping(path) if path is not None and path.is_file() else ()
    except OSError:  # a cache directory this user cannot read
        return ()


def stop_jvm(spark: Any, timeout: float = 60.0) -> None:
    """Stop ``spark`` and wait until its driver JVM has exited (it exits when its stdin closes); a JVM
    writing a class archive at exit has then finished writing it."""
    from pyspark import SparkContext

    gateway = spark.sparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None  # a later session starts a JVM of its own
    SparkContext._jvm = None
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
