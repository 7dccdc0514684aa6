"""Landing directories: the embedded stand-in for Kafka topics.

A topic is a directory ``<home>/data/<topic>/`` of JSON-lines files; each line is one record
``{"key": str|null, "value": str|null, "ts": epoch millis, "seq": n}``. ``ts`` and ``seq`` order records
the way a Kafka partition's offsets do, so "latest value per key" is well defined even within one file.
Files are written under a hidden name and renamed into place, so Spark's file source never sees half a
file (it skips names starting with ``.`` or ``_``).

``parse_console_lines`` reads the ``kafka-console-producer`` input format of seed 000: ``key--value``
lines (``parse.key=true``, ``key.separator=--``).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import BadRequest

__all__ = ["Record", "topic_dir", "parse_console_lines", "write_records", "TOPIC_PATTERN"]

TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class Record:
    """One record of a topic. ``ts`` (epoch millis) is its event time; None means "now" when written."""

    key: str | None
    value: str | None
    ts: int | None = None


def topic_dir(home: Path, topic: str) -> Path:
    """The landing directory of ``topic`` under ``home`` (topic names follow Kafka's rules)."""
    if not TOPIC_PATTERN.match(topic) or topic in (".", ".."):
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


def write_records(home: Path, topic: str, records: Sequence[Record]) -> Path | None:
    """Append ``records`` to ``topic`` as one new file, atomically. Returns the file, or None if empty."""
    if not records:
        return None
    directory = topic_dir(home, topic)
    directory.mkdir(parents=True, exist_ok=True)
    now = int(time.time() * 1000)
    name = f"{now:015d}-{uuid.uuid4().hex[:12]}.json"
    tmp = directory / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for seq, record in enumerate(records):
            ts = now if record.ts is None else record.ts
            out.write(json.dumps({"key": record.key, "value": record.value, "ts": ts, "seq": seq}, ensure_ascii=False))
            out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    final = directory / name
    os.replace(tmp, final)
    return final
