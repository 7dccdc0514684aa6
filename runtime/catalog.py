"""The store catalog entry: what a store is, independent of who holds it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

# Not from runtime.engines: importing any of it runs its package, whose RocksDB engine imports this module.
from runtime.config import DEFAULT_ACTORS, DEFAULT_ENGINE, DEFAULT_PARTITIONS, DEFAULT_STANDBYS, ENGINES
from runtime.errors import SchemaError
from runtime.keys import KeySchema

__all__ = ["StoreSpec", "ValueField", "validate_store_name", "is_store_name", "KINDS", "WINDOWED_KINDS"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
KINDS = ("kv", "window", "session")
WINDOWED_KINDS = ("window", "session")


def is_store_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def validate_store_name(name: str) -> str:
    """Store names appear in URLs and actor names: letters, digits, ``.``, ``_`` and ``-``."""
    if not isinstance(name, str) or not is_store_name(name):
        raise SchemaError(
            f"store name {name!r} is invalid: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            store=str(name),
        )
    return name


@dataclass(frozen=True)
class ValueField:
    """One column of a store's value, as Spark typed it."""

    name: str
    type_name: str

    def to_json(self) -> dict[str, str]:
        return {"column": self.name, "type": self.type_name}


@dataclass(frozen=True)
class StoreSpec:
    """A store's definition.

    ``partitions`` is fixed for the life of the store (the partitioner depends on it); ``actors`` is how
    many query actors share the partitions when it is created; ``standbys`` how many extra copies each
    partition has (None: decided when the store is created, by ``with_standbys_for``; ``riqr standbys``
    adds more later, on new actors, and the registry's spec then says how many its table has).
    ``read_replicas``: every HTTP verticle keeps a read replica of the whole store in its process and
    answers key lookups from it without a Ray hop (``runtime.readreplica``; opt-in: each node then holds
    the store in memory).
    ``value_fields`` lists the value columns: one column means values are scalars, several mean maps.
    """

    name: str
    key: KeySchema
    value_fields: tuple[ValueField, ...]
    kind: str = "kv"
    partitions: int = DEFAULT_PARTITIONS
    actors: int = DEFAULT_ACTORS
    standbys: int | None = DEFAULT_STANDBYS
    engine: str = DEFAULT_ENGINE
    extra: tuple[tuple[str, Any], ...] = field(default=())
    read_replicas: bool = False

    def __post_init__(self) -> None:
        validate_store_name(self.name)
        if self.kind not in KINDS:
            raise SchemaError(f"store kind {self.kind!r} is not supported; supported: {', '.join(KINDS)}")
        if self.partitions < 1:
            raise SchemaError(f"a store needs at least one partition, got {self.partitions}")
        if not 1 <= self.actors <= self.partitions:
            raise SchemaError(
                f"actors must be between 1 and the number of partitions ({self.partitions}), got {self.actors}"
            )
        if self.engine not in ENGINES:
            raise SchemaError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.standbys is not None and self.standbys < 0:
            raise SchemaError(f"standbys must not be negative, got {self.standbys}")
        if not self.value_fields:
            raise SchemaError(f"store {self.name!r} needs at least one value column")
        if self.kind in WINDOWED_KINDS and (not self.key.composite or self.key.columns[-1][1].kind != "timestamp"):
            raise SchemaError(f"a {self.kind} store's key must end with the window start (a timestamp column)")

    def placeable(self) -> StoreSpec:
        """This spec, or ``SchemaError`` when its standbys cannot be placed at creation: a standby copy
        lives on another of the store's actors. Checked for a declared store, not for every spec: one
        given standbys later (``riqr standbys``) has more actors than ``actors``, which counts those it was
        created with."""
        if self.standbys is not None and self.standbys >= self.actors:
            raise SchemaError(
                f"{self.standbys} standby copies of each partition need at least {self.standbys + 1} actors, "
                f"got {self.actors}"
            )
        return self

    def with_standbys_for(self, alive_nodes: int) -> StoreSpec:
        """This spec with its standbys decided: an explicit number stays; None ("auto") becomes 1 when
        more than one node is alive and the store has more than one actor (a standby lives on another
        actor, on another node when there is one), else 0."""
        if self.standbys is not None:
            return self.placeable()
        return replace(self, standbys=1 if alive_nodes > 1 and self.actors > 1 else 0)

    @property
    def scalar_value(self) -> bool:
        return len(self.value_fields) == 1

    @property
    def windowed(self) -> bool:
        """Window and session stores: the key's last column is the window start, the end rides along."""
        return self.kind in WINDOWED_KINDS

    @property
    def user_key_columns(self) -> int:
        """How many key columns the user's key has (a windowed store adds the window start)."""
        return 1 + len(self.key.rest) - (1 if self.windowed else 0)

    def to_json(self) -> dict[str, Any]:
        """The catalog entry served by ``GET /stores``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "key": self.key.to_json(),
            "value": [f.to_json() for f in self.value_fields],
            "partitions": self.partitions,
            "actors": self.actors,
            "standbys": self.standbys,
            "engine": self.engine,
            "read_replicas": self.read_replicas,
        }

    def same_layout(self, other: StoreSpec) -> bool:
        """Whether ``other`` can reuse the actors and data of this store (same key, partitions, value)."""
        return not self.layout_differences(other)

    def layout_differences(self, other: StoreSpec) -> list[str]:
        """What keeps ``other`` from reusing this store, one phrase each (``this`` -> ``other``): its kind,
        key columns and types, value columns, partition count or engine."""

        def columns(pairs: Any) -> str:
            return ", ".join(f"{name} {kind}" for name, kind in pairs)

        out = []
        if self.kind != other.kind:
            out.append(f"kind {self.kind} -> {other.kind}")
        if self.key != other.key:
            mine = columns((name, t.name) for name, t in self.key.columns)
            theirs = columns((name, t.name) for name, t in other.key.columns)
            out.append(f"key ({mine}) -> ({theirs})" if mine != theirs else "key encoding")
        if self.value_fields != other.value_fields:
            mine = columns((f.name, f.type_name) for f in self.value_fields)
            theirs = columns((f.name, f.type_name) for f in other.value_fields)
            out.append(f"value ({mine}) -> ({theirs})")
        if self.partitions != other.partitions:
            out.append(f"partitions {self.partitions} -> {other.partitions}")
        if self.engine != other.engine:
            out.append(f"engine {self.engine} -> {other.engine}")
        return out
