"""Landing directories: the embedded stand-in for Kafka topics.

A topic is a directory ``<home>/data/<topic>/`` of JSON-lines files; each line is one record
``{"key": str|null, "value": str|null, "ts": epoch millis, "seq": n}``. ``ts`` and ``seq`` order records
the way a Kafka partition's offsets do, so "latest value per key" is well defined within a file and
across files: a file's ``seq`` numbers its records on from the nanosecond clock at its write (two files
written in the same millisecond tied when ``seq`` started at 0 in each, and "latest" then kept either).
That clock never goes back within a topic: each write starts past the last ``seq`` the topic handed out
(kept in the hidden ``.riqr-clock`` beside its files, under a lock), so a wall clock stepped back (NTP,
a VM resumed) cannot make a later write of a key lose to an earlier one.
Files are written under a hidden name and renamed into place, so Spark's file source never sees half a
file (it skips names starting with ``.`` or ``_``). A failed or interrupted write removes its hidden file;
only a hard kill (SIGKILL, power loss) can leave one behind, and Spark never reads it.

``parse_console_lines`` reads the ``kafka-console-producer`` input format of seed 000: ``key--value``
lines (``parse.key=true``, ``key.separator=--``). ``parse_console_bytes`` does the same on raw bytes
(what ``riqr produce`` reads from stdin) and rejects input that is not UTF-8 with the line and byte
offset of the first bad byte, so nothing is written and nobody gets a traceback.

Malformed lines in landing files. ``riqr produce`` only writes well-formed lines, but a landing
directory is a plain directory: a hand-edited file, a foreign writer or a disk error can put a line there
that is not JSON, or JSON of the wrong shape (``"ts": "yesterday"``). Such a line does not stop any
topology and is not dropped silently: the file source reads in Spark's PERMISSIVE mode and routes it,
with its raw text and a reason, to the topic's dead letters ``<home>/deadletter/<topic>/`` (see
``topologies.deadletter``). The well-formed lines of the same file are processed as usual.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.durable import fsync_directory, make_directories
from runtime.errors import BadRequest

__all__ = [
    "Record",
    "topic_dir",
    "parse_console_lines",
    "parse_console_bytes",
    "write_records",
    "TOPIC_PATTERN",
]

TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
CLOCK_FILE = ".riqr-clock"  # hidden: Spark's file source skips names starting with "."
CLOCK_LEAD_WARNING_NS = 1_000_000_000  # a topic's clock this far ahead of the wall clock is said

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """One record of a topic. ``ts`` (epoch millis) is its event time; None means "now" when written."""

    key: str | None
    value: str | None
    ts: int | None = None


def topic_dir(home: Path, topic: str) -> Path:
    """The landing directory of ``topic`` under ``home`` (topic names follow Kafka's rules)."""
    if not TOPIC_PATTERN.fullmatch(topic) or topic in (".", ".."):
        raise BadRequest(f"topic name {topic!r} is invalid: use letters, digits, '.', '_' or '-'", topic=topic)
    return home / "data" / topic


def parse_console_lines(
    lines: Iterable[str], separator: str = "--", *, split_escaped_newlines: bool = True
) -> list[Record]:
    """Parse ``key<sep>value`` lines into records; the whole input is rejected if one line is bad.

    With ``split_escaped_newlines`` a literal backslash-n also separates records, because seed 000's
    ``echo "1--john\\n2--adam"`` relies on a shell whose ``echo`` turns ``\\n`` into newlines, and bash's
    does not. Empty lines are skipped. A line without the separator is an error, as it is for
    ``kafka-console-producer`` with ``parse.key=true``.
    """
    if not separator:
        raise BadRequest("the key separator must not be empty")
    records: list[Record] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        pieces = line.split("\\n") if split_escaped_newlines else [line]
        for piece in pieces:
            if piece == "":
                continue
            if separator not in piece:
                raise BadRequest(
                    f"line {number}: no key separator {separator!r} in {piece!r}; write records as key{separator}value",
                    line=number,
                )
            key, value = piece.split(separator, 1)
            records.append(Record(key, value))
    return records


def parse_console_bytes(data: bytes, separator: str = "--", *, split_escaped_newlines: bool = True) -> list[Record]:
    """``parse_console_lines`` over raw bytes (``riqr produce``'s stdin); the whole input is rejected if bad.

    Input that is not UTF-8 is a ``BadRequest`` naming the line and the byte offset (from the start of the
    input, 0-based) of the first bad byte. Lines end at ``\\n`` (a ``\\r`` before it is dropped), as
    ``kafka-console-producer`` reads them; a UTF-8 byte-order mark at the start of a line, as some editors
    write at the top of a file, is not part of its key.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BadRequest(
            f"line {line}: input is not valid UTF-8 (byte offset {exc.start}); no record was taken",
            line=line,
            offset=exc.start,
        ) from None
    # A byte-order mark starts a line, not a key: at the top of the input, or of each file concatenated
    # into it (`cat a.txt b.txt | riqr produce`, both from an editor that writes one).
    lines = [line.removeprefix("\ufeff") for line in text.split("\n")]
    return parse_console_lines(lines, separator, split_escaped_newlines=split_escaped_newlines)


def _encode(seq: int, record: Record, now: int, index: int) -> bytes:
    ts = now if record.ts is None else record.ts
    line = json.dumps({"key": record.key, "value": record.value, "ts": ts, "seq": seq}, ensure_ascii=False)
    try:
        return line.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # Lone surrogates (text decoded with surrogateescape, for one) have no UTF-8 form.
        raise BadRequest(f"record {index + 1} is not encodable as UTF-8; nothing was written",
                         record=index + 1) from None  # fmt: skip


def write_records(home: Path, topic: str, records: Sequence[Record]) -> Path | None:
    """Append ``records`` to ``topic`` as one new file, atomically. Returns the file, or None if empty.

    On any failure (a record that cannot be encoded, a full disk, Ctrl-C) the hidden temporary file is
    removed and nothing appears in the topic. On return the file is durable: its bytes, its name in the
    topic's directory and any directory made for it are synced, so a power loss after ``riqr produce``
    said "wrote" does not take the records back.
    """
    if not records:
        return None
    directory = topic_dir(home, topic)
    make_directories(directory)
    with _topic_clock(directory) as (last, advance):
        wall = time.time_ns()
        clock = max(wall, last + 1)  # past every seq the topic has, whatever the wall clock says
        if clock - wall > CLOCK_LEAD_WARNING_NS:
            log.warning("topic %s: its clock is %.1f s ahead of this machine's (a clock stepped back, or a writer "
                        "whose clock ran ahead): its records are stamped with the topic's time, not the wall "
                        "clock's, until the wall clock passes it", topic, (clock - wall) / 1e9)  # fmt: skip
        now = clock // 1_000_000
        name = f"{now:015d}-{uuid.uuid4().hex[:12]}.json"
        tmp = directory / f".{name}.tmp"
        final = directory / name
        try:
            with open(tmp, "xb") as out:
                for seq, record in enumerate(records, start=clock):
                    out.write(_encode(seq, record, now, seq - clock))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, final)
            advance(clock + len(records) - 1)  # in the topic now, whatever follows
            try:
                fsync_directory(directory)
            except OSError as err:  # the file is in the topic already: writing it again would double it
                raise OSError(err.errno, f"wrote {final}, but could not sync its directory ({err.strerror}): "
                              "its records are in the topic and may not survive a power loss; do not write "
                              "them again") from err  # fmt: skip
        finally:
            # After a successful rename there is nothing left to remove; after a failure, the partial file.
            tmp.unlink(missing_ok=True)
    return final


@contextlib.contextmanager
def _topic_clock(directory: Path) -> Iterator[tuple[int, Callable[[int], None]]]:
    """Hold the topic's clock (one writer at a time, across processes: ``flock`` on ``CLOCK_FILE``) and
    give the last ``seq`` it handed out, with the function that records a new one. The last ``seq`` is the
    larger of ``CLOCK_FILE``'s and the newest file's name's (its millisecond: a file's records start
    there), so a clock file a crash or a power loss set back (it is not synced), or a file an older riqr
    wrote, still bounds it.

    The file is written in place, never replaced: a replaced file would leave a writer waiting on the old
    one's lock while another took the new one's. Where it cannot be locked (a network file system without
    locks, a clock file another user owns) the write goes on, bounded by the files' names alone, with a
    warning: concurrent writers there may then interleave their times."""
    fd = _locked_clock(directory)
    if fd is None:
        yield _newest_file_clock(directory), lambda _seq: None
        return
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        last = max(int(text) if text.isdigit() else 0, _newest_file_clock(directory))

        def advance(seq: int) -> None:
            # After the file is in the topic: failing here must not fail the write (a caller told so would
            # write the records again). The files' names bound the next write's clock anyway.
            data = str(seq).encode("ascii")
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            except OSError as err:
                log.warning("topic %s: could not record its clock (%s); its files' names bound it", directory.name,
                            err)  # fmt: skip

        yield last, advance
    finally:
        os.close(fd)  # and with it the lock


def _locked_clock(directory: Path) -> int | None:
    """The topic's clock file, open and locked; None (said) where it cannot be."""
    fd = None
    try:
        fd = os.open(directory / CLOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    except OSError as err:
        if fd is not None:
            os.close(fd)
        log.warning("topic %s: cannot lock its clock (%s); writing without it, its times bounded by its files' "
                    "names", directory.name, err)  # fmt: skip
        return None


def _newest_file_clock(directory: Path) -> int:
    newest = max((int(n[:15]) for n in os.listdir(directory) if n[:15].isdigit() and n.endswith(".json")), default=0)
    return (newest + 1) * 1_000_000 - 1 if newest else 0
