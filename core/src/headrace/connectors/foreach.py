"""``foreach_batch``: call a user function with each micro-batch as one ``pyarrow.Table``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from headrace.protocols import CommitMessage, Sink

__all__ = ["ForeachBatchSink", "concat_or_empty", "table_of"]


@dataclass(frozen=True)
class _Staged(CommitMessage):
    table: pa.Table


class ForeachBatchSink(Sink):
    """Calls ``fn(table, batch_id)`` once per batch, at commit time, with all the batch's rows.

    At-least-once: after a crash the same batch id may be passed again; a function that is
    idempotent per batch id (a Delta merge, an upsert) makes the pipeline exactly-once.
    """

    output_modes = ("append", "update", "complete")

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        """Collect the batch's rows. Called once per writer per batch."""
        return _Staged(table_of(list(data), self.context.schema))

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Call the function with every writer's rows (an empty batch still has its columns).
        Called once per batch, on the driver."""
        tables = [m.table for m in messages if isinstance(m, _Staged)]
        self.options["function"](concat_or_empty(tables, self.context.schema), batch_id)


def table_of(batches: list[pa.RecordBatch], schema: pa.Schema | None) -> pa.Table:
    """The batches as one table; no batches: an empty table of ``schema`` (the sink's context
    schema: the source's, without a transform), or with no columns when that is unknown."""
    if batches:
        return pa.Table.from_batches(batches)
    return schema.empty_table() if schema is not None else pa.table({})


def concat_or_empty(tables: list[pa.Table], schema: pa.Schema | None) -> pa.Table:
    """Several writers' tables as one: the tables with columns, concatenated (schemas unified);
    when none has columns, an empty table of ``schema`` (or with no columns)."""
    with_columns = [t for t in tables if t.num_columns]
    if not with_columns:
        return schema.empty_table() if schema is not None else pa.table({})
    with_rows = [t for t in with_columns if t.num_rows] or with_columns[:1]
    return pa.concat_tables(with_rows, promote_options="default")
