"""The options every topology takes: where its stores live, how they are split, how often it runs, and
where it reads from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config import DEFAULT_ACTORS, DEFAULT_NAMESPACE, DEFAULT_PARTITIONS, DEFAULT_TRIGGER
from topologies.sources import FILES, SourceConfig

__all__ = ["TopologyOptions", "DEFAULTS", "checkpoint_for"]


@dataclass(frozen=True)
class TopologyOptions:
    """``namespace`` of the riqr runtime; ``partitions`` and ``actors`` of each store it creates;
    ``trigger``, the micro-batch interval (None: the sink's default); ``source`` of its topics."""

    namespace: str = DEFAULT_NAMESPACE
    partitions: int = DEFAULT_PARTITIONS
    actors: int = DEFAULT_ACTORS
    trigger: str | None = None
    source: SourceConfig = FILES

    def sink(self, home: Path, store: str) -> dict[str, Any]:
        """The keyword arguments of ``materialize`` for ``store``: these options plus its checkpoint."""
        return {
            "namespace": self.namespace,
            "partitions": self.partitions,
            "actors": self.actors,
            "trigger": self.trigger or DEFAULT_TRIGGER,
            "checkpoint": str(checkpoint_for(home, self.namespace, store)),
        }


def checkpoint_for(home: Path, namespace: str, store: str) -> Path:
    """Where the query feeding ``store`` keeps its Spark checkpoint."""
    return home / "checkpoints" / namespace / store


DEFAULTS = TopologyOptions()
