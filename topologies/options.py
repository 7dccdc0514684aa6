"""The options every topology takes: where its stores live, how they are split, how often it runs, and
where it reads from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config import (
    DEFAULT_ACTORS,
    DEFAULT_ENGINE,
    DEFAULT_NAMESPACE,
    DEFAULT_PARTITIONS,
    DEFAULT_STANDBYS,
    DEFAULT_TRIGGER,
)
from topologies.sources import FILES, SourceConfig

__all__ = ["TopologyOptions", "DEFAULTS", "checkpoint_for", "dead_letter_checkpoint", "check_interval"]

# What Spark's processing-time trigger takes (checked against Spark 4's Trigger.ProcessingTime): "2 seconds",
# "250 milliseconds", "1 minute 30 seconds", an optional leading "interval", any case; not "10s", "5 mins"
# or months and years.
_AMOUNT = r"\d+(?:\.\d+)?\s+(?:week|day|hour|minute|second|millisecond|microsecond)s?"
_INTERVAL = re.compile(rf"\s*(?:interval\s+)?{_AMOUNT}(?:\s+{_AMOUNT})*\s*", re.IGNORECASE)


def check_interval(value: str) -> str:
    """``value`` if Spark takes it as a micro-batch interval, else ValueError saying what it takes: a bad
    ``--trigger`` is refused before the topology starts anything, not by Spark once its queries start."""
    if not _INTERVAL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an interval Spark takes: use a number and a unit, like '250 milliseconds', "
            "'2 seconds' or '1 minute 30 seconds' (units: week, day, hour, minute, second, millisecond, microsecond)"
        )
    return value


@dataclass(frozen=True)
class TopologyOptions:
    """``namespace`` of the riqr runtime; ``partitions``, ``actors``, ``engine`` and ``standbys`` (None:
    1 on a multi-node cluster, else 0) and ``read_replicas`` (a copy in every HTTP verticle) of each store
    it creates; ``trigger``, the micro-batch interval
    (None: the sink's default); ``source`` of its topics; ``dead_letter_trigger``, the interval of its
    dead-letter queries (None: ``topologies.deadletter.DEAD_LETTER_TRIGGER``'s). Both intervals are checked
    as Spark's trigger takes them (``check_interval``): ValueError here rather than Spark's error once
    the topology's first queries run. ``take_over``: its stores may be taken from what another checkpoint
    (or this one's location, emptied) fed them, their contents replaced by its first batch
    (``topologies.sink.materialize``); refused otherwise."""

    namespace: str = DEFAULT_NAMESPACE
    partitions: int = DEFAULT_PARTITIONS
    actors: int = DEFAULT_ACTORS
    trigger: str | None = None
    source: SourceConfig = FILES
    engine: str = DEFAULT_ENGINE
    standbys: int | None = DEFAULT_STANDBYS
    read_replicas: bool = False
    dead_letter_trigger: str | None = None
    take_over: bool = False

    def __post_init__(self) -> None:
        for interval in (self.trigger, self.dead_letter_trigger):
            if interval is not None:
                check_interval(interval)

    def sink(self, home: Path, store: str) -> dict[str, Any]:
        """The keyword arguments of ``materialize`` for ``store``: these options plus its checkpoint."""
        return {
            "namespace": self.namespace,
            "partitions": self.partitions,
            "actors": self.actors,
            "engine": self.engine,
            "standbys": self.standbys,
            "read_replicas": self.read_replicas,
            "trigger": self.trigger or DEFAULT_TRIGGER,
            "checkpoint": str(checkpoint_for(home, self.namespace, store)),
            # Landing files are read whole by a fresh checkpoint; Kafka from the latest offsets is not.
            "rebuild_from_input": self.source.kind == "files" or self.source.starting_offsets == "earliest",
            "take_over": self.take_over,
        }

    def read(self, spark: Any, home: Path, topic: str) -> tuple[Any, Any | None]:
        """``(records, rejects)`` of ``topic`` from this source (see ``sources.read_topic_checked``)."""
        from topologies.sources import read_topic_checked

        return read_topic_checked(spark, home, topic, self.source)

    def dead_letters(self, home: Path, topic: str, consumer: str, *rejects: Any) -> list[Any]:
        """Start the query sending ``rejects`` (None ones skipped) of ``consumer`` to ``topic``'s dead letters.

        Returns it as a one-element list (empty when there is nothing to reject), for ``start`` to
        return with the topology's other queries, so that stopping the topology stops it too.
        """
        from topologies.deadletter import write_dead_letters

        frames = [r for r in rejects if r is not None]
        if not frames:
            return []
        bad = frames[0]
        for more in frames[1:]:
            bad = bad.unionByName(more)
        checkpoint = dead_letter_checkpoint(home, self.namespace, consumer, topic)
        trigger = {"processingTime": self.dead_letter_trigger} if self.dead_letter_trigger else None
        return [
            write_dead_letters(
                bad, home, topic, checkpoint, consumer=consumer, trigger=trigger, namespace=self.namespace
            )
        ]


def checkpoint_for(home: Path, namespace: str, store: str) -> Path:
    """Where the query feeding ``store`` keeps its Spark checkpoint."""
    return home / "checkpoints" / namespace / store


def dead_letter_checkpoint(home: Path, namespace: str, consumer: str, topic: str) -> Path:
    """Where the dead-letter query of ``consumer`` (a store) for ``topic`` keeps its Spark checkpoint."""
    return home / "checkpoints" / namespace / "_deadletter" / consumer / topic


DEFAULTS = TopologyOptions()
