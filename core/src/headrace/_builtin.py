"""The core's own plugin module: the built-in connectors and their options, and the Spark
query engine (``start(path, engine=spark)``).

Registered through the same ``headrace`` entry-point group as every other plugin; importing it
imports nothing but option declarations.
"""

from __future__ import annotations

from headrace.options import Boolean, Choice, Integer, Option, OptionSchema, PyObject, String, StringList
from headrace.plugins import ConnectorSpec, EngineSpec, hookimpl

__all__ = ["headrace_connectors", "headrace_engines"]

RATE_OPTIONS = OptionSchema(
    [
        Option("rowsPerSecond", Integer(min=1), default=1, doc="Rows generated per second."),
        Option("numPartitions", Integer(min=1), default=1, doc="Partitions each batch is split into."),
        Option("maxRowsPerTrigger", Integer(min=1), doc="At most this many rows per batch (headrace extension)."),
    ]
)

RATE_MICRO_BATCH_OPTIONS = OptionSchema(
    [
        Option("rowsPerBatch", Integer(min=1), required=True, doc="Rows in each micro-batch."),
        Option("numPartitions", Integer(min=1), default=1, doc="Partitions each batch is split into."),
        Option("startTimestamp", Integer(min=0), default=0, doc="Event time (epoch ms) of the first batch."),
        Option("advanceMillisPerBatch", Integer(min=0), default=1000, doc="Event time added per batch (ms)."),
        Option("totalRows", Integer(min=0), doc="Stop after this many rows (headrace extension; default unbounded)."),
    ]
)

MEMORY_SOURCE_OPTIONS = OptionSchema(
    [Option("name", String(), required=True, doc="The in-memory stream: headrace.testing.memory_stream(name).")]
)
MEMORY_SINK_OPTIONS = OptionSchema(
    [Option("queryName", String(), required=True, doc="Table name, set with query_name(); read it with headrace.memory_table(name).")]
)
CONSOLE_OPTIONS = OptionSchema(
    [
        Option("numRows", Integer(min=1), default=20, doc="Rows shown per batch."),
        Option("truncate", Boolean(), default=True, doc="Cut values longer than 20 characters."),
    ]
)
FILES_OPTIONS = OptionSchema(
    [
        Option("path", String(), required=True, doc="Output folder (start(path) or this option)."),
        Option("format", Choice("parquet", "arrow"), default="parquet", doc="File format of the parts."),
        Option("partitionBy", StringList(), doc="Hive-style partition columns (key=value folders)."),
    ]
)
FOREACH_OPTIONS = OptionSchema(
    [Option("function", PyObject(callable_=True), required=True, doc="fn(table, batch_id), set with foreach_batch(fn).")]
)

_C = "headrace.connectors"


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The built-in connectors."""
    return [
        ConnectorSpec(
            name="rate",
            source=f"{_C}.rate:RateSource",
            source_options=RATE_OPTIONS,
            description="Generates (timestamp, value) rows at a fixed rate; supports the real-time trigger.",
        ),
        ConnectorSpec(
            name="rate-micro-batch",
            source=f"{_C}.rate:RateMicroBatchSource",
            source_options=RATE_MICRO_BATCH_OPTIONS,
            description="Generates rowsPerBatch (timestamp, value) rows per batch, deterministically.",
        ),
        ConnectorSpec(
            name="memory",
            source=f"{_C}.memory:MemorySource",
            sink=f"{_C}.memory:MemorySink",
            source_options=MEMORY_SOURCE_OPTIONS,
            sink_options=MEMORY_SINK_OPTIONS,
            description="In-process tables: a source fed by headrace.testing.memory_stream, a sink read by headrace.memory_table.",
        ),
        ConnectorSpec(
            name="console",
            sink=f"{_C}.console:ConsoleSink",
            sink_options=CONSOLE_OPTIONS,
            description="Prints each batch.",
        ),
        ConnectorSpec(name="noop", sink=f"{_C}.console:NoopSink", description="Discards rows (benchmarks)."),
        ConnectorSpec(
            name="files",
            sink=f"{_C}.files:FilesSink",
            sink_options=FILES_OPTIONS,
            description="Exactly-once Parquet/Arrow files, one set per batch (Spark's file sink).",
        ),
        ConnectorSpec(
            name="foreach_batch",
            sink=f"{_C}.foreach:ForeachBatchSink",
            sink_options=FOREACH_OPTIONS,
            description="Calls a function with each micro-batch (set with foreach_batch(fn)).",
        ),
    ]


@hookimpl
def headrace_engines() -> list[EngineSpec]:
    """The Spark engine: a query definition translated to a PySpark streaming DataFrame
    (``headrace.spark.engine``, imported only when a query is started on Spark)."""
    return [
        EngineSpec(
            name="spark",
            accepts=("pyspark.sql.session.SparkSession", "pyspark.sql.connect.session.SparkSession"),
            factory="headrace.spark.engine:as_engine",
            description="a SparkSession or headrace.spark.engine.SparkEngine",
            requires=("pyspark",),
            install_hint="pip install 'headrace[spark]'",
        )
    ]
