"""The SparkSession riqr's topologies run on: ``local[*]`` by default, any master by configuration."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["spark_session", "DEFAULT_CONF"]

# Small shuffles: streaming state is partitioned by spark.sql.shuffle.partitions, and the default of 200
# makes every micro-batch of a small job pay for 200 tasks.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.metricsEnabled": "false",
}

_LOG4J = Path(__file__).with_name("log4j2.properties")


def spark_session(master: str | None = None, app_name: str = "riqr", conf: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Get or create the SparkSession: ``master`` else ``$RIQR_SPARK_MASTER`` else ``local[*]``."""
    from pyspark.sql import SparkSession

    master = master or os.environ.get("RIQR_SPARK_MASTER", "local[*]")
    if master.startswith("local"):
        # A local driver talks to itself only; this also spares the "hostname resolves to loopback" warning.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = os.environ.get("RIQR_SPARK_LOG4J", str(_LOG4J))
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        **DEFAULT_CONF,
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
