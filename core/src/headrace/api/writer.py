"""The writer builder (``stream.write_stream.format(...).option(...).trigger(...).start(path)``).

``start()`` validates every option (sink and engine, all problems at once) before any I/O, then
builds the :class:`~headrace.query.StreamingQuery` and starts it in a background thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, overload

import pyarrow as pa

from headrace.api.builder_options import _merge, _redacted_options, _schema_of
from headrace.api.triggers import make_trigger
from headrace.errors import HeadraceError, OptionProblem, OptionsError, redact
from headrace.options import Boolean, Integer
from headrace.plugins import registry
from headrace.progress import QueryProgress
from headrace.query import StreamingQuery, Trigger
from headrace.state.backends import BACKENDS, DEFAULT_HELD_KEYS_MB

if TYPE_CHECKING:
    from headrace.api.stream_frame import StreamFrame

__all__ = ["DataStreamWriter", "ENGINE_WRITER_OPTIONS", "EngineWriterOptions", "STATE_STORES", "parse_engine_options"]

log = logging.getLogger(__name__)

# Options the engine consumes itself on the writer side (not passed to the sink's schema).
ENGINE_WRITER_OPTIONS = ("checkpointLocation", "queryName", "checkpointFsync", "stateStore", "stateSnapshotInterval",
                         "rocksdbHeldKeysMB", "multipleWatermarkPolicy",
                         "spark.sql.streaming.multipleWatermarkPolicy")  # fmt: skip
#: Spark's spark.sql.streaming.multipleWatermarkPolicy values
WATERMARK_POLICIES = ("min", "max")
STATE_STORES = BACKENDS  # the state store backends, defined once in headrace.state.backends
#: Spark's spark.sql.streaming.stateStore.minDeltasForSnapshot
DEFAULT_SNAPSHOT_INTERVAL = 10


@dataclass(frozen=True)
class EngineWriterOptions:
    """The engine's own writer options, parsed: ``checkpointFsync`` (fsync checkpoint and state
    files), ``stateStore`` (``memory`` or ``rocksdb``), ``stateSnapshotInterval`` (the least
    number of changelogs a stateful operator writes between two snapshots of its state),
    ``rocksdbHeldKeysMB`` (the memory, MiB, a deduplication's RocksDB state may hold new keys
    in before writing them to its database; 0: none are held), ``multipleWatermarkPolicy`` (``min`` or ``max``: how the watermarks of several
    watermarked inputs make the query's, Spark's ``spark.sql.streaming.multipleWatermarkPolicy``;
    also read under that Spark name)."""

    checkpoint_fsync: bool = True
    state_store: str = "memory"
    state_snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL
    watermark_policy: str = "min"
    rocksdb_held_keys_mb: int = DEFAULT_HELD_KEYS_MB


def parse_engine_options(options: Mapping[str, Any]) -> tuple[EngineWriterOptions, list[OptionProblem]]:
    """Parse the engine's writer options out of ``options`` (names matched case-insensitively,
    others ignored): the parsed values (defaults where a value is bad) and every problem found.
    Pure, no I/O; called by ``start()`` and by the pipeline file's validation, before anything
    is opened."""
    lower = {k.lower(): v for k, v in options.items()}
    problems: list[OptionProblem] = []
    out = EngineWriterOptions()
    try:
        out = replace(out, checkpoint_fsync=Boolean().parse(lower.get("checkpointfsync", True)))
    except ValueError as e:
        problems.append(OptionProblem("checkpointFsync", str(e)))
    state_store = str(lower.get("statestore", "memory")).lower()
    if state_store in STATE_STORES:
        out = replace(out, state_store=state_store)
    else:
        problems.append(OptionProblem(
            "stateStore", f"{lower.get('statestore')!r} is not one of {', '.join(STATE_STORES)} "
            "(memory: state in memory with a changelog in the checkpoint; rocksdb: state larger than memory)"))  # fmt: skip
    policy_key = next((k for k in ("multiplewatermarkpolicy", "spark.sql.streaming.multiplewatermarkpolicy")
                       if k in lower), None)  # fmt: skip
    if policy_key is not None:
        policy = str(lower[policy_key]).strip().lower()
        if policy in WATERMARK_POLICIES:
            out = replace(out, watermark_policy=policy)
        else:
            problems.append(OptionProblem(
                "multipleWatermarkPolicy", f"{lower[policy_key]!r} is not one of {', '.join(WATERMARK_POLICIES)} "
                "(min: the query's watermark follows the slowest watermarked input, the default; max: the "
                "fastest, dropping more of the slower inputs' rows as late)"))  # fmt: skip
    n = _integer_option(lower, "stateSnapshotInterval", 1, problems,
                        f"give a whole number of batches, at least 1 (default {DEFAULT_SNAPSHOT_INTERVAL}): the least "
                        "number of changelogs a stateful operator writes between two snapshots of its state")  # fmt: skip
    if n is not None:
        out = replace(out, state_snapshot_interval=n)
    mb = _integer_option(lower, "rocksdbHeldKeysMB", 0, problems,
                         f"give a whole number of MiB, 0 or more (default {DEFAULT_HELD_KEYS_MB}): the memory a "
                         "deduplication's RocksDB state may hold new keys in before writing them to its database "
                         "(0: every batch's keys are written)")  # fmt: skip
    if mb is not None:
        out = replace(out, rocksdb_held_keys_mb=mb)
    return out, problems


def _integer_option(lower: Mapping[str, Any], name: str, minimum: int, problems: list[OptionProblem],
                    hint: str) -> int | None:  # fmt: skip
    """The whole number given as option ``name`` (at least ``minimum``), or None when it is
    absent or bad (then a problem naming it, with ``hint``, is appended to ``problems``)."""
    if name.lower() not in lower:
        return None
    try:
        return int(Integer(min=minimum).parse(lower[name.lower()]))
    except ValueError as e:
        problems.append(OptionProblem(name, f"{e}; {hint}"))
        return None
# Sinks that run without a checkpointLocation (a temporary one is used), as in Spark.
_NO_CHECKPOINT_NEEDED = {"memory", "console", "noop", "foreach_batch"}


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

    # PySpark's spellings (``.writeStream.outputMode("update")`` runs as written)
    def outputMode(self, outputMode: str) -> DataStreamWriter:
        """PySpark's name of :meth:`output_mode`."""
        return self.output_mode(outputMode)

    def queryName(self, queryName: str) -> DataStreamWriter:
        """PySpark's name of :meth:`query_name`."""
        return self.query_name(queryName)

    def partitionBy(self, *cols: str | list[str]) -> DataStreamWriter:
        """PySpark's name of :meth:`partition_by` (names, or one list of them)."""
        names = cols[0] if len(cols) == 1 and isinstance(cols[0], list | tuple) else cols
        return self.partition_by(*(str(c) for c in names))

    def foreachBatch(self, func: Callable[[pa.Table, int], None]) -> DataStreamWriter:
        """PySpark's name of :meth:`foreach_batch`; ``func`` gets a ``pyarrow.Table`` (not a
        Spark DataFrame) and the batch id."""
        return self.foreach_batch(func)

    def to_table(self, table_name: str, format: str | None = None, output_mode: str | None = None,
                 partition_by: str | list[str] | None = None, query_name: str | None = None,
                 **options: Any) -> StreamingQuery:  # fmt: skip
        """Start the query writing table ``table_name``: outside a declarative pipeline a Delta
        table of the local warehouse (:mod:`headrace.api.warehouse`: ``spark-warehouse`` in the
        current directory unless ``hr.set_warehouse(path)`` or ``$HEADRACE_WAREHOUSE`` says
        otherwise), created by the first batch, which ``read_stream.table(table_name)`` and
        ``read.table(table_name)`` read. The other arguments set what their builder methods
        set. Validates every option before any I/O, as :meth:`start`."""
        from headrace.api.catalog import WritableCatalog, current_catalog

        writer = self
        if format is not None:
            writer = writer.format(format)
        if output_mode is not None:
            writer = writer.output_mode(output_mode)
        if partition_by is not None:
            writer = writer.partitionBy(partition_by)
        if query_name is not None:
            writer = writer.query_name(query_name)
        if options:
            writer = writer.options(options)
        catalog = current_catalog()
        if not isinstance(catalog, WritableCatalog):
            raise HeadraceError(
                f"write_stream.to_table({table_name!r}) inside a pipeline's definition: a definition returns its "
                "frame and the pipeline writes it to the dataset; return the frame, or write to a sink with "
                "dp.create_sink(...) and a flow"
            )
        return catalog.table_writer(table_name, writer).start()

    def toTable(self, tableName: str, format: str | None = None, outputMode: str | None = None,
                partitionBy: str | list[str] | None = None, queryName: str | None = None,
                **options: Any) -> StreamingQuery:  # fmt: skip
        """PySpark's name of :meth:`to_table`."""
        return self.to_table(tableName, format, outputMode, partitionBy, queryName, **options)

    @overload
    def start(self, path: str | None = None, *, engine: None = None) -> StreamingQuery: ...
    @overload
    def start(self, path: str | None = None, *, engine: Any) -> Any: ...
    def start(self, path: str | None = None, *, engine: Any = None) -> Any:
        """Validate every option (source and sink, all problems at once), then open the
        checkpoint, build source and sink, and start the query in a background thread: a
        headrace ``StreamingQuery``.

        ``engine``: a ``SparkSession`` (or ``headrace.spark.engine.SparkEngine``) runs the same
        definition on Spark instead: the plan is translated into a PySpark streaming DataFrame
        (steps Spark cannot run are refused first, naming the step) and Spark's
        ``StreamingQuery`` is returned; its checkpoint is Spark's own (docs/spark.md). Any
        :class:`~headrace.api.engines.QueryEngine`, or an object a plugin's engine accepts,
        works the same way."""
        if engine is not None:
            from headrace.api.engines import query_engine

            return query_engine(engine).start_query(self, path)
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
        engine, engine_problems = parse_engine_options(raw)
        reg = registry()
        spec = reg.get(self._format)
        if self._foreach_batch is not None:
            raw = _merge(raw, {"function": self._foreach_batch})
        if spec.name == "memory":
            raw = _merge(raw, {"queryName": name})
        sink_raw = {k: v for k, v in raw.items() if k.lower() not in {o.lower() for o in ENGINE_WRITER_OPTIONS}}
        if spec.name == "memory":
            sink_raw["queryName"] = name
        problems = list(engine_problems)
        try:
            sink_opts = spec.sink_options.parse(sink_raw, connector=spec.name, role="sink")
        except OptionsError as e:
            problems += e.problems
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
            state_store=engine.state_store,
            watermark_policy=engine.watermark_policy,
            state_snapshot_interval=engine.state_snapshot_interval,
            rocksdb_held_keys_mb=engine.rocksdb_held_keys_mb,
            sink_connector=spec.name,
            sink_class=sink_class,
            sink_options=sink_opts,
            output_mode=self._output_mode,
            trigger=self._trigger,
            checkpoint_location=str(checkpoint) if checkpoint is not None else None,
            progress_callbacks=self._progress_callbacks,
            checkpoint_fsync=engine.checkpoint_fsync,
        )
