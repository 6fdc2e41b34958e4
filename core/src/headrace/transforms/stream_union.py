"""The union of two streams that each have their own steps (Spark's ``a.union(b)`` after
``a.withWatermark(...)`` and ``b.withWatermark(...)``): each side's steps run on its own sources
in the reader threads, and the rows of both go on through the plan.

With a watermark on each side the query's watermark follows ``multipleWatermarkPolicy``
(``min``, the default: the slower side's; ``max``: the faster side's), as in Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pyarrow as pa

from headrace.transforms.expressions import ExpressionError
from headrace.transforms.multi_input import TwoInputs, side_of
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext

__all__ = ["StreamUnionOperator"]


class StreamUnionOperator(TwoInputs, Operator):
    """``left.union(right)`` of two streams with their own steps; both sides must give the same
    column names and types (headrace's ``union``)."""

    supports_real_time: ClassVar[bool] = False
    what: ClassVar[str] = "union() of two transformed streams"
    filters_reach_sides: ClassVar[bool] = True  # Spark pushes a filter through a union into both inputs

    def __init__(
        self, left_steps: Sequence[Operator], right_steps: Sequence[Operator], left_sources: int
    ) -> None:
        self._init_sides(left_steps, right_steps, left_sources)
        self._schema: pa.Schema | None = None

    @property
    def name(self) -> str:
        return "union(stream)"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        if self._side_schemas is None:
            raise ExpressionError(f"{self.name}: bind_sources() must be called before output_schema()")
        left, right = self._side_schemas
        if left.names != right.names or [f.type for f in left] != [f.type for f in right]:
            raise ExpressionError(
                f"{self.name}: both sides must have the same columns and types; the left side has "
                f"{[f'{f.name}: {f.type}' for f in left]}, the right side {[f'{f.name}: {f.type}' for f in right]}; "
                "select and cast the same columns on both sides first"
            )
        self._schema = pa.schema(
            [f.with_nullable(f.nullable or right.field(i).nullable) for i, f in enumerate(left)]
        )
        return self._schema

    def open(self, context: OperatorContext) -> None:
        self._open_sides(context)

    def begin(self, batch: BatchInfo) -> None:
        self._begin_sides(batch)

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        side_of(table, self.name)
        table = table.replace_schema_metadata(None)
        if self._schema is not None and table.schema != self._schema:
            table = table.cast(self._schema)
        return table

    def close(self) -> None:
        self._close_sides()
