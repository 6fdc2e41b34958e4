"""Run a headrace query definition on Apache Spark: the frame's plan translated into a PySpark
streaming DataFrame, started with Spark's own ``writeStream``.

::

    query = (stream.where("amount > 0").with_watermark("ts", "10 seconds")
               .group_by(hr.window("ts", "1 minute")).count()
               .write_stream.format("files").option("format", "parquet")
               .option("checkpointLocation", "/chk/q").trigger(available_now=True)
               .start("/out", engine=spark))          # the one change: engine=spark

``engine`` is a ``SparkSession`` or a :class:`SparkEngine` (a session and the connectors to
run as Spark's own format of the same name, e.g. ``SparkEngine(spark, native={"delta"})``).
The translation runs once, on the calling thread, before the query starts: every step is
checked, and one that cannot run on Spark raises :class:`~headrace.errors.UnsupportedError`
naming the step and why. Nothing is read or written before that.

Steps and their Spark forms (docs/spark.md, "Moving a query to Spark"):

- sources: ``spark.readStream.format("headrace.<name>")`` with the options as given (or the
  native format for names in ``SparkEngine.native``); ``union``: ``unionByName``;
- ``sql``/``select_expr``/``where``: ``spark.sql(query, batch=df)``, the step's input as a
  DataFrame parameter (no temporary view; headrace's SQL is Spark SQL; steps written in the
  DuckDB dialect are transpiled by sqlglot);
  ``with_column``: ``withColumn(name, expr(...))``; ``select``, ``drop``,
  ``with_column_renamed``: the same DataFrame methods;
- ``with_watermark``: ``withWatermark`` (with ``SparkEngine.sql_watermarks``, as in a pipeline
  run by Spark Declarative Pipelines: Spark SQL's ``WATERMARK`` clause); ``group_by(...).agg``: ``groupBy(...).agg`` with
  ``window``/``session_window``; ``drop_duplicates[_within_watermark]``: ``dropDuplicates[WithinWatermark]``;
- ``join`` with a static frame: a static Spark DataFrame (``spark.read`` of a native format,
  else the headrace read on the driver handed to ``createDataFrame``);
- ``join`` of two streams / ``union`` of two streams with their own steps: each side's steps
  translated on its own sources, then ``left.alias(a).join(right.alias(b), expr(on) or keys,
  how)`` / ``unionByName``; chained time windows: ``window_time(window)`` grouped by a second
  ``window(...)``;
- ``map_batches``/``filter(fn)``/``mapInArrow``: ``mapInArrow`` (the output schema must be given);
- ``group_by(keys).transform_with_state(processor, ...)``: ``groupBy(keys).transformWithStateInPandas``
  with the headrace processor inside a pyspark ``StatefulProcessor`` (:mod:`headrace.spark.stateful`;
  the session needs the RocksDB state store provider, as Spark's own transformWithState);
- ``foreach_batch(fn)``: ``foreachBatch`` with ``fn(pyarrow.Table, batch_id)`` (``toArrow``);
  sinks ``memory``/``console``/``noop``: Spark's own; others ``headrace.<name>``.

The checkpoint is Spark's: a query started on Spark cannot resume a headrace checkpoint, nor
the reverse (``headrace checkpoint`` commands refuse a Spark checkpoint).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.errors import HeadraceError, UnsupportedError
from headrace.spark._common import STATE_PATH_OPTION

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery as SparkStreamingQuery

    from headrace.api.stream_frame import StreamFrame
    from headrace.api.writer import DataStreamWriter
    from headrace.engine.trigger import SourcePlan
    from headrace.transforms.operator import Operator

__all__ = [
    "SparkEngine",
    "as_engine",
    "check_plan",
    "refusal",
    "start_on_spark",
    "static_to_spark",
    "to_spark",
]

log = logging.getLogger(__name__)

#: sinks that are Spark's own formats of the same name
_SPARK_SINKS = frozenset({"memory", "console", "noop"})
#: writer options that are headrace's engine's own; on Spark they are Spark session settings
_ENGINE_ONLY = {
    "statestore": "spark.sql.streaming.stateStore.providerClass (a Spark session setting)",
    "statesnapshotinterval": "spark.sql.streaming.stateStore.minDeltasForSnapshot (a Spark session setting)",
    "rocksdbheldkeysmb": "spark.sql.streaming.stateStore.rocksdb.* (Spark's RocksDB state store's session settings)",
}


@dataclass(frozen=True)
class SparkEngine:
    """Where a translated query runs: ``session`` (a ``SparkSession``) and the connector names
    to run as Spark's own format of the same name with the same options (``native``, e.g.
    ``{"delta", "kafka"}`` where the cluster has those packages) instead of the adapter's
    ``headrace.<name>``. Built by the user once; used on the thread calling ``start()``."""

    session: Any
    native: frozenset[str] = field(default_factory=frozenset)
    #: headrace table paths that are tables of the Spark session's catalog (path -> table
    #: name): a read of one is ``spark.readStream.table(name)`` / ``spark.read.table(name)``
    #: (a pipeline's datasets, run by Spark Declarative Pipelines: headrace.spark.pipelines)
    tables: Mapping[str, str] = field(default_factory=dict)
    #: watermarks as Spark SQL's ``WATERMARK col DELAY OF INTERVAL ...`` clause instead of
    #: ``withWatermark``: Spark Connect plans ``withWatermark`` by analysing its input at once,
    #: which fails for a read of a dataset Spark Declarative Pipelines has not created yet
    sql_watermarks: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "native", frozenset(n.lower() for n in self.native))
        object.__setattr__(self, "tables", {os.path.normpath(p): n for p, n in self.tables.items()})

    def table_of(self, plan: Any) -> str | None:
        """The catalog table a source plan reads (see ``tables``), or None."""
        path = getattr(plan, "path", None)
        if not self.tables or path is None or str(getattr(plan, "connector", "")).lower() != "delta":
            return None
        return self.tables.get(os.path.normpath(str(path)))

    def format_of(self, connector: str) -> str:
        """The Spark format name for a headrace connector."""
        return connector if connector.lower() in self.native else f"headrace.{connector}"

    def start_query(self, writer: DataStreamWriter, path: str | None) -> SparkStreamingQuery:
        """Translate ``writer``'s query and start it on this session (:func:`start_on_spark`):
        the :class:`~headrace.api.engines.QueryEngine` that ``start(path, engine=...)`` calls."""
        return start_on_spark(writer, path, self)


def as_engine(engine: Any) -> SparkEngine:
    """``engine`` (a ``SparkSession`` or a :class:`SparkEngine`) as a :class:`SparkEngine`;
    raises naming what was given otherwise. Called by ``start(engine=spark)`` through the
    engine the core registers for a ``SparkSession`` (``headrace._builtin``)."""
    if isinstance(engine, SparkEngine):
        return engine
    if type(engine).__name__ == "SparkSession" and hasattr(engine, "readStream"):
        return SparkEngine(engine)
    raise HeadraceError(
        f"start(engine={type(engine).__name__}): engine is a SparkSession or headrace.spark.engine.SparkEngine; "
        "leave it out to run on headrace's own engine"
    )


def _refuse(op: Operator, why: str) -> UnsupportedError:
    return UnsupportedError(f"step {op.name} cannot run on Spark: {why}")


def _spark_sql(op: Any, text: str, kind: str) -> str:
    """The step's SQL in Spark's dialect: as written (headrace's SQL is Spark SQL) or, for a
    step defined in the DuckDB dialect, transpiled by sqlglot (refused naming the step when
    sqlglot cannot)."""
    if getattr(op, "dialect", "spark") != "duckdb":
        return text
    import sqlglot

    try:
        out = sqlglot.transpile(
            text, read="duckdb", write="spark", unsupported_level=sqlglot.ErrorLevel.RAISE
        )
    except Exception as e:
        raise _refuse(op, f"its DuckDB-dialect {kind} {text!r} does not transpile to Spark SQL ({e}); "
                          "write it in Spark SQL (hr.sql_dialect('spark'), the default)") from None  # fmt: skip
    return out[0]


_BATCH_TOKEN = "headrace_step_input_0d5e"  # stands for the step's input while the query is rewritten


def _batch_template(query: str) -> str:
    """``query`` (Spark SQL over the table ``batch``) as a ``spark.sql`` template whose
    ``{batch}`` is the step's input DataFrame (braces of the query itself doubled)."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(query, read="spark")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for t in tree.find_all(exp.Table):
        if t.name.lower() == "batch" and not t.args.get("db") and "batch" not in ctes:
            alias = t.alias
            t.set("this", exp.to_identifier(_BATCH_TOKEN))
            t.set("alias", exp.TableAlias(this=exp.to_identifier(alias or "batch")))
    text = str(tree.sql(dialect="spark")).replace("{", "{{").replace("}", "}}")
    return text.replace(_BATCH_TOKEN, "{batch}")


def _micros(us: int) -> str:
    return f"{int(us)} microseconds"


def _map_in_arrow(df: DataFrame, fn: Callable[[pa.Table], pa.Table | None], schema: pa.Schema) -> DataFrame:
    from headrace.spark.type_mapping import arrow_to_spark_schema

    def each(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            out = fn(pa.Table.from_batches([b]))
            if out is not None and out.num_rows:
                yield from out.cast(schema).to_batches()

    return df.mapInArrow(each, arrow_to_spark_schema(schema))


def _input_schema(df: DataFrame) -> pa.Schema:
    from headrace.spark.type_mapping import spark_to_arrow_schema

    return spark_to_arrow_schema(df.schema)


def _step(df: DataFrame, op: Operator, engine: SparkEngine) -> DataFrame:
    """One headrace operator as Spark DataFrame calls (raising for one Spark cannot run)."""
    from pyspark.sql import functions as F

    from headrace.transforms.aggregate import AggregateOperator
    from headrace.transforms.dedup import DropDuplicatesOperator
    from headrace.transforms.join import StreamStaticJoinOperator
    from headrace.transforms.stateless import (
        DropColumnsOperator,
        FilterFunctionOperator,
        MapBatchesOperator,
        RenameColumnOperator,
        SelectColumnsOperator,
        SqlOperator,
        WithColumnOperator,
    )
    from headrace.transforms.watermark import WatermarkOperator
    from headrace.transforms.window import SessionWindowSpec, WindowSpec
    from headrace.transforms.window_time import WindowTimeOperator

    spark = engine.session
    if isinstance(op, WithColumnOperator):
        return df.withColumn(op.column, F.expr(_spark_sql(op, op.expr, "expression")))
    if isinstance(op, SqlOperator):
        # the input as a DataFrame parameter, no temporary view: Spark Declarative Pipelines
        # forbid createOrReplaceTempView in a definition (block_session_mutations)
        return spark.sql(_batch_template(_spark_sql(op, op.source, "query")), batch=df)
    if isinstance(op, SelectColumnsOperator):
        return df.select(*(F.col(f"`{c}`") for c in op.columns))
    if isinstance(op, RenameColumnOperator):
        return df.withColumnRenamed(op.old, op.new)
    if isinstance(op, DropColumnsOperator):
        return df.drop(*op.columns)
    if isinstance(op, MapBatchesOperator) and op.schema is not None:
        return _map_in_arrow(df, op.fn, op.schema)
    if isinstance(op, FilterFunctionOperator):
        pred = op.predicate
        return _map_in_arrow(df, lambda t: t.filter(pred(t)), _input_schema(df))
    if isinstance(op, WatermarkOperator):
        if engine.sql_watermarks:
            column = op.column.replace("`", "``")
            query = (
                f"SELECT * FROM {{batch}} WATERMARK `{column}` DELAY OF INTERVAL {op.delay_ms} MILLISECONDS"
            )
            return spark.sql(query, batch=df)
        return df.withWatermark(op.column, f"{op.delay_ms} milliseconds")
    if isinstance(op, AggregateOperator):
        keys: list[Any] = []
        for k in op.keys:
            if isinstance(k, WindowSpec):
                w = F.window(k.column, _micros(k.duration_us), _micros(k.slide_us), _micros(k.start_us))
                keys.append(w.alias(k.name) if k.name != "window" else w)
            elif isinstance(k, SessionWindowSpec):
                keys.append(F.session_window(k.column, _micros(k.gap_us)))
            else:
                keys.append(F.col(f"`{k}`"))
        aggs = [F.expr(_spark_sql(op, a.text, "aggregate")) for a in op.aggs]
        return df.groupBy(*keys).agg(*aggs)
    if isinstance(op, DropDuplicatesOperator):
        cols = op.columns or None
        return df.dropDuplicatesWithinWatermark(cols) if op.within_watermark else df.dropDuplicates(cols)
    if isinstance(op, StreamStaticJoinOperator):
        static = static_to_spark(op.static, engine)
        if op.keys is not None:
            return df.join(static, on=op.keys, how=op.how)
        import sqlglot

        # the operator keeps its condition in DuckDB's quoting ("user"); Spark quotes with backticks
        cond = sqlglot.transpile(op.condition or "", read="duckdb", write="spark")[0]
        return df.alias("batch").join(static.alias("static"), F.expr(cond), how=op.how)
    if type(op).__name__ == "TransformWithStateOperator":
        return _transform_with_state(df, op, engine)
    if isinstance(op, WindowTimeOperator):
        return _window_time(df, op)
    if getattr(op, "multi_input", False):
        raise _refuse(op, "a step combining two streams translates only as the first step of its plan")
    raise _refuse(op, refusal(op) or f"{type(op).__name__} has no Spark form")


def _window_time(df: DataFrame, op: Any) -> DataFrame:
    """Chained time windows: the event time of an earlier windowed aggregation's window column
    as Spark's ``window_time(window)`` (``window.end`` minus one microsecond, keeping the
    column's watermark), which the next ``groupBy(window(...))`` groups by."""
    from pyspark.sql import functions as F

    return df.withColumn(op.output, F.window_time(F.col(f"`{op.window}`")))


def _transform_with_state(df: DataFrame, op: Any, engine: SparkEngine) -> DataFrame:
    """``group_by(keys).transform_with_state(processor, ...)`` as
    ``groupBy(keys).transformWithStateInPandas(SparkStatefulProcessor(processor), ...)``; the
    initial state (a static frame or table) as a static DataFrame grouped by the same keys,
    its key columns cast to the stream's types."""
    from pyspark.sql import functions as F

    from headrace.spark.stateful import SPARK_TIME_MODES, SparkStatefulProcessor, check_declarations
    from headrace.spark.types import arrow_to_spark_schema, spark_to_arrow_schema

    input_schema = _input_schema(df)
    missing = [k for k in op.keys if k not in input_schema.names]
    if missing:
        raise _refuse(op, f"no grouping column {', '.join(map(repr, missing))} in the stream "
                          f"(columns: {', '.join(input_schema.names)})")  # fmt: skip
    try:
        check_declarations(op.processor, op.time_mode, pa.schema([input_schema.field(k) for k in op.keys]))
    except HeadraceError as e:
        raise _refuse(op, str(e)) from None
    initial, initial_schema = None, None
    if op.initial_state is not None:
        init_df = static_to_spark(op.initial_state, engine)
        absent = [k for k in op.keys if k not in init_df.columns]
        if absent:
            raise _refuse(op, f"the initial_state has no grouping column {', '.join(map(repr, absent))} "
                              f"(columns: {', '.join(init_df.columns)})")  # fmt: skip
        key_types = {f.name: f.dataType for f in df.schema.fields if f.name in op.keys}
        for k in op.keys:
            init_df = init_df.withColumn(k, F.col(f"`{k}`").cast(key_types[k]))
        initial_schema = spark_to_arrow_schema(init_df.schema)
        initial = init_df.groupBy(*(F.col(f"`{k}`") for k in op.keys))
    tz = engine.session.conf.get("spark.sql.session.timeZone") or "UTC"
    adapter = SparkStatefulProcessor(op.processor, keys=op.keys, input_schema=input_schema,
                                     output_schema=op.out_schema, time_mode=op.time_mode, time_zone=tz,
                                     initial_schema=initial_schema)  # fmt: skip
    grouped = df.groupBy(*(F.col(f"`{k}`") for k in op.keys))
    return grouped.transformWithStateInPandas(
        adapter, arrow_to_spark_schema(op.out_schema), op.tws_output_mode.capitalize(),
        SPARK_TIME_MODES[op.time_mode], initialState=initial,
    )  # fmt: skip


def static_to_spark(static: Any, engine: SparkEngine) -> DataFrame:
    """A static frame (or ``pyarrow.Table``) as a static Spark DataFrame: ``spark.read`` of a
    native format, else headrace reads it on the driver (once, when the query is translated)
    and hands the table to ``createDataFrame``; its steps translated as a stream's."""
    spark = engine.session
    if isinstance(static, pa.Table):
        return spark.createDataFrame(static)
    base = static._base
    table = engine.table_of(base)
    if table is not None:
        df = spark.read.table(table)
    elif isinstance(base, pa.Table):
        df = spark.createDataFrame(base)
    elif str(getattr(base, "connector", "")).lower() in engine.native:  # a connector's read (SourcePlan)
        reader = spark.read.format(base.connector).options(**_strs(base.raw_options))
        if base.user_schema is not None:
            from headrace.spark.type_mapping import arrow_to_spark_schema

            reader = reader.schema(arrow_to_spark_schema(base.user_schema))
        df = reader.load()
    else:  # a connector's read, files, or a table computed on first use: read on the driver
        from headrace.api.static import StaticFrame

        df = spark.createDataFrame(StaticFrame(base, (), static._schema).to_arrow())
    for op in static._steps:
        df = _step(df, op, engine)
    return df


def _strs(options: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in options.items():
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _source(plan: SourcePlan, engine: SparkEngine, state_path: str | None) -> DataFrame:
    table = engine.table_of(plan)
    if table is not None:
        return engine.session.readStream.table(table)
    reader = engine.session.readStream.format(engine.format_of(plan.connector))
    if plan.user_schema is not None:
        from headrace.spark.type_mapping import arrow_to_spark_schema

        reader = reader.schema(arrow_to_spark_schema(plan.user_schema))
    options = dict(plan.raw_options)
    if (
        state_path is not None
        and plan.connector.lower() not in engine.native
        and not _has_state_option(options)
    ):
        from headrace.plugins import registry

        cls = registry().get(plan.connector).load_source()
        derive = getattr(cls, "default_state_path", None)
        if getattr(cls, "needs_state_path", False) and not (callable(derive) and derive(plan.options)):
            options[STATE_PATH_OPTION] = state_path  # the adapter's state, kept with Spark's checkpoint
    return reader.options(**_strs(options)).load()


def _has_state_option(options: Mapping[str, Any]) -> bool:
    return any(k.lower() == STATE_PATH_OPTION.lower() for k in options)


def to_spark(frame: StreamFrame, engine: Any, checkpoint: str | None = None) -> DataFrame:
    """The streaming Spark DataFrame of ``frame``'s plan (sources unioned by name, then every
    step). Called once per ``start(engine=...)`` on the calling thread; raises
    :class:`UnsupportedError` naming the first step that cannot run on Spark. A source that
    keeps state of its own under Spark (``headraceStatePath``, see the adapter) and was given
    no folder for it gets ``<checkpoint>/sources/<i>/headrace``."""
    eng = as_engine(engine)
    frames = [_source(p, eng, os.path.join(checkpoint, "sources", str(i), "headrace") if checkpoint else None)
              for i, p in enumerate(frame._sources)]  # fmt: skip
    steps = frame._steps
    if steps and getattr(steps[0], "multi_input", False):
        df, steps = _two_inputs(steps[0], frames, eng), steps[1:]
    else:
        df = _union(frames)
    for op in steps:
        df = _step(df, op, eng)
    return df


def _union(frames: list[DataFrame]) -> DataFrame:
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


def _two_inputs(op: Any, frames: list[DataFrame], engine: SparkEngine) -> DataFrame:
    """A two-input first step (a stream-stream join, or the union of two streams with their
    own steps): each side's sources unioned and its own steps translated on them (its own
    ``withWatermark``), then the sides joined or unioned by name."""
    from headrace.transforms.stream_union import StreamUnionOperator

    sides = []
    for side, sources in enumerate((frames[: op.left_sources], frames[op.left_sources :])):
        if not sources:
            raise _refuse(op, f"the {('left', 'right')[side]} side has no source")
        df = _union(sources)
        for sop in op.steps[side]:
            df = _step(df, sop, engine)
        sides.append(df)
    left, right = sides
    if isinstance(op, StreamUnionOperator):
        return left.unionByName(right)
    return _stream_join(op, left, right)


def _stream_join(op: Any, left: DataFrame, right: DataFrame) -> DataFrame:
    """``left.join(right, on, how)`` of two streams as Spark's stream-stream join: each side
    aliased as the frame's ``alias()`` name, joined on the key list or on ``expr(on)`` (the
    condition in Spark SQL; a DuckDB-dialect one transpiled by sqlglot), with Spark's name of
    the join type. What Spark refuses of the plan (a missing watermark or range condition for
    an outer join, ...) is Spark's ``AnalysisException`` from ``start()``."""
    from pyspark.sql import functions as F

    for side, alias in enumerate(op.aliases):
        if alias is not None:
            if side == 0:
                left = left.alias(alias)
            else:
                right = right.alias(alias)
    on = op.on
    if isinstance(on, str) and not on.strip().isidentifier():
        return left.join(right, F.expr(_spark_sql(op, on, "join condition")), op.how)
    keys = [on.strip()] if isinstance(on, str) else [str(k) for k in on]
    return left.join(right, keys, op.how)


def refusal(op: Operator) -> str | None:
    """Why ``op`` cannot run on Spark, or None when it translates. Pure, no Spark call."""
    from headrace.transforms.aggregate import AggregateOperator
    from headrace.transforms.dedup import DropDuplicatesOperator
    from headrace.transforms.join import StreamStaticJoinOperator
    from headrace.transforms.stateless import (
        DropColumnsOperator,
        FilterFunctionOperator,
        MapBatchesOperator,
        RenameColumnOperator,
        SelectColumnsOperator,
        SqlOperator,
    )
    from headrace.transforms.stream_join import StreamStreamJoinOperator
    from headrace.transforms.stream_union import StreamUnionOperator
    from headrace.transforms.watermark import WatermarkOperator
    from headrace.transforms.window_time import WindowTimeOperator

    if isinstance(op, MapBatchesOperator) and op.schema is None:
        return ("Spark's mapInArrow needs the schema the function returns; "
                "give it: map_batches(fn, schema=pyarrow.schema([...]))")  # fmt: skip
    if type(op).__name__ == "TransformWithStateOperator":
        return _tws_refusal()
    if isinstance(op, StreamStreamJoinOperator):
        return _join_condition_refusal(op)  # its sides' steps are checked one by one (check_plan)
    known = (SqlOperator, SelectColumnsOperator, RenameColumnOperator, DropColumnsOperator, MapBatchesOperator,
             FilterFunctionOperator, WatermarkOperator, AggregateOperator, DropDuplicatesOperator,
             StreamStaticJoinOperator, StreamUnionOperator, WindowTimeOperator)  # fmt: skip
    if not isinstance(op, known):
        return (f"{type(op).__name__} (a custom operator from apply_operator) has no Spark form; "
                "run this query on headrace, or express the step with map_batches(fn, schema=...)")  # fmt: skip
    return None


def _join_condition_refusal(op: Any) -> str | None:
    """Why a stream-stream join's SQL condition cannot be given to Spark (a DuckDB-dialect
    condition sqlglot does not transpile), or None."""
    on = getattr(op, "on", None)
    if not isinstance(on, str) or on.strip().isidentifier():
        return None
    try:
        _spark_sql(op, on, "join condition")
    except UnsupportedError as e:
        return str(e).removeprefix(f"step {op.name} cannot run on Spark: ")
    return None


def _tws_refusal() -> str | None:
    """Why ``transform_with_state`` cannot run here: Spark runs it through
    ``transformWithStateInPandas``, which needs pandas (and protobuf) beside pyarrow."""
    import importlib.util

    def absent(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except ModuleNotFoundError:
            return True

    lacking = [m for m in ("pandas", "google.protobuf") if absent(m)]
    if lacking:
        return (f"Spark runs transform_with_state through transformWithStateInPandas, which needs "
                f"{' and '.join(lacking)}; install them (pip install 'headrace[spark]')")  # fmt: skip
    return None


def check_plan(frame: StreamFrame) -> None:
    """Refuse, before any Spark call, the first step the translation cannot take (naming the
    step and why). Called by :func:`start_on_spark`; pure."""
    _check_steps(frame._steps, "")


def _check_steps(steps: Iterable[Operator], where: str) -> None:
    """Refuse the first of ``steps`` (or of a static side's or a stream side's steps) that
    cannot be translated; ``where`` names the side they are on, for the message."""
    from headrace.transforms.multi_input import TwoInputs

    for op in steps:
        why = refusal(op)
        if why is not None:
            raise _refuse(op, f"{where}{why}")
        static = getattr(op, "static", None)
        _check_steps(getattr(static, "_steps", ()), f"(in the static side of {op.name}) ")
        if isinstance(op, TwoInputs):
            for side, side_steps in zip(("left", "right"), op.steps, strict=True):
                _check_steps(side_steps, f"(in the {side} side of {op.name}) ")


def start_on_spark(writer: DataStreamWriter, path: str | None, engine: Any) -> SparkStreamingQuery:
    """Translate ``writer``'s frame and sink and start the query on Spark, returning Spark's
    ``StreamingQuery``. Called by ``DataStreamWriter.start(path, engine=...)`` on the calling
    thread; every refusal is raised before the query starts."""
    eng = as_engine(engine)
    fmt = writer._format
    if not fmt:
        raise HeadraceError("write_stream needs a format: .format('delta') (or foreach_batch(fn))")
    raw = dict(writer._options)
    for key in list(raw):
        if key.lower() in _ENGINE_ONLY:
            raise UnsupportedError(
                f"writer option {key}={raw[key]!r} is headrace's engine's own; on Spark set "
                f"{_ENGINE_ONLY[key.lower()]} and leave the option out"
            )
        if key.lower() == "checkpointfsync":
            raw.pop(key)  # Spark's checkpoint manager decides how it writes
    trigger = writer._trigger
    if trigger.kind == "real_time" and writer._foreach_batch is not None:
        raise UnsupportedError("trigger(real_time=...) with foreach_batch cannot run on Spark: Spark's real-time "
                               "mode has no foreachBatch; use another trigger")  # fmt: skip
    check_plan(writer._frame)
    checkpoint = next((str(v) for k, v in raw.items() if k.lower() == "checkpointlocation"), None)
    df = to_spark(writer._frame, eng, os.path.abspath(checkpoint) if checkpoint else None)
    w = df.writeStream.outputMode(writer._output_mode)
    name = writer._name or next((str(v) for k, v in raw.items() if k.lower() == "queryname"), None)
    if name:
        w = w.queryName(name)
    if trigger.kind == "processing_time":
        w = w.trigger(processingTime=f"{trigger.interval:g} seconds")
    elif trigger.kind == "once":
        w = w.trigger(once=True)
    elif trigger.kind == "available_now":
        w = w.trigger(availableNow=True)
    elif trigger.kind == "real_time":
        w = w.trigger(realTime=f"{trigger.interval:g} seconds")  # type: ignore[call-overload]
    if writer._partition_by:
        w = w.partitionBy(*writer._partition_by)
    if writer._foreach_batch is not None:
        fn = writer._foreach_batch

        def each(batch: DataFrame, batch_id: int) -> None:
            fn(batch.toArrow(), batch_id)

        w = w.foreachBatch(each)
    else:
        w = w.format(fmt if fmt.lower() in _SPARK_SINKS else eng.format_of(fmt))
    w = w.options(**_strs({k: v for k, v in raw.items() if k.lower() != "queryname"}))
    log.info("query '%s' starts on Spark (%s)", name or "", fmt)
    return w.start(path) if path is not None else w.start()
