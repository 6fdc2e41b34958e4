"""``foreach_batch``: call a user function with each micro-batch as one ``pyarrow.Table``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from headrace.protocols import CommitMessage, Sink

__all__ = ["ForeachBatchSink"]


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
        batches = list(data)
        return _Staged(pa.Table.from_batches(batches) if batches else pa.table({}))

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        tables = [m.table for m in messages if isinstance(m, _Staged) and m.table.num_columns]
        table = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        self.options["function"](table, batch_id)
