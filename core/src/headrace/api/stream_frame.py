"""``StreamFrame``: a stream and its plan (the operators applied to every micro-batch), and
``GroupedStream``, a stream grouped by keys waiting for its aggregates.

Frames are immutable: every transform returns a new one; the plan is run by the engine once the
query starts (``.write_stream...start()``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.api.writer import DataStreamWriter
from headrace.errors import HeadraceError, redact
from headrace.query import SourcePlan
from headrace.transforms.frame_steps import FrameSteps
from headrace.transforms.operator import Operator

if TYPE_CHECKING:
    from headrace.api.static import StaticFrame
    from headrace.functions import Column

__all__ = ["GroupedStream", "StreamFrame"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamFrame(FrameSteps):
    """A stream of Arrow record batches (the result of ``read_stream...load()``) and its plan:
    the operators applied to every micro-batch, in order.

    Stateless steps (``select_expr``, ``where``, ``with_column``, ``sql``, ``map_batches``,
    ``join`` with a static frame, ...) come from :class:`~headrace.transforms.frame_steps.FrameSteps`;
    this class adds event time (``with_watermark``) and the stateful operators
    (``group_by(...).agg``, ``drop_duplicates``)."""

    _sources: tuple[SourcePlan, ...]
    _steps: tuple[Operator, ...] = ()
    _schema: pa.Schema | None = None  # the plan's output schema, when known before start()
    _alias: str | None = None  # the name a stream-stream join's condition qualifies columns by

    def _with_step(self, op: Operator) -> StreamFrame:
        return replace(self, _steps=(*self._steps, op), _schema=self._next_schema(self._schema, op))

    def __repr__(self) -> str:
        srcs = ", ".join(f"{p.describe()} {p.options!r}" for p in self._sources)
        return redact(f"StreamFrame(sources=[{srcs}], steps={[op.name for op in self._steps]})")

    def union(self, other: StreamFrame) -> StreamFrame:
        """Both streams' rows (same column names and types), with offsets for each source
        checkpointed. Each stream keeps its own steps (e.g. its own ``with_watermark``: the
        query's watermark then follows the writer option ``multipleWatermarkPolicy``, ``min``
        or ``max``, as Spark's)."""
        if not self._steps and not other._steps:
            return StreamFrame((*self._sources, *other._sources), (), self._schema)
        from headrace.transforms.stream_union import StreamUnionOperator

        op = StreamUnionOperator(self._steps, other._steps, len(self._sources))
        schema = None
        if self._schema is not None and other._schema is not None:  # checked now, before any I/O
            op.bind_schemas(self._schema, other._schema)
            schema = op.output_schema(self._schema)
        return StreamFrame((*self._sources, *other._sources), (op,), schema)

    def alias(self, name: str) -> StreamFrame:
        """Name this stream for a stream-stream join's condition (PySpark's ``df.alias("l")``):
        ``left.alias("l").join(right.alias("r"), "l.k = r.k AND l.ts BETWEEN r.ts - INTERVAL
        1 HOUR AND r.ts")``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise HeadraceError(f"alias({name!r}): give a plain name, e.g. alias('l')")
        return replace(self, _alias=name)

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

    def _window_event_column(self) -> str | None:
        """The window column the event time went on in, when the last stateful step is a
        windowed aggregation over the watermarked column (Spark's watermark on the window
        struct): a later aggregation groups by ``hr.window("window", ...)``; else None."""
        from headrace.transforms.aggregate import AggregateOperator
        from headrace.transforms.watermark import WatermarkOperator

        current: str | None = None
        from_window = False
        for op in self._steps:
            if isinstance(op, WatermarkOperator):
                current, from_window = op.column, False
            elif isinstance(op, AggregateOperator) and op.window is not None and current is not None:
                current, from_window = (op.window.name, True) if op.window.column == current else (None, False)
        return current if from_window else None

    def _watermark_column(self) -> str | None:
        from headrace.transforms.watermark import WatermarkOperator

        window = self._window_event_column()
        if window is not None:
            return window
        cols = [op.column for op in self._steps if isinstance(op, WatermarkOperator)]
        if not cols and self._steps and getattr(self._steps[0], "multi_input", False):
            # a union or a stream-stream join: its sides' event-time columns (the left side's first)
            sides = [op.column for steps in reversed(self._steps[0].steps)  # type: ignore[attr-defined]
                     for op in steps if isinstance(op, WatermarkOperator)]  # fmt: skip
            return sides[-1] if sides else None
        return cols[-1] if cols else None

    def group_by(self, *keys: Any) -> GroupedStream:
        """Group by columns and/or time windows (``hr.window("timestamp", "1 minute")``), then
        ``.agg("count(*) AS n", "sum(amount) AS total")`` or ``.count()``."""
        if not keys:
            raise HeadraceError("group_by() needs at least one key: a column name or hr.window(...)")
        from headrace.functions import Column, name_of

        if len(keys) == 1 and isinstance(keys[0], list | tuple):
            keys = tuple(keys[0])  # PySpark's groupBy(["a", "b"])
        return GroupedStream(self, tuple(name_of(k, "group_by()") if isinstance(k, Column) else k for k in keys))

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

    def join(self, other: StreamFrame | StaticFrame | pa.Table, on: str | list[str] | Column,
             how: str = "inner") -> StreamFrame:  # fmt: skip
        """Join each micro-batch with a static table: a ``StaticFrame`` (``hr.read...load()``)
        or a ``pyarrow.Table``, read once when the query starts (later changes to it are not
        seen until the query restarts). ``on``: key column(s) or a SQL condition over
        ``batch`` and ``static``; ``how``: ``inner`` or ``left``.

        With another stream, a stream-stream join (Spark's rules, docs/transforms.md): ``on``
        key columns or a SQL condition over both sides' columns (qualified by ``alias()``
        names), with an equality between the sides; ``how``: ``inner``, ``left``, ``right``,
        ``full`` or ``left_semi`` (outer and semi joins need watermarks and a time-range
        condition bounding how long a row waits); append output mode only."""
        from headrace.api.static import StaticFrame
        from headrace.transforms.join import StreamStaticJoinOperator

        if isinstance(other, StreamFrame):
            return self._join_stream(other, on, how)
        if not isinstance(other, StaticFrame | pa.Table):
            raise HeadraceError(f"join() takes a StaticFrame or a pyarrow.Table, not {type(other).__name__}")
        from headrace.functions import Column

        if isinstance(on, Column):
            on = on.column_name if on.column_name is not None else on.sql
        return self._with_step(StreamStaticJoinOperator(other, on, how))

    def _join_stream(self, other: StreamFrame, on: Any, how: str) -> StreamFrame:
        """A stream-stream join (Spark's symmetric hash join; headrace.transforms.stream_join):
        one frame reading both streams' sources, the left's first."""
        from headrace.functions import Column
        from headrace.transforms.stream_join import StreamStreamJoinOperator

        if isinstance(on, Column):
            on = on.column_name if on.column_name is not None else on.sql
        op = StreamStreamJoinOperator(self._steps, other._steps, len(self._sources), on, how,
                                      aliases=(self._alias, other._alias))  # fmt: skip
        schema = None
        if self._schema is not None and other._schema is not None:  # checked now, before any I/O
            op.bind_schemas(self._schema, other._schema)
            schema = op.output_schema(self._schema)
        return StreamFrame((*self._sources, *other._sources), (op,), schema)

    @property
    def write_stream(self) -> DataStreamWriter:
        """The writer builder of this stream (``.format(...)...start()``)."""
        return DataStreamWriter(self)

    # PySpark's spellings (``df.groupBy(...)`` runs as written)
    @property
    def writeStream(self) -> DataStreamWriter:
        """PySpark's name of :attr:`write_stream`."""
        return DataStreamWriter(self)

    def withWatermark(self, eventTime: str, delayThreshold: str | float) -> StreamFrame:
        """PySpark's name of :meth:`with_watermark`."""
        return self.with_watermark(eventTime, delayThreshold)

    def groupBy(self, *keys: Any) -> GroupedStream:
        """PySpark's name of :meth:`group_by` (column names, ``col(...)``, windows, or one list)."""
        return self.group_by(*keys)

    groupby = groupBy

    def dropDuplicates(self, *subset: list[str] | tuple[str, ...] | str | None) -> StreamFrame:
        """PySpark's ``dropDuplicates(["a", "b"])`` (or ``("a", "b")``, or none for all
        columns): :meth:`drop_duplicates`."""
        return self.drop_duplicates(*_subset(subset, "dropDuplicates"))

    def dropDuplicatesWithinWatermark(self, *subset: list[str] | tuple[str, ...] | str | None) -> StreamFrame:
        """PySpark's ``dropDuplicatesWithinWatermark(["a"])``: :meth:`drop_duplicates_within_watermark`."""
        return self.drop_duplicates_within_watermark(*_subset(subset, "dropDuplicatesWithinWatermark"))

    def unionByName(self, other: StreamFrame) -> StreamFrame:
        """PySpark's ``unionByName``: :meth:`union` (headrace's union already needs the same
        column names and types on both sides)."""
        return self.union(other)


def _subset(args: tuple[Any, ...], what: str) -> tuple[str, ...]:
    """Column names from PySpark's forms: ``(None,)``/``()`` (all columns), one list, or names."""
    subset: Any = args[0] if len(args) == 1 and (args[0] is None or isinstance(args[0], list | tuple)) else args
    if subset is None:
        return ()
    if isinstance(subset, list | tuple) and all(isinstance(c, str) for c in subset):
        return tuple(subset)
    raise HeadraceError(f"{what}() takes a list of column names (or none for all columns), not {subset!r}")


@dataclass(frozen=True)
class GroupedStream:
    """A stream grouped by keys (``stream.group_by(...)``), waiting for its aggregates."""

    _frame: StreamFrame
    _keys: tuple[Any, ...]

    def agg(self, *exprs: str | Column) -> StreamFrame:
        """SQL aggregate expressions, e.g. ``agg("count(*) AS n", "sum(amount) AS total")``
        (count, sum, min, max, avg and the others listed in docs/transforms_state.md), or
        ``headrace.functions`` Columns (``agg(F.count("*").alias("n"))``, the same plan)."""
        if not exprs:
            raise HeadraceError("agg() needs at least one aggregate expression, e.g. agg('count(*) AS n')")
        from headrace.functions import sql_of
        from headrace.transforms.aggregate import aggregate_operator

        texts = [sql_of(e, "agg()") for e in exprs]
        frame, keys, wm = self._frame, list(self._keys), self._frame._watermark_column()
        if wm is not None and wm == frame._window_event_column():
            # the event time is a window column (an earlier windowed aggregation's): group by
            # its window_time, window.end - 1 microsecond, as Spark's window(window_time(window))
            from dataclasses import replace as _replace

            from headrace.transforms.window import WindowSpec
            from headrace.transforms.window_time import WindowTimeOperator

            if any(isinstance(k, WindowSpec) and k.column == wm for k in keys):
                frame = frame._with_step(WindowTimeOperator(wm, f"__{wm}_time"))
                keys = [_replace(k, column=f"__{wm}_time") if isinstance(k, WindowSpec) and k.column == wm else k
                        for k in keys]  # fmt: skip
                wm = f"__{wm}_time"
        op = aggregate_operator(keys, texts, watermark_column=wm)
        return frame._with_step(op)

    def count(self) -> StreamFrame:
        """The number of rows per group, in a column ``count`` (Spark's ``groupBy(...).count()``)."""
        return self.agg("count(*) AS count")

    def transform_with_state(
        self,
        processor: Any,
        output_schema: Any,
        output_mode: str = "append",
        time_mode: str = "none",
        initial_state: Any = None,
        event_time_column_name: str = "",
    ) -> StreamFrame:
        """Spark 4's ``transformWithState``: ``processor`` (an ``hr.StatefulProcessor``) is
        called per grouping key with that key's rows of each batch, keeps value, list and map
        state per key (optional TTL) and timers, and yields rows of ``output_schema`` (a DDL
        string). ``output_mode``: ``append`` or ``update``; ``time_mode``: ``none``,
        ``processing_time`` or ``event_time`` (after ``with_watermark``); ``initial_state``: a
        static frame (or ``pyarrow.Table``) with the grouping columns, handed to
        ``handle_initial_state`` in the first batch. See docs/transforms.md."""
        from headrace.transforms.transform_with_state import TransformWithStateOperator

        if event_time_column_name:
            raise HeadraceError("transform_with_state: event_time_column_name (a watermark on the output, for a "
                                "stateful operator after this one) is not supported; leave it out")  # fmt: skip
        keys = [k for k in self._keys]
        if not all(isinstance(k, str) for k in keys):
            raise HeadraceError("transform_with_state groups by columns only: group_by(<column names>), not windows")
        op = TransformWithStateOperator(keys, processor, output_schema, output_mode, time_mode,
                                        initial_state=initial_state,
                                        watermark_column=self._frame._watermark_column())  # fmt: skip
        return self._frame._with_step(op)

    transformWithState = transform_with_state
    transformWithStateInPandas = transform_with_state

    def _each(self, fn: str, cols: tuple[str, ...]) -> StreamFrame:
        if not cols:
            raise HeadraceError(f"{fn}() on a grouped stream needs column names, e.g. {fn}('amount')")
        from headrace.transforms.expressions import is_identifier, quote_ident

        return self.agg(*(f"{fn}({c if is_identifier(c) else quote_ident(c)})" for c in cols))

    def sum(self, *cols: str) -> StreamFrame:
        """PySpark's ``groupBy(...).sum("a", "b")``: columns ``sum(a)``, ``sum(b)``."""
        return self._each("sum", cols)

    def avg(self, *cols: str) -> StreamFrame:
        """PySpark's ``groupBy(...).avg("a")``: a column ``avg(a)``."""
        return self._each("avg", cols)

    mean = avg

    def min(self, *cols: str) -> StreamFrame:
        """PySpark's ``groupBy(...).min("a")``: a column ``min(a)``."""
        return self._each("min", cols)

    def max(self, *cols: str) -> StreamFrame:
        """PySpark's ``groupBy(...).max("a")``: a column ``max(a)``."""
        return self._each("max", cols)
