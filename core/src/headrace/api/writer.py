"""The fluent reader/writer, in PySpark's shape with snake_case names::

    import headrace as hr

    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1000).load()
           .select_expr("value", "value % 10 AS bucket")   # SQL (DuckDB) over each batch
           .where("bucket < 5")
           .map_batches(lambda t: t)                      # pyarrow.Table in, pyarrow.Table out
           .write_stream.format("memory").query_name("out")
           .output_mode("append").option("checkpointLocation", "/tmp/chk")
           .trigger(available_now=True).start())
    q.await_termination()
    hr.memory_table("out")                                # -> pyarrow.Table

Builders are immutable: every call returns a new one, so a half-built reader can be reused.
Options are validated when ``load()`` / ``start()`` is called, before any I/O. A stream's
transforms are its plan: a tuple of operators (``headrace.transforms``) run by the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.errors import HeadraceError, OptionProblem, OptionsError, redact
from headrace.options import Boolean, Duration, OptionSchema, PassThrough
from headrace.plugins import registry
from headrace.progress import QueryProgress
from headrace.query import SourcePlan, StreamingQuery, Trigger
from headrace.transforms.frame import FrameSteps
from headrace.transforms.operator import Operator

if TYPE_CHECKING:
    from headrace.transforms.static import StaticFrame

__all__ = ["DataStreamReader", "DataStreamWriter", "GroupedStream", "StreamFrame", "read_stream"]

# Options the engine consumes itself on the writer side (not passed to the sink's schema).
ENGINE_WRITER_OPTIONS = ("checkpointLocation", "queryName", "checkpointFsync", "stateStore")
STATE_STORES = ("memory", "rocksdb")
# Sinks that run without a checkpointLocation (a temporary one is used), as in Spark.
_NO_CHECKPOINT_NEEDED = {"memory", "console", "noop", "foreach_batch"}


def _merge(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    lower = {k.lower(): k for k in out}
    for k, v in new.items():
        if k.lower() in lower:
            del out[lower[k.lower()]]
        out[k] = v
        lower[k.lower()] = k
    return out


# the longest trigger interval accepted: longer ones are surely a mistake ("99999999999 days")
MAX_TRIGGER_INTERVAL = 365 * 86400.0


def _schema_of(fmt: str | None, role: str) -> OptionSchema | None:
    """The connector's option schema for ``role``, or None (unknown connector: never raises)."""
    if not fmt:
        return None
    try:
        spec = registry().get(fmt)
    except Exception:
        return None
    return spec.source_options if role == "source" else spec.sink_options


def _redacted_options(options: Mapping[str, Any], schema: OptionSchema | None) -> dict[str, Any]:
    """Options as a repr may show them: secret options (declared ``secret=True``, pass-through
    keys that look like credentials, or any key that looks like one when the connector is
    unknown) as ``***``, callables by name, credentials inside URLs redacted."""
    markers = PassThrough("").secret_markers
    out: dict[str, Any] = {}
    for k, v in options.items():
        lower = k.lower()
        opt = schema.get(k) if schema is not None else None
        if opt is not None:
            secret = opt.secret
        else:
            pt = next((p for p in schema.passthrough if lower.startswith(p.prefix.lower())), None) if schema else None
            secret = any(m in lower for m in (pt.secret_markers if pt is not None else markers)) or (
                "url" in lower and schema is None
            )
        if secret:
            out[k] = "***"
        elif callable(v):
            out[k] = f"<function {getattr(v, '__qualname__', type(v).__name__)}>"
        else:
            out[k] = redact(v) if isinstance(v, str) else v
    return out


def parse_schema(schema: pa.Schema | str) -> pa.Schema:
    """A ``pyarrow.Schema``, or a DDL string like ``"a INT, b STRING, c TIMESTAMP"``."""
    if isinstance(schema, pa.Schema):
        return schema
    from headrace.types import ddl_to_schema

    return ddl_to_schema(schema)


@dataclass(frozen=True)
class DataStreamReader:
    """Builds a streaming source: ``format(...).option(...).schema(...).load(path)``."""

    _format: str | None = None
    _options: Mapping[str, Any] = field(default_factory=dict)
    _schema: pa.Schema | None = None

    def __repr__(self) -> str:
        opts = _redacted_options(self._options, _schema_of(self._format, "source"))
        schema = f", schema={self._schema.to_string(show_schema_metadata=False)!r}" if self._schema is not None else ""
        return redact(f"DataStreamReader(format={self._format!r}, options={opts!r}{schema})")

    def format(self, source: str) -> DataStreamReader:
        """The connector name (``"delta"``, ``"kafka"``, ``"cloudFiles"``, ``"rate"``...)."""
        return replace(self, _format=source)

    def option(self, key: str, value: Any) -> DataStreamReader:
        return replace(self, _options=_merge(self._options, {key: value}))

    def options(self, options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> DataStreamReader:
        return replace(self, _options=_merge(self._options, {**(options or {}), **kwargs}))

    def schema(self, schema: pa.Schema | str) -> DataStreamReader:
        """The schema to read with (a pyarrow.Schema or a DDL string), for sources that take one."""
        return replace(self, _schema=parse_schema(schema))

    def load(self, path: str | None = None) -> StreamFrame:
        """Validate the options (raising ``OptionsError`` before any I/O) and return the stream."""
        if not self._format:
            raise HeadraceError("read_stream needs a format: read_stream.format('delta')...; see `headrace connectors`")
        spec = registry().get(self._format)
        raw = dict(self._options)
        if path is not None:
            raw = _merge(raw, {"path": path})
        if spec.source is None:
            raise HeadraceError(
                f"connector '{spec.name}' cannot be read from (it is a sink only); "
                f"connectors with sources: {', '.join(s.name for s in registry().specs() if s.source)}"
            )
        opts = spec.source_options.parse(raw, connector=spec.name, role="source")
        plan = SourcePlan(
            connector=spec.name,
            options=opts,
            source_class=type,  # resolved at start(): importing the class imports its client library
            user_schema=self._schema,
            path=str(raw.get("path")) if raw.get("path") is not None else None,
        )
        return StreamFrame((plan,), (), self._schema)

    def table(self, name: str) -> StreamFrame:
        """Another dataset of the declarative pipeline calling this definition, as a stream
        (``headrace.pipelines``): a streaming table is read incrementally with the delta source
        (options set on this reader go to it), a temporary view is inlined. The name becomes an
        edge of the pipeline's graph. Only inside a definition the pipeline calls; elsewhere read
        the table's path: ``read_stream.format("delta").load(path)``.
        """
        from headrace.pipelines._context import active_resolver

        resolver = active_resolver()
        if resolver is None:
            raise HeadraceError(
                f"read_stream.table({name!r}) reads a dataset of a declarative pipeline and works only inside a "
                "definition the pipeline calls (headrace pipelines run); elsewhere read the table's path: "
                "read_stream.format('delta').load(path)"
            )
        return resolver.stream_table(name, self)


@dataclass(frozen=True)
class StreamFrame(FrameSteps):
    """A stream of Arrow record batches (the result of ``read_stream...load()``) and its plan:
    the operators applied to every micro-batch, in order.

    Stateless steps (``select_expr``, ``where``, ``with_column``, ``sql``, ``map_batches``,
    ``join`` with a static frame, ...) come from :class:`~headrace.transforms.frame.FrameSteps`;
    this class adds event time (``with_watermark``) and the stateful operators
    (``group_by(...).agg``, ``drop_duplicates``)."""

    _sources: tuple[SourcePlan, ...]
    _steps: tuple[Operator, ...] = ()
    _schema: pa.Schema | None = None  # the plan's output schema, when known before start()

    def _with_step(self, op: Operator) -> StreamFrame:
        return replace(self, _steps=(*self._steps, op), _schema=self._next_schema(self._schema, op))

    def __repr__(self) -> str:
        srcs = ", ".join(f"{p.describe()} {p.options!r}" for p in self._sources)
        return redact(f"StreamFrame(sources=[{srcs}], steps={[op.name for op in self._steps]})")

    def union(self, other: StreamFrame) -> StreamFrame:
        """Both streams' rows (schemas must match), with offsets for each source checkpointed."""
        if self._steps or other._steps:
            raise HeadraceError("union() streams before transforming them; apply the transforms after the union")
        return StreamFrame((*self._sources, *other._sources), (), self._schema)

    def apply_operator(self, op: Operator) -> StreamFrame:
        """Append a custom operator (a ``headrace.transforms.Operator``) to the plan: Spark's
        ``transformWithState`` / ``flatMapGroupsWithState`` niche. A stateful operator gets
        ``<checkpoint>/state/<index>`` for its state, versioned by batch id."""
        if not isinstance(op, Operator):
            raise HeadraceError(f"apply_operator() takes a headrace.transforms.Operator, not {type(op).__name__}")
        return self._with_step(op)

    def with_watermark(self, event_time: str, delay: str | float) -> StreamFrame:
        """Declare the event-time column and how late rows may arrive, as Spark's
        ``withWatermark("timestamp", "10 minutes")``: the watermark is the maximum event time
        seen minus ``delay``, moved between batches and recorded with each batch in the
        checkpoint. Stateful operators after it drop rows older than the watermark and emit
        (append mode) or evict what the watermark has passed."""
        from headrace.transforms.watermark import WatermarkOperator

        return self._with_step(WatermarkOperator(event_time, delay))

    def _watermark_column(self) -> str | None:
        from headrace.transforms.watermark import WatermarkOperator

        cols = [op.column for op in self._steps if isinstance(op, WatermarkOperator)]
        return cols[-1] if cols else None

    def group_by(self, *keys: Any) -> GroupedStream:
        """Group by columns and/or time windows (``hr.window("timestamp", "1 minute")``), then
        ``.agg("count(*) AS n", "sum(amount) AS total")`` or ``.count()``."""
        if not keys:
            raise HeadraceError("group_by() needs at least one key: a column name or hr.window(...)")
        return GroupedStream(self, tuple(keys))

    def drop_duplicates(self, *cols: str) -> StreamFrame:
        """Keep the first row of each distinct ``cols`` (all columns if none) across the whole
        stream. With a watermark and its event-time column among ``cols``, the state of a key
        is dropped once the watermark passes it (Spark's ``dropDuplicates``)."""
        from headrace.transforms.dedup import DropDuplicatesOperator

        return self._with_step(DropDuplicatesOperator(list(cols), watermark_column=self._watermark_column()))

    def drop_duplicates_within_watermark(self, *cols: str) -> StreamFrame:
        """Spark's ``dropDuplicatesWithinWatermark``: duplicates are dropped while the
        watermark has not passed the first row's event time (needs ``with_watermark``)."""
        column = self._watermark_column()
        if column is None:
            raise HeadraceError(
                "drop_duplicates_within_watermark() needs an event-time watermark: "
                "call .with_watermark('timestamp', '10 minutes') before it"
            )
        from headrace.transforms.dedup import DropDuplicatesOperator

        return self._with_step(
            DropDuplicatesOperator(list(cols), within_watermark=True, watermark_column=column)
        )

    def join(self, other: StaticFrame | pa.Table, on: str | list[str], how: str = "inner") -> StreamFrame:
        """Join each micro-batch with a static table: a ``StaticFrame`` (``hr.read...load()``)
        or a ``pyarrow.Table``, read once when the query starts (later changes to it are not
        seen until the query restarts). ``on``: key column(s) or a SQL condition over
        ``batch`` and ``static``; ``how``: ``inner`` or ``left``."""
        from headrace.transforms.join import StreamStaticJoinOperator
        from headrace.transforms.static import StaticFrame

        if isinstance(other, StreamFrame):
            raise HeadraceError(
                "join() of two streams is not supported (stream-stream joins need state on both sides); "
                "join a stream with a static frame (hr.read...load()) or a pyarrow.Table"
            )
        if not isinstance(other, StaticFrame | pa.Table):
            raise HeadraceError(f"join() takes a StaticFrame or a pyarrow.Table, not {type(other).__name__}")
        return self._with_step(StreamStaticJoinOperator(other, on, how))

    @property
    def write_stream(self) -> DataStreamWriter:
        return DataStreamWriter(self)


@dataclass(frozen=True)
class GroupedStream:
    """A stream grouped by keys (``stream.group_by(...)``), waiting for its aggregates."""

    _frame: StreamFrame
    _keys: tuple[Any, ...]

    def agg(self, *exprs: str) -> StreamFrame:
        """SQL aggregate expressions, e.g. ``agg("count(*) AS n", "sum(amount) AS total")``
        (count, sum, min, max, avg and the others listed in docs/transforms_state.md)."""
        if not exprs:
            raise HeadraceError("agg() needs at least one aggregate expression, e.g. agg('count(*) AS n')")
        from headrace.transforms.aggregate import AggregateOperator

        op = AggregateOperator(list(self._keys), list(exprs), watermark_column=self._frame._watermark_column())
        return self._frame._with_step(op)

    def count(self) -> StreamFrame:
        """The number of rows per group, in a column ``count`` (Spark's ``groupBy(...).count()``)."""
        return self.agg("count(*) AS count")


@dataclass(frozen=True)
class DataStreamWriter:
    """Builds and starts a query: ``format(...).option(...).trigger(...).start(path)``."""

    _frame: StreamFrame
    _format: str | None = None
    _options: Mapping[str, Any] = field(default_factory=dict)
    _output_mode: str = "append"
    _name: str | None = None
    _trigger: Trigger = field(default_factory=Trigger)
    _foreach_batch: Callable[[pa.Table, int], None] | None = None
    _partition_by: tuple[str, ...] = ()
    _progress_callbacks: tuple[Callable[[QueryProgress], None], ...] = ()

    def __repr__(self) -> str:
        opts = _redacted_options(self._options, _schema_of(self._format, "sink"))
        return redact(
            f"DataStreamWriter(frame={self._frame!r}, format={self._format!r}, options={opts!r}, "
            f"output_mode={self._output_mode!r}, query_name={self._name!r}, trigger={self._trigger})"
        )

    def format(self, sink: str) -> DataStreamWriter:
        return replace(self, _format=sink)

    def option(self, key: str, value: Any) -> DataStreamWriter:
        return replace(self, _options=_merge(self._options, {key: value}))

    def options(self, options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> DataStreamWriter:
        return replace(self, _options=_merge(self._options, {**(options or {}), **kwargs}))

    def output_mode(self, mode: str) -> DataStreamWriter:
        """``append`` (default), ``complete`` or ``update``, as the sink supports."""
        m = mode.lower()
        if m not in ("append", "complete", "update"):
            raise HeadraceError(f"output mode {mode!r} is not one of append, complete, update")
        return replace(self, _output_mode=m)

    def query_name(self, name: str) -> DataStreamWriter:
        return replace(self, _name=name)

    def partition_by(self, *cols: str) -> DataStreamWriter:
        """Partition columns, for sinks that have them (passed as the ``partitionBy`` option)."""
        return replace(self, _partition_by=tuple(cols))

    def trigger(
        self,
        *,
        processing_time: str | float | None = None,
        once: bool | None = None,
        available_now: bool | None = None,
        real_time: str | float | None = None,
        processingTime: str | float | None = None,
        availableNow: bool | None = None,
        realTime: str | float | None = None,
    ) -> DataStreamWriter:
        """Set the trigger; give exactly one. Durations like ``"10 seconds"`` or seconds.

        PySpark's keywords work too: ``trigger(processingTime="5 seconds")``,
        ``trigger(availableNow=True)``, ``trigger(realTime="5 minutes")``. Intervals are at
        most 365 days; ``real_time`` needs a positive one.
        """
        trigger = make_trigger(processing_time=processing_time, once=once, available_now=available_now,
                               real_time=real_time, processingTime=processingTime, availableNow=availableNow,
                               realTime=realTime)  # fmt: skip
        return replace(self, _trigger=trigger)

    def foreach_batch(self, fn: Callable[[pa.Table, int], None]) -> DataStreamWriter:
        """Call ``fn(table, batch_id)`` with each whole micro-batch as a sink.

        ``fn`` may be called again with the same ``batch_id`` after a crash: make it
        idempotent (e.g. a Delta merge, or skip batch ids already written) for exactly-once.
        """
        return replace(self, _foreach_batch=fn, _format="foreach_batch")

    def on_progress(self, fn: Callable[[QueryProgress], None]) -> DataStreamWriter:
        """Call ``fn(progress)`` after every batch (on the query's thread)."""
        return replace(self, _progress_callbacks=(*self._progress_callbacks, fn))

    def start(self, path: str | None = None) -> StreamingQuery:
        """Validate every option (source and sink, all problems at once), then open the
        checkpoint, build source and sink, and start the query in a background thread."""
        query = self._build(path)
        return query.start()

    def _build(self, path: str | None) -> StreamingQuery:
        if not self._format:
            raise HeadraceError("write_stream needs a format: .format('delta') (or foreach_batch(fn))")
        raw = dict(self._options)
        if path is not None:
            raw = _merge(raw, {"path": path})
        if self._partition_by:
            raw = _merge(raw, {"partitionBy": ",".join(self._partition_by)})
        lower = {k.lower(): v for k, v in raw.items()}
        name = self._name or str(lower.get("queryname") or "")
        checkpoint = lower.get("checkpointlocation")
        try:
            fsync = Boolean().parse(lower.get("checkpointfsync", True))
        except ValueError as e:
            raise OptionsError(str(self._format), "sink", [OptionProblem("checkpointFsync", str(e))]) from None
        state_store = str(lower.get("statestore", "memory")).lower()
        if state_store not in STATE_STORES:
            raise OptionsError(str(self._format), "sink", [OptionProblem(
                "stateStore", f"{lower.get('statestore')!r} is not one of {', '.join(STATE_STORES)} "
                "(memory: state in memory with a changelog in the checkpoint; rocksdb: state larger than memory)")])  # fmt: skip
        reg = registry()
        spec = reg.get(self._format)
        if self._foreach_batch is not None:
            raw = _merge(raw, {"function": self._foreach_batch})
        if spec.name == "memory":
            raw = _merge(raw, {"queryName": name})
        sink_raw = {k: v for k, v in raw.items() if k.lower() not in {o.lower() for o in ENGINE_WRITER_OPTIONS}}
        if spec.name == "memory":
            sink_raw["queryName"] = name
        problems = []
        try:
            sink_opts = spec.sink_options.parse(sink_raw, connector=spec.name, role="sink")
        except OptionsError as e:
            problems = e.problems
        if checkpoint is None and spec.name not in _NO_CHECKPOINT_NEEDED:
            problems.append(
                OptionProblem("checkpointLocation", f"is required for sink '{spec.name}' (a folder for the query's progress)")
            )
        if problems:
            raise OptionsError(spec.name, "sink", problems)
        if spec.sink is None:
            raise HeadraceError(f"connector '{spec.name}' cannot be written to (it is a source only)")
        sink_class = spec.load_sink()
        plans = []
        for plan in self._frame._sources:
            src_spec = reg.get(plan.connector)
            plans.append(replace(plan, source_class=src_spec.load_source()))
        return StreamingQuery(
            name=name,
            sources=plans,
            operators=self._frame._steps,
            state_store=state_store,
            sink_connector=spec.name,
            sink_class=sink_class,
            sink_options=sink_opts,
            output_mode=self._output_mode,
            trigger=self._trigger,
            checkpoint_location=str(checkpoint) if checkpoint is not None else None,
            progress_callbacks=self._progress_callbacks,
            checkpoint_fsync=fsync,
        )


_TRIGGER_ALIASES = {"processingtime": "processing_time", "availablenow": "available_now", "realtime": "real_time"}
TRIGGER_KINDS = ("processing_time", "once", "available_now", "real_time")


def make_trigger(**kwargs: Any) -> Trigger:
    """The :class:`Trigger` of ``trigger(...)`` keywords (snake_case or PySpark's camelCase),
    checked: exactly one given, intervals parse and lie within 0..365 days. Raises
    :class:`HeadraceError` naming the keyword, the value and what is accepted. No I/O."""
    given: dict[str, Any] = {}
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        kind = _TRIGGER_ALIASES.get(key.lower(), key)
        if kind not in TRIGGER_KINDS:
            raise HeadraceError(
                f"unknown trigger {key!r}; use one of processing_time (processingTime), once, "
                "available_now (availableNow), real_time (realTime)"
            )
        if kind in given:
            raise HeadraceError(f"trigger {kind} is given twice (as {key!r} too); give it once")
        given[kind] = value
    if len(given) != 1:
        raise HeadraceError(
            f"trigger() takes exactly one of processing_time, once, available_now, real_time; got {sorted(given) or 'none'}"
        )
    kind, value = next(iter(given.items()))
    interval = 0.0
    if kind in ("once", "available_now") and value is not True:
        raise HeadraceError(f"trigger {kind} must be true (or left out), not {value!r}")
    if kind in ("processing_time", "real_time"):
        try:
            interval = Duration().parse(value)
        except ValueError as e:
            raise HeadraceError(f"trigger({kind}=...): {e}") from None
        if interval > MAX_TRIGGER_INTERVAL:
            raise HeadraceError(
                f"trigger({kind}={value!r}): {interval:g} seconds is longer than the maximum of 365 days; "
                "give a shorter interval (e.g. '1 hour'), or run with available_now from a scheduler"
            )
        if kind == "real_time" and interval <= 0:
            raise HeadraceError("trigger(real_time=...) needs a positive interval, e.g. '5 minutes'")
    return Trigger(kind, interval)


read_stream = DataStreamReader()
"""The entry point: ``hr.read_stream.format(...)``."""
