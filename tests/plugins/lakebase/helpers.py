"""Helpers importable from pipeline subprocesses (``tests.plugins.lakebase.helpers:...``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import headrace as hr


def keyed_mod_100(table: pa.Table) -> pa.Table:
    """(timestamp, value) -> (k = value % 100, value): many updates of few keys."""
    return pa.table({"k": pc.remainder(table["value"], 100), "value": table["value"]})


def keyed_mod_3000(table: pa.Table) -> pa.Table:
    """(timestamp, value) -> (k = value % 3000, value): large overlapping key sets."""
    return pa.table({"k": pc.remainder(table["value"], 3000), "value": table["value"]})


def batches(table: pa.Table, size: int) -> Iterator[pa.RecordBatch]:
    return iter(table.to_batches(max_chunksize=size))


def run_query(
    options: dict[str, Any],
    *,
    checkpoint: str,
    rows: int,
    per_batch: int,
    transform: Callable[[pa.Table], pa.Table] | None = None,
    timeout: float = 60,
) -> hr.StreamingQuery:
    """rate-micro-batch (``rows`` rows, ``per_batch`` per batch) -> lakebase, available-now."""
    frame = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=per_batch, totalRows=rows).load()
    if transform is not None:
        frame = frame.map_batches(transform)
    q = (frame.write_stream.format("lakebase").options(options).option("checkpointLocation", checkpoint)
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(timeout)
    return q


def values(rows: Iterable[tuple[Any, ...]]) -> list[Any]:
    return [r[0] for r in rows]
