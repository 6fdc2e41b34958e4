"""Who writes a share of a batch, and its input made uniform: the writer id that the
bookkeeping table keys replays on, and the record batches cast to the first one's schema."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Iterator

import pyarrow as pa

from headrace_lakebase.table import SchemaMismatchError

__all__ = ["chain_batches", "task_id", "writer_id"]


def task_id() -> str:
    """The Spark partition id when running in a Spark task, else ``local``."""
    if "pyspark" in sys.modules:
        with contextlib.suppress(Exception):
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is not None:
                return f"p{ctx.partitionId()}"
    return "local"


def writer_id(first: pa.RecordBatch) -> str:
    """``<task>:<hash of the first input row>``: the same on a replay of the same range (a
    replayable source yields the same rows), different for the writers of one batch."""
    row = first.slice(0, 1).to_pylist()[0]
    digest = hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{task_id()}:{digest}"


def chain_batches(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``first`` then the non-empty batches of ``rest``, cast to ``schema`` (an error names a
    schema change). Called once per ``write``; lazy (bounded memory)."""
    yield first
    for b in rest:
        if not b.num_rows:
            continue
        if b.schema != schema:
            try:
                b = b.select(schema.names).cast(schema)
            except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaMismatchError(
                    f"lakebase: the data's schema changed within a batch (from {schema} to {b.schema}); "
                    "keep one schema per query, or restart the query after the change"
                ) from e
        yield b
