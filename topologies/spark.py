"""The SparkSession riqr's topologies run on: ``local[*]`` by default, any master by configuration."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["spark_session", "DEFAULT_CONF"]

# Small shuffles: streaming state is partitioned by spark.sql.shuffle.partitions, and the default of 200
# makes every micro-batch of a small job pay for 200 tasks.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.metricsEnabled": "false",
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
}


def spark_session(master: str | None = None, app_name: str = "riqr", conf: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Get or create the SparkSession: ``master`` else ``$RIQR_SPARK_MASTER`` else ``local[*]``."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master or os.environ.get("RIQR_SPARK_MASTER", "local[*]"))
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
