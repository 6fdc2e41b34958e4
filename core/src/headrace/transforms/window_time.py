"""Event time after a windowed aggregation: Spark's ``window_time(window)``.

A windowed aggregation's output keeps the event time in its ``window`` column: a later
aggregation over it (chained time windows, ``group_by(hr.window("window", "1 hour"))`` after
``group_by(hr.window("ts", "10 minutes"))``) groups by the window's time, ``window.end`` minus
one microsecond (Spark's ``window_time``), which this stateless step computes into a column.
"""

from __future__ import annotations

import pyarrow as pa

from headrace.transforms.expressions import ExpressionError
from headrace.transforms.operator import BatchInfo, Operator

__all__ = ["WindowTimeOperator"]


class WindowTimeOperator(Operator):
    """Adds ``output`` = ``window.end - 1 µs`` of the window struct column ``window``."""

    def __init__(self, window: str, output: str) -> None:
        self.window = window
        self.output = output
        self._type: pa.DataType | None = None

    @property
    def name(self) -> str:
        return f"window_time({self.window})"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        if self.window not in input_schema.names:
            raise ExpressionError(
                f"{self.name}: no column {self.window!r}; the columns are {input_schema.names}"
            )
        t = input_schema.field(self.window).type
        if not (
            pa.types.is_struct(t)
            and t.get_field_index("end") >= 0
            and pa.types.is_timestamp(t.field("end").type)
        ):
            raise ExpressionError(f"{self.name}: {self.window!r} is {t}, not a window (struct<start, end>)")
        end = t.field("end").type
        self._type = pa.timestamp("us", tz=end.tz)
        return input_schema.append(pa.field(self.output, self._type))

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        import pyarrow.compute as pc

        col = table.column(self.window).combine_chunks()
        end = col.field("end")
        typ = self._type or pa.timestamp("us", tz=end.type.tz)
        if end.type != typ:
            end = end.cast(typ)
        us = pc.subtract(end.view(pa.int64()), 1)
        return table.append_column(self.output, us.view(typ))
