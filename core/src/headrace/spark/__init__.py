"""Run any headrace connector inside Apache Spark, as a PySpark 4 Python data source.

::

    import headrace.spark
    headrace.spark.register(spark)                 # every installed connector
    # headrace.spark.register(spark, "kinesis")    # or a chosen few

    df = (spark.readStream.format("headrace.rate-micro-batch")   # a Databricks option chain,
            .option("rowsPerBatch", 1000)                        # only the format name changes
            .load())
    (df.writeStream.format("headrace.files").option("path", "/out")
        .option("checkpointLocation", "/chk/q1").trigger(availableNow=True).start())

Each connector is registered as ``headrace.<name>`` (and ``headrace.<alias>``), with its own
options, validation and errors: an ``OptionsError`` reaches the user as Spark's
``AnalysisException`` (reads, at ``load()``) or ``StreamingQueryException`` (writes, when the
first batch is planned) with headrace's message in it.

What differs from headrace's own engine (see docs/spark.md):

- Spark owns the checkpoint (offsets and commits logs, triggers, retries). A source that keeps
  state of its own (``Source.needs_state_path``: cloudFiles, pubsub, rate) puts it in the folder
  given by the reader option ``headraceStatePath``, because Spark does not tell a Python source
  where its checkpoint is; cloudFiles defaults it to ``<cloudFiles.schemaLocation>/_headrace_state``,
  the others ask for it (a folder that stays the same across restarts, e.g.
  ``<checkpointLocation>/sources/0/headrace``). Sources without state (kafka, kinesis, delta,
  rate-micro-batch, ...) need no extra option.
- A sink's ``SinkContext.query_id`` is Spark's query id, read from ``<checkpointLocation>/metadata``
  (stable across restarts); its ``state_path`` is ``<checkpointLocation>/sinks/0``.
- Spark lower-cases option names; declared options get their spelling back, pass-through
  options (``kafka.*``) reach the client library lower-cased.
- ``read`` and ``Sink.write`` run on executors: the plugin must be installed there too.

Requires ``pip install 'headrace[spark]'`` and PySpark 4.2 or later (read limits and the Arrow
stream writer; developed against 4.3).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

try:  # DataSourceStreamArrowWriter: PySpark 4.1; latestOffset(start, limit) and read limits: 4.2
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter  # noqa: F401
    from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"headrace.spark needs PySpark 4.2 or later ({_e}); fix: pip install 'headrace[spark]' 'pyspark>=4.2'"
    ) from _e

from pyspark.sql.types import StructType

from headrace._lazy import lazy_attributes
from headrace.errors import HeadraceError
from headrace.plugins import ConnectorSpec
from headrace.spark._common import FORMAT_PREFIX, STATE_PATH_OPTION
from headrace.spark.source import (
    HeadraceInputPartition,
    HeadraceStreamReader,
    max_tasks_option,
    parse_source_options,
)
from headrace.spark.type_mapping import (
    arrow_to_spark_schema,
    arrow_to_spark_type,
    conform_batch,
    spark_to_arrow_schema,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.plugins import Registry
    from headrace.spark.sink import HeadraceCommitMessage, HeadraceStreamWriter

__all__ = [
    "FORMAT_PREFIX",
    "STATE_PATH_OPTION",
    "HeadraceCommitMessage",
    "HeadraceDataSource",
    "HeadraceInputPartition",
    "HeadraceStreamReader",
    "HeadraceStreamWriter",
    "arrow_to_spark_schema",
    "arrow_to_spark_type",
    "conform_batch",
    "data_source_class",
    "default_max_tasks",
    "format_name",
    "register",
    "spark_to_arrow_schema",
]

log = logging.getLogger(__name__)

# The sink side is imported when a writer is first asked for (Spark's streaming source runner,
# a fresh Python process per query, unpickles this module's data source and never writes).
_LAZY = {"HeadraceCommitMessage": "headrace.spark.sink", "HeadraceStreamWriter": "headrace.spark.sink"}


__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)


def format_name(connector: str) -> str:
    """The Spark format of a connector: ``"headrace." + connector``."""
    return FORMAT_PREFIX + connector


class HeadraceDataSource(DataSource):
    """Base class of the Spark data sources that :func:`register` creates, one subclass per
    connector (name), whose class attribute ``connector`` names the connector.

    Spark creates an instance per ``load()`` / ``start()`` on the driver and pickles it (with
    cloudpickle: the generated subclass travels by value) to every Python process that builds a
    reader or writer. Instances hold only Spark's option strings. The connector's
    ``ConnectorSpec`` travels with the class (``inline_spec``), so Spark's Python processes do
    not run plugin discovery (an entry-point scan of every installed distribution, slow there
    because ``pyspark.zip`` is on their ``sys.path``: about 0.25 s in each fresh process, such
    as the streaming source runner Spark starts for every query); the connector's classes are
    still imported there by module path, so the plugin must be installed on executors too. A
    spec that cannot be pickled is looked up by name in each process's registry instead.
    """

    connector: ClassVar[str] = ""
    inline_spec: ClassVar[ConnectorSpec | None] = None
    format_alias: ClassVar[str] = ""
    max_tasks: ClassVar[int | None] = None  # default_max_tasks(Spark's default parallelism) when registered

    @classmethod
    def connector_spec(cls) -> ConnectorSpec:
        """The connector's spec: from this process's registry, or the inline one. Called once
        per reader, writer or schema request."""
        if cls.inline_spec is not None:
            return cls.inline_spec
        from headrace.plugins import registry

        return registry().get(cls.connector)

    @classmethod
    def name(cls) -> str:
        """The format name Spark registers: ``headrace.<connector>``. Called once at
        registration."""
        return format_name(cls.format_alias or cls.connector)

    def schema(self) -> StructType:
        """The Spark schema of the source, from ``Source.schema``.

        Called by Spark once per ``load()`` on the driver when the user gave no schema. Validates
        the options first (raising :class:`OptionsError`), builds the source to ask its schema,
        and closes it. Raises :class:`UnsupportedError` for a column type Spark cannot hold.
        """
        spec = self.connector_spec()
        options, state_path = parse_source_options(spec, self.options)
        from headrace.spark.source import source_context

        self._schema_inferred = True  # pickled with this instance: streamReader knows the schema is ours
        source = spec.load_source()(options, source_context(state_path, None))
        try:
            return arrow_to_spark_schema(source.schema)
        finally:
            source.close()

    def streamReader(self, schema: StructType) -> HeadraceStreamReader:
        """A stream reader for this query. Called by Spark on the driver in each process that
        needs one (see :mod:`headrace.spark.source`); the result is pickled to executors."""
        user_schema = None if getattr(self, "_schema_inferred", False) else spark_to_arrow_schema(schema)
        spec, raw = self.connector_spec(), dict(self.options)
        reader = HeadraceStreamReader(spec, raw, schema, user_schema, max_tasks_option(raw, self.max_tasks))
        return reader

    def streamWriter(self, schema: StructType, overwrite: bool) -> HeadraceStreamWriter:
        """A stream writer for this query. Called by Spark on the driver once per micro-batch
        and once per commit/abort; the result is pickled to executors."""
        from headrace.spark.sink import HeadraceStreamWriter

        return HeadraceStreamWriter(self.connector_spec(), dict(self.options), schema, overwrite)


def data_source_class(connector: str | ConnectorSpec, *, alias: str = "", reg: Registry | None = None,
                      max_tasks: int | None = None) -> type[HeadraceDataSource]:  # fmt: skip
    """The Spark ``DataSource`` class for one connector (a name looked up in the registry, or a
    ``ConnectorSpec``). ``alias`` registers it under ``headrace.<alias>`` instead of its name.

    The spec is carried inline, pickled with the class, so Spark's Python processes need no
    plugin discovery; an installed connector whose spec cannot be pickled is referred to by
    name instead (Spark's workers look it up in their own registry). Register the class with
    ``spark.dataSource.register(cls)``. ``max_tasks``: the default of the reader option
    ``headraceMaxTasks`` (at most this many Spark tasks per micro-batch; None: one per
    partition of the source).
    """
    from headrace.plugins import registry

    r = reg or registry()
    spec = connector if isinstance(connector, ConnectorSpec) else r.get(connector)
    inline: ConnectorSpec | None = spec
    if reg is None and not _picklable(spec):
        try:
            found = r.get(spec.name)
            if (found.source, found.sink) == (spec.source, spec.sink):
                inline = None  # an installed connector: each process finds it by name
        except HeadraceError:
            pass
    safe = "".join(c if c.isalnum() else "_" for c in (alias or spec.name))
    return type(
        f"HeadraceDataSource_{safe}",
        (HeadraceDataSource,),
        {"connector": spec.name, "inline_spec": inline, "format_alias": alias, "max_tasks": max_tasks,
         "__module__": __name__,
         "__doc__": f"headrace connector '{spec.name}' as a Spark data source"},
    )


def register(spark: SparkSession, *connectors: str | ConnectorSpec, aliases: bool = True,
             reg: Registry | None = None) -> list[str]:  # fmt: skip
    """Register headrace connectors as Spark data sources; return the format names.

    With no ``connectors``, every installed connector is registered (plugins that fail to load
    are skipped with a warning); named ones that cannot be found raise
    :class:`ConnectorNotFoundError` / :class:`PluginError`. With ``aliases`` a connector's
    aliases are registered too. Call once per SparkSession, on the driver; registering again
    replaces the earlier registration.
    """
    from headrace.plugins import registry

    r = reg or registry()
    specs: Sequence[ConnectorSpec]
    if connectors:
        specs = [c if isinstance(c, ConnectorSpec) else r.get(c) for c in connectors]
    else:
        specs = r.specs()
        for name, dist, err in r.broken():
            log.warning("headrace.spark: plugin '%s' (%s) failed to load and is not registered: %s",
                        name, dist, err.splitlines()[0])  # fmt: skip
    if not specs:
        raise HeadraceError("no headrace connectors to register; install a plugin (pip install headrace-<name>)")
    names: list[str] = []
    max_tasks = default_max_tasks(_default_parallelism(spark))
    for spec in specs:
        extra = [a for a in (spec.aliases if aliases else ()) if a.lower() != spec.name.lower()]
        for alias in ("", *dict.fromkeys(extra)):
            cls = data_source_class(spec, alias=alias, max_tasks=max_tasks)
            spark.dataSource.register(cls)
            names.append(cls.name())
    return names


def _picklable(spec: ConnectorSpec) -> bool:
    """Whether ``spec`` survives Spark's cloudpickle (validators in option schemas are plain
    functions, usually fine; a spec holding a live object is not)."""
    from pyspark import cloudpickle

    try:
        cloudpickle.dumps(spec)
    except Exception as e:
        log.debug("headrace.spark: connector '%s' is looked up by name in Spark's workers: its spec "
                  "cannot be pickled (%s)", spec.name, e)  # fmt: skip
        return False
    return True


def default_max_tasks(parallelism: int | None) -> int | None:
    """The default of ``headraceMaxTasks`` for Spark's default parallelism: half of it, at least
    one (None stays None: one task per partition of the source).

    A task of a Python data source keeps about two cores busy, not one: its Python read worker,
    the JVM task thread converting Arrow to rows and back, and its Python write worker run side
    by side as a pipeline, and Spark counts only the task slot. On ``local[2]`` one task per
    micro-batch ran the benchmark's batches faster and with less CPU than two in 5 of 6
    interleaved rounds (medians 5.4 s against 6.4 s, 4.3 against 5.0 CPU seconds).
    """
    if parallelism is None:
        return None
    return max(1, parallelism // 2)


def _default_parallelism(spark: SparkSession) -> int | None:
    """Spark's default parallelism (the cores of ``local[N]`` or of the cluster's executors);
    None where it cannot be asked (Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return None
