"""Small operators written against the Operator contract, to test how the engine drives plans
(the real stateful operators live in headrace.transforms.aggregate/dedup), and plans for the
crash tests run in a subprocess by headrace.testing's pipeline runner."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

import headrace as hr
from headrace.checkpoint import atomic_write
from headrace.errors import UnsupportedError
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext


class StampWatermark(Operator):
    """Stateless: appends the batch's watermark (``wm``) and batch id (``batch``) to each row."""

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return input_schema.append(pa.field("wm", pa.int64())).append(pa.field("batch", pa.int64()))

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        n = table.num_rows
        wm = pa.array([batch.watermark_ms] * n, pa.int64())
        return table.append_column("wm", wm).append_column("batch", pa.array([batch.batch_id] * n, pa.int64()))


class RunningCount(Operator):
    """Stateful: the number of rows seen so far, emitted once per batch (``finish``), with the
    state in ``<state_path>/<batch id>.json``; a replayed batch starts again from ``n - 1``.
    Rows older than the watermark are dropped and counted. Update mode only."""

    stateful = True
    supports_real_time = True

    def __init__(self, event_time: str | None = None) -> None:
        self.event_time = event_time

    def check_output_mode(self, mode: str) -> None:
        if mode != "update":
            raise UnsupportedError(f"RunningCount supports only update mode, not {mode}")

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return pa.schema([("total", pa.int64()), ("batch", pa.int64()), ("wm", pa.int64())])

    def open(self, context: OperatorContext) -> None:
        assert context.state_path is not None
        self.context = context
        self.path = context.state_path
        self.opened = True

    def begin(self, batch: BatchInfo) -> None:
        prev = os.path.join(self.path, str(batch.batch_id - 1) + ".json")
        self.total = json.loads(Path(prev).read_text())["total"] if os.path.exists(prev) else 0
        self.updated = 0
        self.dropped = 0

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        n = table.num_rows
        if self.event_time and batch.watermark_ms is not None:
            import pyarrow.compute as pc

            ms = pc.cast(pc.cast(table.column(self.event_time), pa.timestamp("ms", tz="UTC")), pa.int64())
            late = pc.sum(pc.less(ms, batch.watermark_ms).cast(pa.int64())).as_py() or 0
            self.dropped += late
            n -= late
        self.total += n
        self.updated += n
        if batch.real_time:
            return pa.table({"total": [self.total], "batch": [batch.batch_id], "wm": [batch.watermark_ms]},
                            schema=self.output_schema(table.schema))  # fmt: skip
        return None

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        atomic_write(os.path.join(self.path, f"{batch.batch_id}.json"), json.dumps({"total": self.total}).encode())
        if batch.real_time:
            return None
        return pa.table({"total": [self.total], "batch": [batch.batch_id], "wm": [batch.watermark_ms]},
                        schema=self.output_schema(pa.schema([])))  # fmt: skip

    def metrics(self) -> Mapping[str, Any]:
        return {"numRowsTotal": 1, "numRowsUpdated": self.updated, "numRowsDroppedByWatermark": self.dropped}


def stamp_watermark(frame: hr.StreamFrame) -> hr.StreamFrame:
    """The crash tests' plan: a watermark of 2 s over the rate source's timestamps, a SQL step,
    and the watermark of each batch stamped on its rows."""
    return frame.with_watermark("timestamp", "2 seconds").select_expr("timestamp", "value", "value % 7 AS m").apply_operator(
        StampWatermark())  # fmt: skip
