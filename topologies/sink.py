"""``materialize``: the foreachBatch sink that wires a streaming DataFrame into a riqr store.

The partition column is computed in Spark SQL (``runtime.partitioner.spark_partition_sql``, no Python
UDF). Each micro-batch comes to the driver as Arrow (``DataFrame.toArrow``), is split by partition, and
every owner of a partition (active and standbys) receives ``apply(source, batch_id, slices)`` over Ray.
The batch completes only when all owners acknowledged; if one fails, the exception fails the Spark
query before it commits the batch, and the replay after restart is a no-op wherever it had landed.

``source`` is the streaming query's id from its checkpoint: stable across restarts of the same
checkpoint, new for a fresh one (see ``runtime.engine.PartitionState``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import ray

from runtime import raycalls
from runtime.catalog import StoreSpec, ValueField
from runtime.config import (
    DEFAULT_ACTORS,
    DEFAULT_NAMESPACE,
    DEFAULT_PARTITIONS,
    DEFAULT_STANDBYS,
    DEFAULT_TRIGGER,
    REGISTRY_NAME,
)
from runtime.errors import NotConnected, SchemaError
from runtime.ingest import PARTITION_COLUMN, WINDOW_END_COLUMN, slices_for_owners, split_by_partition
from runtime.keys import KeySchema, key_type_for_spark
from runtime.ownership import ClusterView
from runtime.partitioner import spark_partition_sql

__all__ = ["materialize", "store_spec_for", "BatchDelivery"]

log = logging.getLogger(__name__)

WINDOW_START_COLUMN = "window_start"


def store_spec_for(
    schema: Any,
    store: str,
    key: str | Sequence[str],
    value: str | Sequence[str] | None = None,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    actors: int = DEFAULT_ACTORS,
    standbys: int = DEFAULT_STANDBYS,
    kind: str = "kv",
) -> StoreSpec:
    """The store definition for a DataFrame ``schema`` (a Spark ``StructType``).

    ``key`` names the key column, or several for a composite key (the first is the partition column).
    """
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    key_cols = [key] if isinstance(key, str) else list(key)
    if not key_cols:
        raise SchemaError("a store needs at least one key column")
    for column in key_cols:
        if column not in types:
            raise SchemaError(
                f"key column {column!r} is not in the DataFrame (columns: {', '.join(types)})", column=column
            )
    if value is None:
        value_cols = [c for c in types if c not in key_cols and c != WINDOW_END_COLUMN]
    elif isinstance(value, str):
        value_cols = [value]
    else:
        value_cols = list(value)
    missing = [c for c in value_cols if c not in types]
    if missing:
        raise SchemaError(f"value columns {missing} are not in the DataFrame (columns: {', '.join(types)})")
    overlap = [c for c in key_cols if c in value_cols]
    if overlap:
        raise SchemaError(f"columns {overlap} cannot be both in the key and in the value")
    key_types = [key_type_for_spark(types[c], c).name for c in key_cols]
    return StoreSpec(
        name=store,
        key=KeySchema(key_cols[0], key_types[0], tuple(zip(key_cols[1:], key_types[1:]))),
        value_fields=tuple(ValueField(c, types[c]) for c in value_cols),
        partitions=partitions,
        actors=actors,
        standbys=standbys,
        kind=kind,
    )


def _registry(namespace: str) -> Any:
    try:
        return ray.get_actor(REGISTRY_NAME, namespace=namespace)
    except ValueError:
        raise NotConnected(
            f"no riqr runtime in Ray namespace {namespace!r}; start it with `riqr up --namespace {namespace}`",
            namespace=namespace,
        ) from None


def _read_query_id(checkpoint: str) -> str:
    """The streaming query id Spark wrote to ``<checkpoint>/metadata`` when the query started."""
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        raise SchemaError(f"checkpoint {checkpoint!r}: only local checkpoint directories are supported so far")
    with open(os.path.join(parsed.path if parsed.scheme else checkpoint, "metadata"), encoding="utf-8") as f:
        return str(json.loads(f.readline())["id"])


class BatchDelivery:
    """The foreachBatch function: split a micro-batch by partition and deliver it to the owners."""

    def __init__(self, spec: StoreSpec, namespace: str, checkpoint: str, *, timeout: float = 120.0) -> None:
        self.spec = spec
        self.namespace = namespace
        self.checkpoint = checkpoint
        self.timeout = timeout
        self._source: str | None = None
        self._view: ClusterView | None = None
        self._handles: dict[str, Any] = {}

    def _current_view(self) -> ClusterView:
        registry = _registry(self.namespace)
        epoch = raycalls.get(registry.epoch.remote(), "registry epoch", timeout=self.timeout)
        if self._view is None or self._view.epoch != epoch:
            self._view = raycalls.get(registry.view.remote(), "registry view", timeout=self.timeout)
        return self._view

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            handle = self._handles[uuid] = ray.get_actor(uuid, namespace=self.namespace)
        return handle

    def deliver(self, source: str, batch_id: int, table: Any) -> int:
        """Deliver an Arrow ``table`` (with the partition column) as batch ``batch_id``; returns rows sent."""
        view = self._current_view()
        ownership = view.table(self.spec.name)
        if ownership is None:
            raise NotConnected(f"store {self.spec.name!r} is no longer registered", store=self.spec.name)
        split = split_by_partition(table, self.spec.partitions)
        refs = [
            self._handle(uuid).apply.remote(source, batch_id, slices)
            for uuid, slices in slices_for_owners(ownership, split).items()
        ]
        raycalls.get(refs, f"delivering batch {batch_id} of {self.spec.name}", timeout=self.timeout)
        return table.num_rows

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        if self._source is None:
            self._source = _read_query_id(self.checkpoint)
        table = batch_df.toArrow()
        rows = self.deliver(self._source, batch_id, table)
        log.info(
            "store %s: batch %d delivered, %d rows in %.0f ms",
            self.spec.name,
            batch_id,
            rows,
            (time.monotonic() - started) * 1000,
        )


def _flatten_window(df: Any, window_column: str) -> Any:
    """Spark's window struct as two columns: ``window_start`` (the key's last column) and the end."""
    from pyspark.sql import functions as F

    if window_column not in df.columns:
        raise SchemaError(
            f"the DataFrame has no window column {window_column!r} (columns: {', '.join(df.columns)}); "
            "pass window_column=",
            column=window_column,
        )
    others = [c for c in df.columns if c != window_column]
    return df.select(
        *others,
        F.col(f"`{window_column}`.start").alias(WINDOW_START_COLUMN),
        F.col(f"`{window_column}`.end").alias(WINDOW_END_COLUMN),
    )


def materialize(
    df: Any,
    *,
    store: str,
    key: str | Sequence[str],
    value: str | Sequence[str] | None = None,
    checkpoint: str,
    kind: str = "kv",
    window_column: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    partitions: int = DEFAULT_PARTITIONS,
    actors: int = DEFAULT_ACTORS,
    standbys: int = DEFAULT_STANDBYS,
    trigger: str = DEFAULT_TRIGGER,
    output_mode: str | None = None,
) -> Any:
    """Start a streaming query that keeps store ``store`` equal to ``df`` keyed by ``key``.

    ``key`` names the key column, or a list of columns for a composite key (the first one decides the
    partition). ``value`` names the value column(s); by default every other column. The store is created
    (with its query actors) if it does not exist. Returns the ``StreamingQuery``.

    ``kind="window"`` takes the output of a ``window(...)`` aggregation and ``kind="session"`` of a
    ``session_window(...)`` one: the window struct (``window_column``, by default ``window`` or
    ``session_window``) becomes the key's last column, ``window_start``, and the window end is kept with
    the value. The output mode defaults to ``update``, except for sessions, where Spark allows only
    ``append`` (a session's range changes as it grows, and update mode has no way to retract the old
    one): sessions reach the store once, final, when the watermark passes their end.
    """
    key_cols = [key] if isinstance(key, str) else list(key)
    if kind in ("window", "session"):
        df = _flatten_window(df, window_column or ("session_window" if kind == "session" else "window"))
        key_cols = [*key_cols, WINDOW_START_COLUMN]
    spec = store_spec_for(
        df.schema, store, key_cols, value, partitions=partitions, actors=actors, standbys=standbys, kind=kind
    )
    raycalls.get(_registry(namespace).create_store.remote(spec), f"creating store {store}")
    value_cols = [f.name for f in spec.value_fields]
    extra = [WINDOW_END_COLUMN] if spec.windowed else []
    partition_sql = spark_partition_sql(spec.key.type, spec.key.column, spec.partitions)
    from pyspark.sql import functions as F

    shaped = df.select(*key_cols, *value_cols, *extra, F.expr(partition_sql).alias(PARTITION_COLUMN))
    return (
        shaped.writeStream.foreachBatch(BatchDelivery(spec, namespace, checkpoint))
        .outputMode(output_mode or ("append" if kind == "session" else "update"))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger)
        .queryName(f"riqr-{namespace}-{store}")
        .start()
    )
