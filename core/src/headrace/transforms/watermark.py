"""``with_watermark(column, delay)``: the event-time column and how late rows may be.

The operator passes every row on unchanged (as Spark's ``EventTimeWatermark``); it measures
the batch's event times (min, max, average) for the progress report and for the engine, which
moves the watermark between batches: ``watermark = max event time seen - delay`` (never
backwards; with several watermarks, the minimum, Spark's default policy). Stateful operators
drop rows older than the watermark in force for their batch (``BatchInfo.watermark_ms``).
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.options import Duration
from headrace.transforms.expressions import ExpressionError
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext

__all__ = ["EventTimeStats", "WatermarkOperator", "parse_delay_ms"]


def parse_delay_ms(delay: Any, *, what: str) -> int:
    """``"10 minutes"``, ``"5 seconds"``, a number of seconds or a ``timedelta`` -> milliseconds."""
    try:
        return round(Duration().parse(delay) * 1000)
    except ValueError as e:
        raise HeadraceError(f"{what}: {e}") from None


class EventTimeStats:
    """Min, max, sum and count of one batch's event times (epoch ms); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.min: int | None = None
        self.max: int | None = None
        self.sum = 0
        self.count = 0

    def add(self, lo: int, hi: int, total: int, n: int) -> None:
        with self._lock:
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)
            self.sum += total
            self.count += n


def event_times_ms(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A timestamp column as epoch milliseconds (int64)."""
    import pyarrow.compute as pc

    return pc.cast(pc.cast(column, pa.timestamp("ms", tz=getattr(column.type, "tz", None)), safe=False), pa.int64())


class WatermarkOperator(Operator):
    """``with_watermark(column, delay)``. Runs per chunk in the reader threads."""

    def __init__(self, column: str, delay: Any) -> None:
        self.column = column
        self.delay_text = str(delay)
        self.delay_ms = parse_delay_ms(delay, what=f"with_watermark({column!r}, {delay!r})")
        self.stats = EventTimeStats()
        self.measure_filter: str | None = None
        self._measured_rows: Operator | None = None

    @property
    def name(self) -> str:
        return f"with_watermark({self.column!r}, {self.delay_text!r})"

    def set_measure_filter(self, predicate: str | None) -> None:
        """Measure event times only on the rows for which ``predicate`` (DuckDB SQL over the
        step's input columns) is true: the filters Spark evaluates below its watermark node
        (:mod:`headrace.transforms.watermark_filters`). Every row still passes on. Called when
        the query starts, on the run's own copy of the step."""
        from headrace.transforms.stateless import SqlOperator, where_query

        self.measure_filter = predicate
        what = f"{self.name}: the rows it measures ({predicate})"
        self._measured_rows = SqlOperator(where_query(predicate), what=what, dialect="duckdb") if predicate else None

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        if self.column not in input_schema.names:
            raise ExpressionError(f"{self.name}: no column {self.column!r}; the columns are {input_schema.names}")
        t = input_schema.field(self.column).type
        if not pa.types.is_timestamp(t):
            raise ExpressionError(
                f"{self.name}: column {self.column!r} is {t}, not a timestamp; convert it first, e.g. "
                f".with_column({self.column!r}, \"CAST({self.column} AS TIMESTAMPTZ)\")"
            )
        return input_schema

    def open(self, context: OperatorContext) -> None:
        self.stats = EventTimeStats()  # this run's own (the engine runs a copy of the step)

    def begin(self, batch: BatchInfo) -> None:
        self.stats.reset()

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        measured = table
        if self._measured_rows is not None and table.num_rows:
            measured = self._measured_rows.process(table, batch) or table.slice(0, 0)
        self._measure(measured)
        return table

    def _measure(self, table: pa.Table) -> None:
        if table.num_rows:
            import pyarrow.compute as pc

            col = table.column(self.column)
            if not col.null_count and col.type.unit == "us" and self._measure_us(col):
                return
            ms = event_times_ms(col)
            mm = pc.min_max(ms)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None and hi is not None:
                n = len(ms) - ms.null_count
                self.stats.add(lo, hi, int(pc.sum(ms).as_py() or 0), n)

    def _measure_us(self, col: pa.ChunkedArray) -> bool:
        """Microsecond event times without nulls, all at or after the epoch (where flooring to
        milliseconds is the cast's truncation), measured in numpy: a third of the cost of the
        casts. False (nothing measured) otherwise."""
        import numpy as np

        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        us = np.asarray(arr.view(pa.int64()).to_numpy(zero_copy_only=False))
        lo = int(us.min())
        if lo < 0:
            return False
        lo_ms, hi_ms = lo // 1000, int(us.max()) // 1000
        # the sum of the rows' milliseconds (Spark truncates each event time to ms before its
        # average); a chunk within one millisecond (one timestamp per micro-batch, a producer's
        # batch) needs no division per row
        total = lo_ms * len(us) if lo_ms == hi_ms else int((us // 1000).sum())
        self.stats.add(lo_ms, hi_ms, total, len(us))
        return True
