"""The Spark runtime: any splitflow Source through PySpark's Python Data Source API.

The only package that imports pyspark. ``register(spark)`` registers the built-in sources.
The built-in data sources are imported on first use: the process that reads one connector
(Spark's streaming source runner, a Python worker) imports only that connector's modules.
"""

from __future__ import annotations

import importlib
import os
import socket
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from splitflow.spark.datasource import SplitflowDataSource
from splitflow.spark.options import RuntimeOptions
from splitflow.spark.restart import run_restarting

if TYPE_CHECKING:
    from splitflow.spark.files import FilesDataSource
    from splitflow.spark.generator import GeneratorDataSource
    from splitflow.spark.kafka import KafkaDataSource
    from splitflow.spark.mysql import MySqlCdcDataSource
    from splitflow.spark.postgres import PostgresCdcDataSource
    from splitflow.spark.sequence import SequenceDataSource

_MODULES = {
    "SequenceDataSource": "sequence",
    "GeneratorDataSource": "generator",
    "KafkaDataSource": "kafka",
    "FilesDataSource": "files",
    "PostgresCdcDataSource": "postgres",
    "MySqlCdcDataSource": "mysql",
}
"""Each built-in data source's module in this package, in the order ``register`` uses."""
_UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"
"""Spark's option to talk to its Python processes over Unix domain sockets instead of TCP
(:func:`session` turns it on)."""


def built_in() -> tuple[type[SplitflowDataSource], ...]:
    """The built-in data sources (imports every connector's Spark module)."""
    return tuple(__getattr__(name) for name in _MODULES)


def __getattr__(name: str) -> Any:
    if name == "BUILT_IN":
        return built_in()
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return getattr(module, name)


def register(spark: Any, *data_sources: type[SplitflowDataSource]) -> None:
    """Register ``data_sources`` (default: the built-in ones) with a Spark session.

    Their streaming queries' driver-side Python process and the Python worker daemons on the
    driver's machine are forked from a warm one (:mod:`splitflow.spark.warmstart`;
    ``SPLITFLOW_WARM_START=0`` turns that off).
    """
    from splitflow.spark.warmstart import registering

    with registering(spark):
        for data_source in data_sources or built_in():
            spark.dataSource.register(data_source)


def session(builder: Any, *data_sources: type[SplitflowDataSource]) -> Any:
    """``builder.getOrCreate()``, with ``data_sources`` (default: the built-in ones)
    registered on it (:func:`register`).

    Spark then starts every Python process on the driver's machine forked from the warm
    process, not only the splitflow data sources' (:mod:`splitflow.spark.warmstart`):
    also the daemon it starts once per application, at the first registration, to look up
    installed Python data sources (about a second cold), and other Python code's worker
    daemons.

    Spark also talks to its Python processes over Unix domain sockets
    (``spark.python.unix.domain.socket.enabled``) unless the builder sets that option:
    over TCP, every Python task waited about 40 ms for the JVM's next message, which looks
    like TCP's delayed acknowledgement (a task reading 1,000 rows of Parquet ran 66 to 72
    ms over TCP and 22 to 31 ms over Unix sockets).

    A session that already exists is returned as it is, registered; a Spark Connect session
    (its processes are the server's) is only registered::

        spark = session(SparkSession.builder.master("local[2]"))
    """
    from splitflow.spark.warmstart import starting_spark

    options = getattr(builder, "_options", {})
    remote = "spark.remote" in options or any(
        name in os.environ for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")
    )
    if not remote and _UNIX_SOCKETS not in options and hasattr(socket, "AF_UNIX"):
        builder = builder.config(_UNIX_SOCKETS, "true")
    with nullcontext() if remote else starting_spark():  # Spark Connect: the server starts them
        spark = builder.getOrCreate()
    register(spark, *data_sources)
    return spark


__all__ = [
    "BUILT_IN",
    "FilesDataSource",
    "GeneratorDataSource",
    "KafkaDataSource",
    "MySqlCdcDataSource",
    "PostgresCdcDataSource",
    "RuntimeOptions",
    "SequenceDataSource",
    "SplitflowDataSource",
    "built_in",
    "register",
    "run_restarting",
    "session",
]
