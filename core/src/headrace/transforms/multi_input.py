"""Operators that read two streams, each with its own steps: the stream-stream join and the
union of two transformed streams.

Such an operator is the first step of its plan; the query's sources are the first stream's
then the second's. When the query starts the engine hands it every source's schema
(:meth:`TwoInputs.bind_sources`), adds the sides' ``with_watermark`` steps to the plan's
watermarks (:meth:`TwoInputs.side_watermarks`), and reads each source with its side's
transform (:meth:`TwoInputs.side_transform`, in the reader threads): the side's own steps,
then a tag naming the side in the table's schema metadata, which the operator reads on the
consumer (:func:`side_of`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext
from headrace.transforms.watermark import WatermarkOperator

__all__ = ["SIDE_METADATA", "TwoInputs", "side_of"]

#: the schema metadata key that tags a table with the input side it was read for
SIDE_METADATA = b"headrace.input_side"
_SIDE_TAG = ({SIDE_METADATA: b"0"}, {SIDE_METADATA: b"1"})


def side_of(table: pa.Table, what: str) -> int:
    """The side (0 or 1) a table read for a two-input operator comes from."""
    side = (table.schema.metadata or {}).get(SIDE_METADATA)
    if side is None:
        raise HeadraceError(f"{what}: a table without its side's tag reached it (the engine applies "
                            "side_transform per source)")  # fmt: skip
    return int(side)


class TwoInputs:
    """The two streams' own steps and sources, shared by the two-input operators.

    ``steps`` holds each side's plan; ``left_sources`` how many of the query's sources are
    the first side's. The sides' steps must be stateless (projections, filters,
    ``with_watermark``)."""

    multi_input: ClassVar[bool] = True
    what: ClassVar[str] = "two streams"

    def _init_sides(
        self, left_steps: Sequence[Operator], right_steps: Sequence[Operator], left_sources: int
    ) -> None:
        self.left_sources = int(left_sources)
        self.steps: tuple[tuple[Operator, ...], tuple[Operator, ...]] = (
            tuple(left_steps),
            tuple(right_steps),
        )
        self._side_schemas: tuple[pa.Schema, pa.Schema] | None = None
        self._side_chains: tuple[list[tuple[Operator, pa.Schema | None]], ...] = ([], [])
        self._info: BatchInfo | None = None
        for side, steps in enumerate(self.steps):
            for op in steps:
                if op.stateful:
                    raise UnsupportedError(
                        f"{self.what}: the {('left', 'right')[side]} side has a stateful step ({op.name}) before "
                        "it; headrace combines streams whose own steps are stateless (projections, filters, "
                        "with_watermark); aggregate or deduplicate after combining them instead"
                    )
                if getattr(op, "multi_input", False):
                    raise UnsupportedError(f"{self.what}: a side that itself combines two streams ({op.name}) is not "
                                           "supported; combine two streams, then transform the result")  # fmt: skip

    def bind_schemas(self, left: pa.Schema, right: pa.Schema) -> None:
        """The sides' output schemas, when known where the frame is defined (checked there,
        before any I/O; the query checks again when it starts)."""
        self._side_schemas = (left, right)

    def bind_sources(self, schemas: Sequence[pa.Schema]) -> None:
        """Called by the engine when the query starts, with every source's schema (the first
        side's sources first): each side's own steps are resolved on its first source's
        schema. A run's copy of the operator gets its own copies of the side steps."""
        if len(schemas) <= self.left_sources:
            raise HeadraceError(
                f"{self.what}: {len(schemas)} sources, but the left side alone has {self.left_sources}"
            )
        self.steps = (
            tuple(copy.copy(op) for op in self.steps[0]),
            tuple(copy.copy(op) for op in self.steps[1]),
        )
        outs = []
        chains: list[list[tuple[Operator, pa.Schema | None]]] = []
        for side, schema in ((0, schemas[0]), (1, schemas[self.left_sources])):
            chain: list[tuple[Operator, pa.Schema | None]] = []
            for op in self.steps[side]:
                chain.append((op, schema))
                schema = op.output_schema(schema)
            outs.append(schema)
            chains.append(chain)
        self._side_schemas = (outs[0], outs[1])
        self._side_chains = (chains[0], chains[1])

    def side_filters(self, side: int) -> list[Any]:
        """Filters (sqlglot expressions over the side's output columns) that Spark moves from
        this operator into the side (a join's inferred ``IS NOT NULL``); none by default."""
        return []

    #: whether the filters after this operator apply to each side's rows unchanged (a union)
    filters_reach_sides: ClassVar[bool] = False

    def assign_measure_filters(self, after: Sequence[Any] = ()) -> None:
        """Called by the engine when the query starts, after :meth:`bind_sources` and the
        operator's ``output_schema``: each side's ``with_watermark`` steps get the filters Spark
        evaluates below them (:mod:`headrace.transforms.watermark_filters`): this operator's
        own, and ``after`` (the conjuncts of the filters following it, over its output columns)
        when they reach the sides."""
        from headrace.transforms.watermark_filters import assign_measure_filters

        for side in (0, 1):
            tail = self.side_filters(side) + (list(after) if self.filters_reach_sides else [])
            assign_measure_filters(self._side_chains[side], tail)

    def side_watermarks(self) -> list[tuple[str, WatermarkOperator]]:
        """The sides' ``with_watermark`` steps, keyed for the checkpoint's event-time maxima."""
        return [(f"input.{side}.{j}", op) for side in (0, 1) for j, op in enumerate(self.steps[side])
                if isinstance(op, WatermarkOperator)]  # fmt: skip

    def side_of_source(self, index: int) -> int:
        return 0 if index < self.left_sources else 1

    def _open_sides(self, context: OperatorContext) -> None:
        for steps in self.steps:
            for op in steps:
                op.open(OperatorContext(index=context.index, query_id=context.query_id, output_mode=context.output_mode,
                                        options=context.options))  # fmt: skip

    def _begin_sides(self, batch: BatchInfo) -> None:
        for steps in self.steps:
            for op in steps:
                op.begin(batch)
        self._info = batch

    def _close_sides(self) -> None:
        for steps in self.steps:
            for op in steps:
                op.close()

    def side_transform(self, source_index: int) -> Callable[[pa.Table], pa.Table | None]:
        """The readers' transform of source ``source_index``'s record batches: its side's own
        steps, then the side's tag. Thread-safe; called per record batch in the readers."""
        side = self.side_of_source(source_index)
        steps = self.steps[side]
        tag = _SIDE_TAG[side]

        def apply(table: pa.Table) -> pa.Table | None:
            info = self._info or BatchInfo(-1)
            for op in steps:
                out = op.process(table, info)
                if out is None:
                    return None
                table = out
            return table.replace_schema_metadata(tag)

        return apply

    def sides_state(self) -> dict[str, Any]:
        """What the sides' steps are, for a state spec."""
        return {"sides": [[op.name for op in steps] for steps in self.steps]}
